// Reduce-on-plateau (plateau.h).
#include "brisk/optim/plateau.h"

#include <algorithm>
#include <string>

#include "brisk/core/error.h"

namespace brisk::optim {

ReduceOnPlateau::ReduceOnPlateau(int64_t patience, double factor, double min_scale)
    : patience_(patience), factor_(factor), min_scale_(min_scale) {
  if (patience < 0) throw core::ConfigError("train.plateau_patience must be >= 0, got " + std::to_string(patience));
  if (!(factor > 0 && factor < 1))
    throw core::ConfigError("train.plateau_factor must be in (0, 1), got " + std::to_string(factor));
  if (!(min_scale >= 0 && min_scale <= 1))
    throw core::ConfigError("train.min_lr_ratio must be in [0, 1], got " + std::to_string(min_scale));
}

ReduceOnPlateau::ReduceOnPlateau(const LrSchedule& s)
    : ReduceOnPlateau(s.plateau_patience, double(s.plateau_factor), double(s.min_lr_ratio)) {}

bool ReduceOnPlateau::observe(double val_loss) {
  // best = infinity before the first evaluation: any finite loss improves on it.
  if (val_loss < state_.best * (1.0 - kThreshold)) {
    state_.best = val_loss;
    state_.bad_evals = 0;
    return false;
  }
  if (++state_.bad_evals <= patience_) return false;
  state_.bad_evals = 0;
  const double lowered = std::max(state_.scale * factor_, min_scale_);
  if (!(lowered < state_.scale)) return false;  // already at the floor
  state_.scale = lowered;
  ++state_.cuts;
  return true;
}

}  // namespace brisk::optim
