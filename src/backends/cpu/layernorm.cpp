// CPU kernels for layernorm and layernorm_backward, f32 and bf16; under an f32
// x, y (and so dy) may be bf16 or f16 (mixed precision's narrowed LayerNorm).
//
// Rows are independent, so both ops split rows across threads; a row
// (C <= a few thousand floats) stays in L1 while it is read two or three
// times, so the statistics use the exact two-pass formula at the cost of one
// trip to memory. bf16 widens element by element inside the same loops (a
// shift), so no scratch is needed.
//
// dweight and dbias are sums over rows. Instead of per-thread partial sums
// (whose reduction order would depend on the thread count) a second pass
// splits the *columns* across threads and walks all rows in order: the result
// is bit-identical for any number of threads and needs no scratch memory.
#include <cmath>

#include "brisk/core/op.h"
#include "cpu_util.h"
#include "kernels.h"
#include "layernorm_row.h"

namespace brisk::cpu {
namespace {

using core::KernelCall;


// Y: y's storage, T's or (under an f32 x) a narrower one (LayerNormParams::narrow_to).
template <class T, class Y = T>
void layernorm_kernel(const KernelCall& c) {
  const T* x = c.in(0).as<const T>();
  const T* w = c.in(1).as<const T>();
  const T* b = c.in(2).as<const T>();
  Y* y = c.out(0).as<Y>();
  float* mean_out = c.out(1).as<float>();
  float* rstd_out = c.out(2).as<float>();
  const int64_t C = c.in(0).shape().last(), rows = c.in(0).shape().rows();
  const float eps = c.p<core::LayerNormParams>().eps;
  const float inv_c = C ? 1.f / float(C) : 0.f;
  parallel_for(rows, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(C, 1)), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const T* xr = x + r * C;
      Y* yr = y + r * C;
      float s = 0.f;
#pragma omp simd reduction(+ : s)
      for (int64_t i = 0; i < C; ++i) s += widen(xr[i]);
      const float mean = s * inv_c;
      mean_out[r] = mean;
      rstd_out[r] = layernorm_normalize_row(xr, w, b, C, mean, inv_c, eps, yr);
    }
  });
}

// dx = rstd * (g*w - mean(g*w) - xhat * mean(g*w*xhat)), xhat = (x - mean) * rstd.
// G: dy's storage, T's or (the gradient of a narrowed y) a narrower one.
// With a sixth input dres, dx = dres + that (the residual stream's gradient
// summed in while the row is in L1); with a fourth output, dx is also written
// as N (bf16 or f16 under an f32 x: the gradient of a low-precision branch).
template <class T, class G = T, class N = T>
void layernorm_backward_kernel(const KernelCall& c) {
  const G* dy = c.in(0).as<const G>();
  const T* x = c.in(1).as<const T>();
  const T* w = c.in(2).as<const T>();
  const float* mean = c.in(3).as<const float>();
  const float* rstd = c.in(4).as<const float>();
  T* dx = c.out(0).as<T>();
  T* dw = c.out(1).as<T>();
  T* db = c.out(2).as<T>();
  const T* dres = c.inputs.size() == 6 ? c.in(5).as<const T>() : nullptr;
  N* dxn = c.outputs.size() == 4 ? c.out(3).as<N>() : nullptr;
  const int64_t C = c.in(1).shape().last(), rows = c.in(1).shape().rows();
  const float inv_c = C ? 1.f / float(C) : 0.f;

  parallel_for(rows, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(C, 1)), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const G* gr = dy + r * C;
      const T* xr = x + r * C;
      T* dxr = dx + r * C;
      const float mu = mean[r], rs = rstd[r];
      float s1 = 0.f, s2 = 0.f;
#pragma omp simd reduction(+ : s1, s2)
      for (int64_t i = 0; i < C; ++i) {
        const float gw = widen(gr[i]) * widen(w[i]);
        s1 += gw;
        s2 += gw * (widen(xr[i]) - mu);
      }
      s1 *= inv_c;
      s2 *= inv_c * rs;  // mean(g*w*xhat)
#pragma omp simd
      for (int64_t i = 0; i < C; ++i) {
        const float xh = (widen(xr[i]) - mu) * rs;
        dxr[i] = narrow<T>(rs * (widen(gr[i]) * widen(w[i]) - s1 - xh * s2));
      }
      // As the unfused add and cast compute them: from dx rounded to T.
      if (dres) {
        const T* rr = dres + r * C;
#pragma omp simd
        for (int64_t i = 0; i < C; ++i) dxr[i] = narrow<T>(widen(rr[i]) + widen(dxr[i]));
      }
      if (dxn) {
        N* nr = dxn + r * C;
        for (int64_t i = 0; i < C; ++i) nr[i] = narrow<N>(widen(dxr[i]));
      }
    }
  });

  // Each thread owns a range of columns and walks every row in order over it
  // (contiguous runs, accumulators on the stack): the sums do not depend on
  // the thread count.
  constexpr int64_t kTile = 512;
  parallel_for(C, std::max<int64_t>(16, kParallelGrain / std::max<int64_t>(rows, 1)), [&](int64_t lo, int64_t hi) {
    for (int64_t c0 = lo; c0 < hi; c0 += kTile) {
      const int64_t n = std::min(kTile, hi - c0);
      float aw[kTile], ab[kTile];
      std::fill(aw, aw + n, 0.f);
      std::fill(ab, ab + n, 0.f);
      for (int64_t r = 0; r < rows; ++r) {
        const G* gr = dy + r * C + c0;
        const T* xr = x + r * C + c0;
        const float mu = mean[r], rs = rstd[r];
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) {
          const float g = widen(gr[i]);
          aw[i] += g * ((widen(xr[i]) - mu) * rs);
          ab[i] += g;
        }
      }
      for (int64_t i = 0; i < n; ++i) {
        dw[c0 + i] = narrow<T>(aw[i]);
        db[c0 + i] = narrow<T>(ab[i]);
      }
    }
  });
}

// f32 x: y (forward) or dy (backward) in f32, bf16 or f16.
void layernorm_f32(const KernelCall& c) {
  with_storage_of(c.out(0).dtype(), [&](auto y) { layernorm_kernel<float, decltype(y)>(c); });
}

void layernorm_backward_f32(const KernelCall& c) {
  const core::DType narrowed = c.outputs.size() == 4 ? c.out(3).dtype() : core::DType::f32;
  with_storage_of(c.in(0).dtype(), [&](auto dy) {
    with_storage_of(narrowed, [&](auto n) { layernorm_backward_kernel<float, decltype(dy), decltype(n)>(c); });
  });
}

}  // namespace

void register_layernorm_kernels(core::KernelRegistry& r) {
  using core::DType;
  using core::OpKind;
  r.add(OpKind::layernorm, DType::f32, layernorm_f32);
  r.add(OpKind::layernorm, DType::bf16, layernorm_kernel<uint16_t>);
  r.add(OpKind::layernorm_backward, DType::f32, layernorm_backward_f32);
  r.add(OpKind::layernorm_backward, DType::bf16, layernorm_backward_kernel<uint16_t>);
}

}  // namespace brisk::cpu
