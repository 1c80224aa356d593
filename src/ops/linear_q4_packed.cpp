// The inference engine's int4 Linear over packed weights and scales:
//
//   linear_q4_packed(x (..., K), wp u8 (ceil(N/16), K/32, 256), sp (ceil(N/16), K/32, 16) [, bias (N)]) -> y (..., N)
//
// with N in PackedLinearParams. The same function as linear_q4 on the
// unpacked codes and scales (activations quantized to int8 per group of 32
// inside the op, exact int32 sums per group, each scaled by both scales and
// summed in float); only the layout differs (brisk/ops/packed_linear.h). The
// slots past N are padding that never reaches a result: the harness fills
// them with random values to prove it. Inference only: no backward.
#include <string>

#include "brisk/ops/packed_linear.h"
#include "brisk/ops/quant.h"
#include "op_util.h"

namespace brisk::ops {
using namespace detail;

namespace packed {

void pack_q4(const uint8_t* w, const float* scale, int64_t n, int64_t k, uint8_t* wp, float* sp) {
  const int64_t groups = k / 32;
  auto code = [&](int64_t o, int64_t i) {  // q + 8, or 8 past n
    return o < n ? uint8_t(quant::q4_code(w + o * (k / 2) + (i / 32) * 16, int(i % 32)) + 8) : uint8_t(8);
  };
  for (int64_t p = 0; p < panels(n); ++p)
    for (int64_t g = 0; g < groups; ++g) {
      uint8_t* block = wp + (p * groups + g) * kQ4GroupBytes;
      for (int64_t t = 0; t < 4; ++t)
        for (int64_t j = 0; j < kPanel; ++j)
          for (int64_t b = 0; b < 4; ++b) {
            const int64_t o = p * kPanel + j, i = g * 32 + t * 8 + b;
            block[t * 64 + j * 4 + b] = uint8_t(code(o, i) | code(o, i + 4) << 4);
          }
      for (int64_t j = 0; j < kPanel; ++j) {
        const int64_t o = p * kPanel + j;
        sp[(p * groups + g) * kPanel + j] = o < n ? scale[o * groups + g] : 0.f;
      }
    }
}

}  // namespace packed

namespace {

constexpr std::string_view kOp = "linear_q4_packed";

std::vector<TensorMeta> infer_linear_q4_packed(std::span<const TensorMeta> in, const core::OpParams& params) {
  check_shape(in.size() == 3 || in.size() == 4, kOp, "takes (x, wp, sp) or (x, wp, sp, bias)", in);
  check_dtype(kOp, in[0], DType::f32, "x");
  check_dtype(kOp, in[1], DType::u8, "wp");
  for (size_t i = 2; i < in.size(); ++i) check_dtype(kOp, in[i], DType::f32, i == 2 ? "sp" : "bias");
  const int64_t n = std::get<PackedLinearParams>(params).out;
  const Shape& x = in[0].shape;
  check_shape(x.rank() >= 1 && n >= 1, kOp, "x must be (..., K) and the output count N >= 1 (N = " + std::to_string(n) + ")", in);
  const int64_t k = x.last();
  check_shape(k % quant::kQ4Group == 0, kOp, "K must be a multiple of 32", in);
  const Shape want = packed::q4_packed_shape(n, k), want_s = packed::q4_packed_scale_shape(n, k);
  check_shape(in[1].shape == want, kOp,
              "wp must be (ceil(N/16), K/32, 256) = " + want.str() + " for N = " + std::to_string(n), in);
  check_shape(in[2].shape == want_s, kOp, "sp must be (ceil(N/16), K/32, 16) = " + want_s.str(), in);
  if (in.size() == 4) check_shape(in[3].shape == Shape{n}, kOp, "bias must be (N)", in);
  Shape y = x;
  y[y.rank() - 1] = n;
  return {TensorMeta{y, DType::f32}};
}

// linear_q4's reference, reading codes and scales through the packed layout.
void linear_q4_packed_reference(const KernelCall& c) {
  const TensorView &x = c.in(0), &wp = c.in(1), &sp = c.in(2);
  const int64_t k = x.shape().last(), rows = x.shape().rows(), n = c.p<PackedLinearParams>().out;
  const int64_t groups = k / quant::kQ4Group;
  std::vector<int8_t> q(static_cast<size_t>(k));
  std::vector<float> sx(static_cast<size_t>(groups));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < groups; ++g)
      sx[size_t(g)] = quant::quantize_int8(x.as<float>() + r * k + g * 32, 32, q.data() + g * 32);
    for (int64_t o = 0; o < n; ++o) {
      double y = c.inputs.size() == 4 ? c.in(3).as<float>()[o] : 0.0;
      for (int64_t g = 0; g < groups; ++g) {
        int64_t acc = 0;
        for (int64_t i = g * 32; i < g * 32 + 32; ++i)
          acc += int64_t(q[size_t(i)]) * packed::q4_packed_code(wp.as<uint8_t>(), k, o, i);
        const float sw = sp.as<float>()[((o / packed::kPanel) * groups + g) * packed::kPanel + o % packed::kPanel];
        y += double(acc) * sx[size_t(g)] * sw;
      }
      st(c.out(0), r * n + o, y);
    }
  }
}

// Row counts around the kernel's row tiles (1, 2, 3, 5, 8, 9, 16, 17), N as
// whole panels and with a partial last one, one group and many; one row of
// zeros (scale 0).
std::vector<TestCase> linear_q4_packed_cases() {
  auto c = [](std::string label, Shape x, int64_t n, bool bias, double lo = -2, double hi = 2) {
    const int64_t k = x.last();
    TestCase t{std::move(label),
               {no_grad(spec(x, DType::f32, lo, hi)),
                no_grad(InputSpec{TensorMeta{packed::q4_packed_shape(n, k), DType::u8}, 0, 256, false, {}}),
                no_grad(spec(packed::q4_packed_scale_shape(n, k), DType::f32, 0.001, 0.05))},
               PackedLinearParams{n}};
    if (bias) t.inputs.push_back(no_grad(spec({n})));
    return t;
  };
  std::vector<TestCase> cases = {
      c("1x32 -> 3", {1, 32}, 3, true, -3, 3),
      c("2x96 -> 33 no bias", {2, 96}, 33, false),
      c("3x5x256 -> 40", {3, 5, 256}, 40, true, -4, 4),
      c("5x64 -> 48", {5, 64}, 48, true),
      c("8x256 -> 64 no bias", {8, 256}, 64, false),
      c("9x128 -> 9", {9, 128}, 9, true),
      c("16x256 -> 200", {16, 256}, 200, true),
      c("17x1024 -> 65", {17, 1024}, 65, true),
  };
  TestCase zero = c("zero row", {2, 64}, 9, true);
  zero.inputs[0] = InputSpec{TensorMeta{Shape{2, 64}, DType::f32}, 0, 0, false, std::vector<double>(128, 0.0)};
  cases.push_back(zero);
  return cases;
}

// Scratch: the activation codes (K bytes per row), then per row and group
// its scale and its code sum.
size_t q4_packed_workspace(std::span<const TensorMeta> in, const core::OpParams&) {
  const int64_t k = in[0].shape.last(), rows = in[0].shape.rows();
  return size_t(rows) * size_t(k + 8 * (k / 32 + 1)) + 64;
}

}  // namespace

core::OpDef linear_q4_packed_def() {
  OpDef d;
  d.kind = OpKind::linear_q4_packed;
  d.name = kOp;
  d.infer = infer_linear_q4_packed;
  d.reference = linear_q4_packed_reference;
  d.test_cases = linear_q4_packed_cases;
  d.workspace_bytes = q4_packed_workspace;
  return d;
}

}  // namespace brisk::ops
