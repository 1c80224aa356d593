// The normalising half of a LayerNorm row, shared by the layernorm and
// add_layernorm kernels (the fused kernel computes the row's sum while it
// adds, then normalises the same way): variance about `mean`, then
// y = (x - mean) * rstd * w + b, written as Y (T, or narrower under an f32 T).
// Returns rstd. f32 arithmetic whatever T.
#pragma once

#include <cmath>
#include <cstdint>

#include "cpu_util.h"

namespace brisk::cpu {

template <class T, class Y = T>
inline float layernorm_normalize_row(const T* x, const T* w, const T* b, int64_t C, float mean, float inv_c,
                                     float eps, Y* y) {
  float var = 0.f;
#pragma omp simd reduction(+ : var)
  for (int64_t i = 0; i < C; ++i) {
    const float d = widen(x[i]) - mean;
    var += d * d;
  }
  const float rstd = 1.f / std::sqrt(var * inv_c + eps);
#pragma omp simd
  for (int64_t i = 0; i < C; ++i) y[i] = narrow<Y>((widen(x[i]) - mean) * rstd * widen(w[i]) + widen(b[i]));
  return rstd;
}

}  // namespace brisk::cpu
