// AdamW with global grad-norm clipping, and learning-rate schedules.
//
// The update is one call of the fused multi-tensor `adamw` op: one
// multi-threaded pass over every parameter, grad, m and v; clipping costs
// nothing extra because the clip factor is folded into the op's grad_scale. Weight decay applies to 2-D weights only
// (matrices and embeddings), never to biases or LayerNorm parameters.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "brisk/core/backend.h"
#include "brisk/core/param_store.h"

namespace brisk::optim {

struct AdamWConfig {
  float lr = 6e-4f;
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float weight_decay = 0.1f;
  float grad_clip = 1.0f;  // max global grad norm; 0 disables clipping
  // One adamw op call over every parameter (one parallel pass) instead of
  // one call per parameter. Same numbers either way; off only for the
  // ablation benchmark's unfused baseline.
  bool fused = true;
};

struct StepStats {
  double grad_norm = 0;  // before clipping
  double clip_scale = 1;
};

class AdamW {
 public:
  // allocate_state = false: ZeRO-1 will shard() it before the first step, so
  // the full per-parameter moments are never made for a fresh run.
  AdamW(const AdamWConfig& config, core::ParameterStore& params, core::Backend& backend, bool allocate_state = true);
  // The store's per-parameter moments (zero), for a resume to load into
  // before shard() takes this process's part of them.
  void allocate_full_state();
  // One update with learning rate `lr`; grad_scale divides out a loss scale.
  StepStats step(float lr, float grad_scale = 1.0f);
  // The same, reusing grad_norm() of the current (still scaled) gradients
  // when the caller has computed it already (the loss scaler's finite check).
  StepStats step(float lr, float grad_scale, double scaled_grad_norm);
  double grad_norm();
  // ZeRO-1 (dist/data_parallel.h): this process updates only `pieces` of
  // the parameters, with moments of its own for them, taken over from the
  // store's per-parameter moments (which are then released). The grad
  // norm's sum of squares over the pieces is completed across processes by
  // sum_over_ranks.
  struct Piece {
    std::string name;            // the parameter
    int64_t offset = 0, count = 0;  // elements of it
  };
  void shard(const std::vector<Piece>& pieces, std::function<double(double)> sum_over_ranks);
  bool sharded() const { return bool(sum_over_ranks_); }
  // The sharded moments: piece k's elements follow piece k-1's.
  const core::Tensor& shard_exp_avg() const { return shard_m_; }
  const core::Tensor& shard_exp_avg_sq() const { return shard_v_; }
  int64_t steps_taken() const { return step_; }
  void set_steps_taken(int64_t s) { step_ = s; }
  const AdamWConfig& config() const { return config_; }

 private:
  AdamWConfig config_;
  core::ParameterStore& params_;
  core::Backend& backend_;
  int64_t step_ = 0;
  std::vector<core::TensorView> grads_;  // for grad_norm, built once
  core::Tensor norm_;                    // grad_norm's output, where the grads live
  // The adamw op's operands for every parameter, built once: (p, g, m, v)
  // in, (p, m, v) out, in the store's order.
  std::vector<core::TensorView> step_inputs_, step_outputs_;
  core::Tensor shard_m_, shard_v_;
  std::function<double(double)> sum_over_ranks_;
  bool awaiting_shard_ = false;
};

// plateau: warm-up, then max_lr times the scale that optim::ReduceOnPlateau
// (plateau.h) lowers when the validation loss stops improving.
enum class Schedule { constant, linear, cosine, plateau };

struct LrSchedule {
  Schedule kind = Schedule::cosine;
  float max_lr = 6e-4f;
  float min_lr_ratio = 0.1f;  // the lr decays to max_lr * min_lr_ratio
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  // plateau only: evaluations without improvement tolerated before a cut,
  // and the factor each cut multiplies the lr by.
  int64_t plateau_patience = 3;
  float plateau_factor = 0.5f;
  // Learning rate for 0-based step: linear warmup, then the schedule's decay
  // (plateau: max_lr; the caller applies ReduceOnPlateau::scale()).
  float at(int64_t step) const;
  // Throws ConfigError listing the allowed values. "plateau" needs a run that
  // evaluates between steps and feeds ReduceOnPlateau: only callers that do
  // pass allow_plateau; for the others it is an error that says so.
  static Schedule parse(const std::string& name, bool allow_plateau = false);
};

}  // namespace brisk::optim
