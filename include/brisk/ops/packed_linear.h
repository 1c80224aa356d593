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

// linear_q8_packed's weight (src/ops/quant_linear_packed.cpp): linear_q8's
// int8 W (N, K) in the same panels of kPanel outputs, with k in groups of 4
// bytes, each byte offset by 128:
//
//   packed[p][g][j][b] = uint8(W[p * kPanel + j][4 g + b] + 128)
//                        (128, i.e. a zero weight, past N or past K)
//
// One 64-byte load is 4 consecutive k of 16 outputs, exactly the operand of
// AVX-512 VNNI's vpdpbusd (unsigned bytes times signed bytes, 4 products
// summed per 32-bit lane), against the 4 activation codes of one row
// broadcast: 16 outputs' dot products grow in one register, with no
// horizontal sums at the end (linear_q8's layout needs 45 instructions per
// 16 results). The +128 comes off as 128 * sum(activation codes) per row.
constexpr int64_t kQ8Group = 4;
inline int64_t q8_groups(int64_t k) { return (k + kQ8Group - 1) / kQ8Group; }
inline core::Shape q8_packed_shape(int64_t n, int64_t k) { return core::Shape{panels(n), q8_groups(k), kPanel * kQ8Group}; }
void pack_q8(const int8_t* w, int64_t n, int64_t k, uint8_t* out);
// linear_q4_packed's weight (src/ops/quant_linear_packed.cpp): linear_q4's
// 4-bit codes c = q + 8 in the same panels. Per group of 32 k, four 64-byte
// vectors; vector t holds the k-quads 2t (low nibbles) and 2t + 1 (high
// nibbles) of the 16 outputs in vpdpbusd's order:
//
//   packed[p][g][t][4 j + b] = c(16p + j, 32g + 8t + b) | c(16p + j, 32g + 8t + 4 + b) << 4
//
// (c = 8, a zero weight, past N), so one load and an AND (and a shift) give
// two vpdpbusd operands. The scales go in panels too, one 16-float vector
// per (panel, group): scales[p][g][j] = scale[16p + j][g] (0 past N).
constexpr int64_t kQ4GroupBytes = kPanel * 16;  // 32 codes of 16 outputs: 256 bytes
inline core::Shape q4_packed_shape(int64_t n, int64_t k) { return core::Shape{panels(n), k / 32, kQ4GroupBytes}; }
inline core::Shape q4_packed_scale_shape(int64_t n, int64_t k) { return core::Shape{panels(n), k / 32, kPanel}; }
// w (n, k/2) and scale (n, k/32) as linear_q4 takes them -> wp, sp.
void pack_q4(const uint8_t* w, const float* scale, int64_t n, int64_t k, uint8_t* wp, float* sp);
// q[o][i] in [-8, 7] from the packed codes.
inline int q4_packed_code(const uint8_t* packed, int64_t k, int64_t o, int64_t i) {
  const int64_t g = i / 32, t = (i % 32) / 8;
  const uint8_t byte = packed[((o / kPanel) * (k / 32) + g) * kQ4GroupBytes + t * 64 + (o % kPanel) * 4 + i % 4];
  return ((i % 8) < 4 ? int(byte & 0x0f) : int(byte >> 4)) - 8;
}

// W[o][i] from the packed layout.
inline int8_t q8_weight(const uint8_t* packed, int64_t k, int64_t o, int64_t i) {
  const int64_t at = ((o / kPanel) * q8_groups(k) + i / kQ8Group) * (kPanel * kQ8Group) + (o % kPanel) * kQ8Group + i % kQ8Group;
  return int8_t(int(packed[at]) - 128);
}

}  // namespace brisk::ops::packed
