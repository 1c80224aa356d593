// A step whose loss or gradient norm is not finite has put NaN or inf into
// the weights (AdamW applied it): every later step computes garbage, and a
// checkpoint of them would become the newest one, which --resume, generate
// and classify pick. Every trainer ends the run there instead, with this
// error, before it saves. Internal to src/train.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

#include "brisk/core/error.h"

namespace brisk::train::detail {

inline bool diverged(double loss, double grad_norm) { return !std::isfinite(loss) || !std::isfinite(grad_norm); }

// `kept` says which checkpoint is now the newest ("the newest is ...").
inline core::Error diverged_error(int64_t step, double loss, double grad_norm, double lr, const std::string& kept) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "step %lld: the loss is %g and the gradient norm %g at lr %g: training diverged",
                (long long)step, loss, grad_norm, lr);
  return core::Error(std::string(buf) + "; no checkpoint was written for it (" + kept +
                     "); lower train.lr or raise train.warmup");
}

// An fp16 step whose gradients overflowed at the loss scaler's floor: no
// lower scale is left to try, and a run there (weights or activations past
// fp16's range, a forward pass whose loss is not finite) would skip every
// step to its end and exit 0 with the weights it had.
inline core::Error overflow_at_floor_error(int64_t step, double loss, double scale, double lr, const std::string& kept) {
  char buf[224];
  std::snprintf(buf, sizeof buf,
                "step %lld: the gradients overflowed at the loss scale's floor (%g; the loss is %g) at lr %g: training "
                "diverged",
                (long long)step, scale, loss, lr);
  return core::Error(std::string(buf) + "; no checkpoint was written for it (" + kept +
                     "); lower train.lr or raise train.warmup, or train in bf16 or fp32");
}

}  // namespace brisk::train::detail
