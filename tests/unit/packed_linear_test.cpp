// linear_packed (the inference engine's fp32 Linear) on the CPU backend over
// row counts that take each of its tiles: 16- and 8-row wide tiles (AVX-512,
// over a head-sized output), six-row groups, and row blocks past 48. Each
// row's output must be bit for bit what the same row gives alone (decoding
// is batch-invariant only if this holds), and close to a double-precision
// product.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "brisk/core/tensor.h"
#include "brisk/cpu/cpu_features.h"
#include "brisk/ops/ops.h"
#include "brisk/ops/packed_linear.h"
#include "brisk/ops/quant.h"
#include "test_util.h"

using namespace brisk;
using core::DType;
using core::Tensor;
using core::TensorView;

namespace {

// y (rows, n) = x W^T + bias through the linear_packed kernel.
std::vector<float> run_packed(const float* x, int64_t rows, const Tensor& wp, const Tensor& bias, int64_t n,
                              int64_t k) {
  Tensor xt = Tensor::empty({rows, k}, DType::f32);
  std::memcpy(xt.data_as<float>(), x, size_t(rows * k) * sizeof(float));
  Tensor y = Tensor::empty({rows, n}, DType::f32);
  const std::vector<TensorView> in{xt.as_view(), wp.as_view(), bias.as_view()}, out{y.as_view()};
  core::run_op(testing_util::backend(), core::OpKind::linear_packed, in, out, ops::PackedLinearParams{n});
  return std::vector<float>(y.data_as<float>(), y.data_as<float>() + rows * n);
}

}  // namespace

TEST(PackedLinear, EveryRowAsAloneAtEveryRowCount) {
  ops::register_ops();
  std::printf("[ info ] linear_packed path: %s\n", cpu::packed_path_name(cpu::cpu_features().packed));
  // n = 2085: 131 panels, the last one partial, and at least 64 panels per
  // thread on 2 threads (where the wide tiles start).
  for (const int64_t k : {40, 256}) {
    const int64_t n = 2085, max_rows = 59;
    SCOPED_TRACE("k " + std::to_string(k));
    const Tensor w = Tensor::uniform({n, k}, DType::f32, 3 + k, -1.f, 1.f);
    const Tensor bias = Tensor::uniform({n}, DType::f32, 5, -1.f, 1.f);
    const Tensor x = Tensor::uniform({max_rows, k}, DType::f32, 7, -2.f, 2.f);
    Tensor wp = Tensor::empty(ops::packed::packed_shape(n, k), DType::f32);
    ops::packed::pack(w.data_as<float>(), n, k, wp.data_as<float>());
    std::vector<std::vector<float>> alone(max_rows);
    for (int64_t r = 0; r < max_rows; ++r) alone[r] = run_packed(x.data_as<float>() + r * k, 1, wp, bias, n, k);
    for (const int64_t rows : {2, 7, 8, 13, 16, 24, 27, 48, 59}) {
      SCOPED_TRACE("rows " + std::to_string(rows));
      const std::vector<float> y = run_packed(x.data_as<float>(), rows, wp, bias, n, k);
      for (int64_t r = 0; r < rows; ++r) {
        ASSERT_EQ(std::memcmp(y.data() + r * n, alone[r].data(), size_t(n) * sizeof(float)), 0)
            << "row " << r << " differs from the same row alone";
      }
      for (int64_t r = 0; r < rows; r += 5)
        for (int64_t o = 0; o < n; o += 97) {
          double want = bias.data_as<float>()[o];
          for (int64_t t = 0; t < k; ++t) want += double(x.data_as<float>()[r * k + t]) * w.data_as<float>()[o * k + t];
          ASSERT_NEAR(y[r * n + o], want, 1e-4 * std::sqrt(double(k)) + 1e-5) << "row " << r << " output " << o;
        }
    }
  }
}

namespace {

// y (rows, n) through one of the quantized Linears (w and scale as the op takes them).
std::vector<float> run_q8(core::OpKind op, const float* x, int64_t rows, const Tensor& w, const Tensor& scale,
                          const Tensor& bias, int64_t n, int64_t k) {
  Tensor xt = Tensor::empty({rows, k}, DType::f32);
  std::memcpy(xt.data_as<float>(), x, size_t(rows * k) * sizeof(float));
  Tensor y = Tensor::empty({rows, n}, DType::f32);
  const std::vector<TensorView> in{xt.as_view(), w.as_view(), scale.as_view(), bias.as_view()}, out{y.as_view()};
  const core::OpDef& def = core::op_def(op);
  std::vector<core::TensorMeta> metas;
  for (const TensorView& v : in) metas.push_back(v.meta);
  const bool packed = op == core::OpKind::linear_q8_packed || op == core::OpKind::linear_q4_packed;
  const core::OpParams params = packed ? core::OpParams{ops::PackedLinearParams{n}} : core::OpParams{};
  std::vector<std::byte> ws(def.workspace_bytes(metas, params));
  core::run_op(testing_util::backend(), op, in, out, params, ws.data(), ws.size());
  return std::vector<float>(y.data_as<float>(), y.data_as<float>() + rows * n);
}

}  // namespace

// linear_q8_packed (the engine's int8 Linear on avx512_vnni CPUs) at row
// counts that take each of its tiles (8-row tiles, then 1-7 rows) over an
// output count with a partial last panel, K a multiple of 4 and not: each
// row's output is bit for bit the same row alone, and (on avx512_vnni) bit
// for bit linear_q8's over the unpacked weight, so packing changes no token.
TEST(PackedLinearQ8, SameBitsAsLinearQ8AndEveryRowAsAlone) {
  ops::register_ops();
  const bool vnni = cpu::cpu_features().int8 == cpu::Int8Dot::avx512_vnni;
  std::printf("[ info ] int8 path: %s\n", cpu::int8_dot_name(cpu::cpu_features().int8));
  for (const int64_t k : {70, 256}) {
    const int64_t n = 300, max_rows = 19;
    SCOPED_TRACE("k " + std::to_string(k));
    Tensor w = Tensor::empty({n, k}, DType::i8);
    uint32_t state = 12345u + uint32_t(k);
    for (int64_t i = 0; i < n * k; ++i) {
      state = state * 1664525u + 1013904223u;
      w.data_as<int8_t>()[i] = int8_t(int(state >> 24) - 128 == -128 ? 127 : int(state >> 24) - 128);
    }
    const Tensor scale = Tensor::uniform({n}, DType::f32, 3, 0.001f, 0.05f);
    const Tensor bias = Tensor::uniform({n}, DType::f32, 5, -1.f, 1.f);
    const Tensor x = Tensor::uniform({max_rows, k}, DType::f32, 7, -2.f, 2.f);
    Tensor wp = Tensor::empty(ops::packed::q8_packed_shape(n, k), DType::u8);
    ops::packed::pack_q8(w.data_as<int8_t>(), n, k, wp.data_as<uint8_t>());
    for (int64_t o : {0L, 17L, 299L})
      for (int64_t i : {0L, 3L, k - 1})
        ASSERT_EQ(ops::packed::q8_weight(wp.data_as<uint8_t>(), k, o, i), w.data_as<int8_t>()[o * k + i]);
    std::vector<std::vector<float>> alone(max_rows);
    for (int64_t r = 0; r < max_rows; ++r)
      alone[r] = run_q8(core::OpKind::linear_q8_packed, x.data_as<float>() + r * k, 1, wp, scale, bias, n, k);
    for (const int64_t rows : {1, 3, 7, 8, 9, 16, 19}) {
      SCOPED_TRACE("rows " + std::to_string(rows));
      const std::vector<float> y = run_q8(core::OpKind::linear_q8_packed, x.data_as<float>(), rows, wp, scale, bias, n, k);
      for (int64_t r = 0; r < rows; ++r)
        ASSERT_EQ(std::memcmp(y.data() + r * n, alone[r].data(), size_t(n) * sizeof(float)), 0)
            << "row " << r << " differs from the same row alone";
      const std::vector<float> plain = run_q8(core::OpKind::linear_q8, x.data_as<float>(), rows, w, scale, bias, n, k);
      if (vnni) {
        ASSERT_EQ(std::memcmp(y.data(), plain.data(), y.size() * sizeof(float)), 0) << "linear_q8 gives other bits";
      } else {
        for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], plain[i], 1e-5 * (1 + std::abs(plain[i])));
      }
    }
  }
  if (!vnni) std::printf("[ skip ] this CPU has no avx512_vnni: the bit-for-bit comparison with linear_q8 did not run\n");
}

// linear_q4_packed (the engine's int4 Linear on avx512_vnni CPUs): each row's
// output is bit for bit the same row alone at every row count, the scalar
// path gives the same bits as the AVX-512 one (same sums in the same order),
// and both stay within float rounding of linear_q4 over the unpacked codes.
TEST(PackedLinearQ4, EveryRowAsAloneAndEveryPathTheSameBits) {
  ops::register_ops();
  const bool vnni = cpu::cpu_features().int8 == cpu::Int8Dot::avx512_vnni;
  const int64_t n = 300, k = 256, max_rows = 19;
  const Tensor w = Tensor::uniform({n, k / 2}, DType::u8, 11, 0, 256);
  const Tensor scale = Tensor::uniform({n, k / 32}, DType::f32, 3, 0.001f, 0.05f);
  const Tensor bias = Tensor::uniform({n}, DType::f32, 5, -1.f, 1.f);
  const Tensor x = Tensor::uniform({max_rows, k}, DType::f32, 7, -2.f, 2.f);
  Tensor wp = Tensor::empty(ops::packed::q4_packed_shape(n, k), DType::u8);
  Tensor sp = Tensor::empty(ops::packed::q4_packed_scale_shape(n, k), DType::f32);
  ops::packed::pack_q4(w.data_as<uint8_t>(), scale.data_as<float>(), n, k, wp.data_as<uint8_t>(), sp.data_as<float>());
  for (int64_t o : {0L, 17L, 299L})
    for (int64_t i : {0L, 5L, 31L, 100L, k - 1})
      ASSERT_EQ(ops::packed::q4_packed_code(wp.data_as<uint8_t>(), k, o, i),
                ops::quant::q4_code(w.data_as<uint8_t>() + o * (k / 2) + (i / 32) * 16, int(i % 32)));
  std::vector<std::vector<float>> alone(max_rows);
  for (int64_t r = 0; r < max_rows; ++r)
    alone[r] = run_q8(core::OpKind::linear_q4_packed, x.data_as<float>() + r * k, 1, wp, sp, bias, n, k);
  for (const int64_t rows : {1, 2, 3, 5, 8, 9, 16, 19}) {
    SCOPED_TRACE("rows " + std::to_string(rows));
    const std::vector<float> y = run_q8(core::OpKind::linear_q4_packed, x.data_as<float>(), rows, wp, sp, bias, n, k);
    for (int64_t r = 0; r < rows; ++r)
      ASSERT_EQ(std::memcmp(y.data() + r * n, alone[r].data(), size_t(n) * sizeof(float)), 0)
          << "row " << r << " differs from the same row alone";
    const std::vector<float> plain = run_q8(core::OpKind::linear_q4, x.data_as<float>(), rows, w, scale, bias, n, k);
    for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], plain[i], 1e-5 * (1 + std::abs(plain[i])));
  }
  setenv("BRISK_INT8", "scalar", 1);
  cpu::reload_cpu_features();
  const std::vector<float> scalar = run_q8(core::OpKind::linear_q4_packed, x.data_as<float>(), max_rows, wp, sp, bias, n, k);
  unsetenv("BRISK_INT8");
  cpu::reload_cpu_features();
  for (int64_t r = 0; r < max_rows; ++r)
    ASSERT_EQ(std::memcmp(scalar.data() + r * n, alone[r].data(), size_t(n) * sizeof(float)), 0)
        << "row " << r << ": the scalar path gives other bits";
  if (!vnni) std::printf("[ skip ] this CPU has no avx512_vnni: both runs took the scalar path\n");
}
