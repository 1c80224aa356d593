// Reductions: sum and mean over one axis or over everything, and expand, their
// adjoint, which broadcasts a reduced tensor back along the reduced axis.
// Reducing one axis at a time (rather than a general multi-axis reduction) is
// all the models and the broadcast gradients of add/mul need, and it keeps
// every kernel a plain (outer, n, inner) loop over contiguous memory.
#include "brisk/ops/layout.h"
#include "op_util.h"

namespace brisk::ops {
using namespace detail;

namespace {

constexpr int kAll = ReduceParams::kAllAxes;


// Normalizes a reduce axis against `s`, throwing a ShapeError naming the op.
int checked_axis(std::string_view op, const Shape& s, int axis, std::span<const TensorMeta> in) {
  if (axis == kAll) return kAll;
  check_shape(axis >= -s.rank() && axis < s.rank(), op,
              "axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(s.rank()), in);
  return axis < 0 ? axis + s.rank() : axis;
}

Shape reduced_shape(const Shape& s, int axis, bool keepdim) {
  Shape out;
  for (int i = 0; i < s.rank(); ++i) {
    if (axis == kAll || i == axis) {
      if (keepdim) out.push_back(1);
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

std::vector<TensorMeta> infer_reduce(std::string_view op, std::span<const TensorMeta> in, const core::OpParams& p) {
  check_count(op, in, 1);
  check_float(op, in, {0});
  const auto& rp = std::get<ReduceParams>(p);
  const int axis = checked_axis(op, in[0].shape, rp.axis, in);
  return {TensorMeta{reduced_shape(in[0].shape, axis, rp.keepdim), in[0].dtype}};
}

template <bool kMean>
void reduce_reference(const KernelCall& c) {
  const auto& rp = c.p<ReduceParams>();
  const int axis = rp.axis == kAll ? kAll : c.in(0).shape().normalize_axis(rp.axis);
  const AxisSplit a = split_at(c.in(0).shape(), axis);
  for (int64_t o = 0; o < a.outer; ++o)
    for (int64_t i = 0; i < a.inner; ++i) {
      double acc = 0.0;
      for (int64_t k = 0; k < a.n; ++k) acc += ld(c.in(0), (o * a.n + k) * a.inner + i);
      st(c.out(0), o * a.inner + i, kMean ? acc / double(a.n) : acc);
    }
}

std::vector<TestCase> reduce_cases() {
  std::vector<TestCase> cases;
  for (DType t : {DType::f32, DType::bf16}) {
    cases.push_back({"all", {spec({7, 13}, t)}, ReduceParams{kAll, false}});
    cases.push_back({"all keepdim", {spec({3, 5, 7}, t)}, ReduceParams{kAll, true}});
    cases.push_back({"last axis", {spec({5, 33}, t)}, ReduceParams{-1, false}});
    cases.push_back({"first axis", {spec({13, 9}, t)}, ReduceParams{0, false}});
    cases.push_back({"middle axis keepdim", {spec({3, 7, 5}, t)}, ReduceParams{1, true}});
    cases.push_back({"rank 4 axis -3", {spec({2, 3, 4, 5}, t)}, ReduceParams{-3, false}});
  }
  cases.push_back({"1-d", {spec({101})}, ReduceParams{0, false}});
  // Large enough for the threaded paths; a million positive values show
  // whether accumulation keeps the last f32 bit. (Not grad-checked: a 1e-3
  // nudge of one input is below the f32 spacing of a sum near 1e6.)
  cases.push_back({"million", {no_grad(spec({1000, 1000}, DType::f32, 0.5, 1.5))}, ReduceParams{kAll, false}});
  cases.push_back({"tall columns", {spec({300, 700})}, ReduceParams{0, false}});
  cases.push_back({"long rows", {spec({700, 300}, DType::bf16)}, ReduceParams{-1, false}});
  cases.push_back({"wide middle", {spec({20, 50, 400})}, ReduceParams{1, false}});
  cases.push_back({"f16 rows", {spec({4, 17}, DType::f16)}, ReduceParams{1, false}});
  return cases;
}

// The gradient of a reduction: dy broadcast back over the reduced axis.
ValueId reduce_grad(Graph& g, const core::Node& n, ValueId dy) {
  return expand(g, dy, g.shape(n.inputs[0]), std::get<ReduceParams>(n.params).axis);
}

}  // namespace

// ---- sum --------------------------------------------------------------------------
core::OpDef sum_def() {
  OpDef d;
  d.kind = OpKind::sum;
  d.name = "sum";
  // Optionally an f32 accumulator, for the column sums of a matrix (bias
  // gradients summed into the parameter's gradient, core::grad_sink): y =
  // into + sum over axis 0 of x (rows, C), C >= 2, written over into.
  d.infer = [](std::span<const TensorMeta> in, const core::OpParams& p) {
    if (in.size() != 2) return infer_reduce("sum", in, p);
    const auto& rp = std::get<ReduceParams>(p);
    check_float("sum", in, {0});
    check_shape(in[0].shape.rank() == 2 && in[0].shape[1] >= 2 && (rp.axis == 0 || rp.axis == -2) && !rp.keepdim,
                "sum", "an accumulator needs x (rows, C >= 2) summed over axis 0", in);
    check_shape(in[1] == TensorMeta{Shape{in[0].shape[1]}, DType::f32}, "sum", "the accumulator must be f32 (C)", in);
    return std::vector<TensorMeta>{in[1]};
  };
  d.backward = [](Graph& g, const core::Node& n, std::span<const ValueId> dy) -> std::vector<ValueId> {
    if (n.inputs.size() == 2) {
      if (g.meta(n.inputs[0]).dtype != DType::f32)
        throw core::Error("sum: no gradient through an accumulating sum of low-precision values");
      return {reduce_grad(g, n, dy[0]), dy[0]};
    }
    return {reduce_grad(g, n, dy[0])};
  };
  d.reference = [](const KernelCall& c) {
    if (c.inputs.size() == 1) return reduce_reference<false>(c);
    const int64_t rows = c.in(0).shape()[0], cols = c.in(0).shape()[1];
    for (int64_t j = 0; j < cols; ++j) {
      double acc = ld(c.in(1), j);
      for (int64_t r = 0; r < rows; ++r) acc += ld(c.in(0), r * cols + j);
      st(c.out(0), j, acc);
    }
  };
  d.output_aliases = {1};  // over the accumulator, when given
  d.test_cases = [] {
    std::vector<TestCase> cases = reduce_cases();
    // Column sums added to a random accumulator (a kernel that overwrites it fails).
    for (DType t : {DType::f32, DType::bf16}) {
      const std::string tag = t == DType::f32 ? "" : " bf16";
      cases.push_back({"into, 300x700" + tag, {spec({300, 700}, t), no_grad(spec({700}))}, ReduceParams{0, false}});
      cases.push_back({"into, 5x33" + tag, {spec({5, 33}, t), no_grad(spec({33}))}, ReduceParams{0, false}});
    }
    return cases;
  };
  return d;
}

// ---- mean -------------------------------------------------------------------------
core::OpDef mean_def() {
  OpDef d;
  d.kind = OpKind::mean;
  d.name = "mean";
  d.infer = [](std::span<const TensorMeta> in, const core::OpParams& p) { return infer_reduce("mean", in, p); };
  d.backward = [](Graph& g, const core::Node& n, std::span<const ValueId> dy) -> std::vector<ValueId> {
    const Shape& s = g.shape(n.inputs[0]);
    const int axis = std::get<ReduceParams>(n.params).axis;
    const int64_t count = axis == kAll ? s.numel() : s.dim(axis);
    return {scale(g, reduce_grad(g, n, dy[0]), float(1.0 / double(count)))};
  };
  d.reference = reduce_reference<true>;
  d.test_cases = reduce_cases;
  return d;
}

// ---- expand: x (shape without `axis`, or with it of size 1) -> shape ----------------
core::OpDef expand_def() {
  OpDef d;
  d.kind = OpKind::expand;
  d.name = "expand";
  d.infer = [](std::span<const TensorMeta> in, const core::OpParams& p) {
    check_count("expand", in, 1);
    const auto& ep = std::get<ExpandParams>(p);
    for (int i = 0; i < ep.shape.rank(); ++i)
      check_shape(ep.shape[i] > 0, "expand", "target shape " + ep.shape.str() + " must have positive dims", in);
    if (ep.axis == kAll) {
      check_shape(in[0].shape.numel() == 1, "expand",
                  "expanding over all axes needs a one-element input (target " + ep.shape.str() + ")", in);
    } else {
      const int axis = checked_axis("expand", ep.shape, ep.axis, in);
      const Shape& x = in[0].shape;
      check_shape(x == reduced_shape(ep.shape, axis, false) || x == reduced_shape(ep.shape, axis, true), "expand",
                  "input must be the target " + ep.shape.str() + " with axis " + std::to_string(ep.axis) +
                      " removed or of size 1",
                  in);
    }
    return std::vector<TensorMeta>{TensorMeta{ep.shape, in[0].dtype}};
  };
  d.backward = [](Graph& g, const core::Node& n, std::span<const ValueId> dy) -> std::vector<ValueId> {
    const auto& ep = std::get<ExpandParams>(n.params);
    const Shape& xs = g.shape(n.inputs[0]);
    ValueId s = sum(g, dy[0], ep.axis, false);
    return {g.shape(s) == xs ? s : reshape(g, s, xs)};
  };
  d.reference = [](const KernelCall& c) {
    const auto& ep = c.p<ExpandParams>();
    const int axis = ep.axis == kAll ? kAll : ep.shape.normalize_axis(ep.axis);
    const AxisSplit a = split_at(ep.shape, axis);
    for (int64_t o = 0; o < a.outer; ++o)
      for (int64_t k = 0; k < a.n; ++k)
        for (int64_t i = 0; i < a.inner; ++i) st(c.out(0), (o * a.n + k) * a.inner + i, ld(c.in(0), o * a.inner + i));
  };
  d.test_cases = [] {
    std::vector<TestCase> cases;
    for (DType t : {DType::f32, DType::bf16}) {
      cases.push_back({"all from scalar", {spec(Shape{}, t)}, ExpandParams{Shape{7, 13}, kAll}});
      cases.push_back({"all from (1, 1)", {spec({1, 1}, t)}, ExpandParams{Shape{3, 5}, kAll}});
      cases.push_back({"last axis", {spec({5}, t)}, ExpandParams{Shape{5, 33}, -1}});
      cases.push_back({"first axis", {spec({9}, t)}, ExpandParams{Shape{13, 9}, 0}});
      cases.push_back({"middle axis keepdim", {spec({3, 1, 5}, t)}, ExpandParams{Shape{3, 7, 5}, 1}});
      cases.push_back({"rank 4 axis -3", {spec({2, 4, 5}, t)}, ExpandParams{Shape{2, 3, 4, 5}, -3}});
    }
    cases.push_back({"threaded rows", {spec({300})}, ExpandParams{Shape{300, 700}, -1}});
    cases.push_back({"threaded columns", {spec({20, 1, 400}, DType::bf16)}, ExpandParams{Shape{20, 50, 400}, 1}});
    return cases;
  };
  return d;
}

// ---- builders -----------------------------------------------------------------------
ValueId sum(Graph& g, ValueId x, int axis, bool keepdim) {
  register_ops();
  return g.add_node1(OpKind::sum, {x}, ReduceParams{axis, keepdim});
}
ValueId column_sum_into(Graph& g, ValueId x, ValueId into) {
  register_ops();
  return g.add_node1(OpKind::sum, {x, into}, ReduceParams{0, false});
}
ValueId mean(Graph& g, ValueId x, int axis, bool keepdim) {
  register_ops();
  return g.add_node1(OpKind::mean, {x}, ReduceParams{axis, keepdim});
}
ValueId expand(Graph& g, ValueId x, const core::Shape& shape, int axis) {
  register_ops();
  return g.add_node1(OpKind::expand, {x}, ExpandParams{shape, axis});
}

}  // namespace brisk::ops
