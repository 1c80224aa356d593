// CPU kernel of kv_attention (src/ops/kv_attention.cpp says what it computes).
//
// First every row's key and value are copied into its cache slot (all of
// them, so that rows of one prefill see each other), then tasks of (row,
// some of its heads) are split across threads: scores against the row's past,
// a softmax over them, and the weighted sum of values, normalised once at the
// end. Each (row, head) is computed by one thread in a fixed order whatever
// else is in the call, so a row's output does not depend on the batch.
//
// Batched decoding reads every sequence's whole past each step (16 sequences
// of W1 at 120 positions: 16 MB per step, evicted from cache by the LM head's
// weights in between), so the AVX-512 path is shaped by memory: a task walks
// each cache block front to back for all its heads, and computes 16 scores
// with one transpose-sum. Without AVX-512, an AVX2 + FMA path does the same
// 4 positions at a time (head_dim a multiple of 8). The portable path
// (neither, or BRISK_FEW_ROWS=portable) is the plain loop.
//
// The cache holds f32 or bf16 (EngineOptions::kv_dtype): every path is a
// template over the cache's element type. bf16 keys and values are rounded
// (to nearest even) once as they are stored and widened to f32 as they are
// loaded (a shift of 16 bits), so the dot products, the softmax and the
// weighted sum stay f32 while a decoding step reads half the bytes.
//
// GCC 12 reports its own _mm512_undefined_ps() inside the shuffle and
// reduce intrinsics as maybe-uninitialised once they are inlined here.
#ifndef __clang__  // a GCC-only warning; clang would warn about the unknown group
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "brisk/core/error.h"
#include "brisk/cpu/cpu_features.h"
#include "cpu_util.h"
#include "hsum16.h"
#include "kernels.h"
#include "vec_math.h"

namespace brisk::cpu {
namespace {

using core::KernelCall;

// Heads of one row per task at most (the AVX-512 path keeps per-head maxima and sums on the stack).
constexpr int64_t kMaxHeadsPerTask = 32;

// What every (row, heads) task reads and writes. KV: the cache's element
// type, float or uint16_t (bf16).
template <class KV>
struct Attend {
  const float* qkv;
  const KV *kc, *vc;
  float* y;
  const int32_t *rows, *table;
  float* scores;  // (row, head) -> `context` floats
  int64_t c, t, heads, d, max_blocks, context;
  float scale;
};

// One (row, head)'s scores s[0..pos] become exp(s - top) in place; returns
// their sum (the softmax's numerators and denominator). Inlined into each
// path, so it vectorises with that path's instruction set.
__attribute__((always_inline)) inline float exp_scores(float* s, int64_t pos, float top) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j <= pos; ++j) sum += s[j] = fast_exp(s[j] - top);
  return sum;
}

// Row r's heads h0..h1 one at a time: dot products vectorised by the
// compiler, a softmax with the vectorised fast_exp (libm's expf one
// position at a time was a fifth of a batched decoding step), the weighted
// sum of values normalised once at the end.
template <class KV>
void attend_portable(const Attend<KV>& a, int64_t r, int64_t h0, int64_t h1) {
  const int64_t seq = a.rows[2 * r], pos = a.rows[2 * r + 1], c = a.c, t = a.t, d = a.d;
  const int32_t* blocks_of = a.table + seq * a.max_blocks;
  for (int64_t h = h0; h < h1; ++h) {
    const float* q = a.qkv + r * 3 * c + h * d;
    float* s = a.scores + (r * a.heads + h) * a.context;
    // Positions block by block: one table lookup per block, not a division per position.
    float top = -INFINITY;
    for (int64_t j0 = 0; j0 <= pos; j0 += t) {
      const KV* k = a.kc + int64_t(blocks_of[j0 / t]) * t * c + h * d;
      for (int64_t j = j0; j <= std::min(pos, j0 + t - 1); ++j, k += c) {
        float dot = 0.f;
#pragma omp simd reduction(+ : dot)
        for (int64_t i = 0; i < d; ++i) dot += q[i] * widen(k[i]);
        s[j] = dot * a.scale;
        top = std::max(top, s[j]);
      }
    }
    const float total = exp_scores(s, pos, top);
    float* out = a.y + r * c + h * d;
    std::fill(out, out + d, 0.f);
    for (int64_t j0 = 0; j0 <= pos; j0 += t) {
      const KV* v = a.vc + int64_t(blocks_of[j0 / t]) * t * c + h * d;
      for (int64_t j = j0; j <= std::min(pos, j0 + t - 1); ++j, v += c) {
        const float pj = s[j];
#pragma omp simd
        for (int64_t i = 0; i < d; ++i) out[i] += pj * widen(v[i]);
      }
    }
    const float inv = 1.f / total;
#pragma omp simd
    for (int64_t i = 0; i < d; ++i) out[i] *= inv;
  }
}

// Keys of positions past the end of a sequence's last block are read as this
// (their scores are dropped): no branch in the 16-position loop.
alignas(64) constexpr float kZeroKey[128] = {};
alignas(64) constexpr uint16_t kZeroKeyBf16[128] = {};
inline const float* zero_key(const float*) { return kZeroKey; }
inline const uint16_t* zero_key(const uint16_t*) { return kZeroKeyBf16; }

// 16 (AVX-512) or 8 (AVX2) cache values as f32: loaded, or bf16 widened.
__attribute__((target("avx512f"), always_inline)) inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
__attribute__((target("avx512f"), always_inline)) inline __m512 load16(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
__attribute__((target("avx2,fma"), always_inline)) inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
__attribute__((target("avx2,fma"), always_inline)) inline __m256 load8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// Asks for the task's heads of a block's first `positions` rows: the next
// block is somewhere else in the pool, where the hardware prefetcher cannot
// follow. One request per 64-byte line.
template <class KV>
inline void prefetch_block(const KV* block, int64_t positions, const Attend<KV>& a, int64_t h0, int64_t h1) {
  constexpr int64_t per_line = 64 / int64_t(sizeof(KV));
  for (int64_t i = 0; i < positions; ++i)
    for (int64_t f = h0 * a.d; f < h1 * a.d; f += per_line)
      _mm_prefetch(reinterpret_cast<const char*>(block + i * a.c + f), _MM_HINT_T0);
}

// The same with AVX-512, head_dim = 16 x D. Scores come 16 positions at a
// time: 16 dot products of D vectors each, then one transpose-sum (hsum16)
// instead of 16 horizontal sums. Every head of the task walks one block
// before the next block is touched, so a block's t x C keys (then values)
// stream through once, front to back. Values: two accumulator sets (even and
// odd positions) so the FMA latency is hidden.
template <int D, class KV>
__attribute__((target("avx512f"))) void attend_avx512(const Attend<KV>& a, int64_t r, int64_t h0, int64_t h1) {
  const int64_t seq = a.rows[2 * r], pos = a.rows[2 * r + 1], c = a.c, t = a.t, d = a.d;
  const int32_t* blocks_of = a.table + seq * a.max_blocks;
  const __m512 scale = _mm512_set1_ps(a.scale);
  float* out = a.y + r * c;
  float top[kMaxHeadsPerTask], total[kMaxHeadsPerTask];
  for (int64_t h = h0; h < h1; ++h) top[h - h0] = -INFINITY;
  for (int64_t j0 = 0; j0 <= pos; j0 += t) {
    const KV* kb = a.kc + int64_t(blocks_of[j0 / t]) * t * c;
    const int64_t in_block = std::min(t, pos - j0 + 1);
    if (j0 + t <= pos) prefetch_block(a.kc + int64_t(blocks_of[j0 / t + 1]) * t * c, std::min(t, pos - j0 - t + 1), a, h0, h1);
    for (int64_t h = h0; h < h1; ++h) {
      __m512 q[D];
#pragma GCC unroll 8
      for (int v = 0; v < D; ++v) q[v] = _mm512_loadu_ps(a.qkv + r * 3 * c + h * d + 16 * v);
      float* s = a.scores + (r * a.heads + h) * a.context + j0;
      for (int64_t i0 = 0; i0 < in_block; i0 += 16) {
        const int64_t m = std::min<int64_t>(16, in_block - i0);
        // Position i0 + i's dot product (an array of 16 accumulators would
        // live in memory and trips GCC's uninitialised-use analysis).
        const auto dot = [&](int i) __attribute__((always_inline, target("avx512f"))) {
          const KV* k = i < m ? kb + (i0 + i) * c + h * d : zero_key(kb);
          __m512 acc = _mm512_mul_ps(q[0], load16(k));
#pragma GCC unroll 8
          for (int v = 1; v < D; ++v) acc = _mm512_fmadd_ps(q[v], load16(k + 16 * v), acc);
          return acc;
        };
        const __m512 sv = _mm512_mul_ps(hsum16_ps(dot(0), dot(1), dot(2), dot(3), dot(4), dot(5), dot(6), dot(7), dot(8),
                                                  dot(9), dot(10), dot(11), dot(12), dot(13), dot(14), dot(15)),
                                        scale);
        const __mmask16 mask = __mmask16((1u << m) - 1);
        _mm512_mask_storeu_ps(s + i0, mask, sv);
        top[h - h0] = std::max(top[h - h0], _mm512_mask_reduce_max_ps(mask, sv));
      }
    }
  }
  for (int64_t h = h0; h < h1; ++h) {
    total[h - h0] = exp_scores(a.scores + (r * a.heads + h) * a.context, pos, top[h - h0]);
    std::fill(out + h * d, out + (h + 1) * d, 0.f);
  }
  for (int64_t j0 = 0; j0 <= pos; j0 += t) {
    const KV* vb = a.vc + int64_t(blocks_of[j0 / t]) * t * c;
    const int64_t in_block = std::min(t, pos - j0 + 1);
    if (j0 + t <= pos) prefetch_block(a.vc + int64_t(blocks_of[j0 / t + 1]) * t * c, std::min(t, pos - j0 - t + 1), a, h0, h1);
    for (int64_t h = h0; h < h1; ++h) {
      const float* p = a.scores + (r * a.heads + h) * a.context + j0;
      __m512 even[D], odd[D];
#pragma GCC unroll 8
      for (int v = 0; v < D; ++v) even[v] = _mm512_loadu_ps(out + h * d + 16 * v), odd[v] = _mm512_setzero_ps();
      int64_t i = 0;
      for (; i + 1 < in_block; i += 2) {
        const KV* v0 = vb + i * c + h * d;
        const __m512 p0 = _mm512_set1_ps(p[i]), p1 = _mm512_set1_ps(p[i + 1]);
#pragma GCC unroll 8
        for (int v = 0; v < D; ++v) {
          even[v] = _mm512_fmadd_ps(p0, load16(v0 + 16 * v), even[v]);
          odd[v] = _mm512_fmadd_ps(p1, load16(v0 + c + 16 * v), odd[v]);
        }
      }
      if (i < in_block) {
        const KV* v0 = vb + i * c + h * d;
        const __m512 p0 = _mm512_set1_ps(p[i]);
#pragma GCC unroll 8
        for (int v = 0; v < D; ++v) even[v] = _mm512_fmadd_ps(p0, load16(v0 + 16 * v), even[v]);
      }
#pragma GCC unroll 8
      for (int v = 0; v < D; ++v) _mm512_storeu_ps(out + h * d + 16 * v, _mm512_add_ps(even[v], odd[v]));
    }
  }
  for (int64_t h = h0; h < h1; ++h) {
    const __m512 inv = _mm512_set1_ps(1.f / total[h - h0]);
#pragma GCC unroll 8
    for (int v = 0; v < D; ++v) _mm512_storeu_ps(out + h * d + 16 * v, _mm512_mul_ps(inv, _mm512_loadu_ps(out + h * d + 16 * v)));
  }
}

// The same on AVX2 + FMA, head_dim = 8 x D: scores 4 positions at a time
// (4 dot products of D vectors, the query held in registers for D <= 8,
// then one hadd tree for the four sums), values with one accumulator set
// of D vectors. Blocks are walked as in the AVX-512 path.
__attribute__((target("avx2,fma"), always_inline)) inline __m128 hsum4_ps(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));  // per 128-bit half: a, b, c, d
  return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

template <int D, class KV>
__attribute__((target("avx2,fma"))) void attend_avx2(const Attend<KV>& a, int64_t r, int64_t h0, int64_t h1) {
  const int64_t seq = a.rows[2 * r], pos = a.rows[2 * r + 1], c = a.c, t = a.t, d = a.d;
  const int32_t* blocks_of = a.table + seq * a.max_blocks;
  const __m128 scale = _mm_set1_ps(a.scale);
  float* out = a.y + r * c;
  float top[kMaxHeadsPerTask];
  for (int64_t h = h0; h < h1; ++h) top[h - h0] = -INFINITY;
  for (int64_t j0 = 0; j0 <= pos; j0 += t) {
    const KV* kb = a.kc + int64_t(blocks_of[j0 / t]) * t * c;
    const int64_t in_block = std::min(t, pos - j0 + 1);
    for (int64_t h = h0; h < h1; ++h) {
      __m256 q[D];
#pragma GCC unroll 16
      for (int v = 0; v < D; ++v) q[v] = _mm256_loadu_ps(a.qkv + r * 3 * c + h * d + 8 * v);
      float* s = a.scores + (r * a.heads + h) * a.context + j0;
      __m128 best = _mm_set1_ps(-INFINITY);
      for (int64_t i0 = 0; i0 < in_block; i0 += 4) {
        const int64_t m = std::min<int64_t>(4, in_block - i0);
        const auto dot = [&](int i) __attribute__((always_inline, target("avx2,fma"))) {
          const KV* k = i < m ? kb + (i0 + i) * c + h * d : zero_key(kb);
          __m256 acc = _mm256_mul_ps(q[0], load8(k));
#pragma GCC unroll 16
          for (int v = 1; v < D; ++v) acc = _mm256_fmadd_ps(q[v], load8(k + 8 * v), acc);
          return acc;
        };
        __m128 sv = _mm_mul_ps(hsum4_ps(dot(0), dot(1), dot(2), dot(3)), scale);
        if (m < 4) {  // positions past the end score -inf: they do not move the maximum
          alignas(16) float tail[4];
          _mm_store_ps(tail, sv);
          for (int64_t i = m; i < 4; ++i) tail[i] = -INFINITY;
          sv = _mm_load_ps(tail);
          std::copy(tail, tail + m, s + i0);
        } else {
          _mm_storeu_ps(s + i0, sv);
        }
        best = _mm_max_ps(best, sv);
      }
      alignas(16) float b4[4];
      _mm_store_ps(b4, best);
      top[h - h0] = std::max({top[h - h0], b4[0], b4[1], b4[2], b4[3]});
    }
  }
  for (int64_t h = h0; h < h1; ++h) {
    float* p = a.scores + (r * a.heads + h) * a.context;
    const float total = exp_scores(p, pos, top[h - h0]);
    __m256 acc[D];
#pragma GCC unroll 16
    for (int v = 0; v < D; ++v) acc[v] = _mm256_setzero_ps();
    for (int64_t j0 = 0; j0 <= pos; j0 += t) {
      const KV* vb = a.vc + int64_t(blocks_of[j0 / t]) * t * c + h * d;
      const int64_t in_block = std::min(t, pos - j0 + 1);
      for (int64_t i = 0; i < in_block; ++i) {
        const __m256 pi = _mm256_set1_ps(p[j0 + i]);
#pragma GCC unroll 16
        for (int v = 0; v < D; ++v) acc[v] = _mm256_fmadd_ps(pi, load8(vb + i * c + 8 * v), acc[v]);
      }
    }
    const __m256 inv = _mm256_set1_ps(1.f / total);
#pragma GCC unroll 16
    for (int v = 0; v < D; ++v) _mm256_storeu_ps(out + h * d + 8 * v, _mm256_mul_ps(inv, acc[v]));
  }
}

// attend_avx2 for this head size (d = 8 x D, D = 1..16).
template <class KV>
void attend_avx2_heads(const Attend<KV>& a, int64_t r, int64_t h0, int64_t h1) {
  switch (a.d / 8) {
    case 1: return attend_avx2<1, KV>(a, r, h0, h1);
    case 2: return attend_avx2<2, KV>(a, r, h0, h1);
    case 3: return attend_avx2<3, KV>(a, r, h0, h1);
    case 4: return attend_avx2<4, KV>(a, r, h0, h1);
    case 5: return attend_avx2<5, KV>(a, r, h0, h1);
    case 6: return attend_avx2<6, KV>(a, r, h0, h1);
    case 7: return attend_avx2<7, KV>(a, r, h0, h1);
    case 8: return attend_avx2<8, KV>(a, r, h0, h1);
    case 9: return attend_avx2<9, KV>(a, r, h0, h1);
    case 10: return attend_avx2<10, KV>(a, r, h0, h1);
    case 11: return attend_avx2<11, KV>(a, r, h0, h1);
    case 12: return attend_avx2<12, KV>(a, r, h0, h1);
    case 13: return attend_avx2<13, KV>(a, r, h0, h1);
    case 14: return attend_avx2<14, KV>(a, r, h0, h1);
    case 15: return attend_avx2<15, KV>(a, r, h0, h1);
    default: return attend_avx2<16, KV>(a, r, h0, h1);
  }
}

// Stores n values of a row's key or value in the cache's element type.
inline void store_kv(const float* src, float* dst, int64_t n) { std::memcpy(dst, src, size_t(n) * sizeof(float)); }
inline void store_kv(const float* src, uint16_t* dst, int64_t n) { f32_to_bf16_row(src, dst, n); }

template <class KV>
void kv_attention_cache(const KernelCall& call) {
  const auto& p = call.p<core::AttentionParams>();
  const float* qkv = call.in(0).as<float>();
  const int32_t* rows = call.in(3).as<int32_t>();
  const int32_t* table = call.in(4).as<int32_t>();
  KV* kc = call.out(1).as<KV>();
  KV* vc = call.out(2).as<KV>();
  float* y = call.out(0).as<float>();
  const int64_t n = call.in(0).shape()[0], c = call.in(0).shape()[1] / 3;
  const int64_t t = call.in(1).shape()[1], blocks = call.in(1).shape()[0];
  const int64_t seqs = call.in(4).shape()[0], max_blocks = call.in(4).shape()[1];
  const int64_t heads = p.n_head, d = c / heads, context = max_blocks * t;
  const float scale = p.scale > 0 ? p.scale : 1.f / std::sqrt(float(d));

  // Validate every row before touching the cache.
  for (int64_t r = 0; r < n; ++r) {
    const int64_t seq = rows[2 * r], pos = rows[2 * r + 1];
    if (seq < 0 || seq >= seqs || pos < 0 || pos >= context)
      throw core::Error("kv_attention: row " + std::to_string(r) + " (sequence slot " + std::to_string(seq) +
                        ", position " + std::to_string(pos) + ") is outside the block table");
    for (int64_t b = 0; b <= pos / t; ++b) {
      const int32_t block = table[seq * max_blocks + b];
      if (block < 0 || block >= blocks)
        throw core::Error("kv_attention: sequence slot " + std::to_string(seq) + " maps to block " +
                          std::to_string(block) + ", outside the cache of " + std::to_string(blocks));
    }
  }
  auto slot = [&](int64_t seq, int64_t pos) { return (int64_t(table[seq * max_blocks + pos / t]) * t + pos % t) * c; };
  for (int64_t r = 0; r < n; ++r) {
    const int64_t at = slot(rows[2 * r], rows[2 * r + 1]);
    store_kv(qkv + r * 3 * c + c, kc + at, c);
    store_kv(qkv + r * 3 * c + 2 * c, vc + at, c);
  }

  const Attend<KV> a{qkv, kc, vc, y, rows, table, static_cast<float*>(call.workspace), c, t, heads, d, max_blocks, context, scale};
  // Tasks of a row's heads h0..h1: all of a row's heads in one task read each
  // block of the cache front to back (t x C values, contiguous); a decode of
  // one sequence still needs its heads split to keep every thread busy.
  int64_t per_task = std::min<int64_t>(heads, kMaxHeadsPerTask);
  while (heads % per_task != 0) --per_task;
  while (per_task > 1 && n * (heads / per_task) < 2 * omp_get_max_threads()) {
    int64_t next = per_task - 1;
    while (heads % next != 0) --next;
    per_task = next;
  }
  const int64_t groups = heads / per_task;
  const bool avx512 = cpu_features().few_rows_avx512 && d % 16 == 0 && d <= 128;
  const bool avx2 = !avx512 && cpu_features().packed != CpuFeatures::PackedPath::portable && d % 8 == 0 && d <= 128;
  parallel_for(n * groups, 1, [&](int64_t b, int64_t e) {
    for (int64_t task = b; task < e; ++task) {
      const int64_t r = task / groups, h0 = task % groups * per_task;
      if (avx2) {
        attend_avx2_heads(a, r, h0, h0 + per_task);
        continue;
      }
      if (!avx512) {
        attend_portable(a, r, h0, h0 + per_task);
        continue;
      }
      switch (d / 16) {
        case 1: attend_avx512<1, KV>(a, r, h0, h0 + per_task); break;
        case 2: attend_avx512<2, KV>(a, r, h0, h0 + per_task); break;
        case 3: attend_avx512<3, KV>(a, r, h0, h0 + per_task); break;
        case 4: attend_avx512<4, KV>(a, r, h0, h0 + per_task); break;
        case 5: attend_avx512<5, KV>(a, r, h0, h0 + per_task); break;
        case 6: attend_avx512<6, KV>(a, r, h0, h0 + per_task); break;
        case 7: attend_avx512<7, KV>(a, r, h0, h0 + per_task); break;
        default: attend_avx512<8, KV>(a, r, h0, h0 + per_task); break;
      }
    }
  });
}

// The kernel is keyed on qkv's dtype (f32); the caches may be f32 or bf16.
void kv_attention_f32(const KernelCall& call) {
  if (call.out(1).dtype() == core::DType::bf16) kv_attention_cache<uint16_t>(call);
  else kv_attention_cache<float>(call);
}

}  // namespace

void register_kv_attention_kernels(core::KernelRegistry& r) {
  r.add(core::OpKind::kv_attention, core::DType::f32, kv_attention_f32);
}

}  // namespace brisk::cpu
