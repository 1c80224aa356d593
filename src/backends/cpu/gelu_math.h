// The f32 tanh-GELU and its derivative for the CPU kernels, shared by the
// gelu ops (activation.cpp) and the linear_gelu epilogue (linear_gelu.cpp),
// so that the fused and the unfused graph compute bit-identical activations.
//
// GELU's tanh form is rewritten through the identity 1 + tanh(u) = 2 sigmoid(2u):
//   gelu(x) = x s,   s = 1 / (1 + e),   e = exp(-2u),   u = sqrt(2/pi) (x + 0.044715 x^3)
// which is the same function, but better conditioned: 1 + tanh(u) cancels
// badly for negative x, while 1 + e never does. The derivative uses the same
// e and s (from 1 - tanh^2 = 4 s (1 - s) and 1 - s = e s):
//   d gelu/dx = s (1 + 2 x (e s) sqrt(2/pi) (1 + 3 * 0.044715 x^2))
// with e s (<= 1) formed first: 2 x e overflowed to -inf for x <= -10 before.
//
// Speed: exp is vec_math.h's vectorized polynomial, and 1 / (1 + e) is a
// bit-trick guess refined by three Newton steps (about 1 ulp) rather than a
// division: on this Zen 3 the vector divide was over half of GELU's time
// (2.4 -> 1.1 ns per element, one core, L1-resident). The guess needs a
// normal result, so exp's argument is capped at 80 (s >= 1.8e-35): there
// gelu(x) is ~1e-34 * x instead of the exact ~0, far below anything f32
// arithmetic downstream can see.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>

#include "vec_math.h"

namespace brisk::cpu {

inline constexpr float kGeluSqrt2OverPi = 0.7978845608028654f;
inline constexpr float kGeluCubic = 0.044715f;

// 1 / d for 1 <= d <= 2^120: guess from the exponent bits (within 12%), then
// Newton's r <- r (2 - d r), which squares the error each step.
inline float gelu_recip(float d) {
  float r = std::bit_cast<float>(int32_t(0x7EF311C3) - std::bit_cast<int32_t>(d));
  r = r * (2.f - d * r);
  r = r * (2.f - d * r);
  r = r * (2.f - d * r);
  return r;
}

// e = exp(-2u), capped so that 1 / (1 + e) stays a normal float.
inline float gelu_e(float x) {
  const float u = kGeluSqrt2OverPi * (x + kGeluCubic * x * x * x);
  return fast_exp_clamped(std::min(-2.0f * u, 80.f));
}

inline float gelu_one(float x) { return x * gelu_recip(1.0f + gelu_e(x)); }

inline float gelu_grad_one(float x, float dy) {
  const float e = gelu_e(x);
  const float s = gelu_recip(1.0f + e);
  const float es = e * s;
  return dy * s * (1.0f + 2.0f * x * es * kGeluSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x));
}

inline void gelu_rows(const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = gelu_one(x[i]);
}

inline void gelu_grad_rows(const float* x, const float* dy, float* dx, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dx[i] = gelu_grad_one(x[i], dy[i]);
}

}  // namespace brisk::cpu
