// Small helpers shared by the op definition files: checks that throw errors
// naming the op and the shapes, and shorthands for test-case specs.
#pragma once

#include <string>
#include <vector>

#include "brisk/core/error.h"
#include "brisk/core/graph.h"
#include "brisk/ops/ops.h"

namespace brisk::ops::detail {

using core::DType;
using core::InputSpec;
using core::KernelCall;
using core::OpDef;
using core::OpKind;
using core::Shape;
using core::TensorMeta;
using core::TestCase;
using core::TensorView;

// Throws ShapeError("<op>: <what> (got <shapes>)") unless `ok`.
void check_shape(bool ok, std::string_view op, const std::string& what, std::span<const TensorMeta> inputs);
// Throws DTypeError unless every listed input is a float type (f32/bf16/f16).
void check_float(std::string_view op, std::span<const TensorMeta> inputs, std::initializer_list<int> which);
void check_dtype(std::string_view op, const TensorMeta& m, DType want, const std::string& what);
void check_count(std::string_view op, std::span<const TensorMeta> inputs, size_t n);

// The output of a Linear-like op taking x (..., K) first: x's shape with its
// last dim N, f32, after checking the optional bias at `bias_at` is (N).
inline std::vector<TensorMeta> linear_output(std::string_view op, std::span<const TensorMeta> in, size_t bias_at,
                                             int64_t n) {
  if (in.size() > bias_at) check_shape(in[bias_at].shape == Shape{n}, op, "bias must be (N)", in);
  Shape y = in[0].shape;
  y[y.rank() - 1] = n;
  return {TensorMeta{y, DType::f32}};
}

// The scalar LayerNorm of every row of x into y, mean, rstd (layernorm.cpp):
// shared by the reference kernels of layernorm and add_layernorm.
void layernorm_rows_reference(const TensorView& x, const TensorView& w, const TensorView& b, double eps,
                              const TensorView& y, const TensorView& mean, const TensorView& rstd);

// GPT-2's tanh-approximated GELU and its derivative in double
// (activation.cpp): shared by the reference kernels of the GELU ops.
double gelu_tanh(double x);
double gelu_tanh_derivative(double x);

// Spec of a random float input in [lo, hi).
inline InputSpec spec(Shape s, DType t = DType::f32, double lo = -1.0, double hi = 1.0) {
  return InputSpec{TensorMeta{s, t}, lo, hi, core::dtype_is_float(t), {}};
}
// Spec of integer ids in [0, n).
inline InputSpec ids_spec(Shape s, int64_t n) {
  return InputSpec{TensorMeta{s, DType::i32}, 0.0, double(n), false, {}};
}
inline InputSpec no_grad(InputSpec s) { s.differentiable = false; return s; }

// Reads element i of any dtype as double / writes it (reference kernels).
inline double ld(const TensorView& t, int64_t i) { return core::load_as_double(t.data, t.meta.dtype, size_t(i)); }
inline void st(const TensorView& t, int64_t i, double v) { core::store_from_double(t.data, t.meta.dtype, size_t(i), v); }

// Gradient of a broadcast operand: reduce `grad` (shape of a) back to `target`
// (a's trailing dims) by summing over the leading dims.
core::ValueId reduce_to(Graph& g, core::ValueId grad, const Shape& target);

}  // namespace brisk::ops::detail
