// The inference engine's fp32 Linear over a packed weight:
//
//   linear_packed(x (..., K), wp (ceil(N/16), K, 16) [, bias (N)]) -> y (..., N)
//
// with N in PackedLinearParams. The same function as `linear` on the
// unpacked W; only the weight's layout differs (brisk/ops/packed_linear.h
// says why). The panel slots past N are padding: the op never reads them
// into a result (the harness fills them with random values to prove it).
// Inference only: no backward.
#include <string>

#include "brisk/ops/packed_linear.h"
#include "op_util.h"

namespace brisk::ops {
using namespace detail;

namespace packed {

void pack(const float* w, int64_t n, int64_t k, float* out) {
  for (int64_t p = 0; p < panels(n); ++p)
    for (int64_t i = 0; i < k; ++i)
      for (int64_t j = 0; j < kPanel; ++j) {
        const int64_t o = p * kPanel + j;
        out[(p * k + i) * kPanel + j] = o < n ? w[o * k + i] : 0.f;
      }
}

void unpack_row(const float* packed, int64_t k, int64_t o, float* row) {
  const float* panel = packed + (o / kPanel) * k * kPanel + o % kPanel;
  for (int64_t i = 0; i < k; ++i) row[i] = panel[i * kPanel];
}

}  // namespace packed

namespace {

constexpr std::string_view kOp = "linear_packed";

std::vector<TensorMeta> infer_linear_packed(std::span<const TensorMeta> in, const core::OpParams& params) {
  check_shape(in.size() == 2 || in.size() == 3, kOp, "takes (x, wp) or (x, wp, bias)", in);
  for (size_t i = 0; i < in.size(); ++i) check_dtype(kOp, in[i], DType::f32, i == 0 ? "x" : i == 1 ? "wp" : "bias");
  const int64_t n = std::get<PackedLinearParams>(params).out;
  const Shape& x = in[0].shape;
  check_shape(x.rank() >= 1 && n >= 1, kOp, "x must be (..., K) and the output count N >= 1 (N = " + std::to_string(n) + ")", in);
  check_shape(in[1].shape == packed::packed_shape(n, x.last()), kOp,
              "wp must be (ceil(N/16), K, 16) = " + packed::packed_shape(n, x.last()).str() + " for N = " +
                  std::to_string(n),
              in);
  return linear_output(kOp, in, 2, n);
}

void linear_packed_reference(const KernelCall& c) {
  const TensorView &x = c.in(0), &wp = c.in(1);
  const int64_t n = c.p<PackedLinearParams>().out, k = x.shape().last(), rows = x.shape().rows();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < n; ++o) {
      double acc = c.inputs.size() == 3 ? ld(c.in(2), o) : 0.0;
      const int64_t base = (o / packed::kPanel) * k * packed::kPanel + o % packed::kPanel;
      for (int64_t i = 0; i < k; ++i) acc += ld(x, r * k + i) * ld(wp, base + i * packed::kPanel);
      st(c.out(0), r * n + o, acc);
    }
}

// Row counts around the kernels' row groups (1, 5, 6, 7, 12, 13, 16, 40),
// N as whole panels and with a partial last one (5, 37, 130), K short, odd
// and past a vector (7, 100, 256, 1024), with and without bias.
std::vector<TestCase> linear_packed_cases() {
  auto c = [](std::string label, Shape x, int64_t n, bool bias) {
    const int64_t k = x.last();
    TestCase t{std::move(label), {no_grad(spec(x, DType::f32, -2, 2)), no_grad(spec(packed::packed_shape(n, k)))},
               PackedLinearParams{n}};
    if (bias) t.inputs.push_back(no_grad(spec({n})));
    return t;
  };
  return {
      c("1x64 -> 5", {1, 64}, 5, true),
      c("1x7 -> 16 no bias", {1, 7}, 16, false),
      c("5x100 -> 37", {5, 100}, 37, true),
      c("6x256 -> 48", {6, 256}, 48, true),
      c("7x256 -> 130 no bias", {7, 256}, 130, false),
      c("12x33 -> 20", {12, 33}, 20, true),
      c("2x8x256 -> 64", {2, 8, 256}, 64, true),
      c("13x1024 -> 40", {13, 1024}, 40, true),
      c("16x256 -> 200 no bias", {16, 256}, 200, false),
      c("40x64 -> 33", {40, 64}, 33, true),
      // 131 panels, the last partial: 16- and 8-row wide tiles (AVX-512) and a 3-row rest.
      c("27x40 -> 2085", {27, 40}, 2085, true),
  };
}

}  // namespace

core::OpDef linear_packed_def() {
  OpDef d;
  d.kind = OpKind::linear_packed;
  d.name = kOp;
  d.infer = infer_linear_packed;
  d.reference = linear_packed_reference;
  d.test_cases = linear_packed_cases;
  return d;
}

}  // namespace brisk::ops
