// CPU kernels for add, mul, scale: one vectorised pass, threads for large
// tensors. The broadcast operand (a's trailing dims) repeats every nb elements.
// bf16 widens tiles to f32, computes and rounds once, as PyTorch does. add's
// second operand may be bf16/f16 under an f32 first (mixed precision).
#include <algorithm>

#include "brisk/core/op.h"
#include "cpu_util.h"
#include "kernels.h"

namespace brisk::cpu {
namespace {

using core::KernelCall;

// TB: b's storage, f32 or (add under an f32 a) bf16/f16, widened per element.
template <bool kMul, class TB = float>
void binary_f32(const KernelCall& c) {
  const float* a = c.in(0).as<float>();
  const TB* b = c.in(1).as<TB>();
  float* y = c.out(0).as<float>();
  const int64_t n = c.in(0).numel(), nb = c.in(1).numel();
  if (nb == n) {
    parallel_for(n, kParallelGrain, [&](int64_t lo, int64_t hi) {
#pragma omp simd
      for (int64_t i = lo; i < hi; ++i) y[i] = kMul ? a[i] * widen(b[i]) : a[i] + widen(b[i]);
    });
    return;
  }
  const int64_t rows = n / nb;
  parallel_for(rows, std::max<int64_t>(1, kParallelGrain / nb), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const float* ar = a + r * nb;
      float* yr = y + r * nb;
#pragma omp simd
      for (int64_t i = 0; i < nb; ++i) yr[i] = kMul ? ar[i] * widen(b[i]) : ar[i] + widen(b[i]);
    }
  });
}

// add with an f32 a: b in f32, or the low-precision branch of mixed precision.
void add_f32(const KernelCall& c) {
  with_storage_of(c.in(1).dtype(), [&](auto b) { binary_f32<false, decltype(b)>(c); });
}

void scale_f32(const KernelCall& c) {
  const float* a = c.in(0).as<float>();
  float* y = c.out(0).as<float>();
  const float s = c.p<core::ScaleParams>().scale;
  parallel_for(c.in(0).numel(), kParallelGrain, [&](int64_t lo, int64_t hi) {
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) y[i] = a[i] * s;
  });
}

// ---- bf16: widen a tile of each operand, compute in f32, narrow -----------------
constexpr int64_t kTile = 512;

// Walks [lo, hi) in tiles that never cross a repeat of the broadcast operand,
// so each tile of a lines up with one contiguous stretch of b.
template <bool kMul>
void binary_bf16_range(const uint16_t* a, const uint16_t* b, uint16_t* y, int64_t nb, int64_t lo, int64_t hi) {
  float af[kTile], bf[kTile];
  for (int64_t i = lo; i < hi;) {
    const int64_t j = i % nb;
    const int64_t len = std::min({kTile, hi - i, nb - j});
    bf16_to_f32_row(a + i, af, len);
    bf16_to_f32_row(b + j, bf, len);
#pragma omp simd
    for (int64_t k = 0; k < len; ++k) af[k] = kMul ? af[k] * bf[k] : af[k] + bf[k];
    f32_to_bf16_row(af, y + i, len);
    i += len;
  }
}

template <bool kMul>
void binary_bf16(const KernelCall& c) {
  const uint16_t* a = c.in(0).as<uint16_t>();
  const uint16_t* b = c.in(1).as<uint16_t>();
  uint16_t* y = c.out(0).as<uint16_t>();
  const int64_t n = c.in(0).numel(), nb = c.in(1).numel();
  if (nb == 1) {  // a scalar operand: tiles of one element would crawl
    const float s = core::bf16_to_f32(b[0]);
    parallel_for(n, kParallelGrain, [&](int64_t lo, int64_t hi) {
#pragma omp simd
      for (int64_t i = lo; i < hi; ++i) {
        const float x = core::bf16_to_f32(a[i]);
        y[i] = core::f32_to_bf16(kMul ? x * s : x + s);
      }
    });
    return;
  }
  parallel_for(n, kParallelGrain, [&](int64_t lo, int64_t hi) { binary_bf16_range<kMul>(a, b, y, nb, lo, hi); });
}

void scale_bf16(const KernelCall& c) {
  const uint16_t* a = c.in(0).as<uint16_t>();
  uint16_t* y = c.out(0).as<uint16_t>();
  const float s = c.p<core::ScaleParams>().scale;
  parallel_for(c.in(0).numel(), kParallelGrain, [&](int64_t lo, int64_t hi) {
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) y[i] = core::f32_to_bf16(core::bf16_to_f32(a[i]) * s);
  });
}

}  // namespace

void register_elementwise_kernels(core::KernelRegistry& r) {
  r.add(core::OpKind::add, core::DType::f32, add_f32);
  r.add(core::OpKind::mul, core::DType::f32, binary_f32<true>);
  r.add(core::OpKind::scale, core::DType::f32, scale_f32);
  r.add(core::OpKind::add, core::DType::bf16, binary_bf16<false>);
  r.add(core::OpKind::mul, core::DType::bf16, binary_bf16<true>);
  r.add(core::OpKind::scale, core::DType::bf16, scale_bf16);
}

}  // namespace brisk::cpu
