// CPU kernels of add_layernorm (src/ops/add_layernorm.cpp), f32 and bf16
// (under an f32 a, r and y may be bf16/f16: mixed precision):
// s = a + r, y = layernorm(s), one row at a time. The first loop writes the
// row of s and sums it, so the row is in L1 for the variance and the
// normalization that follow; the unfused pair writes s in one parallel pass
// and reads it back in another. Arithmetic is layernorm.cpp's, on s as
// stored (rounded to bf16 for bf16), so fused and unfused agree. Rows are
// split across threads as in layernorm.cpp; r may be broadcast over a's
// leading dims (row index modulo r's rows).
#include <cmath>

#include "brisk/core/op.h"
#include "cpu_util.h"
#include "kernels.h"
#include "layernorm_row.h"

namespace brisk::cpu {
namespace {

using core::KernelCall;

// R: r's storage, T's or (mixed precision, under an f32 a) bf16/f16; Y: y's
// storage, T's or narrower (LayerNormParams::narrow_to).
template <class T, class R = T, class Y = T>
void add_layernorm_kernel(const KernelCall& c) {
  const T* a = c.in(0).as<const T>();
  const R* res = c.in(1).as<const R>();
  const T* w = c.in(2).as<const T>();
  const T* b = c.in(3).as<const T>();
  T* s = c.out(0).as<T>();
  Y* y = c.out(1).as<Y>();
  float* mean_out = c.out(2).as<float>();
  float* rstd_out = c.out(3).as<float>();
  const int64_t C = c.in(0).shape().last(), rows = c.in(0).shape().rows();
  const int64_t r_rows = c.in(1).numel() / std::max<int64_t>(C, 1);
  const float eps = c.p<core::LayerNormParams>().eps;
  const float inv_c = C ? 1.f / float(C) : 0.f;
  parallel_for(rows, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(C, 1)), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const T* ar = a + r * C;
      const R* rr = res + (r_rows ? r % r_rows : 0) * C;
      T* sr = s + r * C;
      Y* yr = y + r * C;
      float sum = 0.f;
#pragma omp simd reduction(+ : sum)
      for (int64_t i = 0; i < C; ++i) {
        const T v = narrow<T>(widen(ar[i]) + widen(rr[i]));
        sr[i] = v;
        sum += widen(v);
      }
      const float mean = sum * inv_c;
      mean_out[r] = mean;
      rstd_out[r] = layernorm_normalize_row(sr, w, b, C, mean, inv_c, eps, yr);
    }
  });
}

// f32 a: r and y each in f32, bf16 or f16.
void add_layernorm_f32(const KernelCall& c) {
  with_storage_of(c.in(1).dtype(), [&](auto r) {
    with_storage_of(c.out(1).dtype(), [&](auto y) { add_layernorm_kernel<float, decltype(r), decltype(y)>(c); });
  });
}

}  // namespace

void register_add_layernorm_kernels(core::KernelRegistry& r) {
  r.add(core::OpKind::add_layernorm, core::DType::f32, add_layernorm_f32);
  r.add(core::OpKind::add_layernorm, core::DType::bf16, add_layernorm_kernel<uint16_t>);
}

}  // namespace brisk::cpu
