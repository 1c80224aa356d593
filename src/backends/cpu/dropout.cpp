// CPU kernels for dropout (src/ops/dropout.cpp): per tile of elements,
// each one's factor (1 / (1 - p) or 0) from brisk/ops/dropout.h's hash,
// then the product. The hash is 32-bit multiplies, shifts and xors, which
// the compiler vectorises (vpmulld); threads take contiguous ranges, and an
// element's bits do not depend on which thread makes them.
#include <algorithm>

#include "brisk/core/op.h"
#include "brisk/ops/dropout.h"
#include "cpu_util.h"
#include "kernels.h"

namespace brisk::cpu {
namespace {

using core::KernelCall;

constexpr int64_t kTile = 1024;

// f[k] = 1 / (1 - p) where element lo + k is kept, 0 where it is dropped,
// for k in [0, n): a loop of 32-bit integer arithmetic that vectorises,
// in stretches that share the index's high 32 bits (one stream each).
void keep_factors(const KernelCall& c, int64_t lo, int64_t n, float* f) {
  const auto& p = c.p<core::DropoutParams>();
  const int32_t* key = c.in(1).as<int32_t>();
  const uint32_t threshold = ops::dropout_threshold(p.p);
  const float scale = float(1.0 / (1.0 - double(p.p)));
  for (int64_t done = 0; done < n;) {
    const int64_t i = lo + done;
    const uint64_t high = uint64_t(i) >> 32;
    const int64_t len = std::min<int64_t>(n - done, int64_t((high + 1) << 32) - i);
    const ops::DropoutStream s = ops::dropout_stream(uint32_t(key[0]), uint32_t(key[1]), p.site, uint32_t(high));
    const uint32_t base = uint32_t(i);
    float* out = f + done;
#pragma omp simd
    for (int64_t k = 0; k < len; ++k) out[k] = ops::dropout_bits(s, base + uint32_t(k)) >= threshold ? scale : 0.f;
    done += len;
  }
}

void dropout_f32(const KernelCall& c) {
  const float* x = c.in(0).as<float>();
  float* y = c.out(0).as<float>();
  parallel_for(c.in(0).numel(), kParallelGrain, [&](int64_t lo, int64_t hi) {
    float f[kTile];
    for (int64_t i = lo; i < hi; i += kTile) {
      const int64_t n = std::min(kTile, hi - i);
      keep_factors(c, i, n, f);
      const float* __restrict xi = x + i;
      float* __restrict yi = y + i;
#pragma omp simd
      for (int64_t k = 0; k < n; ++k) yi[k] = f[k] != 0.f ? xi[k] * f[k] : 0.f;  // 0 even for an inf
    }
  });
}

void dropout_bf16(const KernelCall& c) {
  const uint16_t* x = c.in(0).as<uint16_t>();
  uint16_t* y = c.out(0).as<uint16_t>();
  parallel_for(c.in(0).numel(), kParallelGrain, [&](int64_t lo, int64_t hi) {
    float f[kTile], v[kTile];
    for (int64_t i = lo; i < hi; i += kTile) {
      const int64_t n = std::min(kTile, hi - i);
      keep_factors(c, i, n, f);
      bf16_to_f32_row(x + i, v, n);
#pragma omp simd
      for (int64_t k = 0; k < n; ++k) v[k] = f[k] != 0.f ? v[k] * f[k] : 0.f;
      f32_to_bf16_row(v, y + i, n);
    }
  });
}

}  // namespace

void register_dropout_kernels(core::KernelRegistry& r) {
  r.add(core::OpKind::dropout, core::DType::f32, dropout_f32);
  r.add(core::OpKind::dropout, core::DType::bf16, dropout_bf16);
}

}  // namespace brisk::cpu
