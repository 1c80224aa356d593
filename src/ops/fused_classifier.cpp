// The fused classifier of a language model's training step, llm.c style:
// classifier_train(x (N, C), w (V, C), targets (N) i32, seed () f32
// [, dw_into (V, C)]) -> loss () f32, dx (N, C), dw (V, C). It is
// linear(x, w) + cross_entropy and
// that pair's backward in one op, done in chunks of rows: logits_c = x_c w^T
// lives in a (chunk, V) workspace, becomes dlogits_c = seed * (softmax -
// onehot) / count in place, and is spent on dx_c = dlogits_c w and dw +=
// dlogits_c^T x_c. So the (N, V) logits and their gradient (412 MB each at
// W1's shape) never exist, and the gradient is produced in the forward pass
// with nothing recomputed. loss is the mean over non-ignored targets, as
// cross_entropy's; dx and dw are d(seed * loss)/dx, dw.
//
// With the optional fifth input, dw is dw_into + d(seed * loss)/dw written
// over dw_into's memory. The fusion pass passes w's accumulated gradient
// ("grad:<w>", the external autograd would accumulate into), so the (V, C)
// weight gradient is summed into it in place instead of being a buffer of
// its own (49 MiB at W1) followed by an accumulate; core::backward takes
// that output as the gradient's accumulated value (see autograd.cpp).
//
// Autograd: the backward rule hands back the node's own dx and dw when the
// gradient arriving at `loss` is exactly the seed input, i.e. the loss is the
// graph's final loss and backward() was seeded with that input: the cheap,
// intended case (with dw_into, only when it is w's accumulated gradient). Any other upstream gradient g (the op harness builds
// L = sum(loss * R)) gets a second classifier_train with g as its seed: a
// recompute, slow but exact, so the rule is right for every graph and the
// harness's finite-difference check is a real check of dx and dw. The GPT
// test asserts a training graph holds one classifier_train, never two.
// Gradients flowing into dx/dw themselves (double backward) are refused.
//
// The pass that puts this op into graphs is classifier_fusion() below: it
// turns linear(x, w) (no bias) -> cross_entropy into classifier_train fed the
// graph's seed input.
#include <cmath>
#include <optional>

#include "brisk/core/autograd.h"
#include "brisk/core/passes.h"
#include "op_util.h"

namespace brisk::ops {
using namespace detail;

namespace {

constexpr std::string_view kOp = "classifier_train";

std::vector<TensorMeta> infer_classifier(std::span<const TensorMeta> in, const core::OpParams& p) {
  // The fused kernels have no label smoothing (the fusion pattern leaves a smoothed loss alone).
  if (std::get<CrossEntropyParams>(p).label_smoothing != 0.f)
    throw core::Error("classifier_train: label_smoothing is not supported by the fused classifier");
  check_shape(in.size() == 4 || in.size() == 5, kOp, "takes x, w, targets, seed and optionally dw_into", in);
  check_float(kOp, in, {0, 1});
  check_dtype(kOp, in[2], DType::i32, "targets");
  check_dtype(kOp, in[3], DType::f32, "seed");
  check_shape(in[0].shape.rank() == 2 && in[1].shape.rank() == 2, kOp, "x must be (N, C) and w (V, C)", in);
  check_shape(in[0].shape[1] == in[1].shape[1], kOp, "x (N, C) and w (V, C) must agree on C", in);
  check_shape(in[0].dtype == in[1].dtype, kOp, "x and w must have the same dtype", in);
  check_shape(in[2].shape == Shape{in[0].shape[0]}, kOp, "targets must be (N) for x (N, C)", in);
  check_shape(in[3].shape.numel() == 1, kOp, "seed must be a scalar", in);
  // dw_into: w's shape, in w's dtype or f32 (a bf16 head's weight gradient
  // summed into the f32 gradient of the parameter it was cast from).
  check_shape(in.size() == 4 || (in[4].shape == in[1].shape && (in[4].dtype == in[1].dtype || in[4].dtype == DType::f32)),
              kOp, "dw_into must have w's shape, and w's dtype or f32", in);
  return {TensorMeta{Shape{}, DType::f32}, in[0], in.size() == 5 ? in[4] : in[1]};
}

// Scratch: one (rows, V) f32 chunk of logits plus a per-row loss in double
// (summed serially afterwards, so the loss does not depend on threading).
// The CPU kernel takes its chunk height from the size it is given.
size_t classifier_workspace(std::span<const TensorMeta> in, const core::OpParams& p) {
  const int64_t n = in[0].shape[0], v = in[1].shape[0];
  const int64_t chunk = classifier_chunk_rows(n, v, std::get<CrossEntropyParams>(p).chunk_floats);
  return size_t(chunk * v) * sizeof(float) + size_t(n) * sizeof(double);
}

void classifier_reference(const KernelCall& c) {
  const TensorView &x = c.in(0), &w = c.in(1), &t = c.in(2);
  const int ignore = c.p<CrossEntropyParams>().ignore_index;
  const int64_t n = x.shape()[0], k = x.shape()[1], v = w.shape()[0];
  int64_t count = 0;
  for (int64_t r = 0; r < n; ++r) {
    const int64_t tr = int64_t(ld(t, r));
    if (tr != ignore && (tr < 0 || tr >= v))
      throw core::Error("classifier_train: target " + std::to_string(tr) + " at position " + std::to_string(r) +
                        " is out of range [0, " + std::to_string(v) + ") and is not ignore_index (" +
                        std::to_string(ignore) + ")");
    count += tr != ignore;
  }
  const double scale = count ? ld(c.in(3), 0) / double(count) : 0.0;
  std::vector<double> dx(size_t(n * k), 0.0), dw(size_t(v * k), 0.0);
  std::vector<double> logit(static_cast<size_t>(v));
  double total = 0.0;
  for (int64_t r = 0; r < n; ++r) {
    const int64_t tr = int64_t(ld(t, r));
    if (tr == ignore) continue;
    double mx = -INFINITY, s = 0.0;
    for (int64_t j = 0; j < v; ++j) {
      double acc = 0.0;
      for (int64_t i = 0; i < k; ++i) acc += ld(x, r * k + i) * ld(w, j * k + i);
      logit[size_t(j)] = acc;
      mx = std::max(mx, acc);
    }
    for (int64_t j = 0; j < v; ++j) s += std::exp(logit[size_t(j)] - mx);
    const double lse = mx + std::log(s);
    total += lse - logit[size_t(tr)];
    for (int64_t j = 0; j < v; ++j) {
      const double d = scale * (std::exp(logit[size_t(j)] - lse) - (j == tr ? 1.0 : 0.0));
      for (int64_t i = 0; i < k; ++i) {
        dx[size_t(r * k + i)] += d * ld(w, j * k + i);
        dw[size_t(j * k + i)] += d * ld(x, r * k + i);
      }
    }
  }
  st(c.out(0), 0, count ? total / double(count) : 0.0);
  for (int64_t i = 0; i < n * k; ++i) st(c.out(1), i, dx[size_t(i)]);
  const bool into = c.inputs.size() == 5;  // out(2) is in(4)'s memory: read before written
  for (int64_t i = 0; i < v * k; ++i) st(c.out(2), i, (into ? ld(c.in(4), i) : 0.0) + dw[size_t(i)]);
}

// True when dw_into is the accumulated gradient of w (or of the f32
// parameter w was cast from, core::param_behind): the external autograd
// sums its gradient pieces into.
bool accumulates_into_grad_of_w(const Graph& g, const core::Node& n) {
  if (n.inputs.size() != 5) return false;
  const ValueId p = core::param_behind(g, n.inputs[1]);
  const core::Value& into = g.value(n.inputs[4]);
  return p != core::kNoValue && into.role == core::ValueRole::grad && into.name == core::grad_name(g.value(p).name);
}

std::vector<ValueId> classifier_backward(Graph& g, const core::Node& n, std::span<const ValueId> dy) {
  if (dy[1] != core::kNoValue || dy[2] != core::kNoValue)
    throw core::Error("classifier_train: its dx and dw outputs are already gradients; differentiating through "
                      "them (double backward) is not supported");
  if (dy[0] == core::kNoValue) return std::vector<ValueId>(n.inputs.size(), core::kNoValue);
  std::vector<ValueId> grads(n.inputs.size(), core::kNoValue);  // none for targets, seed, dw_into
  if (dy[0] == n.inputs[3] && (n.inputs.size() == 4 || accumulates_into_grad_of_w(g, n))) {
    grads[0] = n.outputs[1];
    grads[1] = n.outputs[2];
    return grads;
  }
  // Not the seed (or dw_into is something else): recompute with the arriving
  // gradient as the seed and no accumulator (see the top).
  const auto outs = g.add_node(OpKind::classifier_train, {n.inputs[0], n.inputs[1], n.inputs[2], dy[0]}, n.params);
  grads[0] = outs[1];
  grads[1] = outs[2];
  return grads;
}

}  // namespace

int64_t classifier_chunk_rows(int64_t n, int64_t v, int64_t chunk_floats) {
  // By default about 64 MiB of f32 logits per chunk; equal chunks so the
  // last is not a sliver. At W1 (N 2048, V 50304) that is 7 chunks of 293 rows.
  const int64_t floats = chunk_floats > 0 ? chunk_floats : int64_t(1) << 24;
  if (n <= 0) return 1;
  const int64_t max_rows = std::max<int64_t>(16, floats / std::max<int64_t>(v, 1));
  const int64_t chunks = (n + max_rows - 1) / max_rows;
  return (n + chunks - 1) / chunks;
}

core::OpDef classifier_train_def() {
  OpDef d;
  d.kind = OpKind::classifier_train;
  d.name = kOp;
  d.infer = infer_classifier;
  d.backward = classifier_backward;
  d.reference = classifier_reference;
  d.workspace_bytes = classifier_workspace;
  // dx and dw are gradients, not results: the harness's L = sum(y * R) covers
  // only `loss`, and its check of dx/dw goes through the backward rule above.
  d.num_saved_outputs = 2;
  d.output_aliases = {-1, -1, 4};  // dw over dw_into, when given
  d.test_cases = [] {
    std::vector<TestCase> cases;
    // The seed is a graph input, never differentiated (loss does not depend on it).
    auto one = [&](const std::string& label, int64_t n, int64_t c, int64_t v, int ignore, int64_t id_range) {
      cases.push_back({label,
                       {spec({n, c}), spec({v, c}), ids_spec({n}, id_range), no_grad(spec({}, DType::f32, 0.5, 1.5))},
                       CrossEntropyParams{ignore}});
    };
    one("7x13 V33", 7, 13, 33, -100, 33);
    one("33x16 V257", 33, 16, 257, -100, 257);
    one("1x5 V7", 1, 5, 7, -100, 7);
    // V = 6: about a sixth of the targets hit the ignored class.
    one("ignore 2, 19x9 V6", 19, 9, 6, 2, 6);
    one("all ignored", 4, 3, 5, 0, 1);
    // dw accumulated into a given dw_into (random, so a kernel that ignores it fails).
    cases.push_back({"into dw, 9x7 V21",
                     {spec({9, 7}), spec({21, 7}), ids_spec({9}, 21), no_grad(spec({}, DType::f32, 0.5, 1.5)),
                      no_grad(spec({21, 7}))},
                     CrossEntropyParams{-100}});
    // bf16: the LM head of a mixed-precision model. The loss is f32 but its
    // logits come from bf16 products (the GPU rounds them to bf16 too), and
    // an f32 dw_into takes dlogits rounded to bf16: bf16's tolerance throughout.
    auto bf16 = [&](const std::string& label, int64_t n, int64_t c, int64_t v, int ignore, std::optional<DType> into) {
      TestCase tc{label,
                  {spec({n, c}, DType::bf16), spec({v, c}, DType::bf16), ids_spec({n}, v),
                   no_grad(spec({}, DType::f32, 0.5, 1.5))},
                  CrossEntropyParams{ignore}};
      if (into) tc.inputs.push_back(no_grad(spec({v, c}, *into)));
      tc.forward_tolerance = 2e-2;
      cases.push_back(std::move(tc));
    };
    bf16("bf16 33x16 V257", 33, 16, 257, -100, std::nullopt);
    bf16("bf16 ignore 2, 19x9 V6", 19, 9, 6, 2, std::nullopt);
    bf16("bf16 into bf16 dw, 9x7 V21", 9, 7, 21, -100, DType::bf16);
    // V past one of the emulated path's 512-row blocks of w, into f32 (the GPT's head).
    bf16("bf16 into f32 dw, 12x24 V1100", 12, 24, 1100, -100, DType::f32);
    // Several chunks (a workspace of 16 rows' logits): dw summed across them,
    // equal chunk heights (3 of 14 rows in f32; a GPU's bf16 kernel fits
    // twice the rows in the same bytes, 2 chunks of 20).
    for (DType t : {DType::f32, DType::bf16}) {
      const int64_t n = 40, c = 16, v = 67;
      TestCase tc{std::string(t == DType::bf16 ? "bf16 " : "") + "chunks of 16 rows, 40x16 V67 into f32 dw",
                  {spec({n, c}, t), spec({v, c}, t), ids_spec({n}, v), no_grad(spec({}, DType::f32, 0.5, 1.5)),
                   no_grad(spec({v, c}))},
                  CrossEntropyParams{.ignore_index = -100, .chunk_floats = 16 * v}};
      if (t == DType::bf16) tc.forward_tolerance = 2e-2;
      cases.push_back(std::move(tc));
    }
    return cases;
  };
  return d;
}

std::vector<ValueId> classifier_train(Graph& g, ValueId x, ValueId w, ValueId targets, ValueId seed,
                                      int ignore_index) {
  register_ops();
  return g.add_node(OpKind::classifier_train, {x, w, targets, seed}, CrossEntropyParams{ignore_index});
}

// ---- the pass: linear(x, w) -> cross_entropy  =>  classifier_train ---------------

core::Pattern classifier_fusion(const std::string& seed_name, int64_t chunk_floats) {
  core::Pattern p;
  p.name = "classifier_fusion";
  p.match = [seed_name, chunk_floats](const Graph& g, int i, const core::GraphUses& uses) -> std::optional<core::Match> {
    const core::Node& lin = g.nodes()[size_t(i)];
    if (lin.op != OpKind::linear || lin.inputs.size() != 2) return std::nullopt;  // a bias: no fusion
    const ValueId x = lin.inputs[0], w = lin.inputs[1], logits = lin.outputs[0];
    // Any float dtype the model built the head in: it builds a low-precision
    // head only where the backend has classifier_train in that dtype (GPU
    // bf16), and an f32 one otherwise (models/gpt.cpp).
    if (!core::dtype_is_float(g.meta(x).dtype) || g.meta(w).dtype != g.meta(x).dtype || g.shape(x).rank() != 2)
      return std::nullopt;
    // The logits must feed the loss and nothing else: the fused op never makes them.
    const int ce = uses.sole_reader(logits);
    if (ce < 0) return std::nullopt;
    const core::Node& loss = g.nodes()[size_t(ce)];
    if (loss.op != OpKind::cross_entropy || loss.inputs[0] != logits) return std::nullopt;
    // The fused op has no label smoothing or class weights: such a loss stays as it is.
    if (std::get<CrossEntropyParams>(loss.params).label_smoothing != 0.f || loss.inputs.size() != 2)
      return std::nullopt;
    if (!uses.readers(loss.outputs[1]).empty() || g.value(loss.outputs[1]).is_output) return std::nullopt;  // lse
    // The seed the training step's backward() will be given.
    const ValueId seed = g.find(seed_name);
    if (seed == core::kNoValue || g.value(seed).role != core::ValueRole::input ||
        !(g.meta(seed) == TensorMeta{Shape{}, DType::f32}))
      return std::nullopt;
    core::Match m;
    m.nodes = {i, ce};
    core::OpParams params = loss.params;
    std::get<CrossEntropyParams>(params).chunk_floats = chunk_floats;
    m.emit = [x, w, t = loss.inputs[1], seed, out = loss.outputs[0], params](
                 Graph& dst, std::vector<ValueId>& map) {
      std::vector<ValueId> in = {map[size_t(x)], map[size_t(w)], map[size_t(t)], map[size_t(seed)]};
      // A parameter's weight gradient (or, for a bf16 head, the gradient of
      // the f32 parameter its weight was cast from) is summed straight into
      // its accumulated gradient, the external backward() would accumulate into.
      const ValueId p = core::param_behind(dst, in[1]);
      if (p != core::kNoValue) {
        const core::Value pv = dst.value(p);  // a copy: external() may grow the value table
        const std::string name = core::grad_name(pv.name);
        ValueId into = dst.find(name);
        if (into == core::kNoValue) into = dst.external(name, pv.meta.shape, pv.meta.dtype, core::ValueRole::grad);
        in.push_back(into);
      }
      map[size_t(out)] = dst.add_node(OpKind::classifier_train, in, params)[0];
    };
    return m;
  };
  return p;
}

}  // namespace brisk::ops
