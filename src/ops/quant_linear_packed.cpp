// The inference engine's quantized Linears over packed weights:
//
//   linear_q8_packed(x (..., K), wp u8 (ceil(N/16), ceil(K/4), 64), scale (N) [, bias (N)]) -> y (..., N)
//   linear_q4_packed(x (..., K), wp u8 (ceil(N/16), K/32, 256), sp (ceil(N/16), K/32, 16) [, bias (N)]) -> y (..., N)
//
// with N in PackedLinearParams. The same functions as linear_q8 and
// linear_q4 on the unpacked weights (activations quantized to int8 inside
// the op, per row for q8 and per group of 32 for q4, exact int32 sums, then
// the scaling); only the layouts differ (brisk/ops/packed_linear.h says
// why). The slots past N (and past K for q8) are padding that never reaches
// a result: the harness fills them with random bytes to prove it. Inference
// only: no backward.
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

// Shapes shared by both ops: x f32 (..., K), wp u8 and the scales f32 in
// their packed shapes for N, an optional bias (N).
std::vector<TensorMeta> infer_packed_quant(std::string_view op, std::span<const TensorMeta> in,
                                           const core::OpParams& params, bool q4) {
  const char* scale_name = q4 ? "sp" : "scale";
  check_shape(in.size() == 3 || in.size() == 4, op,
              std::string("takes (x, wp, ") + scale_name + ") or (x, wp, " + scale_name + ", bias)", in);
  check_dtype(op, in[0], DType::f32, "x");
  check_dtype(op, in[1], DType::u8, "wp");
  for (size_t i = 2; i < in.size(); ++i) check_dtype(op, in[i], DType::f32, i == 2 ? scale_name : "bias");
  const int64_t n = std::get<PackedLinearParams>(params).out;
  const Shape& x = in[0].shape;
  check_shape(x.rank() >= 1 && n >= 1, op, "x must be (..., K) and the output count N >= 1 (N = " + std::to_string(n) + ")", in);
  const int64_t k = x.last();
  if (q4) {
    check_shape(k % quant::kQ4Group == 0, op, "K must be a multiple of 32", in);
    const Shape want = packed::q4_packed_shape(n, k), want_s = packed::q4_packed_scale_shape(n, k);
    check_shape(in[1].shape == want, op,
                "wp must be (ceil(N/16), K/32, 256) = " + want.str() + " for N = " + std::to_string(n), in);
    check_shape(in[2].shape == want_s, op, "sp must be (ceil(N/16), K/32, 16) = " + want_s.str(), in);
  } else {
    const Shape want = packed::q8_packed_shape(n, k);
    check_shape(in[1].shape == want, op,
                "wp must be (ceil(N/16), ceil(K/4), 64) = " + want.str() + " for N = " + std::to_string(n), in);
    check_shape(in[2].shape == Shape{n}, op, "scale must be (N)", in);
  }
  return linear_output(op, in, 3, n);
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

// One harness case: x, random packed bytes (padding included) and scales in
// the op's shapes, an optional bias.
TestCase packed_case(std::string label, Shape x, int64_t n, bool bias, bool q4, double lo = -2, double hi = 2) {
  const int64_t k = x.last();
  const Shape w = q4 ? packed::q4_packed_shape(n, k) : packed::q8_packed_shape(n, k);
  const Shape s = q4 ? packed::q4_packed_scale_shape(n, k) : Shape{n};
  TestCase t{std::move(label),
             {no_grad(spec(x, DType::f32, lo, hi)), no_grad(InputSpec{TensorMeta{w, DType::u8}, 0, 256, false, {}}),
              no_grad(spec(s, DType::f32, 0.001, 0.05))},
             PackedLinearParams{n}};
  if (bias) t.inputs.push_back(no_grad(spec({n})));
  return t;
}

// The same case with x a row of zeros (scale 0).
TestCase zero_rows_case(int64_t rows, int64_t k, int64_t n, bool q4) {
  TestCase t = packed_case("zero row", {rows, k}, n, true, q4);
  t.inputs[0] = InputSpec{TensorMeta{Shape{rows, k}, DType::f32}, 0, 0, false, std::vector<double>(size_t(rows * k), 0.0)};
  return t;
}

// Row counts around the kernels' row tiles (1, 2, 3, 5, 8, 9, 16, 17), N as
// whole panels and with a partial last one; for q8 K a multiple of 4 and
// not (the last group's padding), past a 64-byte vector; for q4 one group
// and many; one row of zeros.
std::vector<TestCase> linear_q8_packed_cases() {
  return {
      packed_case("1x64 -> 5", {1, 64}, 5, true, false, -3, 3),
      packed_case("2x100 -> 37 no bias", {2, 100}, 37, false, false),
      packed_case("3x2x255 -> 130", {3, 2, 255}, 130, true, false, -5, 5),
      packed_case("5x33 -> 48", {5, 33}, 48, true, false),
      packed_case("8x256 -> 64 no bias", {8, 256}, 64, false, false),
      packed_case("9x70 -> 9", {9, 70}, 9, true, false),
      packed_case("16x256 -> 200", {16, 256}, 200, true, false),
      packed_case("17x1024 -> 64", {17, 1024}, 64, true, false),
      zero_rows_case(2, 70, 9, false),
  };
}

std::vector<TestCase> linear_q4_packed_cases() {
  return {
      packed_case("1x32 -> 3", {1, 32}, 3, true, true, -3, 3),
      packed_case("2x96 -> 33 no bias", {2, 96}, 33, false, true),
      packed_case("3x5x256 -> 40", {3, 5, 256}, 40, true, true, -4, 4),
      packed_case("5x64 -> 48", {5, 64}, 48, true, true),
      packed_case("8x256 -> 64 no bias", {8, 256}, 64, false, true),
      packed_case("9x128 -> 9", {9, 128}, 9, true, true),
      packed_case("16x256 -> 200", {16, 256}, 200, true, true),
      packed_case("17x1024 -> 65", {17, 1024}, 65, true, true),
      zero_rows_case(2, 64, 9, true),
  };
}

// Scratch: the activation codes, each row padded to 64 bytes (zeros past K,
// which the last group reads), then per row its scale and code sum.
size_t q8_packed_workspace(std::span<const TensorMeta> in, const core::OpParams&) {
  const int64_t k = in[0].shape.last(), rows = in[0].shape.rows();
  return size_t(rows) * size_t((k + 63) / 64 * 64 + 8) + 64;
}

// Scratch: the activation codes (K bytes per row), then per row and group
// its scale and its code sum.
size_t q4_packed_workspace(std::span<const TensorMeta> in, const core::OpParams&) {
  const int64_t k = in[0].shape.last(), rows = in[0].shape.rows();
  return size_t(rows) * size_t(k + 8 * (k / 32 + 1)) + 64;
}

}  // namespace

core::OpDef linear_q8_packed_def() {
  OpDef d;
  d.kind = OpKind::linear_q8_packed;
  d.name = "linear_q8_packed";
  d.infer = [](std::span<const TensorMeta> in, const core::OpParams& p) {
    return infer_packed_quant("linear_q8_packed", in, p, false);
  };
  d.reference = linear_q8_packed_reference;
  d.test_cases = linear_q8_packed_cases;
  d.workspace_bytes = q8_packed_workspace;
  return d;
}

core::OpDef linear_q4_packed_def() {
  OpDef d;
  d.kind = OpKind::linear_q4_packed;
  d.name = "linear_q4_packed";
  d.infer = [](std::span<const TensorMeta> in, const core::OpParams& p) {
    return infer_packed_quant("linear_q4_packed", in, p, true);
  };
  d.reference = linear_q4_packed_reference;
  d.test_cases = linear_q4_packed_cases;
  d.workspace_bytes = q4_packed_workspace;
  return d;
}

}  // namespace brisk::ops
