// The inference engine's int8 Linear over a packed weight:
//
//   linear_q8_packed(x (..., K), wp u8 (ceil(N/16), ceil(K/4), 64), scale (N) [, bias (N)]) -> y (..., N)
//
// with N in PackedLinearParams. The same function as linear_q8 on the
// unpacked W (activations quantized to int8 per row inside the op, exact
// int32 sums, then the scaling); only the weight's layout differs
// (brisk/ops/packed_linear.h says why). The slots past N and past K are
// padding that never reaches a result: the harness fills them with random
// bytes to prove it. Inference only: no backward.
#include <string>

#include "brisk/ops/packed_linear.h"
#include "brisk/ops/quant.h"
#include "op_util.h"

namespace brisk::ops {
using namespace detail;

namespace packed {

void pack_q8(const int8_t* w, int64_t n, int64_t k, uint8_t* out) {
  const int64_t groups = q8_groups(k);
  for (int64_t p = 0; p < panels(n); ++p)
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t j = 0; j < kPanel; ++j)
        for (int64_t b = 0; b < kQ8Group; ++b) {
          const int64_t o = p * kPanel + j, i = g * kQ8Group + b;
          out[((p * groups + g) * kPanel + j) * kQ8Group + b] = uint8_t((o < n && i < k ? int(w[o * k + i]) : 0) + 128);
        }
}

}  // namespace packed

namespace {

constexpr std::string_view kOp = "linear_q8_packed";

std::vector<TensorMeta> infer_linear_q8_packed(std::span<const TensorMeta> in, const core::OpParams& params) {
  check_shape(in.size() == 3 || in.size() == 4, kOp, "takes (x, wp, scale) or (x, wp, scale, bias)", in);
  check_dtype(kOp, in[0], DType::f32, "x");
  check_dtype(kOp, in[1], DType::u8, "wp");
  for (size_t i = 2; i < in.size(); ++i) check_dtype(kOp, in[i], DType::f32, i == 2 ? "scale" : "bias");
  const int64_t n = std::get<PackedLinearParams>(params).out;
  const Shape& x = in[0].shape;
  check_shape(x.rank() >= 1 && n >= 1, kOp, "x must be (..., K) and the output count N >= 1 (N = " + std::to_string(n) + ")", in);
  const Shape want = packed::q8_packed_shape(n, x.last());
  check_shape(in[1].shape == want, kOp,
              "wp must be (ceil(N/16), ceil(K/4), 64) = " + want.str() + " for N = " + std::to_string(n), in);
  check_shape(in[2].shape == Shape{n}, kOp, "scale must be (N)", in);
  if (in.size() == 4) check_shape(in[3].shape == Shape{n}, kOp, "bias must be (N)", in);
  Shape y = x;
  y[y.rank() - 1] = n;
  return {TensorMeta{y, DType::f32}};
}

// linear_q8's reference, reading W through the packed layout.
void linear_q8_packed_reference(const KernelCall& c) {
  const TensorView &x = c.in(0), &wp = c.in(1), &scale = c.in(2);
  const int64_t k = x.shape().last(), rows = x.shape().rows(), n = c.p<PackedLinearParams>().out;
  std::vector<int8_t> q(static_cast<size_t>(k));
  for (int64_t r = 0; r < rows; ++r) {
    const float sx = quant::quantize_int8(x.as<float>() + r * k, k, q.data());
    for (int64_t o = 0; o < n; ++o) {
      int64_t acc = 0;
      for (int64_t i = 0; i < k; ++i) acc += int64_t(q[size_t(i)]) * packed::q8_weight(wp.as<uint8_t>(), k, o, i);
      double y = double(acc) * sx * scale.as<float>()[o];
      if (c.inputs.size() == 4) y += c.in(3).as<float>()[o];
      st(c.out(0), r * n + o, y);
    }
  }
}

// Row counts around the kernel's row tiles (1, 2, 3, 5, 8, 9, 16, 17), N as
// whole panels and with a partial last one, K a multiple of 4 and not (the
// last group's padding), past a 64-byte vector; one row of zeros (scale 0).
std::vector<TestCase> linear_q8_packed_cases() {
  auto c = [](std::string label, Shape x, int64_t n, bool bias, double lo = -2, double hi = 2) {
    const int64_t k = x.last();
    TestCase t{std::move(label),
               {no_grad(spec(x, DType::f32, lo, hi)),
                no_grad(InputSpec{TensorMeta{packed::q8_packed_shape(n, k), DType::u8}, 0, 256, false, {}}),
                no_grad(spec({n}, DType::f32, 0.001, 0.05))},
               PackedLinearParams{n}};
    if (bias) t.inputs.push_back(no_grad(spec({n})));
    return t;
  };
  std::vector<TestCase> cases = {
      c("1x64 -> 5", {1, 64}, 5, true, -3, 3),
      c("2x100 -> 37 no bias", {2, 100}, 37, false),
      c("3x2x255 -> 130", {3, 2, 255}, 130, true, -5, 5),
      c("5x33 -> 48", {5, 33}, 48, true),
      c("8x256 -> 64 no bias", {8, 256}, 64, false),
      c("9x70 -> 9", {9, 70}, 9, true),
      c("16x256 -> 200", {16, 256}, 200, true),
      c("17x1024 -> 64", {17, 1024}, 64, true),
  };
  TestCase zero = c("zero row", {2, 70}, 9, true);
  zero.inputs[0] = InputSpec{TensorMeta{Shape{2, 70}, DType::f32}, 0, 0, false, std::vector<double>(140, 0.0)};
  cases.push_back(zero);
  return cases;
}

// Scratch: the activation codes, each row padded to 64 bytes (zeros past K,
// which the last group reads), then per row its scale and code sum.
size_t q8_packed_workspace(std::span<const TensorMeta> in, const core::OpParams&) {
  const int64_t k = in[0].shape.last(), rows = in[0].shape.rows();
  return size_t(rows) * size_t((k + 63) / 64 * 64 + 8) + 64;
}

}  // namespace

core::OpDef linear_q8_packed_def() {
  OpDef d;
  d.kind = OpKind::linear_q8_packed;
  d.name = kOp;
  d.infer = infer_linear_q8_packed;
  d.reference = linear_q8_packed_reference;
  d.test_cases = linear_q8_packed_cases;
  d.workspace_bytes = q8_packed_workspace;
  return d;
}

}  // namespace brisk::ops
