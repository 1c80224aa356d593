// CPU kernels for softmax over the last dim and its backward, f32 and bf16.
// One row per iteration, rows split across threads. f32 stores exp(x - max)
// straight into y and rescales in place (three passes over an L1-resident
// row); bf16 recomputes the exponentials instead of needing an f32 row buffer.
// exp is the vectorised fast_exp: std::exp would not vectorise and dominates.
#include "brisk/core/op.h"
#include "cpu_util.h"
#include "kernels.h"
#include "vec_math.h"

namespace brisk::cpu {
namespace {

using core::KernelCall;


template <class T>
float row_max(const T* x, int64_t n) {
  float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
  for (int64_t i = 0; i < n; ++i) mx = max_step(mx, widen(x[i]));
  return mx;
}

template <class T>
void softmax_kernel(const KernelCall& c) {
  const T* x = c.in(0).as<const T>();
  T* y = c.out(0).as<T>();
  const int64_t C = c.in(0).shape().last(), rows = c.in(0).shape().rows();
  parallel_for(rows, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(C, 1) / 4), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const T* xr = x + r * C;
      T* yr = y + r * C;
      const float mx = row_max(xr, C);
      float s = 0.f;
      if constexpr (std::is_same_v<T, float>) {
#pragma omp simd reduction(+ : s)
        for (int64_t i = 0; i < C; ++i) {
          const float e = fast_exp(xr[i] - mx);
          yr[i] = e;
          s += e;
        }
        const float inv = 1.f / s;
#pragma omp simd
        for (int64_t i = 0; i < C; ++i) yr[i] *= inv;
      } else {
#pragma omp simd reduction(+ : s)
        for (int64_t i = 0; i < C; ++i) s += fast_exp(widen(xr[i]) - mx);
        const float inv = 1.f / s;
        for (int64_t i = 0; i < C; ++i) yr[i] = narrow<T>(fast_exp(widen(xr[i]) - mx) * inv);
      }
    }
  });
}

// dx = y * (dy - sum(dy * y))
template <class T>
void softmax_backward_kernel(const KernelCall& c) {
  const T* y = c.in(0).as<const T>();
  const T* dy = c.in(1).as<const T>();
  T* dx = c.out(0).as<T>();
  const int64_t C = c.in(0).shape().last(), rows = c.in(0).shape().rows();
  parallel_for(rows, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(C, 1)), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const T* yr = y + r * C;
      const T* gr = dy + r * C;
      T* dr = dx + r * C;
      float s = 0.f;
#pragma omp simd reduction(+ : s)
      for (int64_t i = 0; i < C; ++i) s += widen(gr[i]) * widen(yr[i]);
#pragma omp simd
      for (int64_t i = 0; i < C; ++i) dr[i] = narrow<T>(widen(yr[i]) * (widen(gr[i]) - s));
    }
  });
}

}  // namespace

void register_softmax_kernels(core::KernelRegistry& r) {
  using core::DType;
  using core::OpKind;
  r.add(OpKind::softmax, DType::f32, softmax_kernel<float>);
  r.add(OpKind::softmax, DType::bf16, softmax_kernel<uint16_t>);
  r.add(OpKind::softmax_backward, DType::f32, softmax_backward_kernel<float>);
  r.add(OpKind::softmax_backward, DType::bf16, softmax_backward_kernel<uint16_t>);
}

}  // namespace brisk::cpu
