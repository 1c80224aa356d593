// A vectorisable exp and running maximum, for loops over many floats: the
// CPU kernels (softmax, cross-entropy, attention) and the sampler, which
// weighs a whole vocabulary per drawn token. glibc's expf is only vectorised
// under -ffast-math, so this is the Cephes expf (range reduction by ln 2,
// degree-6 polynomial, exponent by integer shift) written with plain
// arithmetic and selects that `#pragma omp simd` turns into AVX code (GCC
// if-converts the selects only under -fno-trapping-math, set in CMakeLists).
// Accuracy: within 2 ulp for x in [-87.3, 88]; below that 0, above +inf; NaN stays NaN.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>

namespace brisk::core {

// exp on [-87.3, 88], the input clamped into that range first: the ends give
// ~1e-38 and ~1.6e38 rather than 0 and inf, which keeps formulas such as
// GELU's x * e / (1 + e) finite without extra selects.
inline float fast_exp_clamped(float x) {
  constexpr float kHi = 88.f, kLo = -87.3365447504019f;
  // The clamp sends NaN to kLo (NaN < anything is false): converting a NaN
  // n to int below would be undefined. fast_exp puts the NaN back.
  const float above_lo = kLo < x ? x : kLo;
  const float xc = above_lo < kHi ? above_lo : kHi;
  // Round to nearest by the 1.5 * 2^23 trick: branch-free and vectorisable.
  const float n = (xc * 1.44269504088896341f + 12582912.f) - 12582912.f;
  const float r = xc - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.f;
  return y * std::bit_cast<float>((int32_t(n) + 127) << 23);
}

// One step of a running maximum: std::max(m, x), spelled so that GCC 12
// vectorises a `#pragma omp simd reduction(max : m)` loop over it. With
// std::max itself it kept the loop scalar (one dependent vmaxss per element:
// a third of the bf16 attention forward's own time, by perf).
inline float max_step(float m, float x) { return m < x ? x : m; }

// exp with IEEE ends: 0 below the range, +inf above, NaN stays NaN.
inline float fast_exp(float x) {
  constexpr float kHi = 88.f, kLo = -87.3365447504019f;
  float e = fast_exp_clamped(x);
  // Separate selects: a chain of ?: keeps GCC from if-converting the loop.
  e = x < kLo ? 0.f : e;
  e = x > kHi ? std::numeric_limits<float>::infinity() : e;
  e = x != x ? x : e;
  return e;
}

}  // namespace brisk::core
