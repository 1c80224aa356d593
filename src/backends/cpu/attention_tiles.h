// Register-tiled products of one attention head on AVX2 + FMA, for the plain
// attention kernels (attention.cpp, masked_attention.cpp) and the flash ones
// (flash_tiles.h).
//
// An attention head's products are small and oddly shaped: the head width hd
// (32 for the earlier E1 shape, 64 now) is the inner dimension of the scores, and the number of valid
// keys changes from sequence to sequence. A BLAS call per block spends much
// of its time packing and scaling C for so little work (the earlier E1's attention ran
// at 27-39% of the FMA peak through OpenBLAS: bench_attention --masked). These kernels skip all of it:
// the caller makes dense copies (K transposed into panels, V, a block's Q
// and dY rows, a block of P or dS transposed), each read many times.
//
// Every tile keeps up to 6 rows x 16 columns of sums in 12 ymm registers for
// the whole inner loop, so each output is one FMA chain in the order of the
// inner index: a row's result does not depend on the tile it lands in.
// Any hd works (the last column chunk is masked); callers choose these over
// BLAS only where the CPU has AVX2 and FMA (cpu_features().attention_tiles).
#pragma once

#include <cstddef>
#include <cstdint>

namespace brisk::cpu::attention_tiles {

// Keys per panel of a transposed copy.
constexpr int64_t kPanel = 16;

// Floats a transposed copy of n rows of width hd takes.
inline int64_t packed_floats(int64_t n, int64_t hd) { return (n + kPanel - 1) / kPanel * kPanel * hd; }

// out = x^T in panels: panel p holds rows [16p, 16p + 16) of x (rows `ld`
// apart, hd wide) as hd runs of 16 floats, zero past row n.
void pack_transposed(const float* x, int64_t ld, int64_t n, int64_t hd, float* out);

// c[r][j] = alpha * sum_d a[r][d] * x[j][d] for r < m, j < n, with x given
// as pack_transposed(x, ., n, hd). Rows of a are `lda` apart, of c `ldc`.
void scores(const float* a, int64_t lda, const float* packed, int64_t m, int64_t n, int64_t hd, float alpha, float* c,
            int64_t ldc);

// y[r][:] (=, or += with accumulate) sum_j p[r][j] * v[j][:] for r < m,
// j < n: probabilities times values. Rows hd wide: p `ldp` apart, v `ldv`,
// y `ldy`.
void rows_times(const float* p, int64_t ldp, const float* v, int64_t ldv, int64_t m, int64_t n, int64_t hd, float* y,
                int64_t ldy, bool accumulate);

// dst[j][r] = src[r][j] for r < m, j < n: src rows `lds` apart, dst rows
// `ldd`. The transposed products (dV += P^T dY, dK += dS^T Q) run as
// rows_times over a transposed copy: read in place, P's rows T floats apart
// (1 KiB at T = 256) fall into a few L1 sets and evict each other.
void transpose(const float* src, int64_t lds, int64_t m, int64_t n, float* dst, int64_t ldd);

// g[j][:] += sum_r p[r][j] * x[r][:] for j < n, r < m: the transposed
// product (dV += P^T dY, dK += dS^T Q). p rows `ldp` apart, x dense (m, hd),
// g rows `ldg` apart. Keys go in chunks of kKeyChunk, each transposed into
// `work` (kKeyChunk * m floats, small enough to stay in L1) and multiplied
// by rows_times.
constexpr int64_t kKeyChunk = 48;
void transposed_times(const float* p, int64_t ldp, const float* x, int64_t m, int64_t n, int64_t hd, float* g,
                      int64_t ldg, float* work);

// dst = rows [0, m) of src (rows `lds` apart, hd wide) packed densely. A
// head's rows in packed qkv lie 3C floats apart, which maps them onto a few
// L1 sets the same way; the products read dense copies.
void copy_rows(const float* src, int64_t lds, int64_t m, int64_t hd, float* dst);

// A thread's dense copies for one head, for query blocks of up to `block`
// rows: `keys` (K transposed into panels for the scores: K forward, V
// backward), `rows` (the other of K and V, dense), a block's Q and dY rows,
// and the transposed_times work.
struct HeadWork {
  float *keys, *rows, *qb, *dyb, *transposed;
  static size_t floats(int64_t T, int64_t hd, int64_t block) {
    return size_t(packed_floats(T, hd) + T * hd + 2 * block * hd + kKeyChunk * block);
  }
  HeadWork(float* w, int64_t T, int64_t hd, int64_t block)
      : keys(w), rows(keys + packed_floats(T, hd)), qb(rows + T * hd), dyb(qb + block * hd),
        transposed(dyb + block * hd) {}
};

// Each of `rows` rows (`ld` apart): [0, n) -> its softmax, [n, len) -> 0.
// softmax_row (attention_util.h) vectorised by hand: GCC leaves that one's
// max reduction scalar, and its exp's selects for infinities cost a third of
// the exp (a row's shifted scores are <= 0 by construction). NaN scores stay NaN.
void softmax_rows(float* row, int64_t ld, int64_t rows, int64_t n, int64_t len);

// One step of the online softmax (flash attention's forward) on a row of
// scores against one key tile: with m' = the largest of m and row[0, n) (the
// row's own largest when `first`), row[0, n) -> exp(row - m'), [n, w) -> 0,
// l -> l * exp(m - m') + the row's sum (the sum alone when `first`), m -> m'.
// Returns exp(m - m'), the factor the row's output so far must be scaled by
// (1 when `first`). n >= 1.
float online_softmax_row(float* row, int64_t n, int64_t w, float& m, float& l, bool first);

// row[0, n) -> exp(row - shift), [n, w) -> 0: the backward's probabilities
// from the saved log-sum-exp.
void exp_shifted_row(float* row, int64_t n, int64_t w, float shift);

// Row r of `rows` (`ld` apart): [0, n) *= s[r].
void scale_rows(float* row, int64_t ld, int64_t rows, int64_t n, const float* s);

}  // namespace brisk::cpu::attention_tiles
