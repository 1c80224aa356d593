// AdamW steps and LR schedules (optimizer.h).
#include "brisk/optim/optimizer.h"

#include <cmath>

#include "brisk/core/error.h"
#include "brisk/ops/ops.h"

namespace brisk::optim {

AdamW::AdamW(const AdamWConfig& config, core::ParameterStore& params, core::Backend& backend, bool allocate_state)
    : config_(config), params_(params), backend_(backend), awaiting_shard_(!allocate_state) {
  ops::register_ops();  // the step runs ops directly, maybe before any graph was built
  if (awaiting_shard_) return;  // shard() builds the operands
  for (auto& [name, e] : params_.entries()) {
    if (e.state.empty())
      e.state = {params_.make_zeros(e.value.shape(), core::DType::f32),
                 params_.make_zeros(e.value.shape(), core::DType::f32)};
    grads_.push_back(e.grad.as_view());
    step_inputs_.insert(step_inputs_.end(),
                        {e.value.as_view(), e.grad.as_view(), e.state[0].as_view(), e.state[1].as_view()});
    step_outputs_.insert(step_outputs_.end(), {e.value.as_view(), e.state[0].as_view(), e.state[1].as_view()});
  }
}

void AdamW::allocate_full_state() {
  for (auto& [name, e] : params_.entries())
    if (e.state.empty())
      e.state = {params_.make_zeros(e.value.shape(), core::DType::f32),
                 params_.make_zeros(e.value.shape(), core::DType::f32)};
}

// On a device the norm lands in a device scalar and is read back: the one
// synchronisation of a step besides the loss (clipping needs the value).
double AdamW::grad_norm() {
  if (awaiting_shard_) throw core::Error("AdamW: built without state for ZeRO-1, but shard() was never called");
  if (grads_.empty()) return sum_over_ranks_ ? std::sqrt(sum_over_ranks_(0.0)) : 0.0;  // a shard of padding only
  if (!norm_.defined()) norm_ = params_.make_zeros(core::Shape{}, core::DType::f32);
  const core::TensorView out = norm_.as_view();
  core::run_op(backend_, core::OpKind::grad_norm, grads_, std::span<const core::TensorView>(&out, 1));
  float norm = 0.f;
  if (params_.on_device()) backend_.copy_to_host(&norm, norm_.data(), sizeof norm);
  else norm = *norm_.data_as<float>();
  if (sum_over_ranks_) return std::sqrt(sum_over_ranks_(double(norm) * double(norm)));
  return norm;
}

void AdamW::shard(const std::vector<Piece>& pieces, std::function<double(double)> sum_over_ranks) {
  int64_t total = 0;
  for (const Piece& p : pieces) total += p.count;
  shard_m_ = params_.make_zeros(core::Shape{std::max<int64_t>(total, 1)}, core::DType::f32);
  shard_v_ = params_.make_zeros(core::Shape{std::max<int64_t>(total, 1)}, core::DType::f32);
  grads_.clear();
  step_inputs_.clear();
  step_outputs_.clear();
  int64_t at = 0;
  for (const Piece& p : pieces) {
    core::ParameterStore::Entry& e = params_.at(p.name);
    if (p.offset < 0 || p.count <= 0 || p.offset + p.count > e.value.numel())
      throw core::Error("AdamW::shard: piece [" + std::to_string(p.offset) + ", +" + std::to_string(p.count) +
                        ") is outside parameter '" + p.name + "' of " + e.value.meta().str());
    // A piece of a matrix keeps rank 2, so the op still decays it (decay is by rank).
    const core::Shape shape = e.value.shape().rank() >= 2 ? core::Shape{1, p.count} : core::Shape{p.count};
    const core::Tensor value = e.value.slice(p.offset, shape), grad = e.grad.slice(p.offset, shape);
    const core::Tensor m = shard_m_.slice(at, shape), v = shard_v_.slice(at, shape);
    // Moments so far (a resumed run): the store's full ones, piece by piece.
    if (e.state.size() == 2) {
      const core::TensorView src_m = e.state[0].slice(p.offset, shape).as_view(), dst_m = m.as_view();
      const core::TensorView src_v = e.state[1].slice(p.offset, shape).as_view(), dst_v = v.as_view();
      core::run_op(backend_, core::OpKind::copy, std::span<const core::TensorView>(&src_m, 1),
                   std::span<const core::TensorView>(&dst_m, 1));
      core::run_op(backend_, core::OpKind::copy, std::span<const core::TensorView>(&src_v, 1),
                   std::span<const core::TensorView>(&dst_v, 1));
    }
    grads_.push_back(grad.as_view());
    step_inputs_.insert(step_inputs_.end(), {value.as_view(), grad.as_view(), m.as_view(), v.as_view()});
    step_outputs_.insert(step_outputs_.end(), {value.as_view(), m.as_view(), v.as_view()});
    at += p.count;
  }
  for (auto& [name, e] : params_.entries()) e.state.clear();  // the full moments are no longer this process's
  sum_over_ranks_ = std::move(sum_over_ranks);
  awaiting_shard_ = false;
}

StepStats AdamW::step(float lr, float grad_scale) { return step(lr, grad_scale, grad_norm()); }

StepStats AdamW::step(float lr, float grad_scale, double scaled_grad_norm) {
  StepStats s;
  s.grad_norm = scaled_grad_norm / grad_scale;
  if (config_.grad_clip > 0 && s.grad_norm > config_.grad_clip) s.clip_scale = config_.grad_clip / s.grad_norm;
  ++step_;
  ops::AdamWParams p;
  p.lr = lr;
  p.beta1 = config_.beta1;
  p.beta2 = config_.beta2;
  p.eps = config_.eps;
  p.weight_decay = config_.weight_decay;
  p.step = step_;
  p.grad_scale = float(s.clip_scale / grad_scale);
  p.decay_matrices = true;
  if (step_inputs_.empty()) return s;
  if (config_.fused) {
    core::run_op(backend_, core::OpKind::adamw, step_inputs_, step_outputs_, p);
  } else {
    const std::span<const core::TensorView> in(step_inputs_), out(step_outputs_);
    for (size_t t = 0; t < in.size() / 4; ++t)
      core::run_op(backend_, core::OpKind::adamw, in.subspan(4 * t, 4), out.subspan(3 * t, 3), p);
  }
  return s;
}

float LrSchedule::at(int64_t step) const {
  if (warmup_steps > 0 && step < warmup_steps) return max_lr * float(step + 1) / float(warmup_steps);
  const float min_lr = max_lr * min_lr_ratio;
  const int64_t decay_steps = std::max<int64_t>(1, total_steps - warmup_steps);
  const float progress = std::min(1.0f, float(step - warmup_steps) / float(decay_steps));
  switch (kind) {
    case Schedule::constant: return max_lr;
    case Schedule::linear: return max_lr + (min_lr - max_lr) * progress;
    case Schedule::cosine: return min_lr + 0.5f * (max_lr - min_lr) * (1.0f + std::cos(float(M_PI) * progress));
    case Schedule::plateau: return max_lr;
  }
  return max_lr;
}

Schedule LrSchedule::parse(const std::string& name, bool allow_plateau) {
  if (name == "constant") return Schedule::constant;
  if (name == "linear") return Schedule::linear;
  if (name == "cosine") return Schedule::cosine;
  if (name == "plateau" && allow_plateau) return Schedule::plateau;
  if (name == "plateau")
    throw core::ConfigError("train.schedule: 'plateau' follows the validation loss of a GPT run (brisk train with a "
                            "GPT config); this run supports: constant, linear, cosine");
  throw core::ConfigError("train.schedule: unknown value '" + name + "' (allowed: constant, linear, cosine" +
                          (allow_plateau ? ", plateau)" : ")"));
}

}  // namespace brisk::optim
