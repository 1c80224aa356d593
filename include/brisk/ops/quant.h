// The number formats of the quantized Linear ops (linear_q8, linear_q4),
// shared by the quantizer, the reference kernels and the CPU kernels so that
// all of them round the same way. Header-only, like layout.h: backends use it
// without linking the ops layer.
//
// int8 weights (linear_q8): symmetric, one fp32 scale per output row,
//   w[n][k] ~= scale[n] * q[n][k], q in [-127, 127].
// int4 weights (linear_q4), llama.cpp's Q4_0 layout: groups of 32 weights
//   along the input dimension, one fp32 scale each, q in [-8, 7]; 16 bytes per
//   group, byte j holding q[j] + 8 in its low nibble and q[j + 16] + 8 in its
//   high nibble.
// Activations are quantized on the fly, symmetric int8: per row for
//   linear_q8, per group of 32 for linear_q4 (llama.cpp's Q8_0).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace brisk::ops::quant {

inline constexpr int64_t kQ4Group = 32;

// Quantizes n floats to int8 with one scale (max |x| / 127); returns the
// scale (0 for an all-zero input, whose codes are all 0). The rounding is
// x * (127 / max|x|) to nearest even, computed in float: vector kernels that
// multiply by the same reciprocal get the same codes.
inline float quantize_int8(const float* x, int64_t n, int8_t* q) {
  if (n <= 0) return 0.f;  // also tells GCC the fill below has a sane length (-Wstringop-overflow)
  float amax = 0.f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  if (amax == 0.f) {
    std::fill(q, q + n, int8_t(0));
    return 0.f;
  }
  const float inv = 127.f / amax;
  for (int64_t i = 0; i < n; ++i) q[i] = int8_t(std::clamp(std::nearbyint(x[i] * inv), -127.f, 127.f));
  return amax / 127.f;
}

// The 4-bit code of element j (0..31) of a packed group of 16 bytes, as a signed value in [-8, 7].
inline int q4_code(const uint8_t* group, int j) {
  return j < 16 ? int(group[j] & 0x0f) - 8 : int(group[j - 16] >> 4) - 8;
}

}  // namespace brisk::ops::quant
