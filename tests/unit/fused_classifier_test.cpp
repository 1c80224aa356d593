// The fused classifier and the rewrite pass that puts it into graphs, on the
// CPU backend. (1) classifier_train against the unfused graph it replaces,
// linear + cross_entropy + backward seeded by an input: the same loss, dx, dw,
// with the kernel forced through many ragged chunks and with ignored targets.
// (2) The pass: fires on exactly the pattern, leaves anything else alone, and
// with no patterns replays a graph unchanged. (3) A tiny GPT trained one
// micro-step fused and unfused: the same loss and the same gradient of every
// parameter, and one classifier_train in the graph (the cheap backward path,
// no recompute). (4) What it is for: W1's planned arena shrinks by about the
// logits and their gradient (graphs planned, nothing run), and at micro-batch
// 1 holds two head-sized buffers, not three. (5) The eval program with the
// fused classifier: the head and loss in row chunks give the unchunked loss,
// ignored targets included, and W1's eval arena holds one chunk of logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>

#include "brisk/core/autograd.h"
#include "brisk/core/error.h"
#include "brisk/core/executor.h"
#include "brisk/core/passes.h"
#include "brisk/core/planner.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/cpu/cpu_features.h"
#include "brisk/models/gpt.h"
#include "brisk/ops/ops.h"
#include "brisk/train/config.h"
#include "test_util.h"

using namespace brisk;
using core::DType;
using core::Graph;
using core::OpKind;
using core::Tensor;
using core::ValueId;

namespace {

using testing_util::count_ops;


using testing_util::backend;

using testing_util::normalized_error;

Tensor targets_tensor(int64_t n, int64_t v, int ignore, uint64_t seed) {
  Tensor t = Tensor::empty({n}, DType::i32);
  uint64_t s = seed;
  for (int64_t i = 0; i < n; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    // About one in five positions is ignore_index when it is a valid class.
    t.data_as<int32_t>()[i] = (s >> 33) % 5 == 0 && ignore >= 0 ? ignore : int32_t((s >> 20) % uint64_t(v));
  }
  return t;
}

struct Grads {
  Tensor loss, dx, dw;
};

// linear + cross_entropy + backward(seed), or classifier_train, run by an executor.
Grads run_graph(bool fused, const Tensor& x, const Tensor& w, const Tensor& t, float seed, int ignore) {
  Graph g;
  const ValueId xv = g.input("x", x.shape(), DType::f32, true);
  const ValueId wv = g.input("w", w.shape(), DType::f32, true);
  const ValueId tv = g.input("targets", t.shape(), DType::i32);
  const ValueId sv = g.input("seed", {}, DType::f32);
  ValueId loss;
  std::vector<ValueId> outs;
  if (fused) {
    outs = ops::classifier_train(g, xv, wv, tv, sv, ignore);
    loss = outs[0];
  } else {
    loss = ops::cross_entropy(g, ops::linear(g, xv, wv), tv, ignore);
  }
  g.mark_output(loss);
  core::backward(g, loss, {.seed = sv});
  if (fused) {  // the cheap path: the gradients are the op's own outputs
    EXPECT_EQ(g.grad_of(xv), outs[1]);
    EXPECT_EQ(g.grad_of(wv), outs[2]);
  }
  core::Executor ex(g, backend());
  ex.write(xv, x.data(), x.bytes());
  ex.write(wv, w.data(), w.bytes());
  ex.write(tv, t.data(), t.bytes());
  ex.write(sv, &seed, 4);
  ex.run();
  Grads r{Tensor::empty({}, DType::f32), Tensor::empty(x.shape(), DType::f32), Tensor::empty(w.shape(), DType::f32)};
  ex.read(loss, r.loss.data(), 4);
  ex.read(g.grad_of(xv), r.dx.data(), r.dx.bytes());
  ex.read(g.grad_of(wv), r.dw.data(), r.dw.bytes());
  return r;
}

}  // namespace

TEST(FusedClassifier, MatchesUnfusedGraph) {
  struct Case {
    int64_t n, c, v;
    int ignore;
  };
  for (const Case k : {Case{37, 19, 101, -100}, Case{64, 32, 1001, 7}, Case{5, 3, 2, 1}}) {
    SCOPED_TRACE("N " + std::to_string(k.n) + " C " + std::to_string(k.c) + " V " + std::to_string(k.v));
    const Tensor x = Tensor::uniform({k.n, k.c}, DType::f32, 11, -1.f, 1.f);
    const Tensor w = Tensor::uniform({k.v, k.c}, DType::f32, 12, -1.f, 1.f);
    const Tensor t = targets_tensor(k.n, k.v, k.ignore, 13);
    const Grads ref = run_graph(false, x, w, t, 2.5f, k.ignore);
    const Grads got = run_graph(true, x, w, t, 2.5f, k.ignore);
    EXPECT_NEAR(got.loss.item(0), ref.loss.item(0), 1e-5 * std::abs(ref.loss.item(0)));
    EXPECT_LE(normalized_error(ref.dx, got.dx), 1e-5);
    EXPECT_LE(normalized_error(ref.dw, got.dw), 1e-5);
  }
}

// The kernel's chunk height comes from its workspace: 1 row, 5 rows (ragged),
// the OpDef's size, and none at all must all give the same result.
TEST(FusedClassifier, ChunkingDoesNotChangeTheResult) {
  ops::register_ops();  // run_op below needs the op table; no graph is built first
  const int64_t n = 23, c = 17, v = 300;
  const Tensor x = Tensor::uniform({n, c}, DType::f32, 21, -1.f, 1.f);
  const Tensor w = Tensor::uniform({v, c}, DType::f32, 22, -1.f, 1.f);
  const Tensor t = targets_tensor(n, v, 4, 23);
  Tensor seed = Tensor::empty({}, DType::f32);
  seed.data_as<float>()[0] = 0.75f;
  const core::OpDef& def = core::op_def(OpKind::classifier_train);
  const std::vector<core::TensorMeta> metas = {x.meta(), w.meta(), t.meta(), seed.meta()};
  const ops::CrossEntropyParams p{4};
  const size_t full = def.workspace_bytes(metas, p);
  std::vector<Grads> results;
  for (size_t ws : {size_t(v * 4 + n * 8), size_t(5 * v * 4 + n * 8), full, size_t(0)}) {
    Grads r{Tensor::empty({}, DType::f32), Tensor::empty({n, c}, DType::f32), Tensor::empty({v, c}, DType::f32)};
    std::vector<unsigned char> buf(ws);
    const std::vector<core::TensorView> in = {x.as_view(), w.as_view(), t.as_view(), seed.as_view()};
    const std::vector<core::TensorView> out = {r.loss.as_view(), r.dx.as_view(), r.dw.as_view()};
    core::run_op(backend(), OpKind::classifier_train, in, out, p, ws ? buf.data() : nullptr, ws);
    results.push_back(r);
  }
  for (size_t i = 1; i < results.size(); ++i) {
    EXPECT_NEAR(results[i].loss.item(0), results[0].loss.item(0), 1e-6);
    EXPECT_LE(normalized_error(results[0].dx, results[i].dx), 1e-6);
    EXPECT_LE(normalized_error(results[0].dw, results[i].dw), 1e-6);
  }
}

namespace {

using Views = std::vector<core::TensorView>;

// bf16 x -> the same numbers in f32.
Tensor widened(const Tensor& h) {
  Tensor f = Tensor::empty(h.shape(), DType::f32);
  for (int64_t i = 0; i < h.numel(); ++i) f.data_as<float>()[i] = core::bf16_to_f32(h.data_as<uint16_t>()[i]);
  return f;
}

}  // namespace

// The bf16 kernel on each path this CPU has (bf16-emulated everywhere,
// bf16-native where there are bf16 dot products), through ragged chunks and
// several of the emulated path's 512-row blocks of w, against the f32 kernel
// on the same numbers widened: the same loss (both have f32 logits of exact
// products), dx to bf16's rounding, and dw summed into a random f32 dw_into
// (the GPT's head) or into a bf16 one.
TEST(FusedClassifier, Bf16KernelMatchesF32AcrossChunksAndPaths) {
  ops::register_ops();
  const int64_t n = 23, c = 24, v = 1100;
  const Tensor xh = Tensor::uniform({n, c}, DType::bf16, 31, -1.f, 1.f);
  const Tensor wh = Tensor::uniform({v, c}, DType::bf16, 32, -1.f, 1.f);
  const Tensor dw0 = Tensor::uniform({v, c}, DType::f32, 33, -1.f, 1.f);
  const Tensor t = targets_tensor(n, v, 4, 34);
  Tensor seed = Tensor::empty({}, DType::f32);
  seed.data_as<float>()[0] = 0.75f;
  const ops::CrossEntropyParams p{4};
  const size_t tail = size_t(n) * 8;

  // The f32 kernel on the widened numbers, into a copy of dw0.
  const Tensor x = widened(xh), w = widened(wh);
  Grads ref{Tensor::empty({}, DType::f32), Tensor::empty({n, c}, DType::f32), dw0.clone()};
  core::run_op(backend(), OpKind::classifier_train, Views{x.as_view(), w.as_view(), t.as_view(), seed.as_view(), ref.dw.as_view()},
               Views{ref.loss.as_view(), ref.dx.as_view(), ref.dw.as_view()}, p, nullptr, 0);

  const bool native = cpu::cpu_features().bf16 == cpu::Bf16Path::native;
  std::vector<const char*> paths = {"emulated"};
  if (native) paths.push_back(nullptr);
  else std::printf("[ skip ] bf16-native classifier_train not run: %s\n", cpu::cpu_features().bf16_reason.c_str());
  for (const char* path : paths) {
    testing_util::ScopedBf16Path scope(path);
    // Emulated: dlogits stay f32, so dw is f32-exact; native rounds them to bf16.
    const double dw_tol = cpu::cpu_features().bf16 == cpu::Bf16Path::native ? 2e-2 : 1e-5;
    for (size_t ws : {size_t(v * 4) + tail, size_t(5 * v * 4) + tail, size_t(0)}) {
      SCOPED_TRACE(std::string(path ? path : "native") + ", workspace " + std::to_string(ws));
      std::vector<unsigned char> buf(ws);
      // dw into the f32 dw0
      Tensor loss = Tensor::empty({}, DType::f32), dx = Tensor::empty({n, c}, DType::bf16), dw = dw0.clone();
      core::run_op(backend(), OpKind::classifier_train, Views{xh.as_view(), wh.as_view(), t.as_view(), seed.as_view(), dw.as_view()},
                   Views{loss.as_view(), dx.as_view(), dw.as_view()}, p, ws ? buf.data() : nullptr, ws);
      EXPECT_NEAR(loss.item(0), ref.loss.item(0), 1e-5 * std::abs(ref.loss.item(0)));
      EXPECT_LE(normalized_error(ref.dx, widened(dx)), 1e-2);
      EXPECT_LE(normalized_error(ref.dw, dw), dw_tol);
      // dw of its own, bf16, summed over the chunks
      Tensor dwh = Tensor::empty({v, c}, DType::bf16);
      core::run_op(backend(), OpKind::classifier_train, Views{xh.as_view(), wh.as_view(), t.as_view(), seed.as_view()},
                   Views{loss.as_view(), dx.as_view(), dwh.as_view()}, p, ws ? buf.data() : nullptr, ws);
      Tensor grad_only = ref.dw.clone();
      for (int64_t i = 0; i < v * c; ++i) grad_only.data_as<float>()[i] -= dw0.data_as<float>()[i];
      EXPECT_LE(normalized_error(grad_only, widened(dwh)), 2e-2);
    }
  }
}

TEST(FusedClassifier, BadTargetThrows) {
  const Tensor x = Tensor::uniform({3, 4}, DType::f32, 1, -1.f, 1.f);
  const Tensor w = Tensor::uniform({5, 4}, DType::f32, 2, -1.f, 1.f);
  Tensor t = targets_tensor(3, 5, -100, 3);
  t.data_as<int32_t>()[1] = 5;
  EXPECT_THROW(run_graph(true, x, w, t, 1.f, -100), core::Error);
}

// ---- the pass ------------------------------------------------------------------------

namespace {

struct Head {
  Graph g;
  ValueId loss = core::kNoValue, logits = core::kNoValue;
};

// x -> linear(x, w[, b]) -> cross_entropy; an optional loss_scale input.
void build_head(Head& h, bool bias, bool seed_input, bool logits_output) {
  Graph& g = h.g;
  const ValueId x = g.input("x", {6, 4}, DType::f32, true);
  const ValueId w = g.param("w", {9, 4});
  const ValueId t = g.input("targets", {6}, DType::i32);
  h.logits = bias ? ops::linear(g, ops::gelu(g, x), w, g.param("b", {9})) : ops::linear(g, ops::gelu(g, x), w);
  if (logits_output) g.mark_output(h.logits);
  h.loss = ops::cross_entropy(g, h.logits, t);
  g.set_name(h.loss, "loss");
  g.mark_output(h.loss);
  if (seed_input) g.input("loss_scale", {}, DType::f32);  // created after the loss, as GPT does
}

}  // namespace

TEST(RewritePass, FusesLinearCrossEntropy) {
  Head h;
  build_head(h, false, true, false);
  core::RewriteResult r = core::rewrite(h.g, {ops::classifier_fusion("loss_scale")});
  EXPECT_EQ(r.rewrites(), 1);
  EXPECT_EQ(count_ops(r.graph, OpKind::classifier_train), 1);
  EXPECT_EQ(count_ops(r.graph, OpKind::linear), 0);
  EXPECT_EQ(count_ops(r.graph, OpKind::cross_entropy), 0);
  EXPECT_EQ(r.map[size_t(h.logits)], core::kNoValue);
  const ValueId loss = r.map[size_t(h.loss)];
  EXPECT_EQ(r.graph.find("loss"), loss);
  EXPECT_TRUE(r.graph.value(loss).is_output);
  EXPECT_EQ(r.graph.value(r.graph.at("w")).role, core::ValueRole::param);
  core::backward(r.graph, loss, {.seed = r.graph.at("loss_scale")});
  EXPECT_EQ(count_ops(r.graph, OpKind::classifier_train), 1);  // no recompute
  EXPECT_NE(r.graph.grad_of(r.graph.at("w")), core::kNoValue);
}

// A bf16 head (the GPU's: x and the tied weight narrowed, cross-entropy on
// bf16 logits) fuses into classifier_train in bf16. The weight is a cast of
// an f32 parameter, so its gradient is summed into the parameter's f32
// gradient in place (dw_into): no bf16 (V, C) gradient, no cast back, no
// accumulate.
TEST(RewritePass, FusesABf16Head) {
  Graph g;
  const ValueId x = g.input("x", {6, 4}, DType::f32, true);
  const ValueId w = g.param("w", {9, 4});
  const ValueId t = g.input("targets", {6}, DType::i32);
  const ValueId loss = ops::cross_entropy(g, ops::linear(g, ops::cast(g, x, DType::bf16), ops::cast(g, w, DType::bf16)), t);
  g.mark_output(loss);
  g.input("loss_scale", {}, DType::f32);
  core::RewriteResult r = core::rewrite(g, {ops::classifier_fusion("loss_scale")});
  EXPECT_EQ(r.rewrites(), 1);
  for (const core::Node& n : r.graph.nodes())
    if (n.op == OpKind::classifier_train) {
      EXPECT_EQ(r.graph.meta(n.inputs[0]).dtype, DType::bf16);
      ASSERT_EQ(n.inputs.size(), 5u);
      EXPECT_EQ(r.graph.value(n.inputs[4]).name, "grad:w");
      EXPECT_EQ(r.graph.meta(n.outputs[2]).dtype, DType::f32);
    }
  core::backward(r.graph, r.map[size_t(loss)], {.seed = r.graph.at("loss_scale")});
  EXPECT_EQ(r.graph.grad_of(r.graph.at("w")), r.graph.at("grad:w"));
  EXPECT_EQ(count_ops(r.graph, OpKind::accumulate), 0);
  for (size_t i = r.graph.backward_start(); i < r.graph.nodes().size(); ++i) {
    const core::Node& n = r.graph.nodes()[i];
    EXPECT_FALSE(n.op == OpKind::cast && r.graph.shape(n.outputs[0]) == core::Shape({9, 4}))
        << "the weight gradient is not widened after the fact";
  }
}

TEST(RewritePass, LeavesOtherGraphsAlone) {
  for (int variant = 0; variant < 3; ++variant) {
    Head h;
    build_head(h, variant == 0, variant != 1, variant == 2);  // bias / no seed input / logits read elsewhere
    const core::RewriteResult r = core::rewrite(h.g, {ops::classifier_fusion("loss_scale")});
    EXPECT_EQ(r.rewrites(), 0) << "variant " << variant;
    EXPECT_EQ(r.graph.nodes().size(), h.g.nodes().size());
    EXPECT_EQ(count_ops(r.graph, OpKind::classifier_train), 0);
  }
}

TEST(RewritePass, NoPatternsReplaysTheGraph) {
  Head h;
  build_head(h, true, true, false);
  const core::RewriteResult r = core::rewrite(h.g, {});
  ASSERT_EQ(r.graph.nodes().size(), h.g.nodes().size());
  ASSERT_EQ(r.graph.num_values(), h.g.num_values());
  for (size_t i = 0; i < h.g.nodes().size(); ++i) EXPECT_EQ(r.graph.nodes()[i].op, h.g.nodes()[i].op);
  for (size_t v = 0; v < h.g.num_values(); ++v) {
    const core::Value &a = h.g.value(ValueId(v)), &b = r.graph.value(r.map[v]);
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(a.role, b.role);
    EXPECT_TRUE(a.meta == b.meta);
    EXPECT_EQ(a.is_output, b.is_output);
    EXPECT_EQ(a.requires_grad, b.requires_grad);
  }
}

// Backward fusions rewrite the finished graph: the replay keeps where the
// backward starts and which value is each parameter's gradient.
TEST(RewritePass, ReplaysABackwardPass) {
  Head h;
  build_head(h, true, true, false);
  core::backward(h.g, h.loss);
  const core::RewriteResult r = core::rewrite(h.g, {});
  ASSERT_EQ(r.graph.nodes().size(), h.g.nodes().size());
  EXPECT_EQ(r.graph.backward_start(), h.g.backward_start());
  ASSERT_LT(h.g.backward_start(), h.g.nodes().size());
  for (size_t i = 0; i < h.g.nodes().size(); ++i) {
    EXPECT_EQ(r.graph.nodes()[i].op, h.g.nodes()[i].op);
    EXPECT_EQ(r.graph.nodes()[i].is_backward, h.g.nodes()[i].is_backward) << "node " << i;
  }
  int grads = 0;
  for (ValueId p : h.g.params()) {
    ASSERT_NE(h.g.grad_of(p), core::kNoValue);
    EXPECT_EQ(r.graph.grad_of(r.map[size_t(p)]), r.map[size_t(h.g.grad_of(p))]);
    ++grads;
  }
  EXPECT_GT(grads, 0);
}

TEST(RewritePass, PatternThatDropsAUsedValueIsAnError) {
  Head h;
  build_head(h, false, true, false);
  core::Pattern drop;  // removes the gelu and replaces nothing
  drop.name = "drop";
  drop.match = [](const Graph& g, int i, const core::GraphUses&) -> std::optional<core::Match> {
    if (g.nodes()[size_t(i)].op != OpKind::gelu) return std::nullopt;
    return core::Match{{i}, [](Graph&, std::vector<ValueId>&) {}};
  };
  EXPECT_THROW(core::rewrite(h.g, {drop}), core::Error);
}

// Match::emit_at: a match emitted at its first node instead of its last.
// x -> a = gelu(x) [0] -> s = scale(a) [1] -> e = add(a, x) [2]: the match
// {0, 2} emitted at 0 puts the new gelu and add before the replayed scale,
// which reads the new a. Emitting at a node outside the match, or before an
// outside value the match reads is made, is an error that names the pattern.
TEST(RewritePass, EmitAtPlacesTheReplacementAtAnEarlierMatchedNode) {
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE("variant " + std::to_string(variant));
    Graph g;
    const ValueId x = g.input("x", {4}, DType::f32);
    const ValueId a = ops::gelu(g, x);
    const ValueId s = ops::scale(g, a, 2.f);
    // variant 2: the add reads the scale's output, made after the emit point.
    const ValueId e = ops::add(g, variant == 2 ? s : a, x);
    g.mark_output(s);
    g.mark_output(e);
    core::Pattern p;
    p.name = "early";
    p.match = [variant](const Graph& gr, int i, const core::GraphUses&) -> std::optional<core::Match> {
      if (gr.nodes()[size_t(i)].op != OpKind::gelu) return std::nullopt;
      core::Match m;
      m.nodes = {i, i + 2};
      m.emit_at = variant == 1 ? i + 1 : i;
      m.emit = [nodes = std::vector<core::Node>{gr.nodes()[size_t(i)], gr.nodes()[size_t(i + 2)]}](
                   Graph& dst, std::vector<ValueId>& map) {
        for (const core::Node& n : nodes) {  // the same two nodes, emitted together
          std::vector<ValueId> in;
          for (ValueId v : n.inputs) in.push_back(map[size_t(v)]);
          map[size_t(n.outputs[0])] = dst.add_node1(n.op, std::move(in), n.params);
        }
      };
      return m;
    };
    if (variant > 0) {
      try {
        core::rewrite(g, {p});
        ADD_FAILURE() << "no error";
      } catch (const core::Error& err) {
        EXPECT_NE(std::string(err.what()).find("pattern early"), std::string::npos) << err.what();
      }
      continue;
    }
    const core::RewriteResult r = core::rewrite(g, {p});
    ASSERT_EQ(r.graph.nodes().size(), 3u);
    EXPECT_EQ(r.graph.nodes()[0].op, OpKind::gelu);
    EXPECT_EQ(r.graph.nodes()[1].op, OpKind::add);
    EXPECT_EQ(r.graph.nodes()[2].op, OpKind::scale);
    EXPECT_EQ(r.graph.nodes()[2].inputs[0], r.map[size_t(a)]);
    EXPECT_EQ(r.graph.value(r.map[size_t(e)]).producer, 1);
  }
}

// ---- in the model ---------------------------------------------------------------------

namespace {

// The small GPT of the model tests below, with the plain head (on the CPU
// backend) and the fused one (on `fused_on`) from the same weights, and one
// batch of B x T tokens.
constexpr int64_t kHeadB = 2, kHeadT = 17;
struct HeadPair {
  std::unique_ptr<models::Gpt> plain, fused;
  std::vector<int32_t> x, y;
};
HeadPair head_pair(models::GptConfig cfg, core::Backend& fused_on) {
  HeadPair h;
  h.x.resize(size_t(kHeadB * kHeadT));
  h.y.resize(h.x.size());
  for (size_t i = 0; i < h.x.size(); ++i) h.x[i] = int32_t((i * 7 + 3) % 61), h.y[i] = int32_t((i * 11 + 5) % 61);
  cfg.fused_classifier = false;
  h.plain = std::make_unique<models::Gpt>(cfg, backend());
  h.plain->init_weights(5);
  cfg.fused_classifier = true;
  h.fused = std::make_unique<models::Gpt>(cfg, fused_on);
  h.fused->init_weights(5);
  return h;
}

}  // namespace

TEST(FusedClassifier, GptGradientsMatchUnfused) {
  const int64_t B = kHeadB, T = kHeadT;
  HeadPair h = head_pair(models::GptConfig{61, 2, 24, 3, 40}, backend());
  models::Gpt &plain = *h.plain, &fused = *h.fused;
  const std::vector<int32_t>&x = h.x, &y = h.y;

  // Two micro-steps on different batches, gradients not zeroed between them:
  // the fused head sums its weight gradient into the accumulated one in
  // place, so the second step must add to the first, not overwrite it.
  std::vector<int32_t> x2(x.size()), y2(x.size());
  for (size_t i = 0; i < x.size(); ++i) x2[i] = int32_t((i * 13 + 1) % 61), y2[i] = int32_t((i * 5 + 2) % 61);
  const double lp = plain.train_micro_step(x.data(), y.data(), B, T, 3.0);
  const double lf = fused.train_micro_step(x.data(), y.data(), B, T, 3.0);
  EXPECT_NEAR(lf, lp, 1e-5 * std::abs(lp));
  const double lp2 = plain.train_micro_step(x2.data(), y2.data(), B, T, 3.0);
  const double lf2 = fused.train_micro_step(x2.data(), y2.data(), B, T, 3.0);
  EXPECT_NEAR(lf2, lp2, 1e-5 * std::abs(lp2));
  const core::Graph& fg = fused.program(true, B, T).graph;
  EXPECT_EQ(count_ops(fg, OpKind::classifier_train), 1);
  for (const core::Node& n : fg.nodes())
    if (n.op == OpKind::classifier_train) {  // dw goes straight into the tied weight's gradient
      ASSERT_EQ(n.inputs.size(), 5u);
      EXPECT_EQ(fg.value(n.inputs[4]).name, core::grad_name(fg.value(n.inputs[1]).name));
      EXPECT_EQ(fg.value(n.inputs[4]).role, core::ValueRole::grad);
    }
  EXPECT_EQ(count_ops(plain.program(true, B, T).graph, OpKind::classifier_train), 0);
  EXPECT_EQ(fused.program(true, B, T).logits, core::kNoValue);
  // Eval is forward only (no classifier_train; at this size one chunk, the
  // plain head) and agrees.
  EXPECT_EQ(count_ops(fused.program(false, B, T).graph, OpKind::classifier_train), 0);
  EXPECT_TRUE(fused.program(false, B, T).chunk_rows.empty());
  EXPECT_NEAR(fused.eval_loss(x.data(), y.data(), B, T), plain.eval_loss(x.data(), y.data(), B, T), 1e-6);

  int checked = 0;
  for (const auto& [name, e] : plain.params().entries()) {
    SCOPED_TRACE(name);
    const auto& other = fused.params().entries().at(name);
    EXPECT_LE(normalized_error(e.grad, other.grad), 1e-5);
    ++checked;
  }
  EXPECT_EQ(checked, int(plain.params().entries().size()));
  EXPECT_GT(checked, 10);
}

// In bf16 on a backend with a bf16 classifier_train (the CPU's, on the path
// this machine takes; the GPU's), the GPT's head is fused in bf16 and trains
// like the unfused bf16 head: same loss up to the rounding of the logits to
// bf16 (which only the unfused head does), gradients pointing the same way.
TEST(FusedClassifier, Bf16HeadFusesWhereTheBackendHasTheKernel) {
  ops::register_ops();
  ASSERT_TRUE(backend().supports(OpKind::classifier_train, DType::bf16));
  models::GptConfig cfg{61, 2, 24, 3, 40};
  cfg.compute = DType::bf16;
  const int64_t B = kHeadB, T = kHeadT;
  HeadPair h = head_pair(cfg, backend());
  models::Gpt &plain = *h.plain, &fused = *h.fused;
  const std::vector<int32_t>&x = h.x, &y = h.y;
  const core::Graph& fg = fused.program(true, B, T).graph;
  ASSERT_EQ(count_ops(fg, OpKind::classifier_train), 1);
  for (const core::Node& n : fg.nodes()) {
    if (n.op == OpKind::classifier_train) {
      EXPECT_EQ(fg.meta(n.inputs[0]).dtype, DType::bf16);
      ASSERT_EQ(n.inputs.size(), 5u) << "wte's gradient is summed into its f32 accumulator";
      EXPECT_EQ(fg.value(n.inputs[4]).name, "grad:wte.weight");
    }
  }

  const double lp = plain.train_micro_step(x.data(), y.data(), B, T);
  const double lf = fused.train_micro_step(x.data(), y.data(), B, T);
  EXPECT_NEAR(lf, lp, 2e-3 * std::abs(lp));
  int checked = 0;
  double worst = 0;
  for (const auto& [name, e] : plain.params().entries()) {
    SCOPED_TRACE(name);
    const double err = normalized_error(e.grad, fused.params().entries().at(name).grad);
    EXPECT_LE(err, 5e-2);
    worst = std::max(worst, err);
    ++checked;
  }
  EXPECT_GT(checked, 10);
  std::printf("[ info ] bf16 fused head: loss %.6f vs unfused %.6f, worst gradient error %.2e\n", lf, lp, worst);
}

// The planned arena of W1's train or eval graph (planned, not run: program()
// would allocate it), with or without the fused classifier.
size_t w1_arena(bool fused, int64_t B, int64_t T, bool train) {
  models::GptConfig cfg = models::GptConfig::preset("W1");
  cfg.fused_classifier = fused;
  models::Gpt m(cfg, backend());
  return core::plan_memory(train ? m.train_graph(B, T) : m.eval_graph(B, T)).report.arena;
}

TEST(FusedClassifier, W1ArenaDropsByTheLogits) {
  const models::GptConfig w1 = models::GptConfig::preset("W1");
  const int64_t B = 8, T = 256;
  const size_t arena[2] = {w1_arena(false, B, T, true), w1_arena(true, B, T, true)};
  const double logits = double(B * T) * double(w1.vocab_size) * 4.0;
  std::printf("W1 train arena: unfused %.1f MiB, fused %.1f MiB (logits + dlogits %.1f MiB)\n",
              double(arena[0]) / (1 << 20), double(arena[1]) / (1 << 20), 2 * logits / (1 << 20));
  EXPECT_LE(double(arena[1]) + 1.6 * logits, double(arena[0]));
}

// model.classifier_chunk_mb: the chunk of f32 logits in MiB, in config.toml
// and in the plan. At W1 (2048 rows, V 50304) 128 MiB makes 4 chunks of 512
// rows where the default 64 MiB makes 7 of 293: the arena grows by the
// difference of the two chunks' logits. A negative size is refused.
TEST(FusedClassifier, ChunkSizeKeyReachesTheConfigAndThePlan) {
  const train::TrainConfig c = train::load_train_config("", {"model.classifier_chunk_mb=128"});
  EXPECT_EQ(c.model.classifier_chunk_floats, int64_t(128) << 18);
  EXPECT_NE(train::to_toml(c).find("classifier_chunk_mb = 128"), std::string::npos);
  EXPECT_EQ(train::load_train_config("", {}).model.classifier_chunk_floats, 0);

  models::GptConfig cfg = models::GptConfig::preset("W1");
  cfg.fused_classifier = true;
  const size_t base = w1_arena(true, 8, 256, true);
  cfg.classifier_chunk_floats = c.model.classifier_chunk_floats;
  models::Gpt m(cfg, backend());
  const size_t big = core::plan_memory(m.train_graph(8, 256)).report.arena;
  const double want = double(512 - 293) * double(cfg.vocab_size) * 4.0;
  EXPECT_NEAR(double(big) - double(base), want, 0.05 * want);

  EXPECT_THROW(train::load_train_config("", {"model.classifier_chunk_mb=-1"}), core::ConfigError);
}

// The tied embedding/head gradient: the head's (V, C) piece goes into the
// grad as soon as it exists, so at micro-batch 1 the unfused train arena
// holds two (V, C)-sized buffers at most (the logits and their gradient),
// not the three of an add of the pieces (147.6 MiB before, at every
// setting). The fused op sums its dw into the gradient in place, so its
// arena holds one: the logits chunk.
TEST(FusedClassifier, W1MicroBatchOneArenaHoldsTwoHeadSizedBuffers) {
  const models::GptConfig w1 = models::GptConfig::preset("W1");
  const double head = double(w1.vocab_size) * double(w1.n_embd) * 4.0;
  for (const bool fused : {false, true}) {
    models::GptConfig cfg = w1;
    cfg.fused_classifier = fused;
    models::Gpt m(cfg, backend());
    const double arena = double(core::plan_memory(m.train_graph(1, 256)).report.arena);
    std::printf("W1 train arena at micro-batch 1, fused %d: %.1f MiB ((V, C) = %.1f MiB)\n", int(fused),
                arena / (1 << 20), head / (1 << 20));
    EXPECT_LT(arena, (fused ? 1.5 : 2.5) * head) << "fused " << fused;
  }
}

// ---- evaluation with the fused classifier -----------------------------------------------

namespace {
void lcg_ids(std::vector<int32_t>& out, int64_t v, uint64_t seed) {
  uint64_t s = seed;
  for (int32_t& t : out) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    t = int32_t((s >> 20) % uint64_t(v));
  }
}
}  // namespace

// A vocabulary large enough that 150 rows split into 3 chunks of 50: the
// chunked eval loss is the unchunked one, with and without ignored targets
// (one chunk wholly ignored weighs nothing), on random weights.
TEST(FusedClassifier, ChunkedEvalLossMatchesUnchunked) {
  models::GptConfig cfg{65536, 1, 16, 2, 64};
  const int64_t B = 3, T = 50, N = B * T;
  ASSERT_EQ(models::Gpt::eval_chunk_rows(N, cfg.vocab_size), 50);
  std::vector<int32_t> x(static_cast<size_t>(N)), y(x.size());
  lcg_ids(x, cfg.vocab_size, 1);
  lcg_ids(y, cfg.vocab_size, 2);

  cfg.fused_classifier = false;
  models::Gpt plain(cfg, backend());
  plain.init_weights(11);
  cfg.fused_classifier = true;
  models::Gpt fused(cfg, backend());
  fused.init_weights(11);

  const models::GptProgram& p = fused.program(false, B, T);
  EXPECT_EQ(p.chunk_rows, (std::vector<int64_t>{50, 50, 50}));
  EXPECT_EQ(p.logits, core::kNoValue);
  EXPECT_EQ(count_ops(p.graph, OpKind::classifier_train), 0);
  EXPECT_EQ(count_ops(p.graph, OpKind::cross_entropy), 3);
  EXPECT_TRUE(plain.program(false, B, T).chunk_rows.empty());

  const double lp = plain.eval_loss(x.data(), y.data(), B, T);
  const double lf = fused.eval_loss(x.data(), y.data(), B, T);
  EXPECT_NEAR(lf, lp, 1e-5 * std::abs(lp));
  EXPECT_NEAR(lp, std::log(double(cfg.vocab_size)), 0.5) << "small random weights: about uniform";

  const int32_t ignore = ops::CrossEntropyParams{}.ignore_index;
  for (int64_t i = 0; i < N; ++i)
    if (i % 7 == 3 || (i >= 50 && i < 100)) y[size_t(i)] = ignore;
  const double lp2 = plain.eval_loss(x.data(), y.data(), B, T);
  const double lf2 = fused.eval_loss(x.data(), y.data(), B, T);
  EXPECT_NE(lp2, lp);
  EXPECT_NEAR(lf2, lp2, 1e-5 * std::abs(lp2));

  std::fill(y.begin(), y.end(), ignore);
  EXPECT_EQ(plain.eval_loss(x.data(), y.data(), B, T), 0.0);
  EXPECT_EQ(fused.eval_loss(x.data(), y.data(), B, T), 0.0);
}

// What the chunks are for: W1's eval program (planned, not run) holds one
// chunk of logits instead of the (B*T, V) matrix.
TEST(FusedClassifier, W1EvalArenaIsAFractionOfTheLogits) {
  const models::GptConfig w1 = models::GptConfig::preset("W1");
  const int64_t T = 256;
  for (const int64_t B : {1, 8}) {
    const size_t arena[2] = {w1_arena(false, B, T, false), w1_arena(true, B, T, false)};
    const double logits = double(B * T) * double(w1.vocab_size) * 4.0;
    std::printf("W1 eval arena, batch %lld: unfused %.1f MiB, fused %.1f MiB (logits %.1f MiB)\n", (long long)B,
                double(arena[0]) / (1 << 20), double(arena[1]) / (1 << 20), logits / (1 << 20));
    EXPECT_GE(double(arena[0]), logits);
    EXPECT_LT(double(arena[1]), (B == 1 ? 0.5 : 0.1) * logits) << "batch " << B;
    EXPECT_LT(arena[1], size_t(20) << 20) << "one chunk of at most 16 MiB of logits, plus the forward";
  }
}
