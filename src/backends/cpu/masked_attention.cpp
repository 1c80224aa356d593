// CPU kernels for bidirectional attention over a right-padded batch
// (masked_attention and its backward) on packed qkv, f32.
//
// Threads take the (batch, head) pairs one at a time as they finish (the
// sequences' lengths differ, so an even split would not balance): each pair owns
// its columns of y / dqkv and its (T, T) block of probs, so nothing is reduced
// across threads and dK, dV accumulate straight into the output. Sequence b
// has L = lengths[b] valid keys, and every product's key dimension stops at
// L: padding costs nothing on the key side. Padded query rows are still
// computed (they attend over the valid keys, the op's contract). Query rows
// go in blocks of kBlock, so a block's scores stay in cache between the
// softmax and the P V product.
//
// Products run as register tiles on AVX2 + FMA (attention_tiles.h: BLAS
// calls this small spend much of their time packing), and otherwise as
// direct cblas_sgemm calls on the calling thread (OpenBLAS's OpenMP build
// runs single-threaded inside our parallel region), not gemm.h: their key
// dimension is each sequence's length, and gemm.h's oneDNN path would create
// and keep a primitive for every length it meets. Both compute the same
// products in the same block order; cpu_features().attention_tiles chooses.
//
// The backward reads probs only at keys < L: the products take P with its
// row stride T and just its first L columns, so the masked entries (zero
// from the forward, but undefined by the op's contract) never enter a result.
#include <cblas.h>

#include <cmath>
#include <vector>

#include "brisk/core/op.h"
#include "brisk/cpu/cpu_features.h"
#include "brisk/ops/layout.h"
#include "attention_tiles.h"
#include "attention_util.h"
#include "cpu_util.h"
#include "dropout_factors.h"
#include "kernels.h"
#include "vec_math.h"

namespace brisk::cpu {
namespace {

using core::KernelCall;
using Dims = AttentionDims;

// Query rows per block (as attention.cpp): large enough for efficient sgemms,
// small enough that a block of scores (kBlock x T) stays in L2.
constexpr int64_t kBlock = 64;

inline void sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                  const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, blasint(m), blasint(n),
              blasint(k), alpha, a, blasint(lda), b, blasint(ldb), beta, c, blasint(ldc));
}

// ---- BLAS products -------------------------------------------------------------------------

// One head. q, k, v: T rows of hd floats `ld` apart; y: T rows `ldy` apart;
// P: the head's (T, T) probabilities; L valid keys. With dropout P is saved
// as it is, and its dropped copy P Z (drop.pz, kBlock * L floats) multiplies V.
void forward_head(const float* q, const float* k, const float* v, int64_t ld, float* y, int64_t ldy, float* P,
                  int64_t T, int64_t L, int64_t hd, float scale, const HeadDropout& drop) {
  for (int64_t i0 = 0; i0 < T; i0 += kBlock) {
    const int64_t bs = std::min(kBlock, T - i0);
    float* Pb = P + i0 * T;
    // S = scale * Q[i0:i0+bs] K[0:L]^T, straight into the probs rows
    sgemm(false, true, bs, L, hd, scale, q + i0 * ld, ld, k, ld, 0.f, Pb, T);
    for (int64_t r = 0; r < bs; ++r) softmax_row(Pb + r * T, L, T);
    int64_t ldv = T;
    const float* Pv = drop.dropped(Pb, ldv, i0, bs, L);
    // Y[i0:i0+bs] = P[:, 0:L] V[0:L]
    sgemm(false, false, bs, hd, L, 1.f, Pv, ldv, v, ld, 0.f, y + i0 * ldy, ldy);
  }
}

// One head of the backward. Inputs as in forward_head plus dy (rows `lddy`
// apart); dq, dk, dv rows `ldd` apart. dS: kBlock * L floats. With dropout
// (Z in drop.z, P Z in drop.pz) dV takes P Z and dP is (dY V^T) Z.
void backward_head(const float* q, const float* k, const float* v, int64_t ld, const float* dy, int64_t lddy,
                   const float* P, float* dq, float* dk, float* dv, int64_t ldd, int64_t T, int64_t L, int64_t hd,
                   float scale, float* dS, const HeadDropout& drop) {
  zero_key_grads(dk, dv, ldd, T, hd);
  for (int64_t i0 = 0; i0 < T; i0 += kBlock) {
    const int64_t bs = std::min(kBlock, T - i0);
    const float* Pb = P + i0 * T;
    const float* dyb = dy + i0 * lddy;
    const float* Z = drop.on() ? drop.factors(i0, bs, 0, L) : nullptr;
    // dP = dY[i0:i0+bs] V[0:L]^T
    sgemm(false, true, bs, L, hd, 1.f, dyb, lddy, v, ld, 0.f, dS, L);
    if (Z) multiply_rows(dS, L, Z, bs, L), times_rows(Pb, T, Z, bs, L, drop.pz);
    // dV[0:L] += P[:, 0:L]^T dY[i0:i0+bs]
    sgemm(true, false, L, hd, bs, 1.f, Z ? drop.pz : Pb, Z ? L : T, dyb, lddy, 1.f, dv, ldd);
    softmax_backward_rows(Pb, T, dS, bs, L, scale);
    // dQ[i0:i0+bs] = dS K[0:L]
    sgemm(false, false, bs, hd, L, 1.f, dS, L, k, ld, 0.f, dq + i0 * ldd, ldd);
    // dK[0:L] += dS^T Q[i0:i0+bs]
    sgemm(true, false, L, hd, bs, 1.f, dS, L, q + i0 * ld, ld, 1.f, dk, ldd);
  }
}

// ---- register tiles (attention_tiles.h) ----------------------------------------------------

using HeadWork = attention_tiles::HeadWork;

// forward_head on tiles: the same products in the same block order.
void forward_head_tiles(const float* q, const float* k, const float* v, int64_t ld, float* y, int64_t ldy, float* P,
                        int64_t T, int64_t L, int64_t hd, float scale, const HeadWork& w, const HeadDropout& drop) {
  namespace tiles = attention_tiles;
  tiles::pack_transposed(k, ld, L, hd, w.keys);
  tiles::copy_rows(v, ld, L, hd, w.rows);
  for (int64_t i0 = 0; i0 < T; i0 += kBlock) {
    const int64_t bs = std::min(kBlock, T - i0);
    float* Pb = P + i0 * T;
    tiles::copy_rows(q + i0 * ld, ld, bs, hd, w.qb);
    tiles::scores(w.qb, hd, w.keys, bs, L, hd, scale, Pb, T);
    tiles::softmax_rows(Pb, T, bs, L, T);
    int64_t ldv = T;
    const float* Pv = drop.dropped(Pb, ldv, i0, bs, L);
    tiles::rows_times(Pv, ldv, w.rows, hd, bs, L, hd, y + i0 * ldy, ldy, false);
  }
}

// backward_head on tiles. The transposed products (dV += P^T dY, dK += dS^T
// Q) multiply a transposed copy of the block of P or dS.
void backward_head_tiles(const float* q, const float* k, const float* v, int64_t ld, const float* dy, int64_t lddy,
                         const float* P, float* dq, float* dk, float* dv, int64_t ldd, int64_t T, int64_t L, int64_t hd,
                         float scale, float* dS, const HeadWork& w, const HeadDropout& drop) {
  namespace tiles = attention_tiles;
  zero_key_grads(dk, dv, ldd, T, hd);
  tiles::pack_transposed(v, ld, L, hd, w.keys);
  tiles::copy_rows(k, ld, L, hd, w.rows);
  for (int64_t i0 = 0; i0 < T; i0 += kBlock) {
    const int64_t bs = std::min(kBlock, T - i0);
    const float* Pb = P + i0 * T;
    tiles::copy_rows(dy + i0 * lddy, lddy, bs, hd, w.dyb);
    tiles::copy_rows(q + i0 * ld, ld, bs, hd, w.qb);
    tiles::scores(w.dyb, hd, w.keys, bs, L, hd, 1.f, dS, L);  // dP
    const float* Z = drop.on() ? drop.factors(i0, bs, 0, L) : nullptr;
    if (Z) multiply_rows(dS, L, Z, bs, L), times_rows(Pb, T, Z, bs, L, drop.pz);
    tiles::transposed_times(Z ? drop.pz : Pb, Z ? L : T, w.dyb, bs, L, hd, dv, ldd, w.transposed);  // dV
    softmax_backward_rows(Pb, T, dS, bs, L, scale);
    tiles::rows_times(dS, L, w.rows, hd, bs, L, hd, dq + i0 * ldd, ldd, false);  // dQ
    tiles::transposed_times(dS, L, w.qb, bs, L, hd, dk, ldd, w.transposed);  // dK
  }
}

void masked_attention_f32(const KernelCall& c) {
  const Dims d = attention_dims(c, c.in(0).shape());
  const int32_t* lengths = c.in(1).as<const int32_t>();
  ops::check_lengths("masked_attention", lengths, d.B, d.T);  // before the parallel region: it throws
  const float* qkv = c.in(0).as<float>();
  float* y = c.out(0).as<float>();
  float* probs = c.out(1).as<float>();
  const bool tiles = cpu_features().attention_tiles;
  const ProbDropout drop(c, d.T);
  const size_t head_floats = tiles ? HeadWork::floats(d.T, d.hd, kBlock) : 0, block = size_t(kBlock * d.T);
  for_each_head(d, head_floats + (drop.on() ? 2 * block : 0), [&](const HeadOffsets& o, float* w) {
    const float* q = qkv + o.qkv;
    float *yh = y + o.y, *P = probs + o.probs;
    const HeadDropout hdrop(drop, o.bh, w + head_floats, int64_t(block));  // Z, then P Z
    if (tiles)
      forward_head_tiles(q, q + d.C, q + 2 * d.C, 3 * d.C, yh, d.C, P, d.T, lengths[o.b], d.hd, d.scale,
                         HeadWork(w, d.T, d.hd, kBlock), hdrop);
    else
      forward_head(q, q + d.C, q + 2 * d.C, 3 * d.C, yh, d.C, P, d.T, lengths[o.b], d.hd, d.scale, hdrop);
  });
}

void masked_attention_backward_f32(const KernelCall& c) {
  const Dims d = attention_dims(c, c.in(1).shape());
  const int32_t* lengths = c.in(3).as<const int32_t>();
  ops::check_lengths("masked_attention_backward", lengths, d.B, d.T);
  const float* dy = c.in(0).as<float>();
  const float* qkv = c.in(1).as<float>();
  const float* probs = c.in(2).as<float>();
  float* dqkv = c.out(0).as<float>();
  const bool tiles = cpu_features().attention_tiles;
  const ProbDropout drop(c, d.T);
  // dS, then (tiles) the dense copies, then (dropout) Z and P Z
  const size_t ds_floats = size_t(kBlock * d.T);
  const size_t floats = ds_floats + (tiles ? HeadWork::floats(d.T, d.hd, kBlock) : 0);
  for_each_head(d, floats + (drop.on() ? 2 * ds_floats : 0), [&](const HeadOffsets& o, float* dS) {
    const float *q = qkv + o.qkv, *dyh = dy + o.y, *P = probs + o.probs;
    float* dq = dqkv + o.qkv;
    const int64_t L = lengths[o.b];
    const HeadDropout hdrop(drop, o.bh, dS + floats, int64_t(ds_floats));
    if (tiles)
      backward_head_tiles(q, q + d.C, q + 2 * d.C, 3 * d.C, dyh, d.C, P, dq, dq + d.C, dq + 2 * d.C, 3 * d.C, d.T, L,
                          d.hd, d.scale, dS, HeadWork(dS + ds_floats, d.T, d.hd, kBlock), hdrop);
    else
      backward_head(q, q + d.C, q + 2 * d.C, 3 * d.C, dyh, d.C, P, dq, dq + d.C, dq + 2 * d.C, 3 * d.C, d.T, L, d.hd,
                    d.scale, dS, hdrop);
  });
}

}  // namespace

void register_masked_attention_kernels(core::KernelRegistry& r) {
  r.add(core::OpKind::masked_attention, core::DType::f32, masked_attention_f32);
  r.add(core::OpKind::masked_attention_backward, core::DType::f32, masked_attention_backward_f32);
}

}  // namespace brisk::cpu
