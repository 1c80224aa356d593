// Weight, bias and table gradients summed in place (core::grad_sink): a
// Linear's weight-gradient product writes into the parameter's accumulated
// gradient with beta = 1, its bias's column sum and an embedding's
// scatter-add add to theirs, and in mixed
// precision the product of bf16/f16 operands lands in the f32 gradient with
// no cast and no accumulate in between.
//
// What could go wrong, and the test that would see it:
// - the fold silently stops happening (a rule change, a new cast) ->
//   every Linear weight and bias and both tables are written in place: only
//   LayerNorm gradients are accumulated, no dW product is widened, one
//   accumulating product per weight, column sum per bias, scatter per table;
// - a kernel overwrites the gradient instead of adding to it (beta = 0, a
//   zero fill) -> two micro-steps without zeroing must give the sum of the
//   two single-step gradients; the op harness's "into" cases check each
//   kernel against its reference on random accumulators;
// - the values themselves -> the PyTorch cross-check (fp32) and
//   MixedPrecision.OneStepLossAndGradientsTrackFp32 (bf16, f16).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "brisk/cpu/cpu_backend.h"
#include "brisk/models/gpt.h"

using namespace brisk;
using core::DType;
using core::OpKind;

namespace {

models::GptConfig small(DType compute, bool fused) {
  models::GptConfig c;
  c.vocab_size = 61;
  c.n_layer = 2;
  c.n_embd = 32;
  c.n_head = 4;
  c.block_size = 24;
  c.compute = compute;
  c.fused_classifier = fused;
  return c;
}

constexpr int64_t kB = 2, kT = 17;

TEST(GradSink, WeightAndTableGradientsAreWrittenInPlace) {
  cpu::CpuBackend backend(2);
  for (const DType dt : {DType::f32, DType::bf16, DType::f16})
    for (const bool fused : {false, true}) {
      if (fused && dt == DType::f16) continue;  // the fused classifier is f32/bf16 only
      SCOPED_TRACE(std::string(core::dtype_name(dt)) + (fused ? " fused" : " plain"));
      models::Gpt m(small(dt, fused), backend);
      const core::Graph g = m.train_graph(kB, kT);
      int into_products = 0, into_scatters = 0, into_sums = 0;
      for (size_t i = g.backward_start(); i < g.nodes().size(); ++i) {
        const core::Node& n = g.nodes()[i];
        const core::TensorMeta& out = g.meta(n.outputs[0]);
        if (n.op == OpKind::accumulate) {
          const std::string& into = g.value(n.inputs[0]).name;
          EXPECT_NE(into.find("ln_"), std::string::npos) << "only LayerNorm gradients are accumulated: " << into;
        }
        if (n.op == OpKind::sum && n.inputs.size() == 2) ++into_sums;
        if (n.op == OpKind::linear_param_grad) {  // both of a Linear's parameter gradients, in place
          ++into_products;
          ++into_sums;
          EXPECT_EQ(out.dtype, DType::f32);
        }
        if (n.op == OpKind::cast && out.dtype == DType::f32) {  // a widened weight-gradient product (dy^T x)?
          const core::Node& src = g.nodes()[size_t(g.value(n.inputs[0]).producer)];
          EXPECT_FALSE(src.op == OpKind::matmul && std::get<core::MatmulParams>(src.params).trans_a)
              << "no weight gradient is widened after the fact: " << out.str();
        }
        if (n.op == OpKind::matmul && n.inputs.size() == 3) {
          ++into_products;
          EXPECT_EQ(g.value(n.inputs[2]).role == core::ValueRole::grad || g.value(n.inputs[2]).producer >= 0, true);
          EXPECT_EQ(out.dtype, DType::f32);
        }
        if (n.op == OpKind::embedding_backward) {
          EXPECT_EQ(n.inputs.size(), 3u) << "the tables' scatter-adds add to their gradients";
          into_scatters += n.inputs.size() == 3;
        }
      }
      // 4 Linear weights per layer, plus the tied head unless the fused
      // classifier computes its gradient itself.
      EXPECT_EQ(into_products, 4 * 2 + (fused ? 0 : 1));
      EXPECT_EQ(into_scatters, 2) << "wte and wpe";
      EXPECT_EQ(into_sums, 4 * 2) << "every Linear bias's column sum adds to its gradient";
    }
}

// Gradients of every parameter, by name.
std::map<std::string, std::vector<double>> grads_of(models::Gpt& m) {
  std::map<std::string, std::vector<double>> out;
  for (const auto& [name, e] : m.params().entries()) {
    std::vector<double>& v = out[name];
    for (int64_t i = 0; i < e.grad.numel(); ++i) v.push_back(e.grad.item(i));
  }
  return out;
}

TEST(GradSink, TwoMicroStepsAddUpToTheSumOfTheirGradients) {
  cpu::CpuBackend backend(2);
  std::vector<int32_t> x1(size_t(kB * kT)), y1(x1.size()), x2(x1.size()), y2(x1.size());
  for (size_t i = 0; i < x1.size(); ++i) {
    x1[i] = int32_t((i * 7 + 3) % 61), y1[i] = int32_t((i * 11 + 5) % 61);
    x2[i] = int32_t((i * 13 + 1) % 61), y2[i] = int32_t((i * 5 + 2) % 61);
  }
  for (const DType dt : {DType::f32, DType::bf16})
    for (const bool fused : {false, true}) {
      SCOPED_TRACE(std::string(core::dtype_name(dt)) + (fused ? " fused" : " plain"));
      models::Gpt m(small(dt, fused), backend);
      m.init_weights(3);
      m.params().zero_grads();
      m.train_micro_step(x1.data(), y1.data(), kB, kT);
      const auto g1 = grads_of(m);
      m.params().zero_grads();
      m.train_micro_step(x2.data(), y2.data(), kB, kT);
      const auto g2 = grads_of(m);
      m.params().zero_grads();
      m.train_micro_step(x1.data(), y1.data(), kB, kT);
      m.train_micro_step(x2.data(), y2.data(), kB, kT);
      const auto both = grads_of(m);
      for (const auto& [name, v] : both) {
        const std::vector<double>&a = g1.at(name), &b = g2.at(name);
        double scale = 1e-12, worst = 0;
        for (size_t i = 0; i < v.size(); ++i) scale = std::max({scale, std::abs(a[i]), std::abs(b[i])});
        for (size_t i = 0; i < v.size(); ++i) worst = std::max(worst, std::abs(v[i] - (a[i] + b[i])));
        EXPECT_GT(scale, 1e-8) << name << " has no gradient";
        EXPECT_LE(worst / scale, 1e-5) << name << ": the second micro-step overwrote or lost the first";
      }
    }
}

}  // namespace
