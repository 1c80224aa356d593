// Softmax over the last dim (max-subtracted, so any finite input is safe) and
// its backward. The backward is its own op, dx = y * (dy - sum(dy * y)), fed
// with the forward's output rather than its input: that keeps one tensor
// alive instead of two and costs one fused pass per row.
#include <cmath>

#include "op_util.h"

namespace brisk::ops {
using namespace detail;

namespace {

std::vector<TensorMeta> infer_softmax(std::span<const TensorMeta> in, const core::OpParams&) {
  check_count("softmax", in, 1);
  check_float("softmax", in, {0});
  check_shape(in[0].shape.rank() >= 1, "softmax", "x must have rank >= 1", in);
  return {in[0]};
}

void softmax_reference(const KernelCall& c) {
  const TensorView &x = c.in(0), &y = c.out(0);
  const int64_t C = x.shape().last(), rows = x.shape().rows();
  for (int64_t r = 0; r < rows; ++r) {
    double mx = -INFINITY, s = 0.0;
    for (int64_t i = 0; i < C; ++i) mx = std::max(mx, ld(x, r * C + i));
    for (int64_t i = 0; i < C; ++i) s += std::exp(ld(x, r * C + i) - mx);
    for (int64_t i = 0; i < C; ++i) st(y, r * C + i, std::exp(ld(x, r * C + i) - mx) / s);
  }
}

std::vector<TensorMeta> infer_softmax_backward(std::span<const TensorMeta> in, const core::OpParams&) {
  constexpr std::string_view op = "softmax_backward";
  check_count(op, in, 2);
  check_float(op, in, {0, 1});
  check_shape(in[0] == in[1] && in[0].shape.rank() >= 1, op, "y and dy must have the same shape and dtype", in);
  return {in[0]};
}

void softmax_backward_reference(const KernelCall& c) {
  const TensorView &y = c.in(0), &dy = c.in(1), &dx = c.out(0);
  const int64_t C = y.shape().last(), rows = y.shape().rows();
  for (int64_t r = 0; r < rows; ++r) {
    double s = 0.0;
    for (int64_t i = 0; i < C; ++i) s += ld(dy, r * C + i) * ld(y, r * C + i);
    for (int64_t i = 0; i < C; ++i) st(dx, r * C + i, ld(y, r * C + i) * (ld(dy, r * C + i) - s));
  }
}

}  // namespace

core::OpDef softmax_def() {
  OpDef d;
  d.kind = OpKind::softmax;
  d.name = "softmax";
  d.infer = infer_softmax;
  d.backward = [](Graph& g, const core::Node& n, std::span<const ValueId> dy) -> std::vector<ValueId> {
    if (dy[0] == core::kNoValue) return {core::kNoValue};
    return {g.add_node1(OpKind::softmax_backward, {n.outputs[0], dy[0]})};
  };
  d.reference = softmax_reference;
  d.test_cases = [] {
    std::vector<TestCase> cases;
    for (DType t : {DType::f32, DType::bf16}) {
      const std::string tag = t == DType::f32 ? "" : " bf16";
      cases.push_back({"7x13" + tag, {spec({7, 13}, t, -3, 3)}, NoParams{}});
      cases.push_back({"2x3x33" + tag, {spec({2, 3, 33}, t, -3, 3)}, NoParams{}});
    }
    cases.push_back({"wide 4x300", {spec({4, 300}, DType::f32, -4, 4)}, NoParams{}});
    cases.push_back({"large logits", {spec({3, 17}, DType::f32, 50, 54)}, NoParams{}});
    cases.push_back({"1-D", {spec({5})}, NoParams{}});
    return cases;
  };
  return d;
}

core::OpDef softmax_backward_def() {
  OpDef d;
  d.kind = OpKind::softmax_backward;
  d.name = "softmax_backward";
  d.infer = infer_softmax_backward;
  d.reference = softmax_backward_reference;
  d.test_cases = [] {
    std::vector<TestCase> cases;
    for (DType t : {DType::f32, DType::bf16}) {
      const std::string tag = t == DType::f32 ? "" : " bf16";
      cases.push_back({"7x13" + tag, {spec({7, 13}, t, 0.01, 0.2), spec({7, 13}, t)}, NoParams{}});
      cases.push_back({"2x3x33" + tag, {spec({2, 3, 33}, t, 0.01, 0.1), spec({2, 3, 33}, t)}, NoParams{}});
    }
    return cases;
  };
  return d;
}

ValueId softmax(Graph& g, ValueId x) {
  register_ops();
  return g.add_node1(OpKind::softmax, {x});
}

}  // namespace brisk::ops
