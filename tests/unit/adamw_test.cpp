// AdamW as one multi-tensor op: the fused step (one adamw call over every
// parameter) must produce exactly the numbers of one call per parameter, and
// weight decay must reach matrices only. Both are checked on a store of odd
// shapes, with gradient clipping active so the folded clip factor is covered.
#include <gtest/gtest.h>

#include <cmath>

#include "brisk/core/graph.h"
#include "brisk/core/param_store.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/optim/optimizer.h"
#include "test_util.h"

using namespace brisk;

namespace {

using testing_util::backend;

// Parameters of assorted ranks and sizes (some above the parallel grain),
// random values and gradients from `seed`.
core::ParameterStore make_store(uint64_t seed) {
  core::Graph g;
  const std::vector<std::pair<std::string, core::Shape>> shapes = {
      {"a.weight", {33, 7}}, {"a.bias", {33}}, {"b.gain", {1}}, {"c.weight", {130, 65}}, {"d.bias", {40999}},
      {"e.weight", {5, 3, 2}}};
  for (const auto& [name, shape] : shapes) g.param(name, shape);
  core::ParameterStore store;
  store.adopt(g);
  uint64_t k = 0;
  for (auto& [name, e] : store.entries()) {
    e.value.copy_from(core::Tensor::uniform(e.value.shape(), core::DType::f32, seed + (++k), -1.f, 1.f));
    e.grad.copy_from(core::Tensor::uniform(e.value.shape(), core::DType::f32, seed + 100 + k, -3.f, 3.f));
  }
  return store;
}

TEST(AdamW, FusedStepEqualsOneCallPerParameter) {
  core::ParameterStore fused_store = make_store(7), loop_store = make_store(7);
  optim::AdamWConfig cfg;
  cfg.grad_clip = 1.0f;  // the gradients' norm is far above 1: clipping is active
  optim::AdamWConfig loop_cfg = cfg;
  loop_cfg.fused = false;
  optim::AdamW fused(cfg, fused_store, backend()), loop(loop_cfg, loop_store, backend());
  for (int step = 0; step < 3; ++step) {
    const optim::StepStats a = fused.step(1e-2f), b = loop.step(1e-2f);
    EXPECT_LT(a.clip_scale, 1.0);
    EXPECT_EQ(a.grad_norm, b.grad_norm);
  }
  for (const auto& [name, e] : fused_store.entries()) {
    const auto& other = loop_store.at(name);
    for (int64_t i = 0; i < e.value.numel(); ++i) {
      ASSERT_EQ(e.value.item(i), other.value.item(i)) << name << "[" << i << "]";
      ASSERT_EQ(e.state[0].item(i), other.state[0].item(i)) << name << " m[" << i << "]";
      ASSERT_EQ(e.state[1].item(i), other.state[1].item(i)) << name << " v[" << i << "]";
    }
  }
}

// With zero gradients Adam's update is exactly zero (m = v = 0), so what
// moves a parameter is the decoupled decay alone: p * (1 - lr * wd) for
// tensors of rank >= 2, nothing for vectors.
TEST(AdamW, WeightDecayOnlyOnMatrices) {
  core::ParameterStore store = make_store(11), before = make_store(11);
  store.zero_grads();
  optim::AdamWConfig cfg;
  cfg.weight_decay = 0.5f;
  optim::AdamW adamw(cfg, store, backend());
  const float lr = 0.1f;
  adamw.step(lr);
  const double factor = double(float(1.0 - double(lr) * double(cfg.weight_decay)));
  for (const auto& [name, e] : store.entries()) {
    const bool matrix = e.value.shape().rank() >= 2;
    for (int64_t i = 0; i < e.value.numel(); ++i) {
      const double was = before.at(name).value.item(i);
      const double want = matrix ? double(float(was * factor)) : was;
      ASSERT_NEAR(e.value.item(i), want, 1e-7 * std::abs(was)) << name << "[" << i << "] (matrix: " << matrix << ")";
    }
  }
}

}  // namespace
