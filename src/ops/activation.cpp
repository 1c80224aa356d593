// Activations: the tanh-approximated GELU of GPT-2 and its backward. The
// backward is its own op rather than a composition of mul/add/tanh nodes: the
// derivative needs tanh(u) again, and one fused pass reads x and dy once
// instead of materializing half a dozen temporaries of the MLP's widest
// activation. Formulas match PyTorch's gelu(approximate='tanh') exactly.
#include <cmath>

#include "op_util.h"

namespace brisk::ops {
using namespace detail;

namespace {
constexpr double kSqrt2OverPi = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kCubic = 0.044715;
}  // namespace

double detail::gelu_tanh(double x) {
  const double t = std::tanh(kSqrt2OverPi * (x + kCubic * x * x * x));
  return 0.5 * x * (1.0 + t);
}

// d gelu / dx = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 c x^2)
double detail::gelu_tanh_derivative(double x) {
  const double t = std::tanh(kSqrt2OverPi * (x + kCubic * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * kSqrt2OverPi * (1.0 + 3.0 * kCubic * x * x);
}

// ---- gelu -----------------------------------------------------------------------
core::OpDef gelu_def() {
  OpDef d;
  d.kind = OpKind::gelu;
  d.name = "gelu";
  d.infer = [](std::span<const TensorMeta> in, const core::OpParams&) {
    check_count("gelu", in, 1);
    check_float("gelu", in, {0});
    return std::vector<TensorMeta>{in[0]};
  };
  d.backward = [](Graph& g, const core::Node& n, std::span<const ValueId> dy) -> std::vector<ValueId> {
    return {g.add_node1(OpKind::gelu_backward, {n.inputs[0], dy[0]})};
  };
  d.reference = [](const KernelCall& c) {
    for (int64_t i = 0; i < c.in(0).numel(); ++i) st(c.out(0), i, gelu_tanh(ld(c.in(0), i)));
  };
  d.test_cases = [] {
    std::vector<TestCase> cases;
    for (DType t : {DType::f32, DType::bf16}) {
      cases.push_back({"odd rows", {spec({7, 13}, t, -3.0, 3.0)}, NoParams{}});
      cases.push_back({"rank 3", {spec({2, 5, 33}, t, -4.0, 4.0)}, NoParams{}});
      cases.push_back({"long row", {spec({1031}, t, -6.0, 6.0)}, NoParams{}});
      cases.push_back({"threaded", {spec({70001}, t, -5.0, 5.0)}, NoParams{}});
    }
    // Far tails: the CPU kernel caps exp's argument there (gelu_math.h).
    cases.push_back({"tails", {spec({257}, DType::f32, -40.0, 40.0)}, NoParams{}});
    return cases;
  };
  return d;
}

// ---- gelu_backward: inputs x, dy -> dx ------------------------------------------
core::OpDef gelu_backward_def() {
  OpDef d;
  d.kind = OpKind::gelu_backward;
  d.name = "gelu_backward";
  d.infer = [](std::span<const TensorMeta> in, const core::OpParams&) {
    check_count("gelu_backward", in, 2);
    check_float("gelu_backward", in, {0, 1});
    check_shape(in[0] == in[1], "gelu_backward", "x and dy must have the same shape and dtype", in);
    return std::vector<TensorMeta>{in[0]};
  };
  d.reference = [](const KernelCall& c) {
    for (int64_t i = 0; i < c.in(0).numel(); ++i)
      st(c.out(0), i, gelu_tanh_derivative(ld(c.in(0), i)) * ld(c.in(1), i));
  };
  d.test_cases = [] {
    std::vector<TestCase> cases;
    for (DType t : {DType::f32, DType::bf16}) {
      cases.push_back({"odd rows", {no_grad(spec({7, 13}, t, -3.0, 3.0)), no_grad(spec({7, 13}, t))}, NoParams{}});
      cases.push_back(
          {"rank 3", {no_grad(spec({2, 5, 33}, t, -5.0, 5.0)), no_grad(spec({2, 5, 33}, t, -2.0, 2.0))}, NoParams{}});
      cases.push_back({"long row", {no_grad(spec({1031}, t, -6.0, 6.0)), no_grad(spec({1031}, t))}, NoParams{}});
      cases.push_back({"threaded", {no_grad(spec({70001}, t, -5.0, 5.0)), no_grad(spec({70001}, t))}, NoParams{}});
    }
    // Far tails: the CPU kernel once gave -inf for x <= -10 (2 x e overflowed).
    cases.push_back({"tails", {no_grad(spec({257}, DType::f32, -40.0, 40.0)), no_grad(spec({257}))}, NoParams{}});
    return cases;
  };
  return d;
}

// ---- builder --------------------------------------------------------------------
ValueId gelu(Graph& g, ValueId x) { register_ops(); return g.add_node1(OpKind::gelu, {x}); }

}  // namespace brisk::ops
