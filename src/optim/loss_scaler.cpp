// Dynamic loss scaling (loss_scaler.h). Kept apart from AdamW because the
// policy (when to skip, when to grow) is independent of the update rule and
// of the tensors: the trainer asks it each step and feeds AdamW the scale.
#include "brisk/optim/loss_scaler.h"

#include <algorithm>
#include <string>

#include "brisk/core/error.h"

namespace brisk::optim {

namespace {

void require(bool ok, const std::string& what) {
  if (!ok) throw core::ConfigError("loss scaler: " + what);
}

}  // namespace

LossScaler::LossScaler(const LossScalerConfig& config) : config_(config), scale_(config.init_scale) {
  const auto& c = config_;
  require(std::isfinite(c.min_scale) && c.min_scale > 0, "min_scale must be a positive finite number");
  require(std::isfinite(c.max_scale) && c.max_scale >= c.min_scale, "max_scale must be finite and >= min_scale");
  require(std::isfinite(c.init_scale) && c.init_scale >= c.min_scale && c.init_scale <= c.max_scale,
          "init_scale " + std::to_string(c.init_scale) + " must lie in [min_scale, max_scale] = [" +
              std::to_string(c.min_scale) + ", " + std::to_string(c.max_scale) + "]");
  require(c.growth_factor > 1 && std::isfinite(c.growth_factor), "growth_factor must be > 1");
  require(c.backoff_factor > 0 && c.backoff_factor < 1, "backoff_factor must be in (0, 1)");
  require(c.growth_interval >= 1, "growth_interval must be at least 1, got " + std::to_string(c.growth_interval));
}

void LossScaler::restore(const LossScalerState& s) {
  require(std::isfinite(s.scale) && s.scale >= config_.min_scale && s.scale <= config_.max_scale,
          "saved scale " + std::to_string(s.scale) + " lies outside [min_scale, max_scale]");
  require(s.steps >= 0 && s.skipped >= 0 && s.growths >= 0 && s.backoffs >= 0 && s.clean_streak >= 0,
          "saved counters must not be negative");
  scale_ = s.scale;
  steps_ = s.steps;
  skipped_ = s.skipped;
  growths_ = s.growths;
  backoffs_ = s.backoffs;
  clean_streak_ = s.clean_streak;
}

bool LossScaler::update(bool grads_finite) {
  ++steps_;
  if (!grads_finite) {
    ++skipped_;
    clean_streak_ = 0;
    const float lowered = std::max(config_.min_scale, scale_ * config_.backoff_factor);
    // At the floor the scale cannot go lower: the step is still skipped, but
    // it is not a scale change.
    if (lowered != scale_) {
      scale_ = lowered;
      ++backoffs_;
    }
    return false;
  }
  if (++clean_streak_ >= config_.growth_interval) {
    clean_streak_ = 0;
    const float raised = std::min(config_.max_scale, scale_ * config_.growth_factor);
    if (raised != scale_) {
      scale_ = raised;
      ++growths_;
    }
  }
  return true;
}

ScaledStep scaled_step(AdamW& adamw, LossScaler& scaler, float lr) {
  ScaledStep r;
  r.scale_used = scaler.scale();
  const double scaled_norm = adamw.grad_norm();
  r.applied = scaler.update(LossScaler::grads_finite(scaled_norm));
  if (r.applied) r.stats = adamw.step(lr, r.scale_used, scaled_norm);
  else r.stats.grad_norm = scaled_norm / r.scale_used;
  return r;
}

}  // namespace brisk::optim
