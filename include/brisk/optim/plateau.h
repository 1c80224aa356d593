// Reduce-on-plateau (train.schedule = "plateau", docs/monitoring.md): the
// learning rate is LrSchedule::at(step) (warm-up, then max_lr) times a scale
// that drops when the validation loss stops improving. The rule is
// PyTorch's ReduceLROnPlateau in its default "min, rel" mode without
// cooldown: an evaluation improves on the best one so far when its loss is
// below best * (1 - 1e-4); after more than `patience` evaluations in a row
// without improvement the scale is multiplied by `factor` (never below
// `min_scale`) and the count starts again. patience = 2: the third
// evaluation in a row without improvement cuts.
//
// The whole state is four numbers (PlateauState), kept in the checkpoint so
// a resumed run continues with the same scale, best loss and count.
#pragma once

#include <cstdint>
#include <limits>

#include "brisk/optim/optimizer.h"

namespace brisk::optim {

struct PlateauState {
  double scale = 1.0;                                   // multiplies the schedule's lr
  double best = std::numeric_limits<double>::infinity();  // lowest validation loss so far
  int64_t bad_evals = 0;                                // evaluations in a row without improvement
  int64_t cuts = 0;                                     // times the scale was lowered
  bool operator==(const PlateauState&) const = default;
};

class ReduceOnPlateau {
 public:
  // Relative improvement an evaluation must make over the best loss.
  static constexpr double kThreshold = 1e-4;

  ReduceOnPlateau(int64_t patience, double factor, double min_scale);
  // From train.plateau_patience, train.plateau_factor and train.min_lr_ratio.
  explicit ReduceOnPlateau(const LrSchedule& s);

  // Feeds one validation loss (NaN counts as no improvement); true when this
  // evaluation lowered the scale.
  bool observe(double val_loss);
  double scale() const { return state_.scale; }
  // The lr of 0-based `step`: the schedule's, scaled.
  float lr(const LrSchedule& s, int64_t step) const { return float(double(s.at(step)) * state_.scale); }

  const PlateauState& state() const { return state_; }
  void restore(const PlateauState& s) { state_ = s; }

 private:
  int64_t patience_;
  double factor_, min_scale_;
  PlateauState state_;
};

}  // namespace brisk::optim
