// AVX2 + FMA register tiles for one attention head (attention_tiles.h says
// what each product computes and why these exist).
//
// Tiles: 6 rows x 16 columns (12 accumulators, two loads and six broadcasts
// per 12 FMAs), fewer rows at the edges. Columns go in chunks of 16; a head
// width that is not a multiple of 16 ends with a chunk of 8 or with a masked
// one, so no load reads past a row's hd floats.
#include "attention_tiles.h"

#include <immintrin.h>

#include <algorithm>
#include <limits>

#include "vec_math.h"

namespace brisk::cpu::attention_tiles {
namespace {

#define BRISK_TILE_TARGET __attribute__((target("avx2,fma")))
#define BRISK_TILE_INLINE __attribute__((target("avx2,fma"), always_inline)) inline

constexpr int kRows = 6;  // rows (or keys) per tile

BRISK_TILE_INLINE __m256i lane_mask(int64_t count) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(std::clamp<int64_t>(count, 0, 8))), idx);
}

// A chunk of NV vectors (8 * NV columns). Full: all columns valid; otherwise
// the first `cols` are, and loads and stores go through masks.
template <int NV, bool Full>
struct Chunk {
  __m256i mask[NV];
  BRISK_TILE_INLINE void set(int64_t cols) {
    if constexpr (!Full)
      for (int k = 0; k < NV; ++k) mask[k] = lane_mask(cols - 8 * k);
  }
  BRISK_TILE_INLINE __m256 load(const float* p, int k) const {
    if constexpr (Full) return _mm256_loadu_ps(p + 8 * k);
    else return _mm256_maskload_ps(p + 8 * k, mask[k]);
  }
  BRISK_TILE_INLINE void store(float* p, int k, __m256 v) const {
    if constexpr (Full) _mm256_storeu_ps(p + 8 * k, v);
    else _mm256_maskstore_ps(p + 8 * k, mask[k], v);
  }
};

// Runs f.template operator()<R>() for R = rows (1..kRows).
template <class F>
void with_rows(int rows, F&& f) {
  switch (rows) {
    case 1: f.template operator()<1>(); break;
    case 2: f.template operator()<2>(); break;
    case 3: f.template operator()<3>(); break;
    case 4: f.template operator()<4>(); break;
    case 5: f.template operator()<5>(); break;
    default: f.template operator()<6>(); break;
  }
}

// Runs f.template operator()<NV, Full>() for a chunk of `cols` (1..16) columns.
template <class F>
void with_chunk(int64_t cols, F&& f) {
  if (cols == 16) f.template operator()<2, true>();
  else if (cols == 8) f.template operator()<1, true>();
  else if (cols > 8) f.template operator()<2, false>();
  else f.template operator()<1, false>();
}

// ---- scores: R rows of a against one panel of 16 transposed rows --------------------------
template <int R>
BRISK_TILE_TARGET void scores_tile(const float* a, int64_t lda, const float* panel, int64_t hd, float alpha, float* c,
                                   int64_t ldc, int64_t cols) {
  __m256 acc[R][2];
#pragma GCC unroll 6
  for (int i = 0; i < R; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  for (int64_t d = 0; d < hd; ++d) {
    const __m256 b0 = _mm256_loadu_ps(panel + d * kPanel), b1 = _mm256_loadu_ps(panel + d * kPanel + 8);
#pragma GCC unroll 6
    for (int i = 0; i < R; ++i) {
      const __m256 x = _mm256_broadcast_ss(a + i * lda + d);
      acc[i][0] = _mm256_fmadd_ps(x, b0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(x, b1, acc[i][1]);
    }
  }
  const __m256 s = _mm256_set1_ps(alpha);
  if (cols == kPanel) {
#pragma GCC unroll 6
    for (int i = 0; i < R; ++i) {
      _mm256_storeu_ps(c + i * ldc, _mm256_mul_ps(s, acc[i][0]));
      _mm256_storeu_ps(c + i * ldc + 8, _mm256_mul_ps(s, acc[i][1]));
    }
  } else {  // the last panel: only its first `cols` keys exist
    const __m256i m0 = lane_mask(cols), m1 = lane_mask(cols - 8);
    for (int i = 0; i < R; ++i) {
      _mm256_maskstore_ps(c + i * ldc, m0, _mm256_mul_ps(s, acc[i][0]));
      _mm256_maskstore_ps(c + i * ldc + 8, m1, _mm256_mul_ps(s, acc[i][1]));
    }
  }
}

// ---- rows_times: R rows of p times n rows of v, one column chunk -------------------------
template <int R, int NV, bool Full>
BRISK_TILE_TARGET void rows_tile(const float* p, int64_t ldp, const float* v, int64_t ldv, int64_t n, float* y,
                                 int64_t ldy, int64_t cols, bool accumulate) {
  Chunk<NV, Full> ch;
  ch.set(cols);
  __m256 acc[R][NV];
#pragma GCC unroll 6
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 2
    for (int k = 0; k < NV; ++k) acc[i][k] = accumulate ? ch.load(y + i * ldy, k) : _mm256_setzero_ps();
  for (int64_t j = 0; j < n; ++j) {
    __m256 vv[NV];
#pragma GCC unroll 2
    for (int k = 0; k < NV; ++k) vv[k] = ch.load(v + j * ldv, k);
#pragma GCC unroll 6
    for (int i = 0; i < R; ++i) {
      const __m256 x = _mm256_broadcast_ss(p + i * ldp + j);
#pragma GCC unroll 2
      for (int k = 0; k < NV; ++k) acc[i][k] = _mm256_fmadd_ps(x, vv[k], acc[i][k]);
    }
  }
#pragma GCC unroll 6
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 2
    for (int k = 0; k < NV; ++k) ch.store(y + i * ldy, k, acc[i][k]);
}

// ---- transpose: one 8 x 8 block in registers -------------------------------------------
BRISK_TILE_TARGET void transpose8x8(const float* src, int64_t lds, float* dst, int64_t ldd) {
  __m256 r[8], t[8];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * lds);
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
#pragma GCC unroll 2
  for (int i = 0; i < 2; ++i) {
    r[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    r[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xee);
    r[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    r[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xee);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(dst + i * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
    _mm256_storeu_ps(dst + (i + 4) * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
  }
}

// exp(x) for x <= 0, as vec_math.h's fast_exp (Cephes: range reduction by
// ln 2, degree-6 polynomial, exponent by integer shift). Below -87.3 it gives
// ~1.2e-38 rather than 0: nothing beside a row's largest term, exp(0) = 1.
// max(lo, x) returns x when x is NaN, so NaN comes through.
BRISK_TILE_INLINE __m256 exp_nonpositive(__m256 x) {
  x = _mm256_max_ps(_mm256_set1_ps(-87.3365447504019f), x);
  const __m256 magic = _mm256_set1_ps(12582912.f);
  const __m256 n = _mm256_sub_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), magic), magic);
  const __m256 r =
      _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f), _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x));
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

// The largest of row[0, n), n >= 1. NaN lanes lose here, but a NaN score's
// exp below stays NaN.
BRISK_TILE_TARGET float row_max(const float* row, int64_t n) {
  const __m256i tail = lane_mask(n % 8);
  const int64_t full = n - n % 8;
  __m256 mx = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < full; j += 8) mx = _mm256_max_ps(_mm256_loadu_ps(row + j), mx);
  if (full < n)  // masked-off lanes load 0; blend them back to -inf
    mx = _mm256_max_ps(_mm256_blendv_ps(mx, _mm256_maskload_ps(row + full, tail), _mm256_castsi256_ps(tail)), mx);
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  return _mm_cvtss_f32(m4);
}

// row[j] = exp(row[j] - shift) for j < n (every row[j] - shift <= 0, up to
// rounding: exp_nonpositive is exact enough a little above 0 too); returns
// their sum.
BRISK_TILE_TARGET float exp_sum(float* row, int64_t n, float shift) {
  const __m256i tail = lane_mask(n % 8);
  const int64_t full = n - n % 8;
  const __m256 m = _mm256_set1_ps(shift);
  __m256 sum = _mm256_setzero_ps();
  for (int64_t j = 0; j < full; j += 8) {
    const __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(row + j), m));
    _mm256_storeu_ps(row + j, e);
    sum = _mm256_add_ps(sum, e);
  }
  if (full < n) {
    const __m256 e = _mm256_and_ps(exp_nonpositive(_mm256_sub_ps(_mm256_maskload_ps(row + full, tail), m)),
                                   _mm256_castsi256_ps(tail));
    _mm256_maskstore_ps(row + full, tail, e);
    sum = _mm256_add_ps(sum, e);
  }
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps(sum, 1));
  s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
  return _mm_cvtss_f32(s4);
}

// row[0, n) *= s.
BRISK_TILE_TARGET void scale_row(float* row, int64_t n, float s) {
  const __m256i tail = lane_mask(n % 8);
  const int64_t full = n - n % 8;
  const __m256 v = _mm256_set1_ps(s);
  for (int64_t j = 0; j < full; j += 8) _mm256_storeu_ps(row + j, _mm256_mul_ps(_mm256_loadu_ps(row + j), v));
  if (full < n) _mm256_maskstore_ps(row + full, tail, _mm256_mul_ps(_mm256_maskload_ps(row + full, tail), v));
}

BRISK_TILE_TARGET void softmax_row(float* row, int64_t n, int64_t len) {
  const float sum = exp_sum(row, n, row_max(row, n));
  scale_row(row, n, 1.f / sum);
  std::fill(row + n, row + len, 0.f);
}

}  // namespace

void softmax_rows(float* row, int64_t ld, int64_t rows, int64_t n, int64_t len) {
  for (int64_t r = 0; r < rows; ++r) softmax_row(row + r * ld, n, len);
}

float online_softmax_row(float* row, int64_t n, int64_t w, float& m, float& l, bool first) {
  const float tile_max = row_max(row, n);
  const float mx = first ? tile_max : std::max(m, tile_max);
  const float sum = exp_sum(row, n, mx);
  std::fill(row + n, row + w, 0.f);
  float alpha = 1.f;
  if (first) {
    l = sum;
  } else {
    alpha = fast_exp(m - mx);
    l = l * alpha + sum;
  }
  m = mx;
  return alpha;
}

void exp_shifted_row(float* row, int64_t n, int64_t w, float shift) {
  exp_sum(row, n, shift);
  std::fill(row + n, row + w, 0.f);
}

void scale_rows(float* row, int64_t ld, int64_t rows, int64_t n, const float* s) {
  for (int64_t r = 0; r < rows; ++r) scale_row(row + r * ld, n, s[r]);
}

void pack_transposed(const float* x, int64_t ld, int64_t n, int64_t hd, float* out) {
  for (int64_t j0 = 0; j0 < n; j0 += kPanel) {
    float* panel = out + j0 * hd;  // panel j0 / 16 starts 16 * hd floats after the previous one
    const int64_t w = std::min(kPanel, n - j0);
    for (int64_t d = 0; d < hd; ++d) {
      for (int64_t i = 0; i < w; ++i) panel[d * kPanel + i] = x[(j0 + i) * ld + d];
      for (int64_t i = w; i < kPanel; ++i) panel[d * kPanel + i] = 0.f;
    }
  }
}

void scores(const float* a, int64_t lda, const float* packed, int64_t m, int64_t n, int64_t hd, float alpha, float* c,
            int64_t ldc) {
  for (int64_t j0 = 0; j0 < n; j0 += kPanel) {
    const float* panel = packed + j0 * hd;
    const int64_t cols = std::min(kPanel, n - j0);
    for (int64_t r = 0; r < m; r += kRows)
      with_rows(int(std::min<int64_t>(kRows, m - r)), [&]<int R>() {
        scores_tile<R>(a + r * lda, lda, panel, hd, alpha, c + r * ldc + j0, ldc, cols);
      });
  }
}

void rows_times(const float* p, int64_t ldp, const float* v, int64_t ldv, int64_t m, int64_t n, int64_t hd, float* y,
                int64_t ldy, bool accumulate) {
  for (int64_t r = 0; r < m; r += kRows)
    with_rows(int(std::min<int64_t>(kRows, m - r)), [&]<int R>() {
      for (int64_t c0 = 0; c0 < hd; c0 += 16)
        with_chunk(std::min<int64_t>(16, hd - c0), [&]<int NV, bool Full>() {
          rows_tile<R, NV, Full>(p + r * ldp, ldp, v + c0, ldv, n, y + r * ldy + c0, ldy, hd - c0, accumulate);
        });
    });
}

void transpose(const float* src, int64_t lds, int64_t m, int64_t n, float* dst, int64_t ldd) {
  const int64_t m8 = m - m % 8, n8 = n - n % 8;
  for (int64_t r = 0; r < m8; r += 8) {
    for (int64_t j = 0; j < n8; j += 8) transpose8x8(src + r * lds + j, lds, dst + j * ldd + r, ldd);
    for (int64_t j = n8; j < n; ++j)
      for (int64_t i = r; i < r + 8; ++i) dst[j * ldd + i] = src[i * lds + j];
  }
  for (int64_t i = m8; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) dst[j * ldd + i] = src[i * lds + j];
}

void transposed_times(const float* p, int64_t ldp, const float* x, int64_t m, int64_t n, int64_t hd, float* g,
                      int64_t ldg, float* work) {
  for (int64_t j0 = 0; j0 < n; j0 += kKeyChunk) {
    const int64_t w = std::min(kKeyChunk, n - j0);
    transpose(p + j0, ldp, m, w, work, m);
    rows_times(work, m, x, hd, w, m, hd, g + j0 * ldg, ldg, true);
  }
}

void copy_rows(const float* src, int64_t lds, int64_t m, int64_t hd, float* dst) {
  for (int64_t r = 0; r < m; ++r) std::copy(src + r * lds, src + r * lds + hd, dst + r * hd);
}

}  // namespace brisk::cpu::attention_tiles
