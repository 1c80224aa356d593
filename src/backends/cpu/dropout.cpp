// CPU kernels for dropout (src/ops/dropout.cpp): per tile of elements,
// each one's factor (1 / (1 - p) or 0, dropout_factors.h), then the
// product. Threads take contiguous ranges; an element's factor does not
// depend on which thread makes it.
#include <algorithm>

#include "brisk/core/op.h"
#include "cpu_util.h"
#include "dropout_factors.h"
#include "kernels.h"

namespace brisk::cpu {
namespace {

using core::KernelCall;

constexpr int64_t kTile = 1024;

DropoutMask mask_of(const KernelCall& c) {
  const auto& p = c.p<core::DropoutParams>();
  return DropoutMask(c.in(1).as<int32_t>(), p.p, p.site);
}

void dropout_f32(const KernelCall& c) {
  const float* x = c.in(0).as<float>();
  float* y = c.out(0).as<float>();
  const DropoutMask mask = mask_of(c);
  parallel_for(c.in(0).numel(), kParallelGrain, [&](int64_t lo, int64_t hi) {
    float f[kTile];
    for (int64_t i = lo; i < hi; i += kTile) {
      const int64_t n = std::min(kTile, hi - i);
      mask.factors(i, n, f);
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
  const DropoutMask mask = mask_of(c);
  parallel_for(c.in(0).numel(), kParallelGrain, [&](int64_t lo, int64_t hi) {
    float f[kTile], v[kTile];
    for (int64_t i = lo; i < hi; i += kTile) {
      const int64_t n = std::min(kTile, hi - i);
      mask.factors(i, n, f);
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
