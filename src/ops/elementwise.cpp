// Elementwise arithmetic: add, mul, scale. The second operand of add/mul may
// be a tensor of a's trailing dims (a bias, a LayerNorm weight): that covers
// every broadcast the models need without a general broadcasting engine.
#include "op_util.h"

namespace brisk::ops {
using namespace detail;

namespace {

// b must equal a's shape or a's trailing dims.
bool trailing_match(const Shape& a, const Shape& b) {
  if (b.rank() > a.rank()) return false;
  for (int i = 1; i <= b.rank(); ++i)
    if (a[a.rank() - i] != b[b.rank() - i]) return false;
  return true;
}

// `mixed`: add's second operand may be bf16/f16 under an f32 first (mixed
// precision's low-precision branch added to the f32 residual: no widening
// cast first); the result has the first's dtype.
std::vector<TensorMeta> infer_binary(std::string_view op, std::span<const TensorMeta> in, bool mixed = false) {
  check_count(op, in, 2);
  check_float(op, in, {0, 1});
  check_shape(trailing_match(in[0].shape, in[1].shape), op,
              "second operand must have the first's shape or its trailing dims", in);
  const bool narrower_b = mixed && in[0].dtype == DType::f32 && (in[1].dtype == DType::bf16 || in[1].dtype == DType::f16);
  check_shape(in[0].dtype == in[1].dtype || narrower_b, op,
              mixed ? "operands must have the same dtype, or an f32 first and a bf16/f16 second"
                    : "operands must have the same dtype",
              in);
  return {in[0]};
}

template <bool kMul>
void binary_reference(const KernelCall& c) {
  const TensorView &a = c.in(0), &b = c.in(1), &y = c.out(0);
  const int64_t n = a.numel(), nb = b.numel();
  for (int64_t i = 0; i < n; ++i) {
    const double x = ld(a, i), z = ld(b, i % nb);
    st(y, i, kMul ? x * z : x + z);
  }
}

std::vector<TestCase> binary_cases() {
  std::vector<TestCase> cases;
  for (DType t : {DType::f32, DType::bf16}) {
    cases.push_back({"same shape", {spec({7, 13}, t), spec({7, 13}, t)}, NoParams{}});
    cases.push_back({"bias broadcast", {spec({2, 5, 33}, t), spec({33}, t)}, NoParams{}});
    cases.push_back({"row broadcast", {spec({3, 4, 9}, t), spec({4, 9}, t)}, NoParams{}});
  }
  cases.push_back({"scalar-sized", {spec({1}), spec({1})}, NoParams{}});
  return cases;
}

// add also takes a bf16/f16 second operand under an f32 first.
std::vector<TestCase> add_cases() {
  std::vector<TestCase> cases = binary_cases();
  for (DType t : {DType::bf16, DType::f16}) {
    const std::string tag = std::string(" + ") + std::string(core::dtype_name(t));
    cases.push_back({"f32" + tag, {spec({7, 13}), spec({7, 13}, t)}, NoParams{}});
    cases.push_back({"f32 bias" + tag, {spec({2, 5, 33}), spec({33}, t)}, NoParams{}});
    // A repeated operand whose length is a multiple of the vector: the GPUs' vectorised broadcast.
    cases.push_back({"f32 bias 64" + tag, {spec({2, 5, 64}), spec({64}, t)}, NoParams{}});
  }
  return cases;
}

}  // namespace

core::ValueId detail::reduce_to(Graph& g, core::ValueId grad, const Shape& target) {
  const Shape& s = g.shape(grad);
  if (s == target) return grad;
  // (lead..., trailing...) -> (prod(lead), numel(target)) -> sum over axis 0
  const int64_t inner = target.numel();
  ValueId flat = reshape(g, grad, Shape{s.numel() / inner, inner});
  return reshape(g, sum(g, flat, 0), target);
}

// ---- add ----------------------------------------------------------------------
core::OpDef add_def() {
  OpDef d;
  d.kind = OpKind::add;
  d.name = "add";
  d.infer = [](std::span<const TensorMeta> in, const core::OpParams&) { return infer_binary("add", in, true); };
  d.backward = [](Graph& g, const core::Node& n, std::span<const ValueId> dy) -> std::vector<ValueId> {
    ValueId db = reduce_to(g, dy[0], g.shape(n.inputs[1]));
    const DType tb = g.meta(n.inputs[1]).dtype;
    if (g.meta(db).dtype != tb) db = cast(g, db, tb);  // a narrower b gets its gradient in its own dtype
    return {dy[0], db};
  };
  d.reference = binary_reference<false>;
  d.test_cases = add_cases;
  return d;
}

// ---- mul ----------------------------------------------------------------------
core::OpDef mul_def() {
  OpDef d;
  d.kind = OpKind::mul;
  d.name = "mul";
  d.infer = [](std::span<const TensorMeta> in, const core::OpParams&) { return infer_binary("mul", in); };
  d.backward = [](Graph& g, const core::Node& n, std::span<const ValueId> dy) -> std::vector<ValueId> {
    const ValueId a = n.inputs[0], b = n.inputs[1];
    ValueId da = mul(g, dy[0], b);
    // d(b) = sum over broadcast dims of dy * a
    ValueId db = reduce_to(g, mul(g, dy[0], a), g.shape(b));
    return {da, db};
  };
  d.reference = binary_reference<true>;
  d.test_cases = binary_cases;
  return d;
}

// ---- scale ----------------------------------------------------------------------
core::OpDef scale_def() {
  OpDef d;
  d.kind = OpKind::scale;
  d.name = "scale";
  d.infer = [](std::span<const TensorMeta> in, const core::OpParams&) {
    check_count("scale", in, 1);
    check_float("scale", in, {0});
    return std::vector<TensorMeta>{in[0]};
  };
  d.backward = [](Graph& g, const core::Node& n, std::span<const ValueId> dy) -> std::vector<ValueId> {
    return {scale(g, dy[0], std::get<ScaleParams>(n.params).scale)};
  };
  d.reference = [](const KernelCall& c) {
    const double s = c.p<ScaleParams>().scale;
    for (int64_t i = 0; i < c.in(0).numel(); ++i) st(c.out(0), i, s * ld(c.in(0), i));
  };
  d.test_cases = [] {
    return std::vector<TestCase>{{"f32", {spec({5, 17})}, ScaleParams{-1.7f}},
                                 {"bf16", {spec({64}, DType::bf16)}, ScaleParams{0.25f}}};
  };
  return d;
}

// ---- builders -------------------------------------------------------------------
ValueId add(Graph& g, ValueId a, ValueId b) { register_ops(); return g.add_node1(OpKind::add, {a, b}); }
ValueId mul(Graph& g, ValueId a, ValueId b) { register_ops(); return g.add_node1(OpKind::mul, {a, b}); }
ValueId scale(Graph& g, ValueId a, float s) {
  register_ops();
  return g.add_node1(OpKind::scale, {a}, ScaleParams{s});
}

}  // namespace brisk::ops
