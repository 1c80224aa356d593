// The bias+GELU and residual+LayerNorm fusions (linear_gelu, add_layernorm and
// their rewrite patterns) and the backward fusions (a LayerNorm's backward
// with the residual gradient: layernorm_backward's dres input; GELU's
// backward with the product before it: matmul_gelu_backward) on the CPU
// backend. The op harness checks each op against its reference kernel and its
// backward by finite differences; this file checks what the harness cannot:
// (1) the fused CPU kernels against the unfused CPU kernels they replace, at
// W2's MLP width and odd shapes; (2) that the patterns fire exactly where
// they should (GPT-shaped graphs, fp32 and mixed precision) and nowhere else;
// (3) a small GPT with each fusion on and off: the same loss, logits and
// parameter gradients (the backward fusion: to the bit); (4) the
// model.fuse_* config keys.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "brisk/core/autograd.h"
#include "brisk/core/error.h"
#include "brisk/core/executor.h"
#include "brisk/core/passes.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/models/gpt.h"
#include "brisk/ops/ops.h"
#include "brisk/train/config.h"
#include "brisk/train/tune.h"
#include "test_models.h"
#include "test_util.h"

using namespace brisk;
using core::DType;
using core::Graph;
using core::OpKind;
using core::Tensor;
using core::ValueId;
using testing_util::normalized_error;

namespace {

using testing_util::backend;

int count_ops(const Graph& g, OpKind k, bool forward_only = true) {
  const size_t end = forward_only ? g.backward_start() : g.nodes().size();
  return int(std::count_if(g.nodes().begin(), g.nodes().begin() + ptrdiff_t(end),
                           [&](const core::Node& n) { return n.op == k; }));
}

int applied(const core::RewriteResult& r, const std::string& name) {
  for (const auto& [n, k] : r.applied)
    if (n == name) return k;
  return -1;
}

std::vector<Tensor> run_one(OpKind op, const std::vector<Tensor>& in, const ops::OpParams& p,
                            const std::vector<core::TensorMeta>& out_metas) {
  std::vector<core::TensorView> iv, ov;
  for (const Tensor& t : in) iv.push_back(t.as_view());
  std::vector<Tensor> out;
  for (const auto& m : out_metas) out.push_back(Tensor::empty(m.shape, m.dtype));
  for (const Tensor& t : out) ov.push_back(t.as_view());
  std::vector<core::TensorMeta> im;
  for (const Tensor& t : in) im.push_back(t.meta());
  const core::OpDef& def = core::op_def(op);
  std::vector<unsigned char> ws(def.workspace_bytes ? def.workspace_bytes(im, p) : 0);
  core::run_op(backend(), op, iv, ov, p, ws.data(), ws.size());
  return out;
}

}  // namespace

// ---- kernels: fused vs the unfused CPU kernels ------------------------------------------

TEST(FusedKernels, LinearGeluMatchesLinearThenGelu) {
  ops::register_ops();
  struct Case { int64_t rows, in, out; DType t; };
  // W2's MLP width with ragged thread blocks, an odd narrow case, one too
  // small to thread, and bf16 (the composed path).
  for (const Case k : {Case{517, 96, 1536, DType::f32}, Case{133, 13, 33, DType::f32}, Case{3, 5, 7, DType::f32},
                       Case{70, 24, 40, DType::bf16}}) {
    SCOPED_TRACE(std::to_string(k.rows) + "x" + std::to_string(k.in) + "->" + std::to_string(k.out));
    const Tensor x = Tensor::uniform({k.rows, k.in}, k.t, 1, -2.f, 2.f);
    const Tensor w = Tensor::uniform({k.out, k.in}, k.t, 2, -0.5f, 0.5f);
    const Tensor b = Tensor::uniform({k.out}, k.t, 3, -1.f, 1.f);
    const core::TensorMeta ym{{k.rows, k.out}, k.t};
    const Tensor h_ref = run_one(OpKind::linear, {x, w, b}, ops::NoParams{}, {ym})[0];
    const Tensor y_ref = run_one(OpKind::gelu, {h_ref}, ops::NoParams{}, {ym})[0];
    const std::vector<Tensor> got = run_one(OpKind::linear_gelu, {x, w, b}, ops::NoParams{}, {ym, ym});
    EXPECT_LE(normalized_error(h_ref, got[1]), 1e-6);
    EXPECT_LE(normalized_error(y_ref, got[0]), 1e-6);
  }
}

TEST(FusedKernels, AddLayerNormMatchesAddThenLayerNorm) {
  ops::register_ops();
  for (DType t : {DType::f32, DType::bf16}) {
    for (const core::Shape& rs : {core::Shape{2, 64, 384}, core::Shape{64, 384}}) {  // same shape, broadcast
      SCOPED_TRACE(std::string(core::dtype_name(t)) + " r " + std::to_string(rs.rank()) + "-d");
      const core::Shape as{2, 64, 384};
      const Tensor a = Tensor::uniform(as, t, 4, -2.f, 2.f), r = Tensor::uniform(rs, t, 5, -1.f, 1.f);
      const Tensor w = Tensor::uniform({384}, t, 6, 0.5f, 1.5f), b = Tensor::uniform({384}, t, 7, -1.f, 1.f);
      const core::TensorMeta sm{as, t}, stat{{128}, DType::f32};
      const Tensor s_ref = run_one(OpKind::add, {a, r}, ops::NoParams{}, {sm})[0];
      const std::vector<Tensor> ln = run_one(OpKind::layernorm, {s_ref, w, b}, ops::LayerNormParams{}, {sm, stat, stat});
      const std::vector<Tensor> got =
          run_one(OpKind::add_layernorm, {a, r, w, b}, ops::LayerNormParams{}, {sm, sm, stat, stat});
      EXPECT_LE(normalized_error(s_ref, got[0]), 1e-6);
      for (size_t k = 0; k < 3; ++k) EXPECT_LE(normalized_error(ln[k], got[k + 1]), 1e-6) << "output " << k + 1;
    }
  }
}

// ---- the patterns --------------------------------------------------------------------------

TEST(FusionPatterns, FireOnEveryBlockOfAGptGraph) {
  Graph g;
  const testing_models::Built built = testing_models::build_gpt_block(g, {});
  core::RewriteResult r =
      core::rewrite(g, {ops::bias_gelu_fusion(), ops::residual_layernorm_fusion(), ops::classifier_fusion()});
  EXPECT_EQ(applied(r, "bias_gelu_fusion"), 1);
  // embeddings (a broadcast add) -> ln1, +attn -> ln2, +mlp -> lnf
  EXPECT_EQ(applied(r, "residual_layernorm_fusion"), 3);
  EXPECT_EQ(applied(r, "classifier_fusion"), 0);  // no loss_scale input in this graph
  EXPECT_EQ(count_ops(r.graph, OpKind::gelu), 0);
  EXPECT_EQ(count_ops(r.graph, OpKind::layernorm), 0);
  EXPECT_EQ(count_ops(r.graph, OpKind::linear_gelu), 1);
  EXPECT_EQ(count_ops(r.graph, OpKind::add_layernorm), 3);
  EXPECT_EQ(count_ops(r.graph, OpKind::add), 0);
  // The fused graph differentiates: one gelu_backward, three layernorm_backward.
  core::backward(r.graph, r.map[size_t(built.loss)]);
  EXPECT_EQ(count_ops(r.graph, OpKind::gelu_backward, false), 1);
  EXPECT_EQ(count_ops(r.graph, OpKind::layernorm_backward, false), 3);
}

TEST(FusionPatterns, LeaveNonMatchingGraphsAlone) {
  // linear -> gelu where the pre-activation has a second reader, or is a
  // graph output: no linear_gelu. add whose sum is read before its
  // LayerNorm: no add_layernorm (the fused op would be emitted too late).
  for (int variant = 0; variant < 3; ++variant) {
    Graph g;
    const ValueId x = g.input("x", {5, 8}, DType::f32, true);
    const ValueId h = ops::linear(g, x, g.param("w", {8, 8}), g.param("b", {8}));
    ValueId y = ops::gelu(g, h);
    if (variant == 0) y = ops::add(g, y, h);
    if (variant == 1) g.mark_output(h);
    ValueId s = ops::add(g, x, y);
    const ValueId early = variant == 2 ? ops::scale(g, s, 2.f) : core::kNoValue;  // a reader before the LayerNorm
    s = ops::layernorm(g, s, g.param("lw", {8}), g.param("lb", {8})).y;
    if (early != core::kNoValue) s = ops::add(g, early, s);
    g.mark_output(s);
    const core::RewriteResult r = core::rewrite(g, {ops::bias_gelu_fusion(), ops::residual_layernorm_fusion()});
    SCOPED_TRACE("variant " + std::to_string(variant));
    EXPECT_EQ(applied(r, "bias_gelu_fusion"), variant == 2 ? 1 : 0);
    EXPECT_EQ(applied(r, "residual_layernorm_fusion"), variant == 2 ? 0 : 1);
  }
}

// ---- in the model ---------------------------------------------------------------------------

TEST(FusionPatterns, GptGivesTheSameLossLogitsAndGradients) {
  const int64_t B = 2, T = 17;
  models::GptConfig base{61, 3, 24, 3, 40};
  std::vector<int32_t> x(size_t(B * T)), y(x.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = int32_t((i * 7 + 3) % 61), y[i] = int32_t((i * 11 + 5) % 61);

  models::Gpt plain(base, backend());
  plain.init_weights(9);
  const double lp = plain.train_micro_step(x.data(), y.data(), B, T, 2.0);
  const double ep = plain.eval_loss(x.data(), y.data(), B, T);
  const std::vector<float> logits_p(plain.logits(x.data(), B, T), plain.logits(x.data(), B, T) + B * T * 61);

  // bias+gelu alone, residual+layernorm alone, both, both with the fused classifier.
  for (int variant = 0; variant < 4; ++variant) {
    SCOPED_TRACE("variant " + std::to_string(variant));
    models::GptConfig cfg = base;
    cfg.fuse_bias_gelu = variant != 1;
    cfg.fuse_residual_layernorm = variant != 0 ? "on" : "off";
    cfg.fused_classifier = variant == 3;
    models::Gpt fused(cfg, backend());
    fused.init_weights(9);
    const double lf = fused.train_micro_step(x.data(), y.data(), B, T, 2.0);
    EXPECT_NEAR(lf, lp, 1e-5 * std::abs(lp));
    EXPECT_NEAR(fused.eval_loss(x.data(), y.data(), B, T), ep, 1e-5 * std::abs(ep));
    const float* lg = fused.logits(x.data(), B, T);
    double worst = 0.0;
    for (size_t i = 0; i < logits_p.size(); ++i) worst = std::max(worst, double(std::abs(lg[i] - logits_p[i])));
    EXPECT_LE(worst, 1e-5);

    // Every mode's graph is fused: n_layer linear_gelu, 2 n_layer + 1 add_layernorm.
    for (bool train : {true, false}) {
      const Graph& g = fused.program(train, B, T).graph;
      EXPECT_EQ(count_ops(g, OpKind::linear_gelu), cfg.fuse_bias_gelu ? 3 : 0);
      EXPECT_EQ(count_ops(g, OpKind::gelu), cfg.fuse_bias_gelu ? 0 : 3);
      EXPECT_EQ(count_ops(g, OpKind::add_layernorm), cfg.fuse_residual_layernorm == "on" ? 7 : 0);
      EXPECT_EQ(count_ops(g, OpKind::layernorm), cfg.fuse_residual_layernorm == "on" ? 0 : 7);
      EXPECT_EQ(count_ops(g, OpKind::classifier_train), train && cfg.fused_classifier ? 1 : 0);
    }

    int checked = 0;
    for (const auto& [name, e] : plain.params().entries()) {
      SCOPED_TRACE(name);
      EXPECT_LE(normalized_error(e.grad, fused.params().entries().at(name).grad), 1e-5);
      ++checked;
    }
    EXPECT_EQ(checked, int(plain.params().entries().size()));
    EXPECT_GT(checked, 20);
  }
}

// Mixed precision (bf16 compute): the residual adds take a bf16 branch and
// the LayerNorms write bf16, and add_layernorm's mixed form still fuses
// every one; selective recomputation redoes its LayerNorm with the same
// narrowed output.
TEST(FusionPatterns, MixedPrecisionGptFusesEveryResidualLayerNorm) {
  const int64_t B = 2, T = 17, L = 3;
  std::vector<int32_t> x(size_t(B * T)), y(x.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = int32_t((i * 5 + 1) % 61), y[i] = int32_t((i * 3 + 7) % 61);
  models::GptConfig base{61, L, 24, 3, 40};
  base.compute = DType::bf16;
  models::Gpt plain(base, backend());
  plain.init_weights(6);
  const double lp = plain.train_micro_step(x.data(), y.data(), B, T, 2.0);
  for (const std::string recompute : {"none", "selective"}) {
    SCOPED_TRACE("recompute " + recompute);
    models::GptConfig cfg = base;
    cfg.fuse_residual_layernorm = "on";
    cfg.recompute = recompute;
    models::Gpt fused(cfg, backend());
    fused.init_weights(6);
    const double lf = fused.train_micro_step(x.data(), y.data(), B, T, 2.0);
    EXPECT_NEAR(lf, lp, 1e-6 * std::abs(lp));
    for (bool train : {true, false}) {
      const Graph& g = fused.program(train, B, T).graph;
      EXPECT_EQ(count_ops(g, OpKind::add_layernorm), 2 * L + 1);
      EXPECT_EQ(count_ops(g, OpKind::layernorm), 0);
      for (const core::Node& n : g.nodes()) {
        if (n.op == OpKind::add_layernorm) {
          EXPECT_EQ(g.meta(n.outputs[1]).dtype, DType::bf16);
        }
      }
    }
    for (const auto& [name, e] : plain.params().entries()) {
      SCOPED_TRACE(name);
      EXPECT_LE(normalized_error(e.grad, fused.params().entries().at(name).grad), 1e-3);
    }
  }
}

// Every parameter gradient of two models equal element by element.
void expect_same_gradients(const models::Gpt& plain, const models::Gpt& fused) {
  int checked = 0;
  for (const auto& [name, e] : plain.params().entries()) {
    const Tensor& f = fused.params().entries().at(name).grad;
    ASSERT_EQ(f.numel(), e.grad.numel()) << name;
    int64_t differ = 0;
    for (int64_t i = 0; i < e.grad.numel(); ++i) differ += e.grad.item(i) != f.item(i);
    EXPECT_EQ(differ, 0) << name;
    ++checked;
  }
  EXPECT_GT(checked, 20);
}

// ---- the backward fusion: layernorm_backward + residual add (+ narrowing cast) ------------

// Layer-norm backwards that took in a residual gradient (6 inputs) and, of
// them, those that also write a narrowed dx (4 outputs).
std::pair<int, int> fused_layernorm_backwards(const Graph& g) {
  int with_dres = 0, narrowed = 0;
  for (const core::Node& n : g.nodes())
    if (n.op == OpKind::layernorm_backward && n.inputs.size() == 6) {
      ++with_dres;
      narrowed += n.outputs.size() == 4 ? 1 : 0;
    }
  return {with_dres, narrowed};
}

// The same function as the unfused graph, to the bit: the fused kernel adds
// the residual gradient to dx as stored and narrows the sum as a cast would.
TEST(FusionPatterns, LayerNormBackwardTakesTheResidualGradient) {
  const int64_t B = 2, T = 17, L = 3;
  std::vector<int32_t> x(size_t(B * T)), y(x.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = int32_t((i * 7 + 3) % 61), y[i] = int32_t((i * 11 + 5) % 61);
  for (DType compute : {DType::f32, DType::bf16})
    for (bool ln_fused : {false, true}) {
      SCOPED_TRACE(std::string(core::dtype_name(compute)) + (ln_fused ? ", add_layernorm" : ""));
      models::GptConfig cfg{61, L, 24, 3, 40};
      cfg.compute = compute;
      cfg.fuse_residual_layernorm = ln_fused ? "on" : "off";
      cfg.fuse_layernorm_backward = "off";
      models::Gpt plain(cfg, backend());
      cfg.fuse_layernorm_backward = "auto";  // on for the CPU
      models::Gpt fused(cfg, backend());
      plain.init_weights(4);
      fused.init_weights(4);
      const double lp = plain.train_micro_step(x.data(), y.data(), B, T, 2.0);
      const double lf = fused.train_micro_step(x.data(), y.data(), B, T, 2.0);
      EXPECT_EQ(lf, lp);

      // Every block's two LayerNorms take in the residual gradient (ln_f has
      // none); in bf16 each sum is also narrowed for the branch below it,
      // except block 0's ln_1, whose residual is the fp32 embedding sum.
      const Graph& gp = plain.program(true, B, T).graph;
      const Graph& gf = fused.program(true, B, T).graph;
      EXPECT_EQ(fused_layernorm_backwards(gp), std::make_pair(0, 0));
      EXPECT_EQ(fused_layernorm_backwards(gf), std::make_pair(int(2 * L), compute == DType::f32 ? 0 : int(2 * L - 1)));
      EXPECT_EQ(count_ops(gp, OpKind::add, false) - count_ops(gf, OpKind::add, false), 2 * L);
      EXPECT_EQ(count_ops(gp, OpKind::cast, false) - count_ops(gf, OpKind::cast, false),
                compute == DType::f32 ? 0 : 2 * L - 1);
      EXPECT_EQ(gf.nodes().size() - gf.backward_start(),
                gp.nodes().size() - gp.backward_start() - size_t(compute == DType::f32 ? 2 * L : 4 * L - 1));

      expect_same_gradients(plain, fused);
    }
}

// Where the pattern fires and what it takes in: (0) x feeds a LayerNorm and
// a residual add: fused; (1) x feeds only the LayerNorm, so its dx is x's
// whole gradient: nothing to fuse; (2) x is a mixed add of a bf16 branch:
// fused, and the cast narrowing x's gradient for the branch becomes the
// fused op's fourth output.
TEST(FusionPatterns, LayerNormBackwardFusionFiresOnResidualGradientsOnly) {
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE("variant " + std::to_string(variant));
    Graph g;
    ValueId x = g.input("x", {5, 8}, DType::f32, true);
    if (variant == 2) x = ops::add(g, x, ops::cast(g, g.param("branch", {5, 8}), DType::bf16));
    const auto ln = ops::layernorm(g, x, g.param("lw", {8}), g.param("lb", {8}));
    const ValueId out = variant == 1 ? ln.y : ops::add(g, x, ln.y);
    const ValueId loss = ops::sum(g, out);
    g.mark_output(loss);
    core::backward(g, loss);
    const int casts = count_ops(g, OpKind::cast, false);
    const core::RewriteResult r = core::rewrite(g, {ops::residual_layernorm_backward_fusion()});
    EXPECT_EQ(applied(r, "residual_layernorm_backward_fusion"), variant == 1 ? 0 : 1);
    EXPECT_EQ(fused_layernorm_backwards(r.graph), std::make_pair(variant == 1 ? 0 : 1, variant == 2 ? 1 : 0));
    EXPECT_EQ(count_ops(r.graph, OpKind::cast, false), casts - (variant == 2 ? 1 : 0));
    EXPECT_EQ(r.graph.backward_start(), g.backward_start());
    const ValueId gx = r.graph.grad_of(r.map[size_t(g.at("x"))]);
    ASSERT_NE(gx, core::kNoValue);
    const int producer = r.graph.value(gx).producer;
    EXPECT_EQ(r.graph.nodes()[size_t(producer)].op, OpKind::layernorm_backward)
        << "x's gradient comes straight out of the LayerNorm's backward";
  }
}

// ---- the backward fusion: matmul (+ reshape) + gelu_backward -----------------------------

// The same function as the unfused graph, to the bit (the CPU composes the
// same two kernels), with the MLP unfused or as linear_gelu, with and without
// selective recomputation (which redoes GELU, not its input), fp32 and bf16.
TEST(FusionPatterns, GeluBackwardRidesOnTheProduct) {
  const int64_t B = 2, T = 17, L = 3;
  std::vector<int32_t> x(size_t(B * T)), y(x.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = int32_t((i * 5 + 1) % 61), y[i] = int32_t((i * 13 + 2) % 61);
  for (DType compute : {DType::f32, DType::bf16})
    for (int form = 0; form < 3; ++form) {
      SCOPED_TRACE(std::string(core::dtype_name(compute)) + " form " + std::to_string(form));
      models::GptConfig cfg{61, L, 24, 3, 40};
      cfg.compute = compute;
      cfg.fuse_bias_gelu = form == 1;
      cfg.recompute = form == 2 ? "selective" : "none";
      cfg.fuse_gelu_backward = "off";
      models::Gpt plain(cfg, backend());
      cfg.fuse_gelu_backward = "auto";  // on for the CPU
      models::Gpt fused(cfg, backend());
      plain.init_weights(6);
      fused.init_weights(6);
      EXPECT_EQ(fused.train_micro_step(x.data(), y.data(), B, T, 2.0),
                plain.train_micro_step(x.data(), y.data(), B, T, 2.0));

      // One per block: the MLP's GELU backward and the product before it.
      const Graph& gp = plain.program(true, B, T).graph;
      const Graph& gf = fused.program(true, B, T).graph;
      EXPECT_EQ(count_ops(gp, OpKind::matmul_gelu_backward, false), 0);
      EXPECT_EQ(count_ops(gf, OpKind::matmul_gelu_backward, false), L);
      EXPECT_EQ(count_ops(gf, OpKind::gelu_backward, false), 0);
      EXPECT_EQ(count_ops(gp, OpKind::matmul, false) - count_ops(gf, OpKind::matmul, false), L);
      EXPECT_EQ(train::graph_matmul_flops(gf), train::graph_matmul_flops(gp)) << "brisk plan's GFLOP/step";

      expect_same_gradients(plain, fused);
    }
}

// Where the pattern fires: (0) a Linear reading gelu(h) of rank 3 (its
// input gradient is reshaped back): fused; (1) the same of rank 2 (no
// reshape): fused; (2) gelu(h) read by two Linears, so its gradient is a sum
// of two products: not fused; (3) a Linear reading h itself beside the GELU
// (h's gradient gets another piece; the GELU's still fuses).
TEST(FusionPatterns, GeluBackwardFusionFiresOnALinearsInputGradientOnly) {
  for (int variant = 0; variant < 4; ++variant) {
    SCOPED_TRACE("variant " + std::to_string(variant));
    Graph g;
    const core::Shape xs = variant == 1 ? core::Shape{6, 8} : core::Shape{2, 3, 8};
    const ValueId x = g.input("x", xs, DType::f32, true);
    const ValueId h = ops::linear(g, x, g.param("w1", {16, 8}), g.param("b1", {16}));
    const ValueId a = ops::gelu(g, h);
    ValueId out = ops::linear(g, a, g.param("w2", {8, 16}), g.param("b2", {8}));
    if (variant == 2) out = ops::add(g, out, ops::linear(g, a, g.param("w3", {8, 16})));
    if (variant == 3) out = ops::add(g, out, ops::linear(g, h, g.param("w3", {8, 16})));
    const ValueId loss = ops::sum(g, out);
    g.mark_output(loss);
    core::backward(g, loss);
    const core::RewriteResult r = core::rewrite(g, {ops::gelu_backward_fusion()});
    const int want = variant == 2 ? 0 : 1;
    EXPECT_EQ(applied(r, "gelu_backward_fusion"), want);
    EXPECT_EQ(count_ops(r.graph, OpKind::matmul_gelu_backward, false), want);
    EXPECT_EQ(count_ops(r.graph, OpKind::gelu_backward, false), 1 - want);
    EXPECT_EQ(r.graph.backward_start(), g.backward_start());
    // The fused graph computes the same gradients (fp32: the CPU composes
    // the same kernels, so to the bit).
    core::ParameterStore store;
    store.adopt(g);
    uint64_t seed = 11;  // weights wide enough to put h in GELU's curved region and tails
    for (auto& [name, e] : store.entries())
      e.value.copy_from(Tensor::randn(e.value.shape(), DType::f32, seed++, 0.f, 0.5f));
    std::vector<float> xt(size_t(xs.numel()));
    for (size_t i = 0; i < xt.size(); ++i) xt[i] = float(std::sin(0.7 * double(i)) * 2.0);
    std::vector<std::vector<float>> dx;
    for (const Graph* gr : std::initializer_list<const Graph*>{&g, &r.graph}) {
      core::Executor e(*gr, backend());
      e.bind(store);
      e.write(gr->at("x"), xt.data(), xt.size() * sizeof(float));
      e.run();
      dx.emplace_back(xt.size());
      const ValueId gx = gr == &g ? g.grad_of(g.at("x")) : r.graph.grad_of(r.map[size_t(g.at("x"))]);
      e.read(gx, dx.back().data(), xt.size() * sizeof(float));
    }
    EXPECT_EQ(dx[0], dx[1]);
  }
}

TEST(FusionPatterns, ConfigKeysRoundTrip) {
  const train::TrainConfig c = train::load_train_config("", {"model.fuse_bias_gelu=true"});
  EXPECT_TRUE(c.model.fuse_bias_gelu);
  const std::string toml = train::to_toml(c);
  EXPECT_NE(toml.find("fuse_bias_gelu = true"), std::string::npos) << toml;
  // The fusion modes: auto by default, in config.toml, on | off, and a clear
  // error for anything else.
  for (const auto& [key, member] :
       {std::pair{"fuse_residual_layernorm", &models::GptConfig::fuse_residual_layernorm},
        std::pair{"fuse_layernorm_backward", &models::GptConfig::fuse_layernorm_backward},
        std::pair{"fuse_gelu_backward", &models::GptConfig::fuse_gelu_backward},
        std::pair{"fuse_bias_backward", &models::GptConfig::fuse_bias_backward},
        std::pair{"fuse_weight_casts", &models::GptConfig::fuse_weight_casts}}) {
    SCOPED_TRACE(key);
    const std::string k = key;
    EXPECT_EQ(c.model.*member, "auto");
    EXPECT_NE(toml.find(k + " = \"auto\""), std::string::npos) << toml;
    const train::TrainConfig off = train::load_train_config("", {"model." + k + "=off"});
    EXPECT_EQ(off.model.*member, "off");
    EXPECT_NE(train::to_toml(off).find(k + " = \"off\""), std::string::npos);
    try {
      train::load_train_config("", {"model." + k + "=yes"});
      ADD_FAILURE() << "an unknown value was accepted";
    } catch (const core::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(k + ": unknown value 'yes' (allowed: auto, on, off)"), std::string::npos)
          << e.what();
    }
  }
  // fuse_residual_layernorm was a switch: true / false still mean on / off.
  EXPECT_EQ(train::load_train_config("", {"model.fuse_residual_layernorm=true"}).model.fuse_residual_layernorm, "on");
  EXPECT_EQ(train::load_train_config("", {"model.fuse_residual_layernorm=false"}).model.fuse_residual_layernorm,
            "off");
}

// "auto" per device: on the CPU the residual add + LayerNorm stays unfused
// (no gain there) and every backward fusion is on; on a GPU the forward
// fusion is on and the bias-gradient fusion off (slower there). An explicit
// on / off is kept either way.
TEST(FusionPatterns, AutoFusionModesResolvePerDevice) {
  const models::GptConfig a;
  const models::GptConfig cpu = a.with_fusions_for(false), gpu = a.with_fusions_for(true);
  EXPECT_EQ(cpu.fuse_residual_layernorm, "off");
  EXPECT_EQ(gpu.fuse_residual_layernorm, "on");
  for (const models::GptConfig* r : {&cpu, &gpu}) {
    EXPECT_EQ(r->fuse_layernorm_backward, "on");
    EXPECT_EQ(r->fuse_gelu_backward, "on");
    EXPECT_EQ(r->fuse_weight_casts, "on");
  }
  EXPECT_EQ(cpu.fuse_bias_backward, "on");
  EXPECT_EQ(gpu.fuse_bias_backward, "off");
  models::GptConfig e;
  e.fuse_residual_layernorm = "off";
  e.fuse_bias_backward = "on";
  e.fuse_gelu_backward = "off";
  const models::GptConfig eg = e.with_fusions_for(true);
  EXPECT_EQ(eg.fuse_residual_layernorm, "off");
  EXPECT_EQ(eg.fuse_bias_backward, "on");
  EXPECT_EQ(eg.fuse_gelu_backward, "off");
  // brisk plan / the tuner plan a GPU run with the GPU's fusions.
  train::TrainConfig t = train::load_train_config("", {"train.device=\"cuda\""});
  EXPECT_EQ(train::planned_model_config(t).fuse_residual_layernorm, "on");
  EXPECT_EQ(train::planned_model_config(t).fuse_bias_backward, "off");
  t.device = "cpu";
  EXPECT_EQ(train::planned_model_config(t).fuse_residual_layernorm, "off");
  // Full recomputation, the memory level: the fusion across block
  // boundaries would keep each next block's LayerNorm output, so auto is off.
  models::GptConfig full;
  full.recompute = "full";
  EXPECT_EQ(full.with_fusions_for(true).fuse_residual_layernorm, "off");
  full.fuse_residual_layernorm = "on";
  EXPECT_EQ(full.with_fusions_for(true).fuse_residual_layernorm, "on");
  t = train::load_train_config("", {"train.device=\"cuda\"", "train.recompute=\"full\"", "model.attention=\"flash\""});
  EXPECT_EQ(train::planned_model_config(t).fuse_residual_layernorm, "off");
  // brisk plan and tune plan each level as a run at that level resolves it.
  t.model.recompute = "none";
  EXPECT_EQ(train::planned_model_config(t).fuse_residual_layernorm, "on");
  EXPECT_EQ(train::planned_model_config(t, "selective").fuse_residual_layernorm, "on");
  EXPECT_EQ(train::planned_model_config(t, "full").fuse_residual_layernorm, "off");
  EXPECT_EQ(train::planned_model_config(t, "full").recompute, "full");
}

// ---- the backward fusion: weight-gradient matmul + bias column sums ----------------------

// The same function as the unfused graph, to the bit (the CPU composes the
// same two kernels): fp32 and bf16, with the other fusions off and on, and
// with selective recomputation.
TEST(FusionPatterns, BiasGradientRidesOnTheWeightProduct) {
  const int64_t B = 2, T = 17, L = 3;
  std::vector<int32_t> x(size_t(B * T)), y(x.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = int32_t((i * 3 + 4) % 61), y[i] = int32_t((i * 7 + 1) % 61);
  for (DType compute : {DType::f32, DType::bf16})
    for (int form = 0; form < 3; ++form) {
      SCOPED_TRACE(std::string(core::dtype_name(compute)) + " form " + std::to_string(form));
      models::GptConfig cfg{61, L, 24, 3, 40};
      cfg.compute = compute;
      const std::string others = form == 0 ? "off" : "on";
      cfg.fuse_bias_gelu = form != 0;
      cfg.fuse_residual_layernorm = cfg.fuse_layernorm_backward = cfg.fuse_gelu_backward = others;
      cfg.recompute = form == 2 ? "selective" : "none";
      cfg.fuse_bias_backward = "off";
      models::Gpt plain(cfg, backend());
      cfg.fuse_bias_backward = "auto";  // on for the CPU
      models::Gpt fused(cfg, backend());
      plain.init_weights(8);
      fused.init_weights(8);
      EXPECT_EQ(fused.train_micro_step(x.data(), y.data(), B, T, 2.0),
                plain.train_micro_step(x.data(), y.data(), B, T, 2.0));

      // Four Linears with a bias per block (QKV, attention projection, MLP
      // in and out), each with its weight and bias gradient in one op.
      const Graph& gp = plain.program(true, B, T).graph;
      const Graph& gf = fused.program(true, B, T).graph;
      EXPECT_EQ(count_ops(gp, OpKind::linear_param_grad, false), 0);
      EXPECT_EQ(count_ops(gf, OpKind::linear_param_grad, false), 4 * L);
      EXPECT_EQ(count_ops(gp, OpKind::matmul, false) - count_ops(gf, OpKind::matmul, false), 4 * L);
      EXPECT_EQ(count_ops(gp, OpKind::sum, false) - count_ops(gf, OpKind::sum, false), 4 * L);
      EXPECT_EQ(train::graph_matmul_flops(gf), train::graph_matmul_flops(gp)) << "brisk plan's GFLOP/step";

      expect_same_gradients(plain, fused);
    }
}

// ---- the forward's weight casts as one cast_many -------------------------------------------

// Forward casts whose input is a parameter.
int weight_casts(const Graph& g) {
  int n = 0;
  for (size_t i = 0; i < g.backward_start(); ++i) {
    const core::Node& node = g.nodes()[i];
    n += node.op == OpKind::cast && g.value(node.inputs[0]).role == core::ValueRole::param;
  }
  return n;
}

// Mixed precision: every weight and bias cast (4 Linears of a block, 2
// tensors each, and the tied head's copy of the embedding) becomes one node
// at the start, with the same losses and gradients to the bit and no higher
// a peak of live memory. Not where there is nothing to cast (f32) or where
// recomputation replays the casts (selective).
TEST(FusionPatterns, WeightCastsBecomeOneNode) {
  const int64_t B = 2, T = 17, L = 3;
  std::vector<int32_t> x(size_t(B * T)), y(x.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = int32_t((i * 5 + 2) % 61), y[i] = int32_t((i * 3 + 7) % 61);
  for (int form = 0; form < 3; ++form) {
    SCOPED_TRACE("form " + std::to_string(form));
    models::GptConfig cfg{61, L, 24, 3, 40};
    cfg.compute = form == 1 ? DType::f32 : DType::bf16;
    cfg.recompute = form == 2 ? "selective" : "none";
    cfg.fuse_weight_casts = "off";
    models::Gpt plain(cfg, backend());
    cfg.fuse_weight_casts = "auto";  // on
    models::Gpt fused(cfg, backend());
    plain.init_weights(5);
    fused.init_weights(5);
    EXPECT_EQ(fused.train_micro_step(x.data(), y.data(), B, T, 1.0),
              plain.train_micro_step(x.data(), y.data(), B, T, 1.0));
    expect_same_gradients(plain, fused);

    const models::GptProgram& pp = plain.program(true, B, T);
    const models::GptProgram& pf = fused.program(true, B, T);
    const int casts = weight_casts(pp.graph);
    EXPECT_EQ(casts, form == 1 ? 0 : 8 * L + 1);
    const bool merged = form == 0;
    EXPECT_EQ(weight_casts(pf.graph), merged ? 0 : casts);
    EXPECT_EQ(count_ops(pf.graph, OpKind::cast_many), merged ? 1 : 0);
    if (merged) {
      // At the start: before the first product reads a copy.
      const auto& nodes = pf.graph.nodes();
      const auto at = std::find_if(nodes.begin(), nodes.end(), [](const core::Node& n) { return n.op == OpKind::cast_many; });
      const auto first_product = std::find_if(nodes.begin(), nodes.end(), [](const core::Node& n) {
        return n.op == OpKind::linear || n.op == OpKind::linear_gelu;
      });
      EXPECT_LT(at, first_product);
      EXPECT_EQ(int(at->inputs.size()), casts);
      EXPECT_LE(pf.executor->plan().report.live_lower_bound, pp.executor->plan().report.live_lower_bound);
    }
  }
}

// Where the pattern fires: (0) a Linear with a bias: fused; (1) without one:
// nothing to fuse; (2) a bias shared by two Linears and (3) a weight shared
// by two: each parameter's gradient is still summed in place, piece by
// piece, so both Linears fuse; (4) one output feature: the bias gradient is
// not summed in place (sum's accumulator wants >= 2 columns): not fused.
TEST(FusionPatterns, BiasGradFusionFiresOnInPlaceParameterGradientsOnly) {
  for (int variant = 0; variant < 5; ++variant) {
    SCOPED_TRACE("variant " + std::to_string(variant));
    Graph g;
    const ValueId x = g.input("x", {2, 3, 8}, DType::f32, true);
    const int64_t n_out = variant == 4 ? 1 : 6;
    const ValueId w = g.param("w", {n_out, 8}), b = g.param("b", {n_out});
    ValueId out = ops::linear(g, x, w, variant == 1 ? core::kNoValue : b);
    if (variant == 2) out = ops::add(g, out, ops::linear(g, x, g.param("w2", {6, 8}), b));
    if (variant == 3) out = ops::add(g, out, ops::linear(g, x, w, g.param("b2", {6})));
    const ValueId loss = ops::sum(g, ops::mul(g, out, out));
    g.mark_output(loss);
    core::backward(g, loss);
    const core::RewriteResult r = core::rewrite(g, {ops::bias_grad_fusion()});
    const int want = variant == 0 ? 1 : variant == 2 || variant == 3 ? 2 : 0;
    EXPECT_EQ(applied(r, "bias_grad_fusion"), want);
    EXPECT_EQ(count_ops(r.graph, OpKind::linear_param_grad, false), want);
    EXPECT_EQ(r.graph.backward_start(), g.backward_start());
    // Same gradients for every parameter, to the bit.
    core::ParameterStore a, c;
    a.adopt(g);
    c.adopt(r.graph);
    uint64_t seed = 3;
    for (auto& [name, e] : a.entries()) {
      e.value.copy_from(Tensor::randn(e.value.shape(), DType::f32, seed, 0.f, 0.5f));
      c.entries().at(name).value.copy_from(Tensor::randn(e.value.shape(), DType::f32, seed++, 0.f, 0.5f));
    }
    std::vector<float> xt(48);
    for (size_t i = 0; i < xt.size(); ++i) xt[i] = float(std::cos(0.3 * double(i)));
    using Run = std::pair<const Graph*, core::ParameterStore*>;
    for (auto [gr, store] : {Run{&g, &a}, Run{&r.graph, &c}}) {
      core::Executor e(*gr, backend());
      e.bind(*store);
      e.write(gr->at("x"), xt.data(), xt.size() * sizeof(float));
      e.run();
    }
    for (const auto& [name, e] : a.entries()) {
      const Tensor& f = c.entries().at(name).grad;
      int64_t differ = 0;
      double mass = 0.0;
      for (int64_t i = 0; i < e.grad.numel(); ++i) {
        differ += e.grad.item(i) != f.item(i);
        mass += std::abs(e.grad.item(i));
      }
      EXPECT_EQ(differ, 0) << name;
      if (!(variant == 1 && name == "b")) {  // b is unused there
        EXPECT_GT(mass, 0.0) << name << ": a gradient that was never computed";
      }
    }
  }
}
