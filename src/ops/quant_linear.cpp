// Linear layers with quantized weights, for inference (src/infer/):
//
//   linear_q8(x, w int8 (N, K), scale (N) [, bias (N)]) -> y (..., N)
//   linear_q4(x, w u8 (N, K/2), scale (N, K/32) [, bias (N)]) -> y (..., N)
//
// The number formats are in brisk/ops/quant.h. The activations are quantized
// to int8 inside the op (per row for q8, per group of 32 for q4), so the
// products are integer dot products with exact int32 sums; only the final
// scaling is floating point. The op's function *includes* that activation
// rounding: the reference kernel rounds exactly as the fast kernels do, and
// the harness compares them at the f32 tolerance. How far the result is
// from the fp32 Linear is a property of the format, measured separately
// (tests/unit/quantize_test.cpp, and perplexity in docs/inference.md).
// Inference only: no backward.
#include <cstring>

#include "brisk/ops/quant.h"
#include "op_util.h"

namespace brisk::ops {
using namespace detail;

namespace {

// Shapes shared by both ops; `cols` is the weight's second dim per input column.
std::vector<TensorMeta> infer_quant_linear(std::string_view op, std::span<const TensorMeta> in, bool q4) {
  check_shape(in.size() == 3 || in.size() == 4, op, "takes (x, w, scale) or (x, w, scale, bias)", in);
  check_dtype(op, in[0], DType::f32, "x");
  check_dtype(op, in[1], q4 ? DType::u8 : DType::i8, "w");
  for (size_t i = 2; i < in.size(); ++i) check_dtype(op, in[i], DType::f32, i == 2 ? "scale" : "bias");
  const Shape& x = in[0].shape;
  const Shape& w = in[1].shape;
  check_shape(x.rank() >= 1 && w.rank() == 2, op, "x must be (..., K) and w 2-D", in);
  const int64_t n = w[0], k = x.last();
  if (q4) {
    check_shape(k % quant::kQ4Group == 0, op, "K must be a multiple of 32", in);
    check_shape(w[1] * 2 == k, op, "w must be (N, K/2) packed 4-bit codes", in);
    check_shape(in[2].shape == Shape{n, k / quant::kQ4Group}, op, "scale must be (N, K/32)", in);
  } else {
    check_shape(w[1] == k, op, "w must be (N, K)", in);
    check_shape(in[2].shape == Shape{n}, op, "scale must be (N)", in);
  }
  return linear_output(op, in, 3, n);
}

void linear_q8_reference(const KernelCall& c) {
  const TensorView &x = c.in(0), &w = c.in(1), &scale = c.in(2);
  const int64_t k = x.shape().last(), rows = x.shape().rows(), n = w.shape()[0];
  std::vector<int8_t> q(static_cast<size_t>(k));
  for (int64_t r = 0; r < rows; ++r) {
    const float sx = quant::quantize_int8(x.as<float>() + r * k, k, q.data());
    for (int64_t o = 0; o < n; ++o) {
      int64_t acc = 0;
      for (int64_t i = 0; i < k; ++i) acc += int64_t(q[size_t(i)]) * w.as<int8_t>()[o * k + i];
      double y = double(acc) * sx * scale.as<float>()[o];
      if (c.inputs.size() == 4) y += c.in(3).as<float>()[o];
      st(c.out(0), r * n + o, y);
    }
  }
}

void linear_q4_reference(const KernelCall& c) {
  const TensorView &x = c.in(0), &w = c.in(1), &scale = c.in(2);
  const int64_t k = x.shape().last(), rows = x.shape().rows(), n = w.shape()[0], groups = k / quant::kQ4Group;
  std::vector<int8_t> q(static_cast<size_t>(k));
  std::vector<float> sx(static_cast<size_t>(groups));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < groups; ++g)
      sx[size_t(g)] = quant::quantize_int8(x.as<float>() + r * k + g * 32, 32, q.data() + g * 32);
    for (int64_t o = 0; o < n; ++o) {
      double y = c.inputs.size() == 4 ? c.in(3).as<float>()[o] : 0.0;
      for (int64_t g = 0; g < groups; ++g) {
        const uint8_t* codes = w.as<uint8_t>() + o * (k / 2) + g * 16;
        int64_t acc = 0;
        for (int j = 0; j < 32; ++j) acc += int64_t(q[size_t(g * 32 + j)]) * quant::q4_code(codes, j);
        y += double(acc) * sx[size_t(g)] * scale.as<float>()[o * groups + g];
      }
      st(c.out(0), r * n + o, y);
    }
  }
}

// Weights cover the whole code range; rows of x with a wide spread, one row
// of zeros (scale 0), shapes with K past a 64-byte vector and odd N.
std::vector<TestCase> q8_cases() {
  auto w = [](int64_t n, int64_t k) { return no_grad(InputSpec{TensorMeta{Shape{n, k}, DType::i8}, -127, 128, false, {}}); };
  auto s = [](Shape sh) { return no_grad(spec(sh, DType::f32, 0.001, 0.05)); };
  return {
      {"1x64 -> 5", {no_grad(spec({1, 64}, DType::f32, -3, 3)), w(5, 64), s({5}), no_grad(spec({5}))}, NoParams{}},
      {"3x100 -> 37 no bias", {no_grad(spec({3, 100}, DType::f32, -2, 2)), w(37, 100), s({37})}, NoParams{}},
      {"2x4x256 -> 130", {no_grad(spec({2, 4, 256}, DType::f32, -5, 5)), w(130, 256), s({130}), no_grad(spec({130}))},
       NoParams{}},
      {"17x1024 -> 64", {no_grad(spec({17, 1024})), w(64, 1024), s({64}), no_grad(spec({64}))}, NoParams{}},
      {"zero row", {InputSpec{TensorMeta{Shape{2, 70}, DType::f32}, 0, 0, false, std::vector<double>(140, 0.0)},
                    w(9, 70), s({9}), no_grad(spec({9}))},
       NoParams{}},
  };
}

std::vector<TestCase> q4_cases() {
  auto w = [](int64_t n, int64_t k) {
    return no_grad(InputSpec{TensorMeta{Shape{n, k / 2}, DType::u8}, 0, 256, false, {}});
  };
  auto s = [](Shape sh) { return no_grad(spec(sh, DType::f32, 0.001, 0.05)); };
  return {
      {"1x32 -> 3", {no_grad(spec({1, 32}, DType::f32, -3, 3)), w(3, 32), s({3, 1}), no_grad(spec({3}))}, NoParams{}},
      {"2x96 -> 33 no bias", {no_grad(spec({2, 96}, DType::f32, -2, 2)), w(33, 96), s({33, 3})}, NoParams{}},
      {"3x5x256 -> 40", {no_grad(spec({3, 5, 256}, DType::f32, -4, 4)), w(40, 256), s({40, 8}), no_grad(spec({40}))},
       NoParams{}},
      {"16x1024 -> 65", {no_grad(spec({16, 1024})), w(65, 1024), s({65, 32}), no_grad(spec({65}))}, NoParams{}},
  };
}

// Scratch for the quantized activations: codes padded to 64 bytes per row,
// plus per group its scale, its sum and four copies of the scale (the CPU
// kernels' layout, generous here).
size_t quant_workspace(std::span<const TensorMeta> in, const core::OpParams&) {
  const int64_t k = in[0].shape.last(), rows = in[0].shape.rows();
  const int64_t padded = (k + 63) / 64 * 64;
  return size_t(rows) * size_t(padded + 24 * (padded / 32 + 1) + 64) + 64;
}

}  // namespace

core::OpDef linear_q8_def() {
  OpDef d;
  d.kind = OpKind::linear_q8;
  d.name = "linear_q8";
  d.infer = [](std::span<const TensorMeta> in, const core::OpParams&) { return infer_quant_linear("linear_q8", in, false); };
  d.reference = linear_q8_reference;
  d.test_cases = q8_cases;
  d.workspace_bytes = quant_workspace;
  return d;
}

core::OpDef linear_q4_def() {
  OpDef d;
  d.kind = OpKind::linear_q4;
  d.name = "linear_q4";
  d.infer = [](std::span<const TensorMeta> in, const core::OpParams&) { return infer_quant_linear("linear_q4", in, true); };
  d.reference = linear_q4_reference;
  d.test_cases = q4_cases;
  d.workspace_bytes = quant_workspace;
  return d;
}

}  // namespace brisk::ops
