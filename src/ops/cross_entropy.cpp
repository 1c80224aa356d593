// Cross-entropy of logits (N, V) against i32 targets (N): log-softmax and
// negative log-likelihood in one op, averaged over the targets that are not
// ignore_index (PyTorch's reduction='mean'). Fusing avoids materializing an
// (N, V) log-softmax, the largest tensor of a language model's step. The
// per-row logsumexp is returned as a saved f32 output so the backward,
// softmax - onehot, is one pass with no second reduction. With label
// smoothing e the target is (1 - e) onehot + e / V: the loss adds e / V
// times each row's sum of (lse - x_j), and the backward subtracts the
// smoothed target instead of the onehot. With class weights w (an optional
// third input, PyTorch's `weight`) each kept row counts w[t] times, its
// smoothing term is e / V * sum_j w_j (lse - x_j), and the mean divides by
// the kept rows' sum of w[t] (PyTorch's reduction='mean' with a weight).
#include <cmath>
#include <tuple>

#include "op_util.h"

namespace brisk::ops {
using namespace detail;

namespace {

void check_target(std::string_view op, int64_t t, int64_t row, int64_t v, int ignore) {
  if (t != ignore && (t < 0 || t >= v))
    throw core::Error(std::string(op) + ": target " + std::to_string(t) + " at position " + std::to_string(row) +
                      " is out of range [0, " + std::to_string(v) + ") and is not ignore_index (" +
                      std::to_string(ignore) + ")");
}

void check_smoothing(std::string_view op, const core::OpParams& p) {
  const float e = std::get<CrossEntropyParams>(p).label_smoothing;
  if (!(e >= 0.f && e < 1.f))
    throw core::Error(std::string(op) + ": label_smoothing must be in [0, 1), got " + std::to_string(e));
}

// The optional class weights at in[at]: (V) f32.
void check_class_weights(std::string_view op, std::span<const TensorMeta> in, size_t at) {
  if (in.size() <= at) return;
  check_dtype(op, in[at], DType::f32, "class_weights");
  check_shape(in[at].shape == Shape{in[0].shape[1]}, op, "class_weights must be (V) for logits (N, V)", in);
}

// Class j's weight: 1 without class weights.
double weight_of(const KernelCall& c, size_t at, int64_t j) {
  return c.inputs.size() > at ? ld(c.in(int(at)), j) : 1.0;
}

std::vector<TensorMeta> infer_cross_entropy(std::span<const TensorMeta> in, const core::OpParams& p) {
  constexpr std::string_view op = "cross_entropy";
  check_smoothing(op, p);
  if (in.size() != 3) check_count(op, in, 2);
  check_float(op, in, {0});
  check_dtype(op, in[1], DType::i32, "targets");
  check_shape(in[0].shape.rank() == 2, op, "logits must be (N, V)", in);
  check_shape(in[1].shape == Shape{in[0].shape[0]}, op, "targets must be (N) for logits (N, V)", in);
  check_class_weights(op, in, 2);
  return {TensorMeta{Shape{}, DType::f32}, TensorMeta{Shape{in[0].shape[0]}, DType::f32}};
}

void cross_entropy_reference(const KernelCall& c) {
  const TensorView &x = c.in(0), &t = c.in(1);
  const int ignore = c.p<CrossEntropyParams>().ignore_index;
  const double e = c.p<CrossEntropyParams>().label_smoothing;
  const int64_t n = x.shape()[0], v = x.shape()[1];
  double total = 0.0, weight = 0.0;
  for (int64_t r = 0; r < n; ++r) {
    const int64_t tr = int64_t(ld(t, r));
    check_target("cross_entropy", tr, r, v, ignore);
    double mx = -INFINITY, s = 0.0, all = 0.0;
    for (int64_t j = 0; j < v; ++j) mx = std::max(mx, ld(x, r * v + j));
    for (int64_t j = 0; j < v; ++j) s += std::exp(ld(x, r * v + j) - mx);
    const double lse = mx + std::log(s);
    st(c.out(1), r, lse);
    if (tr == ignore) continue;
    for (int64_t j = 0; j < v; ++j) all += weight_of(c, 2, j) * (lse - ld(x, r * v + j));
    const double wt = weight_of(c, 2, tr);
    total += (1.0 - e) * wt * (lse - ld(x, r * v + tr)) + e / double(v) * all;
    weight += wt;
  }
  st(c.out(0), 0, weight != 0.0 ? total / weight : 0.0);
}

// inputs logits (N, V), targets (N), lse (N), dloss () -> dlogits (N, V)
std::vector<TensorMeta> infer_cross_entropy_backward(std::span<const TensorMeta> in, const core::OpParams& p) {
  constexpr std::string_view op = "cross_entropy_backward";
  check_smoothing(op, p);
  if (in.size() != 5) check_count(op, in, 4);
  check_float(op, in, {0});
  check_dtype(op, in[1], DType::i32, "targets");
  check_dtype(op, in[2], DType::f32, "lse");
  check_dtype(op, in[3], DType::f32, "dloss");
  check_shape(in[0].shape.rank() == 2, op, "logits must be (N, V)", in);
  const Shape n{in[0].shape[0]};
  check_shape(in[1].shape == n && in[2].shape == n, op, "targets and lse must be (N)", in);
  check_shape(in[3].shape.numel() == 1, op, "dloss must be a scalar", in);
  check_class_weights(op, in, 4);
  return {in[0]};
}

// d loss / d x_j of a kept row with target t: (w[t] (1 - e) (p_j - [j = t])
// + e / V (sum_k w_k p_j - w_j)) / (the kept rows' sum of w[t]), times dloss.
void cross_entropy_backward_reference(const KernelCall& c) {
  const TensorView &x = c.in(0), &t = c.in(1), &lse = c.in(2), &dx = c.out(0);
  const int ignore = c.p<CrossEntropyParams>().ignore_index;
  const int64_t n = x.shape()[0], v = x.shape()[1];
  double weight = 0.0, all_weights = 0.0;
  for (int64_t r = 0; r < n; ++r) {
    const int64_t tr = int64_t(ld(t, r));
    check_target("cross_entropy_backward", tr, r, v, ignore);
    if (tr != ignore) weight += weight_of(c, 4, tr);
  }
  for (int64_t j = 0; j < v; ++j) all_weights += weight_of(c, 4, j);
  const double scale = weight != 0.0 ? ld(c.in(3), 0) / weight : 0.0;
  const double e = c.p<CrossEntropyParams>().label_smoothing;
  for (int64_t r = 0; r < n; ++r) {
    const int64_t tr = int64_t(ld(t, r));
    for (int64_t j = 0; j < v; ++j) {
      if (tr == ignore) {
        st(dx, r * v + j, 0.0);
        continue;
      }
      const double p = std::exp(ld(x, r * v + j) - ld(lse, r));
      const double nll = weight_of(c, 4, tr) * (1.0 - e) * (p - (j == tr ? 1.0 : 0.0));
      const double smooth = e / double(v) * (all_weights * p - weight_of(c, 4, j));
      st(dx, r * v + j, scale * (nll + smooth));
    }
  }
}

}  // namespace

core::OpDef cross_entropy_def() {
  OpDef d;
  d.kind = OpKind::cross_entropy;
  d.name = "cross_entropy";
  d.infer = infer_cross_entropy;
  d.backward = [](Graph& g, const core::Node& n, std::span<const ValueId> dy) -> std::vector<ValueId> {
    if (dy[0] == core::kNoValue) return std::vector<ValueId>(n.inputs.size(), core::kNoValue);
    register_ops();
    std::vector<ValueId> in = {n.inputs[0], n.inputs[1], n.outputs[1], dy[0]};
    if (n.inputs.size() > 2) in.push_back(n.inputs[2]);  // the class weights (they get no gradient)
    const ValueId dx = g.add_node1(OpKind::cross_entropy_backward, in, n.params);
    std::vector<ValueId> grads(n.inputs.size(), core::kNoValue);
    grads[0] = dx;
    return grads;
  };
  d.reference = cross_entropy_reference;
  d.num_saved_outputs = 1;
  d.test_cases = [] {
    std::vector<TestCase> cases;
    for (DType t : {DType::f32, DType::bf16}) {
      const std::string tag = t == DType::f32 ? "" : " bf16";
      cases.push_back({"7x50" + tag, {spec({7, 50}, t, -2, 2), ids_spec({7}, 50)}, CrossEntropyParams{}});
      cases.push_back({"33x257" + tag, {spec({33, 257}, t, -2, 2), ids_spec({33}, 257)}, CrossEntropyParams{}});
    }
    // With V = 5 about a fifth of the targets hit the ignored class.
    cases.push_back({"ignore 3", {spec({16, 5}, DType::f32, -2, 2), ids_spec({16}, 5)}, CrossEntropyParams{3}});
    cases.push_back({"all ignored", {spec({4, 6}), ids_spec({4}, 1)}, CrossEntropyParams{0}});
    cases.push_back({"33x257 f16", {spec({33, 257}, DType::f16, -2, 2), ids_spec({33}, 257)}, CrossEntropyParams{}});
    // Label smoothing, with some targets ignored, and on two classes (the classifier's case).
    for (DType t : {DType::f32, DType::bf16})
      cases.push_back({std::string("smoothing 0.1 ignore 3") + (t == DType::f32 ? "" : " bf16"),
                       {spec({16, 5}, t, -2, 2), ids_spec({16}, 5)},
                       CrossEntropyParams{.ignore_index = 3, .label_smoothing = 0.1f}});
    cases.push_back({"smoothing 0.3 9x2", {spec({9, 2}, DType::f32, -3, 3), ids_spec({9}, 2)},
                     CrossEntropyParams{.label_smoothing = 0.3f}});
    // Class weights (not differentiated: the loss's weights are data), with
    // ignored targets and with smoothing, on two classes and wide rows.
    auto weights = [](int64_t v) {
      InputSpec w = spec({v}, DType::f32, 0.2, 3.0);
      w.differentiable = false;
      return w;
    };
    cases.push_back({"weights ignore 3", {spec({16, 5}, DType::f32, -2, 2), ids_spec({16}, 5), weights(5)},
                     CrossEntropyParams{3}});
    // Classes that weigh 0 (PyTorch allows them): their rows count for
    // nothing; where every kept row weighs 0 the loss is 0, as with every
    // target ignored (PyTorch gives NaN there).
    auto given = [](std::vector<double> values) {
      InputSpec w = spec({int64_t(values.size())}, DType::f32);
      w.values = std::move(values);
      w.differentiable = false;
      return w;
    };
    cases.push_back({"weights with zeros", {spec({16, 5}, DType::f32, -2, 2), ids_spec({16}, 5),
                                            given({0.0, 1.5, 0.5, 2.0, 0.0})},
                     CrossEntropyParams{.label_smoothing = 0.1f}});
    cases.push_back({"weights all kept rows 0", {spec({4, 3}), ids_spec({4}, 1), given({0.0, 1.0, 2.0})},
                     CrossEntropyParams{}});
    cases.push_back({"weights smoothing 0.2 9x2", {spec({9, 2}, DType::f32, -3, 3), ids_spec({9}, 2), weights(2)},
                     CrossEntropyParams{.label_smoothing = 0.2f}});
    for (DType t : {DType::bf16, DType::f16})  // wide rows in 16 bits only (below)
      cases.push_back({"weights smoothing 0.1 ignore 3 33x257 " + std::string(core::dtype_name(t)),
                       {spec({33, 257}, t, -2, 2), ids_spec({33}, 257), weights(257)},
                       CrossEntropyParams{.ignore_index = 3, .label_smoothing = 0.1f}});
    // Wide rows (the kernel's vector loops and their tails) in bf16 and f16:
    // 16-bit inputs are left out of the finite-difference check, which at
    // V = 257 could not resolve f32 gradients of ~1e-4 from a loss near 5.
    for (DType t : {DType::bf16, DType::f16})
      cases.push_back({"smoothing 0.2 33x257 " + std::string(core::dtype_name(t)),
                       {spec({33, 257}, t, -2, 2), ids_spec({33}, 257)}, CrossEntropyParams{.label_smoothing = 0.2f}});
    return cases;
  };
  return d;
}

core::OpDef cross_entropy_backward_def() {
  OpDef d;
  d.kind = OpKind::cross_entropy_backward;
  d.name = "cross_entropy_backward";
  d.infer = infer_cross_entropy_backward;
  d.reference = cross_entropy_backward_reference;
  d.test_cases = [] {
    std::vector<TestCase> cases;
    auto one = [&](const std::string& label, int64_t n, int64_t v, DType t, int ignore) {
      cases.push_back({label,
                       {spec({n, v}, t, -2, 2), ids_spec({n}, v), spec({n}, DType::f32, 2, 4),
                        spec({}, DType::f32, 0.5, 1.5)},
                       CrossEntropyParams{ignore}});
    };
    one("7x50", 7, 50, DType::f32, -100);
    one("33x257", 33, 257, DType::f32, -100);
    one("7x50 bf16", 7, 50, DType::bf16, -100);
    one("33x257 f16", 33, 257, DType::f16, -100);
    one("ignore 2", 16, 5, DType::f32, 2);
    for (const auto& [label, n, v, t, ignore] : {std::tuple{"smoothing 0.1 ignore 2", 16, 5, DType::f32, 2},
                                                 std::tuple{"smoothing 0.1 bf16", 7, 50, DType::bf16, -100},
                                                 std::tuple{"smoothing 0.1 9x2", 9, 2, DType::f32, -100}}) {
      one(label, n, v, t, ignore);
      std::get<CrossEntropyParams>(cases.back().params).label_smoothing = 0.1f;
    }
    // Class weights (V) as the fifth input, with and without smoothing.
    for (const auto& [label, n, v, t, e] : {std::tuple{"weights ignore 2", 16, 5, DType::f32, 0.f},
                                            std::tuple{"weights smoothing 0.2 9x2", 9, 2, DType::f32, 0.2f},
                                            std::tuple{"weights smoothing 0.1 33x257 bf16", 33, 257, DType::bf16, 0.1f},
                                            std::tuple{"weights 33x257 f16", 33, 257, DType::f16, 0.f}}) {
      one(label, n, v, t, v == 5 ? 2 : -100);
      std::get<CrossEntropyParams>(cases.back().params).label_smoothing = e;
      cases.back().inputs.push_back(spec({v}, DType::f32, 0.2, 3.0));
    }
    return cases;
  };
  return d;
}

ValueId cross_entropy(Graph& g, ValueId logits, ValueId targets, int ignore_index, float label_smoothing,
                      ValueId class_weights) {
  register_ops();
  std::vector<ValueId> in = {logits, targets};
  if (class_weights != core::kNoValue) in.push_back(class_weights);
  return g.add_node(OpKind::cross_entropy, in,
                    CrossEntropyParams{.ignore_index = ignore_index, .label_smoothing = label_smoothing})[0];
}

}  // namespace brisk::ops
