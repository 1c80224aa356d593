// Flash attention of one head on register tiles (flash_tiles.h says what and
// why). The structure is the BLAS kernels' (flash_attention.cpp): the rows of
// y are the online softmax's accumulator, rescaled whenever a key tile
// raises a row's maximum.
#include "flash_tiles.h"

#include <cmath>

#include "attention_util.h"

namespace brisk::cpu::flash_tiles {

namespace tiles = attention_tiles;

namespace {

// Keys any row of the query block [i0, i0 + bs) sees: [0, this).
int64_t block_keys(const KeyRange& keys, int64_t i0, int64_t bs) { return keys.end(i0 + bs - 1); }

// Query row t's valid keys among the key tile [j0, j0 + w).
int64_t tile_keys(const KeyRange& keys, int64_t t, int64_t j0, int64_t w) {
  return std::min(w, keys.end(t) - j0);
}

}  // namespace

void forward_head(const float* q, const float* k, const float* v, int64_t ld, float* y, int64_t ldy, float* lse,
                  int64_t T, KeyRange keys, int64_t hd, float scale, const Work& w, const HeadDropout& drop) {
  const int64_t n_keys = block_keys(keys, T - 1, 1);  // the last row sees the most keys
  tiles::pack_transposed(k, ld, n_keys, hd, w.kt);
  tiles::copy_rows(v, ld, n_keys, hd, w.vrows);
  float *m = w.stats, *l = w.stats + kTileQ;
  for (int64_t i0 = 0; i0 < T; i0 += kTileQ) {
    const int64_t bs = std::min(kTileQ, T - i0), kend = block_keys(keys, i0, bs);
    float* yb = y + i0 * ldy;
    tiles::copy_rows(q + i0 * ld, ld, bs, hd, w.qb);
    for (int64_t j0 = 0; j0 < kend; j0 += kTileK) {
      const int64_t wk = std::min(kTileK, kend - j0);
      const bool first = j0 == 0;
      tiles::scores(w.qb, hd, w.kt + j0 * hd, bs, wk, hd, scale, w.s, wk);  // j0 is a whole number of panels
      for (int64_t r = 0; r < bs; ++r) {
        const float alpha =
            tiles::online_softmax_row(w.s + r * wk, tile_keys(keys, i0 + r, j0, wk), wk, m[r], l[r], first);
        if (!first && alpha != 1.f) tiles::scale_rows(yb + r * ldy, ldy, 1, hd, &alpha);
      }
      // Dropout after the row sums (l is the softmax's), before P V.
      if (drop.on()) multiply_rows(w.s, wk, drop.factors(i0, bs, j0, wk), bs, wk);
      // Y (+)= P V[j0:j0+wk]; masked entries of P are zero.
      tiles::rows_times(w.s, wk, w.vrows + j0 * hd, hd, bs, wk, hd, yb, ldy, !first);
    }
    for (int64_t r = 0; r < bs; ++r) {
      const float inv = 1.f / l[r];
      tiles::scale_rows(yb + r * ldy, ldy, 1, hd, &inv);
      lse[i0 + r] = m[r] + std::log(l[r]);
    }
  }
}

void backward_head(const float* q, const float* k, const float* v, int64_t ld, const float* dy, const float* y,
                   int64_t ldg, const float* lse, float* dq, float* dk, float* dv, int64_t ldd, int64_t T,
                   KeyRange keys, int64_t hd, float scale, const Work& w, const HeadDropout& drop) {
  zero_key_grads(dk, dv, ldd, T, hd);
  const int64_t n_keys = block_keys(keys, T - 1, 1);
  tiles::pack_transposed(k, ld, n_keys, hd, w.kt);  // for S = Q K^T
  tiles::pack_transposed(v, ld, n_keys, hd, w.vt);  // for dP = dY V^T
  tiles::copy_rows(k, ld, n_keys, hd, w.krows);     // for dQ = dS K
  float* D = w.stats;
  for (int64_t i0 = 0; i0 < T; i0 += kTileQ) {
    const int64_t bs = std::min(kTileQ, T - i0), kend = block_keys(keys, i0, bs);
    tiles::copy_rows(q + i0 * ld, ld, bs, hd, w.qb);
    tiles::copy_rows(dy + i0 * ldg, ldg, bs, hd, w.dyb);
    flash_row_dots(w.dyb, hd, y + i0 * ldg, ldg, bs, hd, D);
    for (int64_t j0 = 0; j0 < kend; j0 += kTileK) {
      const int64_t wk = std::min(kTileK, kend - j0);
      float *P = w.s, *dS = w.ds;
      // P = exp(scale * Q K^T - lse), zero where masked
      tiles::scores(w.qb, hd, w.kt + j0 * hd, bs, wk, hd, scale, P, wk);
      for (int64_t r = 0; r < bs; ++r)
        tiles::exp_shifted_row(P + r * wk, tile_keys(keys, i0 + r, j0, wk), wk, lse[i0 + r]);
      // With dropout (factors Z) dV takes P Z (made in dS, free until dP) and dP is (dY V^T) Z.
      const float* Z = drop.on() ? drop.factors(i0, bs, j0, wk) : nullptr;
      if (Z) times_rows(P, wk, Z, bs, wk, dS);
      tiles::transposed_times(Z ? dS : P, wk, w.dyb, bs, wk, hd, dv + j0 * ldd, ldd, w.transposed);  // dV += P^T dY
      tiles::scores(w.dyb, hd, w.vt + j0 * hd, bs, wk, hd, 1.f, dS, wk);                            // dP = dY V^T
      if (Z) multiply_rows(dS, wk, Z, bs, wk);
      flash_softmax_backward(P, dS, bs, wk, D, scale);
      tiles::rows_times(dS, wk, w.krows + j0 * hd, hd, bs, wk, hd, dq + i0 * ldd, ldd, j0 > 0);  // dQ (+)= dS K
      tiles::transposed_times(dS, wk, w.qb, bs, wk, hd, dk + j0 * ldd, ldd, w.transposed);     // dK += dS^T Q
    }
  }
}

}  // namespace brisk::cpu::flash_tiles
