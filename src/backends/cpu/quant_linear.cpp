// CPU kernels of linear_q8 and linear_q4 (src/ops/quant_linear.cpp says what
// they compute; brisk/ops/quant.h the formats).
//
// Both first quantize the activations into the workspace, then run integer
// dot products, one path per CPU (cpu_features().int8, chosen at run time):
//
//  - avx512_vnni / avx_vnni (linear_q8): vpdpbusd multiplies unsigned by
//    signed bytes. linear_q8 stores the activations as x + 128 (unsigned)
//    and subtracts 128 * sum(w) (itself a vpdpbusd of ones with w, in the
//    same pass).
//  - avx2 (linear_q8 on AVX2 CPUs, linear_q4 on every CPU with AVX2):
//    vpmaddubsw to 16 bits, vpmaddwd to 32. For int8 weights the unsigned
//    side is |w| and x takes w's sign (vpsignb), so no pair sum can saturate
//    16 bits (2 * 127 * 127 < 32767); 4-bit codes (q + 8) are small enough
//    to be the unsigned side directly, and the kernel subtracts 8 * sum(x)
//    per group (summed at quantization time).
//  - scalar: plain loops, for CPUs without AVX2 and as the tail of rows
//    whose length is not a multiple of the vector.
//
// Every path gives the same int32 sums, so the results differ only in the
// order of the final float scaling. Output features are split across
// threads; each thread runs every activation row against its weight rows, so
// a weight row is read from memory once per call: on avx512_vnni in 4x4
// tiles of (weight rows x activation rows), on avx2 in tiles of 8 int32 (or
// float) accumulators (8x1, 4x2, 2x3, 2x4; see "avx2: tiles" below), on
// avx_vnni and scalar one weight row against blocks of 4 activation rows.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "intrinsics_warnings.h"  // before the headers that hold intrinsics
#include "brisk/cpu/cpu_features.h"
#include "brisk/ops/quant.h"
#include "cpu_util.h"
#include "hsum16.h"
#include "kernels.h"

namespace brisk::cpu {
namespace {

using core::KernelCall;
namespace quant = ops::quant;

constexpr int kRowBlock = 4;

struct Dims {
  int64_t rows, k, n, padded;
};

Dims dims_of(const KernelCall& c) {
  const int64_t k = c.in(0).shape().last();
  return {c.in(0).shape().rows(), k, c.in(1).shape()[0], (k + 63) / 64 * 64};
}

// ---- linear_q8 --------------------------------------------------------------------

// Activation codes of one row: int8, or int8 + 128 as bytes for the vpdpbusd paths.
float quantize_row_q8(const float* x, int64_t k, int8_t* q, bool offset) {
  const float s = quant::quantize_int8(x, k, q);
  if (offset)
    for (int64_t i = 0; i < k; ++i) q[i] = int8_t(uint8_t(q[i]) ^ 0x80);
  return s;
}

// sums[r] = dot(x row r, w row) over [0, k) for r < nr; xs rows `stride` bytes apart.
using DotQ8 = void (*)(const uint8_t* xs, int64_t stride, int nr, const int8_t* w, int64_t k, int32_t* sums);

void dot_q8_scalar(const uint8_t* xs, int64_t stride, int nr, const int8_t* w, int64_t k, int32_t* sums) {
  for (int r = 0; r < nr; ++r) {
    const int8_t* x = reinterpret_cast<const int8_t*>(xs + r * stride);
    int32_t acc = 0;
    for (int64_t i = 0; i < k; ++i) acc += int32_t(x[i]) * w[i];
    sums[r] = acc;
  }
}

// The vpdpbusd paths see x + 128: the tail past the last full vector is undone here.
// Not vectorised: GCC 12 at -O3 with AVX-512 VNNI enabled miscompiles this
// loop (a 36-element tail summed to the wrong value; the op harness's
// "3x100" case caught it). The tail is shorter than one vector anyway.
__attribute__((optimize("no-tree-vectorize"))) int32_t tail_offset_q8(const uint8_t* x, const int8_t* w, int64_t from, int64_t k) {
  int32_t acc = 0;
  for (int64_t i = from; i < k; ++i) acc += (int32_t(x[i]) - 128) * w[i];
  return acc;
}

__attribute__((target("avx2"))) int32_t hsum256(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

// The avx_vnni path: one weight row against up to kRowBlock activation rows,
// 32 bytes at a time. Written once, compiled twice: with the VEX-encoded
// vpdpbusd of AVX-VNNI, and with its EVEX twin on AVX-512 VNNI + VL (same
// instruction, same results), so that CPUs with only AVX-512 VNNI still run
// (and test) this path.
#define BRISK_DOT_Q8_256(NAME, TARGET, DPBUSD)                                                                 \
  __attribute__((target(TARGET))) void NAME(const uint8_t* xs, int64_t stride, int nr, const int8_t* w, int64_t k, \
                                            int32_t* sums) {                                                   \
    const int64_t full = k / 32 * 32;                                                                          \
    const __m256i ones = _mm256_set1_epi8(1);                                                                  \
    __m256i acc[kRowBlock], wsum = _mm256_setzero_si256();                                                     \
    for (int r = 0; r < kRowBlock; ++r) acc[r] = _mm256_setzero_si256();                                       \
    for (int64_t i = 0; i < full; i += 32) {                                                                   \
      const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + i));                          \
      wsum = DPBUSD(wsum, ones, wv);                                                                           \
      for (int r = 0; r < nr; ++r)                                                                             \
        acc[r] = DPBUSD(acc[r], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs + r * stride + i)), wv); \
    }                                                                                                          \
    const int32_t ws = hsum256(wsum);                                                                          \
    for (int r = 0; r < nr; ++r) sums[r] = hsum256(acc[r]) - 128 * ws + tail_offset_q8(xs + r * stride, w, full, k); \
  }
BRISK_DOT_Q8_256(dot_q8_avxvnni, "avx2,avxvnni", _mm256_dpbusd_avx_epi32)
BRISK_DOT_Q8_256(dot_q8_avxvnni_evex, "avx2,avx512vl,avx512vnni", _mm256_dpbusd_epi32)
#undef BRISK_DOT_Q8_256

DotQ8 dot_q8_for(Int8Dot path) {
  switch (path) {
    case Int8Dot::avx_vnni: return cpu_features().avx_vnni ? dot_q8_avxvnni : dot_q8_avxvnni_evex;
    case Int8Dot::avx512_vnni:  // q8_tiles_avx512 instead
    case Int8Dot::avx2:         // q8_tiles_avx2 instead
    case Int8Dot::scalar: return dot_q8_scalar;
  }
  return dot_q8_scalar;
}

// ---- avx2: tiles ----
// Without VNNI a dot product of bytes is vpmaddubsw (unsigned by signed
// bytes, pairs summed to 16 bits) then vpmaddwd (to 32 bits). One weight row
// against blocks of 4 activation rows (as avx_vnni runs) re-read every activation
// vector per weight row and summed each dot product on its own; at 16 rows
// W1's LM head ran at about half the fp32 FMA rate. Here a tile of kW weight
// rows x kR activation rows (kW * kR <= 8: 8x1, 4x2, 2x3, 2x4) keeps its
// accumulators in registers, loads each vector of either operand once per
// step, and sums all eight accumulators at once (hsum8). Weights go through
// in blocks of kBlockW rows, which stay in L1 while every group of
// activation rows passes over them; the next block is prefetched.

constexpr int kBlockW = 8;  // weight rows per block: a multiple of every tile's kW
template <int kR> constexpr int kTileW = kR == 1 ? 8 : kR == 2 ? 4 : 2;

// Lane j of the result = the sum of aj's eight lanes. Every lane goes
// through the same tree, so a float sum's rounding does not depend on its
// place in the tile (decoding stays batch-invariant).
__attribute__((target("avx2"))) inline __m256i hsum8_epi32(__m256i a0, __m256i a1, __m256i a2, __m256i a3,
                                                          __m256i a4, __m256i a5, __m256i a6, __m256i a7) {
  // Per 128-bit half: [a0, a1, a2, a3] (lanes 0-3, then 4-7 of each), the same for a4..a7.
  const __m256i h0 = _mm256_hadd_epi32(_mm256_hadd_epi32(a0, a1), _mm256_hadd_epi32(a2, a3));
  const __m256i h1 = _mm256_hadd_epi32(_mm256_hadd_epi32(a4, a5), _mm256_hadd_epi32(a6, a7));
  return _mm256_add_epi32(_mm256_permute2x128_si256(h0, h1, 0x20), _mm256_permute2x128_si256(h0, h1, 0x31));
}

__attribute__((target("avx2"))) inline __m256 hsum8_ps(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4,
                                                      __m256 a5, __m256 a6, __m256 a7) {
  const __m256 h0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  const __m256 h1 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
  return _mm256_add_ps(_mm256_permute2f128_ps(h0, h1, 0x20), _mm256_permute2f128_ps(h0, h1, 0x31));
}

// Lane r * kW + o: dot(activation codes of row r, weight row o) over the
// first `full` bytes (a multiple of 32). x: kR rows `stride` bytes apart; w:
// `no` weight rows of k bytes (lanes of the missing ones repeat row 0 and are
// dropped by the caller). One side is taken as unsigned |a| and the other
// takes a's sign (|a| * b sign(a) = a b), so no pair sum saturates 16 bits
// (2 * 127 * 127 < 32767). The side held in registers across the inner loop
// is the one whose absolute value is formed once per step: the weights when
// there are more weight rows (kW > kR), else the activations; holding the
// other side too would spill accumulators to the stack. (Widening both sides
// to 16 bits for vpmaddwd alone measured slower: 1.05-1.25x at 1-16 rows.)
template <int kR>
__attribute__((target("avx2"))) __m256i tile_q8_avx2(const int8_t* x, int64_t stride, const int8_t* w, int no,
                                                     int64_t k, int64_t full) {
  constexpr int kW = kTileW<kR>;
  const int8_t* wr[kW];
  for (int o = 0; o < kW; ++o) wr[o] = w + (o < no ? o : 0) * k;
  const __m256i ones16 = _mm256_set1_epi16(1);
  auto dot = [&](__m256i acc, __m256i a, __m256i b) {  // acc + dot of a and b, |a| unsigned
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(a), _mm256_sign_epi8(b, a)), ones16));
  };
  __m256i acc[8];
#pragma GCC unroll 8
  for (auto& a : acc) a = _mm256_setzero_si256();
  for (int64_t i = 0; i < full; i += 32) {
    if ((i & 63) == 0)
#pragma GCC unroll 8
      for (int o = 0; o < kW; ++o) _mm_prefetch(reinterpret_cast<const char*>(wr[o] + i + kBlockW * k), _MM_HINT_T0);
    if constexpr (kW > kR) {  // activations held, one weight row at a time
      __m256i xv[kR];
#pragma GCC unroll 4
      for (int r = 0; r < kR; ++r) xv[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + r * stride + i));
#pragma GCC unroll 8
      for (int o = 0; o < kW; ++o) {
        const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wr[o] + i));
#pragma GCC unroll 4
        for (int r = 0; r < kR; ++r) acc[r * kW + o] = dot(acc[r * kW + o], wv, xv[r]);
      }
    } else {  // weights held, one activation row at a time
      __m256i wv[kW];
#pragma GCC unroll 8
      for (int o = 0; o < kW; ++o) wv[o] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wr[o] + i));
#pragma GCC unroll 4
      for (int r = 0; r < kR; ++r) {
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + r * stride + i));
#pragma GCC unroll 8
        for (int o = 0; o < kW; ++o) acc[r * kW + o] = dot(acc[r * kW + o], xv, wv[o]);
      }
    }
  }
  return hsum8_epi32(acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7]);
}

// ---- avx512_vnni: 4x4 tiles ----
// Like the f32 few-row kernel (matmul.cpp): a block of 4 weight rows stays
// in L1 while each group of 4 activation rows is dotted with it, 16
// accumulators summed at the end by hsum16_epi32. Masked loads take the
// tail (zero bytes add nothing to either sum), so k needs no multiple of 64.

__attribute__((target("avx512f,avx512bw"))) inline __mmask64 tail_mask64(int64_t left) {
  return left >= 64 ? ~__mmask64(0) : (__mmask64(1) << left) - 1;
}

// sum(w[0..k)) for one weight row (the -128 correction of the x + 128 codes).
__attribute__((target("avx512f,avx512bw,avx512vnni"))) int32_t row_sum_q8(const int8_t* w, int64_t k) {
  const __m512i ones = _mm512_set1_epi8(1);
  __m512i acc = _mm512_setzero_si512();
  for (int64_t i = 0; i < k; i += 64) acc = _mm512_dpbusd_epi32(acc, ones, _mm512_maskz_loadu_epi8(tail_mask64(k - i), w + i));
  return _mm512_reduce_add_epi32(acc);
}

// Lane r * kRowBlock + o: dot(x + 128 codes of row r, weight row o); rows
// past kRows / no repeat the first (their sums are dropped).
template <int kRows>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) __m512i tile_q8_avx512(const uint8_t* xs, int64_t stride,
                                                                               const int8_t* w, int no, int64_t k) {
  const uint8_t* xr[kRowBlock];
  const int8_t* wr[kRowBlock];
  for (int i = 0; i < kRowBlock; ++i) xr[i] = xs + (i < kRows ? i : 0) * stride, wr[i] = w + (i < no ? i : 0) * k;
  __m512i acc[kRowBlock * kRowBlock];
  // Unrolled before GCC's scalar replacement runs, so the accumulators live
  // in registers (otherwise they are stored to the stack on every step).
#pragma GCC unroll 16
  for (auto& a : acc) a = _mm512_setzero_si512();
  for (int64_t i = 0; i < k; i += 64) {
    const __mmask64 m = tail_mask64(k - i);
    __m512i wv[kRowBlock];
#pragma GCC unroll 4
    for (int o = 0; o < kRowBlock; ++o) {
      wv[o] = _mm512_maskz_loadu_epi8(m, wr[o] + i);
      _mm_prefetch(reinterpret_cast<const char*>(wr[o] + i + kRowBlock * k), _MM_HINT_T0);  // the next block's line
    }
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      const __m512i xv = _mm512_maskz_loadu_epi8(m, xr[r] + i);
#pragma GCC unroll 4
      for (int o = 0; o < kRowBlock; ++o) acc[r * kRowBlock + o] = _mm512_dpbusd_epi32(acc[r * kRowBlock + o], xv, wv[o]);
    }
  }
  return hsum16_epi32(acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7], acc[8], acc[9], acc[10],
                      acc[11], acc[12], acc[13], acc[14], acc[15]);
}

struct Q8Call {
  const uint8_t* codes;  // activation rows, x + 128, `padded` bytes apart
  const float* scales;   // per activation row
  const int8_t* w;
  const float *wscale, *bias;
  float* y;
  Dims d;
};

__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))) void q8_tiles_avx512(const Q8Call& q, int64_t o0,
                                                                                       int64_t o1) {
  const Dims& d = q.d;
  alignas(64) float out[kRowBlock * kRowBlock];
  // Lane r * 4 + o takes row r's scale: lanes / 4.
  const __m512i row_of_lane = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  for (int64_t o = o0; o < o1; o += kRowBlock) {
    const int no = int(std::min<int64_t>(kRowBlock, o1 - o));
    const __mmask8 om = __mmask8((1u << no) - 1);
    const int8_t* w = q.w + o * d.k;
    alignas(16) int32_t wsum[kRowBlock] = {0, 0, 0, 0};
    for (int j = 0; j < no; ++j) wsum[j] = row_sum_q8(w + j * d.k, d.k);
    // Per lane r * 4 + o: the weight row's -128 correction, scale and bias.
    const __m512i corr = _mm512_broadcast_i32x4(_mm_slli_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(wsum)), 7));
    const __m512 wscale = _mm512_broadcast_f32x4(_mm_maskz_loadu_ps(om, q.wscale + o));
    const __m512 bias = q.bias ? _mm512_broadcast_f32x4(_mm_maskz_loadu_ps(om, q.bias + o)) : _mm512_setzero_ps();
    for (int64_t r0 = 0; r0 < d.rows; r0 += kRowBlock) {
      const int nr = int(std::min<int64_t>(kRowBlock, d.rows - r0));
      const uint8_t* x = q.codes + r0 * d.padded;
      __m512i s;
      switch (nr) {
        case 1: s = tile_q8_avx512<1>(x, d.padded, w, no, d.k); break;
        case 2: s = tile_q8_avx512<2>(x, d.padded, w, no, d.k); break;
        case 3: s = tile_q8_avx512<3>(x, d.padded, w, no, d.k); break;
        default: s = tile_q8_avx512<4>(x, d.padded, w, no, d.k); break;
      }
      const __m512 xscale = _mm512_permutexvar_ps(
          row_of_lane, _mm512_castps128_ps512(_mm_maskz_loadu_ps(__mmask8((1u << nr) - 1), q.scales + r0)));
      const __m512 dots = _mm512_cvtepi32_ps(_mm512_sub_epi32(s, corr));
      _mm512_store_ps(out, _mm512_fmadd_ps(dots, _mm512_mul_ps(xscale, wscale), bias));
      for (int r = 0; r < nr; ++r) std::memcpy(q.y + (r0 + r) * d.n + o, out + r * kRowBlock, size_t(no) * sizeof(float));
    }
  }
}

// Activation rows r0 .. r0 + kR against weight rows o .. o + nb (nb <= kBlockW).
template <int kR>
__attribute__((target("avx2"))) void q8_rows_avx2(const Q8Call& q, int64_t o, int nb, int64_t r0) {
  constexpr int kW = kTileW<kR>;
  const Dims& d = q.d;
  const int64_t full = d.k / 32 * 32;
  const auto* x = reinterpret_cast<const int8_t*>(q.codes + r0 * d.padded);
  alignas(32) int32_t sums[8];
  for (int ob = 0; ob < nb; ob += kW) {
    const int no = std::min(kW, nb - ob);
    const int8_t* w = q.w + (o + ob) * d.k;
    _mm256_store_si256(reinterpret_cast<__m256i*>(sums), tile_q8_avx2<kR>(x, d.padded, w, no, d.k, full));
    for (int r = 0; r < kR; ++r)
      for (int j = 0; j < no; ++j) {
        const int64_t oj = o + ob + j;
        int32_t sum = sums[r * kW + j];
        for (int64_t i = full; i < d.k; ++i) sum += int32_t(x[r * d.padded + i]) * w[j * d.k + i];  // the tail
        q.y[(r0 + r) * d.n + oj] = float(sum) * (q.scales[r0 + r] * q.wscale[oj]) + (q.bias ? q.bias[oj] : 0.f);
      }
  }
}

void q8_tiles_avx2(const Q8Call& q, int64_t o0, int64_t o1) {
  for (int64_t o = o0; o < o1; o += kBlockW) {
    const int nb = int(std::min<int64_t>(kBlockW, o1 - o));
    int64_t r0 = 0;
    for (; r0 + 4 <= q.d.rows; r0 += 4) q8_rows_avx2<4>(q, o, nb, r0);
    switch (q.d.rows - r0) {
      case 3: q8_rows_avx2<3>(q, o, nb, r0); break;
      case 2: q8_rows_avx2<2>(q, o, nb, r0); break;
      case 1: q8_rows_avx2<1>(q, o, nb, r0); break;
      default: break;
    }
  }
}

void linear_q8_f32(const KernelCall& c) {
  const Dims d = dims_of(c);
  const Int8Dot path = cpu_features().int8;
  const bool offset = path == Int8Dot::avx512_vnni || path == Int8Dot::avx_vnni;
  auto* codes = static_cast<uint8_t*>(c.workspace);
  auto* scales = reinterpret_cast<float*>(codes + d.rows * d.padded);
  const float* x = c.in(0).as<float>();
  parallel_for(d.rows, 4, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r)
      scales[r] = quantize_row_q8(x + r * d.k, d.k, reinterpret_cast<int8_t*>(codes + r * d.padded), offset);
  });
  const int8_t* w = c.in(1).as<int8_t>();
  const float* wscale = c.in(2).as<float>();
  const float* bias = c.inputs.size() == 4 ? c.in(3).as<float>() : nullptr;
  float* y = c.out(0).as<float>();
  // Split the output features; enough work per thread to wake the team.
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(d.k * d.rows, 1));
  if (path == Int8Dot::avx512_vnni || path == Int8Dot::avx2) {  // tiles over blocks of weight rows
    const Q8Call q{codes, scales, w, wscale, bias, y, d};
    const int64_t block = path == Int8Dot::avx2 ? kBlockW : kRowBlock;
    parallel_for((d.n + block - 1) / block, std::max<int64_t>(1, grain / block), [&](int64_t b, int64_t e) {
      const int64_t o0 = b * block, o1 = std::min(d.n, e * block);
      if (path == Int8Dot::avx2) q8_tiles_avx2(q, o0, o1);
      else q8_tiles_avx512(q, o0, o1);
    });
    return;
  }
  const DotQ8 dot = dot_q8_for(path);
  parallel_for(d.n, grain, [&](int64_t nb, int64_t ne) {
    int32_t sums[kRowBlock];
    for (int64_t o = nb; o < ne; ++o) {
      const float bo = bias ? bias[o] : 0.f;
      for (int64_t r0 = 0; r0 < d.rows; r0 += kRowBlock) {
        const int nr = int(std::min<int64_t>(kRowBlock, d.rows - r0));
        dot(codes + r0 * d.padded, d.padded, nr, w + o * d.k, d.k, sums);
        for (int r = 0; r < nr; ++r) y[(r0 + r) * d.n + o] = float(sums[r]) * (scales[r0 + r] * wscale[o]) + bo;
      }
    }
  });
}

// ---- linear_q4 --------------------------------------------------------------------

// Per activation row: int8 codes (padded), then per group its scale and its
// scale * sum of codes (the correction for the +8 in the weight codes).
struct Q4Rows {
  int8_t* codes;
  float* scale;  // rows x groups
  float* corr;   // rows x groups: scale * sum(codes) * 8
  float* scale4;  // the AVX2 tiles: rows x groups x 4, each scale four times
};

Q4Rows q4_rows(const KernelCall& c, const Dims& d) {
  const int64_t groups = d.k / quant::kQ4Group;
  auto* base = static_cast<uint8_t*>(c.workspace);
  Q4Rows q;
  q.codes = reinterpret_cast<int8_t*>(base);
  q.scale = reinterpret_cast<float*>(base + d.rows * d.padded);
  q.corr = q.scale + d.rows * groups;
  const uintptr_t after = reinterpret_cast<uintptr_t>(q.corr + d.rows * groups);
  q.scale4 = reinterpret_cast<float*>((after + 31) / 32 * 32);  // 32-byte aligned: the op's workspace_bytes leaves room
  return q;
}

// out[r] = sum over groups of dot(codes_u, x) * sx * sw for rows r < nr
// (codes_u = q + 8, the correction applied by the caller): the path of CPUs
// without AVX2.
void dot_q4_scalar(const Q4Rows& q, int64_t row0, int nr, int64_t padded, int64_t groups, const uint8_t* w,
                   const float* ws, float* out) {
  for (int r = 0; r < nr; ++r) {
    const int8_t* x = q.codes + (row0 + r) * padded;
    float acc = 0.f;
    for (int64_t g = 0; g < groups; ++g) {
      int32_t s = 0;
      for (int j = 0; j < 32; ++j) s += (quant::q4_code(w + g * 16, j) + 8) * x[g * 32 + j];
      acc += float(s) * (q.scale[(row0 + r) * groups + g] * ws[g]);
    }
    out[r] = acc;
  }
}

// The 32 codes (q + 8) of one group in element order, as bytes.
__attribute__((target("avx2"))) inline __m256i unpack_q4(const uint8_t* group) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(group));
  const __m128i mask = _mm_set1_epi8(0x0f);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), mask), _mm_and_si128(b, mask));
}

// avx2 tiles (see "avx2: tiles" above): lane r * kW + o of the result is
// y[r][o] without the bias. Groups go in pairs: one 32-byte load holds two
// groups' codes, whose low nibbles (elements 0-15 of each) and high nibbles
// (16-31) are one AND (and a shift) apiece, so the activation codes of a
// pair are stored to match (q4_pair_layout): [g 0-15, g+1 0-15, g 16-31,
// g+1 16-31]. Two vpmaddubsw add up in 16 bits (2 x 2 x 15 x 127 < 32767),
// one vpmaddwd gives lanes 0-3 of group g and 4-7 of g + 1, scaled by
// [sx sw of g x4, of g+1 x4] (scale4 holds each sx four times). Per pair
// of groups and (row, weight row) that is 7 instructions where one group
// at a time took 11, most of it the unpacking. Each (row, weight row) keeps
// a float accumulator of 8 partial sums; the +8 of the weight codes comes
// off at the end as one vector product per 8 groups: sum over g of
// corr[r][g] * ws[o][g], corr = 8 * sum(x codes) * sx. An odd last group
// goes on its own, in element order.
template <int kR>
__attribute__((target("avx2,fma"))) __m256 tile_q4_avx2(const Q4Rows& q, int64_t row0, int64_t padded,
                                                        int64_t groups, const uint8_t* w, const float* ws, int no) {
  constexpr int kW = kTileW<kR>;
  const int64_t wstride = groups * 16;  // bytes per weight row
  const uint8_t* wr[kW];
  const float* sr[kW];
  for (int o = 0; o < kW; ++o) wr[o] = w + (o < no ? o : 0) * wstride, sr[o] = ws + (o < no ? o : 0) * groups;
  const __m256i ones16 = _mm256_set1_epi16(1), low4 = _mm256_set1_epi8(0x0f);
  const __m256i pair_of_lane = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
  auto xcodes = [&](int r, int64_t at) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q.codes + (row0 + r) * padded + at));
  };
  __m256 acc[8];
#pragma GCC unroll 8
  for (auto& a : acc) a = _mm256_setzero_ps();
  int64_t g = 0;
  for (; g + 2 <= groups; g += 2) {
#pragma GCC unroll 8
    for (int o = 0; o < kW; ++o) {
      if ((g & 3) == 0) _mm_prefetch(reinterpret_cast<const char*>(wr[o] + g * 16 + kBlockW * wstride), _MM_HINT_T0);
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wr[o] + g * 16));
      const __m256i lo = _mm256_and_si256(b, low4), hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), low4);
      const __m256 sw = _mm256_permutevar8x32_ps(
          _mm256_castps128_ps256(_mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sr[o] + g)))),
          pair_of_lane);
#pragma GCC unroll 4
      for (int r = 0; r < kR; ++r) {
        const __m256i p16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xcodes(r, g * 32)),
                                             _mm256_maddubs_epi16(hi, xcodes(r, g * 32 + 32)));
        const __m256 sx = _mm256_loadu_ps(q.scale4 + ((row0 + r) * groups + g) * 4);
        acc[r * kW + o] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones16)), _mm256_mul_ps(sx, sw),
                                          acc[r * kW + o]);
      }
    }
  }
  if (g < groups) {  // an odd last group, codes in element order
#pragma GCC unroll 8
    for (int o = 0; o < kW; ++o) {
      const __m256i codes = unpack_q4(wr[o] + g * 16);
      const __m256 sw = _mm256_broadcast_ss(sr[o] + g);
#pragma GCC unroll 4
      for (int r = 0; r < kR; ++r) {
        const __m256i s32 = _mm256_madd_epi16(_mm256_maddubs_epi16(codes, xcodes(r, g * 32)), ones16);
        const __m256 sx = _mm256_broadcast_ss(q.scale + (row0 + r) * groups + g);
        acc[r * kW + o] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s32), _mm256_mul_ps(sx, sw), acc[r * kW + o]);
      }
    }
  }
  // The weight codes' +8, 8 groups per step (masked loads for the last few).
  for (int64_t g8 = 0; g8 < groups; g8 += 8) {
    const int left = int(std::min<int64_t>(8, groups - g8));
    const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(left), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
#pragma GCC unroll 8
    for (int o = 0; o < kW; ++o) {
      const __m256 sw = _mm256_maskload_ps(sr[o] + g8, m);
#pragma GCC unroll 4
      for (int r = 0; r < kR; ++r)
        acc[r * kW + o] = _mm256_fnmadd_ps(_mm256_maskload_ps(q.corr + (row0 + r) * groups + g8, m), sw, acc[r * kW + o]);
    }
  }
  return hsum8_ps(acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7]);
}

// The avx2 tiles' order of one row's activation codes: each full pair of
// groups as [g 0-15, g+1 0-15, g 16-31, g+1 16-31], an odd last group as is.
void q4_pair_layout(int8_t* codes, int64_t groups) {
  int8_t pair[64];
  for (int64_t g = 0; g + 2 <= groups; g += 2) {
    int8_t* c = codes + g * 32;
    std::memcpy(pair, c, 16);             // g 0-15
    std::memcpy(pair + 16, c + 32, 16);   // g+1 0-15
    std::memcpy(pair + 32, c + 16, 16);   // g 16-31
    std::memcpy(pair + 48, c + 48, 16);   // g+1 16-31
    std::memcpy(c, pair, 64);
  }
}

// Activation rows r0 .. r0 + kR against weight rows o .. o + nb (nb <= kBlockW).
template <int kR>
__attribute__((target("avx2,fma"))) void q4_rows_avx2(const Q4Rows& q, const Dims& d, const uint8_t* w,
                                                       const float* wscale, const float* bias, float* y, int64_t o,
                                                       int nb, int64_t r0) {
  constexpr int kW = kTileW<kR>;
  const int64_t groups = d.k / quant::kQ4Group;
  alignas(32) float out[8];
  for (int ob = 0; ob < nb; ob += kW) {
    const int no = std::min(kW, nb - ob);
    _mm256_store_ps(out, tile_q4_avx2<kR>(q, r0, d.padded, groups, w + (o + ob) * groups * 16,
                                          wscale + (o + ob) * groups, no));
    for (int r = 0; r < kR; ++r)
      for (int j = 0; j < no; ++j)
        y[(r0 + r) * d.n + o + ob + j] = out[r * kW + j] + (bias ? bias[o + ob + j] : 0.f);
  }
}

void q4_tiles_avx2(const Q4Rows& q, const Dims& d, const uint8_t* w, const float* wscale, const float* bias,
                   float* y, int64_t o0, int64_t o1) {
  for (int64_t o = o0; o < o1; o += kBlockW) {
    const int nb = int(std::min<int64_t>(kBlockW, o1 - o));
    int64_t r0 = 0;
    for (; r0 + 4 <= d.rows; r0 += 4) q4_rows_avx2<4>(q, d, w, wscale, bias, y, o, nb, r0);
    switch (d.rows - r0) {
      case 3: q4_rows_avx2<3>(q, d, w, wscale, bias, y, o, nb, r0); break;
      case 2: q4_rows_avx2<2>(q, d, w, wscale, bias, y, o, nb, r0); break;
      case 1: q4_rows_avx2<1>(q, d, w, wscale, bias, y, o, nb, r0); break;
      default: break;
    }
  }
}

void linear_q4_f32(const KernelCall& c) {
  const Dims d = dims_of(c);
  const int64_t groups = d.k / quant::kQ4Group;
  const Q4Rows q = q4_rows(c, d);
  // Every SIMD path takes the AVX2 tiles: on a Zen 5 (avx512_vnni and
  // avx_vnni) they ran W1's Linears 2-3.5x faster than one weight row at a
  // time against vpdpbusd, which unpacked every group's nibbles once per row
  // block and summed each dot product on its own (bench_decode, LM head:
  // 406 -> 121 us at 1 row, 3165 -> 1404 us at 16).
  const bool tiles = cpu_features().int8 != Int8Dot::scalar;
  const float* x = c.in(0).as<float>();
  parallel_for(d.rows, 4, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r)
      for (int64_t g = 0; g < groups; ++g) {
        int8_t* codes = q.codes + r * d.padded + g * 32;
        const float s = quant::quantize_int8(x + r * d.k + g * 32, 32, codes);
        int32_t sum = 0;
        for (int j = 0; j < 32; ++j) sum += codes[j];
        q.scale[r * groups + g] = s;
        q.corr[r * groups + g] = s * float(8 * sum);
        if (tiles) std::fill_n(q.scale4 + (r * groups + g) * 4, 4, s);
      }
    if (tiles)
      for (int64_t r = b; r < e; ++r) q4_pair_layout(q.codes + r * d.padded, groups);
  });
  const uint8_t* w = c.in(1).as<uint8_t>();
  const float* wscale = c.in(2).as<float>();
  const float* bias = c.inputs.size() == 4 ? c.in(3).as<float>() : nullptr;
  float* y = c.out(0).as<float>();
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(d.k * d.rows, 1));
  if (tiles) {
    const int64_t blocks = (d.n + kBlockW - 1) / kBlockW;
    parallel_for(blocks, std::max<int64_t>(1, grain / kBlockW), [&](int64_t b, int64_t e) {
      q4_tiles_avx2(q, d, w, wscale, bias, y, b * kBlockW, std::min(d.n, e * kBlockW));
    });
    return;
  }
  parallel_for(d.n, grain, [&](int64_t nb, int64_t ne) {
    float dots[kRowBlock];
    for (int64_t o = nb; o < ne; ++o) {
      const float* ws = wscale + o * groups;
      const float bo = bias ? bias[o] : 0.f;
      for (int64_t r0 = 0; r0 < d.rows; r0 += kRowBlock) {
        const int nr = int(std::min<int64_t>(kRowBlock, d.rows - r0));
        dot_q4_scalar(q, r0, nr, d.padded, groups, w + o * (d.k / 2), ws, dots);
        for (int r = 0; r < nr; ++r) {
          float corr = 0.f;  // the +8 of every weight code, group by group
          for (int64_t g = 0; g < groups; ++g) corr += q.corr[(r0 + r) * groups + g] * ws[g];
          y[(r0 + r) * d.n + o] = dots[r] - corr + bo;
        }
      }
    }
  });
}

}  // namespace

void register_quant_linear_kernels(core::KernelRegistry& r) {
  r.add(core::OpKind::linear_q8, core::DType::f32, linear_q8_f32);
  r.add(core::OpKind::linear_q4, core::DType::f32, linear_q4_f32);
}

}  // namespace brisk::cpu
