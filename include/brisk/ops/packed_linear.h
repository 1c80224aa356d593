// The weight layout of linear_packed (src/ops/linear_packed.cpp), the
// inference engine's fp32 Linear.
//
// A Linear's weight W (N, K) as PyTorch stores it is read one output row at
// a time, so a product over a few activation rows (decoding) is a set of
// dot products that end in horizontal sums. Packed, the same weight is
// panels of kPanel output features, each panel K rows of kPanel values:
//
//   packed[p][k][j] = W[p * kPanel + j][k]     (zero where p * kPanel + j >= N)
//
// so one vector load gives kPanel outputs' weights at one k, every
// activation value is broadcast against it, and a panel is one contiguous
// stream in memory. The engine packs its fp32 Linears once, at load.
#pragma once

#include <cstdint>

#include "brisk/core/shape.h"

namespace brisk::ops::packed {

constexpr int64_t kPanel = 16;

inline int64_t panels(int64_t n) { return (n + kPanel - 1) / kPanel; }
inline core::Shape packed_shape(int64_t n, int64_t k) { return core::Shape{panels(n), k, kPanel}; }

// w (n, k) row-major -> out, packed_shape(n, k) elements.
void pack(const float* w, int64_t n, int64_t k, float* out);
// Row `o` of the original W (k values) from the packed layout.
void unpack_row(const float* packed, int64_t k, int64_t o, float* row);

}  // namespace brisk::ops::packed
