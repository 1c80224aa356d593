// Dynamic loss scaling for fp16 training: the loss gradient is
// seeded with `scale()` so small fp16 gradients do not flush to zero, and the
// optimizer divides the scale back out (AdamW::step's grad_scale).
//
// The state machine is the usual one (PyTorch's GradScaler, Micikevicius et
// al. 2018): start at 2^16; after `growth_interval` consecutive clean steps
// double the scale; on a step whose gradients hold an inf or nan, skip the
// update and halve the scale (never below `min_scale`). It is a small value
// type with no tensors, so it is trivially testable and the trainer owns the
// policy of what a "step" is.
//
// Finite check: the caller passes whether the gradients are finite. The
// cheapest exact test is the global gradient norm that AdamW computes anyway
// (AdamW::grad_norm(), see grads_finite()): it sums squares in double, so it
// is inf/nan iff some gradient element is inf/nan, or the scaled norm itself
// exceeds the float range (> 3.4e38) -- which is an overflow of the scaled
// gradients too and must back off just the same.
#pragma once

#include <cmath>
#include <cstdint>

#include "brisk/optim/optimizer.h"

namespace brisk::optim {

struct LossScalerConfig {
  float init_scale = 65536.0f;     // 2^16
  float growth_factor = 2.0f;      // applied after growth_interval clean steps
  float backoff_factor = 0.5f;     // applied on an overflow
  int64_t growth_interval = 2000;  // consecutive clean steps before a growth
  float min_scale = 1.0f;          // floor: backoffs stop here (steps are still skipped)
  // Ceiling, so growth can never make the scale itself overflow to inf; 2^64
  // is far beyond anything fp16 gradients can use.
  float max_scale = 18446744073709551616.0f;
};

// Everything that decides future scales: saved in checkpoints so a resumed
// fp16 run continues with the scale (and streak) it stopped at.
struct LossScalerState {
  float scale = 65536.0f;
  int64_t steps = 0, skipped = 0, growths = 0, backoffs = 0, clean_streak = 0;
};

class LossScaler {
 public:
  // Throws core::ConfigError naming the bad field (non-positive scale,
  // growth_factor <= 1, backoff outside (0, 1), growth_interval < 1, or
  // init_scale outside [min_scale, max_scale]).
  explicit LossScaler(const LossScalerConfig& config = {});

  // The current scale: seed the backward with it, pass it to AdamW::step as
  // grad_scale.
  float scale() const { return scale_; }

  // Call once per optimizer step, after the backward. Returns true if the
  // step should be applied (gradients finite), false if it must be skipped.
  // Updates the scale for the next step.
  bool update(bool grads_finite);

  // The finite check on AdamW::grad_norm() described at the top of this file.
  static bool grads_finite(double global_grad_norm) { return std::isfinite(global_grad_norm); }

  int64_t steps() const { return steps_; }                // update() calls
  int64_t skipped_steps() const { return skipped_; }      // overflows (steps not applied)
  int64_t scale_changes() const { return growths_ + backoffs_; }
  int64_t growths() const { return growths_; }
  int64_t backoffs() const { return backoffs_; }          // overflows that lowered the scale
  int64_t clean_streak() const { return clean_streak_; }  // clean steps since the last change or overflow
  const LossScalerConfig& config() const { return config_; }

  LossScalerState state() const { return {scale_, steps_, skipped_, growths_, backoffs_, clean_streak_}; }
  // Throws core::ConfigError if the scale is outside [min_scale, max_scale]
  // or a counter is negative (a damaged checkpoint).
  void restore(const LossScalerState& s);

 private:
  LossScalerConfig config_;
  float scale_;
  int64_t steps_ = 0, skipped_ = 0, growths_ = 0, backoffs_ = 0, clean_streak_ = 0;
};

struct ScaledStep {
  StepStats stats;         // grad_norm unscaled (inf/nan on an overflow)
  bool applied = false;    // false: skipped on overflow
  float scale_used = 1.f;  // the scale the gradients carried
};

// One optimizer step under loss scaling, for gradients that hold
// d(loss * scaler.scale()) (the backward was seeded with the scale): one
// grad-norm pass decides; finite gradients get AdamW::step with
// grad_scale = scale, an overflow leaves weights, moments and AdamW's step
// count untouched. The scaler is updated either way. The trainer and the
// tests both go through here, so the tests check the trainer's logic.
ScaledStep scaled_step(AdamW& adamw, LossScaler& scaler, float lr);

}  // namespace brisk::optim
