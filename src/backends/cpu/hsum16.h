// Sixteen horizontal sums at once, for the few-row Linear kernels (a 4x4
// tile of dot products keeps one 512-bit accumulator per output element).
//
// Summing each accumulator on its own costs ~8 shuffles and adds apiece;
// transposing pairs, then quads, then 128-bit chunks while adding costs 45
// instructions for all sixteen. Every lane goes through the same tree
// (element pairs, then quads, then chunks), so a sum's rounding does not
// depend on its position in the tile: a row's result is the same whichever
// tile row it lands in, which keeps decoding batch-invariant.
#pragma once

#include <immintrin.h>

namespace brisk::cpu {

// Lane j of the result = the sum of vj's sixteen lanes. The vectors come by
// value: an array argument would make GCC keep the caller's accumulators in
// memory and store them on every iteration of its loop.
__attribute__((target("avx512f"))) inline __m512 hsum16_ps(__m512 v0, __m512 v1, __m512 v2, __m512 v3, __m512 v4,
                                                           __m512 v5, __m512 v6, __m512 v7, __m512 v8, __m512 v9,
                                                           __m512 v10, __m512 v11, __m512 v12, __m512 v13,
                                                           __m512 v14, __m512 v15) {
  const __m512 v[16] = {v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15};
  __m512 pairs[8], quads[4];
  for (int i = 0; i < 8; ++i)  // per 128-bit chunk: [a0+a2, b0+b2, a1+a3, b1+b3]
    pairs[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i) {  // per chunk: the four vectors' chunk sums
    const __m512d a = _mm512_castps_pd(pairs[2 * i]), b = _mm512_castps_pd(pairs[2 * i + 1]);
    quads[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  // Chunks 0+1 and 2+3 of two quads side by side, then the same once more.
  const __m512 h0 = _mm512_add_ps(_mm512_shuffle_f32x4(quads[0], quads[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                  _mm512_shuffle_f32x4(quads[0], quads[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 h1 = _mm512_add_ps(_mm512_shuffle_f32x4(quads[2], quads[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                  _mm512_shuffle_f32x4(quads[2], quads[3], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(h0, h1, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(h0, h1, _MM_SHUFFLE(3, 1, 3, 1)));
}

// The same for int32 lanes (exact, so only the instruction count matters).
__attribute__((target("avx512f"))) inline __m512i hsum16_epi32(__m512i v0, __m512i v1, __m512i v2, __m512i v3,
                                                                __m512i v4, __m512i v5, __m512i v6, __m512i v7,
                                                                __m512i v8, __m512i v9, __m512i v10, __m512i v11,
                                                                __m512i v12, __m512i v13, __m512i v14, __m512i v15) {
  const __m512i v[16] = {v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15};
  __m512i pairs[8], quads[4];
  for (int i = 0; i < 8; ++i)
    pairs[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i)
    quads[i] = _mm512_add_epi32(_mm512_unpacklo_epi64(pairs[2 * i], pairs[2 * i + 1]),
                                _mm512_unpackhi_epi64(pairs[2 * i], pairs[2 * i + 1]));
  const __m512i h0 = _mm512_add_epi32(_mm512_shuffle_i32x4(quads[0], quads[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                      _mm512_shuffle_i32x4(quads[0], quads[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512i h1 = _mm512_add_epi32(_mm512_shuffle_i32x4(quads[2], quads[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                      _mm512_shuffle_i32x4(quads[2], quads[3], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_epi32(_mm512_shuffle_i32x4(h0, h1, _MM_SHUFFLE(2, 0, 2, 0)),
                          _mm512_shuffle_i32x4(h0, h1, _MM_SHUFFLE(3, 1, 3, 1)));
}

}  // namespace brisk::cpu
