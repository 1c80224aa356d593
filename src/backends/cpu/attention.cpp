// CPU kernels for causal attention (forward and backward) on packed qkv.
//
// Threads split the (batch, head) pairs (the f32 kernels hand them out one at
// a time, parallel_for_each): each pair writes its own columns of
// y / dqkv and its own (T, T) block of probs, so no two threads touch the same
// bytes and nothing needs a reduction across threads. Within a pair the query
// rows go in blocks (kGemmBlock, kTileBlock rows); block [i0, i1) only needs
// keys [0, i1), so the matrix products (single-threaded inside our parallel
// region) cover the causal lower triangle plus half of one diagonal block,
// and the rest of the masked work is skipped. Scores are written straight
// into the probs output. The
// f32 products run as AVX2 + FMA register tiles where cpu_features() says so
// (attention_tiles.h), otherwise through gemm.h like the bf16 ones.
//
// bf16 on the bf16-native path reads q, k, v and dy as bf16 operands where
// they lie, accumulates in f32 (scores, dP, dK, dV), keeps the softmax and its
// gradient in f32 and rounds P and dS to bf16 only as the operands of the
// next product (as bf16 flash-attention kernels do). bf16-emulated widens one
// head's q, k, v (and dy) into per-thread f32 buffers, runs the f32 code and
// narrows the result.
//
// attention_backward never uses the masked (upper) entries of probs: the
// diagonal block is copied with zeros above the diagonal before it enters a
// matrix product (with dropout, its dropped copy is made first and the
// copy then drops the upper entries). The forward writes zeros there anyway,
// but the op's contract (and the reference kernel) only define the lower
// triangle.
#include <cmath>
#include <cstring>
#include <vector>

#include "brisk/core/op.h"
#include "brisk/cpu/cpu_features.h"
#include "attention_gemm.h"
#include "attention_tiles.h"
#include "attention_util.h"
#include "cpu_util.h"
#include "dropout_factors.h"
#include "kernels.h"
#include "vec_math.h"

namespace brisk::cpu {
namespace {

using core::KernelCall;

// Query rows per block, a trade: larger blocks make fewer, larger products,
// but compute more masked scores above the diagonal (at T = 256, blocks of
// 128 compute 1.5x the causal triangle, blocks of 64 1.25x). Through gemm.h
// (oneDNN on AVX-512 CPUs, f32 and bf16) 128 rows; bench_attention at W2's shape (B 8, T 256, hd 64) on a Zen 5 gave
// fwd+bwd 6.84 -> 6.26 ms (f32) and 4.99 -> 4.67 ms (bf16-native) against
// 64 rows, and 256 rows was slower than both. The register tiles keep 64.
constexpr int64_t kGemmBlock = 128;
constexpr int64_t kTileBlock = 64;

using Dims = AttentionDims;

// The first n values of a probability row as the products' operand type,
// zeros up to len (the masked part).
template <class E>
void masked_row(const float* src, int64_t n, int64_t len, E* dst) {
  for (int64_t j = 0; j < n; ++j) dst[j] = narrow<E>(src[j]);
  std::fill(dst + n, dst + len, narrow<E>(0.f));
}

// One head. q, k, v: T rows of hd values, `ld` apart; y: T rows `ldy` apart;
// P: the head's (T, T) f32 probabilities. `pw` (kGemmBlock * T values) holds a
// block of P as the operand type when that is not f32. With dropout P is
// saved as it is and its dropped copy P Z (drop.pz, kGemmBlock * T floats)
// multiplies V.
template <class E>
void forward_head(GemmCache& cache, const E* q, const E* k, const E* v, int64_t ld, E* y, int64_t ldy, float* P,
                  int64_t T, int64_t hd, float scale, E* pw, const HeadDropout& drop) {
  for (int64_t i0 = 0; i0 < T; i0 += kGemmBlock) {
    const int64_t bs = std::min(kGemmBlock, T - i0), i1 = i0 + bs;
    float* Pb = P + i0 * T;
    // S = scale * Q[i0:i1] K[0:i1]^T, f32
    mm(cache, false, true, bs, i1, hd, scale, q + i0 * ld, ld, k, ld, 0.f, Pb, T);
    for (int64_t r = 0; r < bs; ++r) softmax_row(Pb + r * T, i0 + r + 1, T);
    int64_t ldv = T;
    const float* Pv = drop.dropped(Pb, ldv, i0, bs, i1);
    // Y[i0:i1] = P[i0:i1, 0:i1] V[0:i1]  (masked entries are zero by now)
    if constexpr (std::is_same_v<E, float>) {
      mm(cache, false, false, bs, hd, i1, 1.f, Pv, ldv, v, ld, 0.f, y + i0 * ldy, ldy);
    } else {
      for (int64_t r = 0; r < bs; ++r) masked_row(Pv + r * ldv, i1, i1, pw + r * i1);
      mm(cache, false, false, bs, hd, i1, 1.f, pw, i1, v, ld, 0.f, y + i0 * ldy, ldy);
    }
  }
}

// One head of the backward. Inputs as in forward_head plus dy (rows `lddy`
// apart) and P; dq is written in place (rows `lddq` apart), dk and dv are
// f32 accumulators (rows `lddkv` apart). `work` holds 2 * kGemmBlock * T floats,
// `ew` 2 * kGemmBlock * T operand values (used when E is not f32). With
// dropout (factors Z in drop.z, kGemmBlock * T floats): dV takes P Z, dP is
// (dY V^T) Z, and the softmax's backward the saved, undropped P.
template <class E>
void backward_head(GemmCache& cache, const E* q, const E* k, const E* v, int64_t ld, const E* dy, int64_t lddy,
                   const float* P, E* dq, int64_t lddq, float* dk, float* dv, int64_t lddkv, int64_t T, int64_t hd,
                   float scale, float* work, E* ew, const HeadDropout& drop) {
  zero_key_grads(dk, dv, lddkv, T, hd);
  float* dS = work;  // (bs, i1): dP, then dS
  E* Pm = reinterpret_cast<E*>(work + kGemmBlock * T);  // (bs, i1): P with the mask applied
  E* dSe = reinterpret_cast<E*>(dS);                // dS as the operand type
  if constexpr (!std::is_same_v<E, float>) Pm = ew, dSe = ew + kGemmBlock * T;
  for (int64_t i0 = 0; i0 < T; i0 += kGemmBlock) {
    const int64_t bs = std::min(kGemmBlock, T - i0), i1 = i0 + bs;
    const E* dyb = dy + i0 * lddy;
    const float* Z = drop.on() ? drop.factors(i0, bs, 0, i1) : nullptr;
    const float* Pd = P + i0 * T;  // dV's P: with dropout P Z, made in dS (free until dP)
    int64_t ldp = T;
    if (Z) times_rows(Pd, T, Z, bs, i1, dS), Pd = dS, ldp = i1;
    for (int64_t r = 0; r < bs; ++r) masked_row(Pd + r * ldp, i0 + r + 1, i1, Pm + r * i1);
    // dP = dY[i0:i1] V[0:i1]^T
    mm(cache, false, true, bs, i1, hd, 1.f, dyb, lddy, v, ld, 0.f, dS, i1);
    if (Z) multiply_rows(dS, i1, Z, bs, i1);
    // dV[0:i1] += P^T dY[i0:i1]
    mm(cache, true, false, i1, hd, bs, 1.f, Pm, i1, dyb, lddy, 1.f, dv, lddkv);
    // dS = scale * P * (dP - rowsum(P * dP)); masked entries are zero.
    for (int64_t r = 0; r < bs; ++r) {
      float* ds = dS + r * i1;
      const float* pr = P + (i0 + r) * T;
      const int64_t n = i0 + r + 1;
      float pdp = 0.f;
#pragma omp simd reduction(+ : pdp)
      for (int64_t j = 0; j < n; ++j) pdp += pr[j] * ds[j];
      if constexpr (std::is_same_v<E, float>) {
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) ds[j] = scale * pr[j] * (ds[j] - pdp);
        std::fill(ds + n, ds + i1, 0.f);
      } else {
        E* de = dSe + r * i1;
        for (int64_t j = 0; j < n; ++j) de[j] = narrow<E>(scale * pr[j] * (ds[j] - pdp));
        std::fill(de + n, de + i1, narrow<E>(0.f));
      }
    }
    // dQ[i0:i1] = dS K[0:i1]
    mm(cache, false, false, bs, hd, i1, 1.f, dSe, i1, k, ld, 0.f, dq + i0 * lddq, lddq);
    // dK[0:i1] += dS^T Q[i0:i1]
    mm(cache, true, false, i1, hd, bs, 1.f, dSe, i1, q + i0 * ld, ld, 1.f, dk, lddkv);
  }
}

// ---- f32 on register tiles (attention_tiles.h): the same blocks, products and masks ------

using HeadWork = attention_tiles::HeadWork;

void forward_head_tiles(const float* q, const float* k, const float* v, int64_t ld, float* y, int64_t ldy, float* P,
                        int64_t T, int64_t hd, float scale, const HeadWork& w, const HeadDropout& drop) {
  namespace tiles = attention_tiles;
  tiles::pack_transposed(k, ld, T, hd, w.keys);
  tiles::copy_rows(v, ld, T, hd, w.rows);
  for (int64_t i0 = 0; i0 < T; i0 += kTileBlock) {
    const int64_t bs = std::min(kTileBlock, T - i0), i1 = i0 + bs;
    float* Pb = P + i0 * T;
    tiles::copy_rows(q + i0 * ld, ld, bs, hd, w.qb);
    tiles::scores(w.qb, hd, w.keys, bs, i1, hd, scale, Pb, T);
    for (int64_t r = 0; r < bs; ++r) tiles::softmax_rows(Pb + r * T, T, 1, i0 + r + 1, T);
    int64_t ldv = T;
    const float* Pv = drop.dropped(Pb, ldv, i0, bs, i1);  // with dropout, P Z
    tiles::rows_times(Pv, ldv, w.rows, hd, bs, i1, hd, y + i0 * ldy, ldy, false);  // masked entries are zero
  }
}

// dS and Pm: kTileBlock * T floats each (dP then dS; the block of P with its
// causal mask applied). With dropout dV takes P Z (drop.pz) and dP is
// (dY V^T) Z (drop.z).
void backward_head_tiles(const float* q, const float* k, const float* v, int64_t ld, const float* dy, int64_t lddy,
                         const float* P, float* dq, float* dk, float* dv, int64_t ldd, int64_t T, int64_t hd,
                         float scale, float* dS, float* Pm, const HeadWork& w, const HeadDropout& drop) {
  namespace tiles = attention_tiles;
  zero_key_grads(dk, dv, ldd, T, hd);
  tiles::pack_transposed(v, ld, T, hd, w.keys);
  tiles::copy_rows(k, ld, T, hd, w.rows);
  for (int64_t i0 = 0; i0 < T; i0 += kTileBlock) {
    const int64_t bs = std::min(kTileBlock, T - i0), i1 = i0 + bs;
    tiles::copy_rows(dy + i0 * lddy, lddy, bs, hd, w.dyb);
    tiles::copy_rows(q + i0 * ld, ld, bs, hd, w.qb);
    for (int64_t r = 0; r < bs; ++r) masked_row(P + (i0 + r) * T, i0 + r + 1, i1, Pm + r * i1);
    const float* Z = drop.on() ? drop.factors(i0, bs, 0, i1) : nullptr;
    if (Z) times_rows(Pm, i1, Z, bs, i1, drop.pz);
    tiles::scores(w.dyb, hd, w.keys, bs, i1, hd, 1.f, dS, i1);  // dP
    if (Z) multiply_rows(dS, i1, Z, bs, i1);
    tiles::transposed_times(Z ? drop.pz : Pm, i1, w.dyb, bs, i1, hd, dv, ldd, w.transposed);  // dV += P^T dY
    softmax_backward_rows(Pm, i1, dS, bs, i1, scale);  // masked entries of P are zero, so are dS's
    tiles::rows_times(dS, i1, w.rows, hd, bs, i1, hd, dq + i0 * ldd, ldd, false);  // dQ = dS K
    tiles::transposed_times(dS, i1, w.qb, bs, i1, hd, dk, ldd, w.transposed);   // dK += dS^T Q
  }
}

// ---- f32: work directly on the packed layout -----------------------------------------
// Heads go to threads one at a time, as in masked_attention.cpp; every head
// costs the same here, but the dynamic hand-out costs nothing either.
void attention_f32(const KernelCall& c) {
  const Dims d = attention_dims(c, c.in(0).shape());
  const float* qkv = c.in(0).as<float>();
  float* y = c.out(0).as<float>();
  float* probs = c.out(1).as<float>();
  GemmCache& cache = gemm_cache_of(c.ctx);
  const bool tiles = cpu_features().attention_tiles;
  const ProbDropout drop(c, d.T);
  const size_t head_floats = tiles ? HeadWork::floats(d.T, d.hd, kTileBlock) : 0;
  const size_t block = size_t((tiles ? kTileBlock : kGemmBlock) * d.T);  // with dropout: Z, then P Z
  for_each_head(d, head_floats + (drop.on() ? 2 * block : 0), [&](const HeadOffsets& o, float* w) {
    const float* q = qkv + o.qkv;
    float *yh = y + o.y, *P = probs + o.probs;
    const HeadDropout hdrop(drop, o.bh, w + head_floats, int64_t(block));
    if (tiles)
      forward_head_tiles(q, q + d.C, q + 2 * d.C, 3 * d.C, yh, d.C, P, d.T, d.hd, d.scale,
                         HeadWork(w, d.T, d.hd, kTileBlock), hdrop);
    else
      forward_head<float>(cache, q, q + d.C, q + 2 * d.C, 3 * d.C, yh, d.C, P, d.T, d.hd, d.scale, nullptr, hdrop);
  });
}

void attention_backward_f32(const KernelCall& c) {
  const Dims d = attention_dims(c, c.in(1).shape());
  const float* dy = c.in(0).as<float>();
  const float* qkv = c.in(1).as<float>();
  const float* probs = c.in(2).as<float>();
  float* dqkv = c.out(0).as<float>();
  GemmCache& cache = gemm_cache_of(c.ctx);
  const bool tiles = cpu_features().attention_tiles;
  const ProbDropout drop(c, d.T);
  const size_t block = size_t((tiles ? kTileBlock : kGemmBlock) * d.T);
  const size_t work_floats = 2 * block;
  const size_t floats = work_floats + (tiles ? HeadWork::floats(d.T, d.hd, kTileBlock) : 0);
  // with dropout: Z, then (tiles) P Z
  for_each_head(d, floats + (drop.on() ? (tiles ? 2 : 1) * block : 0), [&](const HeadOffsets& o, float* work) {
    const float *q = qkv + o.qkv, *dyh = dy + o.y, *P = probs + o.probs;
    float* dq = dqkv + o.qkv;
    const HeadDropout hdrop(drop, o.bh, work + floats, tiles ? int64_t(block) : 0);
    if (tiles)
      backward_head_tiles(q, q + d.C, q + 2 * d.C, 3 * d.C, dyh, d.C, P, dq, dq + d.C, dq + 2 * d.C, 3 * d.C, d.T,
                          d.hd, d.scale, work, work + kTileBlock * d.T,
                          HeadWork(work + work_floats, d.T, d.hd, kTileBlock), hdrop);
    else
      backward_head<float>(cache, q, q + d.C, q + 2 * d.C, 3 * d.C, dyh, d.C, P, dq, 3 * d.C, dq + d.C, dq + 2 * d.C,
                           3 * d.C, d.T, d.hd, d.scale, work, nullptr, hdrop);
  });
}

// ---- bf16-native: bf16 operands straight from qkv, f32 accumulation --------------------

uint16_t* scratch16(size_t n) {
  thread_local std::vector<uint16_t> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

void attention_bf16_native(const KernelCall& c) {
  const Dims d = attention_dims(c, c.in(0).shape());
  const uint16_t* qkv = c.in(0).as<uint16_t>();
  uint16_t* y = c.out(0).as<uint16_t>();
  float* probs = c.out(1).as<float>();
  GemmCache& cache = gemm_cache_of(c.ctx);
  const ProbDropout drop(c, d.T);
  const size_t block = size_t(kGemmBlock * d.T);
  parallel_for(d.B * d.nh, 1, [&](int64_t lo, int64_t hi) {
    uint16_t* pw = scratch16(block);
    float* z = drop.on() ? scratch(2 * block) : nullptr;  // Z, then P Z
    for (int64_t bh = lo; bh < hi; ++bh) {
      const int64_t b = bh / d.nh, h = bh % d.nh;
      const uint16_t* q = qkv + b * d.T * 3 * d.C + h * d.hd;
      forward_head<uint16_t>(cache, q, q + d.C, q + 2 * d.C, 3 * d.C, y + b * d.T * d.C + h * d.hd, d.C,
                             probs + bh * d.T * d.T, d.T, d.hd, d.scale, pw, HeadDropout(drop, bh, z, int64_t(block)));
    }
  });
}

void attention_backward_bf16_native(const KernelCall& c) {
  const Dims d = attention_dims(c, c.in(1).shape());
  const uint16_t* dy = c.in(0).as<uint16_t>();
  const uint16_t* qkv = c.in(1).as<uint16_t>();
  const float* probs = c.in(2).as<float>();
  uint16_t* dqkv = c.out(0).as<uint16_t>();
  GemmCache& cache = gemm_cache_of(c.ctx);
  const int64_t n = d.T * d.hd;
  const ProbDropout drop(c, d.T);
  const int64_t block = kGemmBlock * d.T;
  parallel_for(d.B * d.nh, 1, [&](int64_t lo, int64_t hi) {
    float* buf = scratch(size_t(2 * n + (drop.on() ? 3 : 2) * block));
    float *dk = buf, *dv = buf + n, *work = buf + 2 * n, *z = work + 2 * block;
    uint16_t* ew = scratch16(size_t(2 * block));
    for (int64_t bh = lo; bh < hi; ++bh) {
      const int64_t b = bh / d.nh, h = bh % d.nh;
      const int64_t off = b * d.T * 3 * d.C + h * d.hd;
      const uint16_t* q = qkv + off;
      backward_head<uint16_t>(cache, q, q + d.C, q + 2 * d.C, 3 * d.C, dy + b * d.T * d.C + h * d.hd, d.C,
                              probs + bh * d.T * d.T, dqkv + off, 3 * d.C, dk, dv, d.hd, d.T, d.hd, d.scale, work, ew,
                              HeadDropout(drop, bh, z));
      narrow_head(dk, dqkv + off + d.C, 3 * d.C, d.T, d.hd);
      narrow_head(dv, dqkv + off + 2 * d.C, 3 * d.C, d.T, d.hd);
    }
  });
}

// ---- bf16-emulated: widen one head, run the f32 code, narrow --------------------------

void attention_bf16_emulated(const KernelCall& c) {
  const Dims d = attention_dims(c, c.in(0).shape());
  const uint16_t* qkv = c.in(0).as<uint16_t>();
  uint16_t* y = c.out(0).as<uint16_t>();
  float* probs = c.out(1).as<float>();
  GemmCache& cache = gemm_cache_of(c.ctx);
  const int64_t n = d.T * d.hd;
  const ProbDropout drop(c, d.T);
  const int64_t block = kGemmBlock * d.T;
  parallel_for(d.B * d.nh, 1, [&](int64_t lo, int64_t hi) {
    float* buf = scratch(size_t(4 * n + (drop.on() ? 2 * block : 0)));
    float *q = buf, *k = buf + n, *v = buf + 2 * n, *yh = buf + 3 * n, *z = buf + 4 * n;
    for (int64_t bh = lo; bh < hi; ++bh) {
      const int64_t b = bh / d.nh, h = bh % d.nh;
      const uint16_t* src = qkv + b * d.T * 3 * d.C + h * d.hd;
      widen_qkv_head(src, d, q, k, v);
      forward_head<float>(cache, q, k, v, d.hd, yh, d.hd, probs + bh * d.T * d.T, d.T, d.hd, d.scale, nullptr,
                          HeadDropout(drop, bh, z, block));
      narrow_head(yh, y + b * d.T * d.C + h * d.hd, d.C, d.T, d.hd);
    }
  });
}

void attention_backward_bf16_emulated(const KernelCall& c) {
  const Dims d = attention_dims(c, c.in(1).shape());
  const uint16_t* dy = c.in(0).as<uint16_t>();
  const uint16_t* qkv = c.in(1).as<uint16_t>();
  const float* probs = c.in(2).as<float>();
  uint16_t* dqkv = c.out(0).as<uint16_t>();
  GemmCache& cache = gemm_cache_of(c.ctx);
  const int64_t n = d.T * d.hd;
  const ProbDropout drop(c, d.T);
  const int64_t block = kGemmBlock * d.T;
  parallel_for(d.B * d.nh, 1, [&](int64_t lo, int64_t hi) {
    float* buf = scratch(size_t(7 * n + (drop.on() ? 3 : 2) * block));
    float *q = buf, *k = buf + n, *v = buf + 2 * n, *g = buf + 3 * n;
    float *dq = buf + 4 * n, *dk = buf + 5 * n, *dv = buf + 6 * n, *work = buf + 7 * n, *z = work + 2 * block;
    for (int64_t bh = lo; bh < hi; ++bh) {
      const int64_t b = bh / d.nh, h = bh % d.nh;
      const int64_t off = b * d.T * 3 * d.C + h * d.hd;
      widen_qkv_head(qkv + off, d, q, k, v);
      widen_head(dy + b * d.T * d.C + h * d.hd, d.C, g, d.T, d.hd);
      backward_head<float>(cache, q, k, v, d.hd, g, d.hd, probs + bh * d.T * d.T, dq, d.hd, dk, dv, d.hd, d.T, d.hd,
                           d.scale, work, nullptr, HeadDropout(drop, bh, z));
      narrow_head(dq, dqkv + off, 3 * d.C, d.T, d.hd);
      narrow_head(dk, dqkv + off + d.C, 3 * d.C, d.T, d.hd);
      narrow_head(dv, dqkv + off + 2 * d.C, 3 * d.C, d.T, d.hd);
    }
  });
}

void attention_bf16(const KernelCall& c) {
  gemm_bf16_native() ? attention_bf16_native(c) : attention_bf16_emulated(c);
}
void attention_backward_bf16(const KernelCall& c) {
  gemm_bf16_native() ? attention_backward_bf16_native(c) : attention_backward_bf16_emulated(c);
}

}  // namespace

void register_attention_kernels(core::KernelRegistry& r) {
  r.add(core::OpKind::attention, core::DType::f32, attention_f32);
  r.add(core::OpKind::attention, core::DType::bf16, attention_bf16);
  r.add(core::OpKind::attention_backward, core::DType::f32, attention_backward_f32);
  r.add(core::OpKind::attention_backward, core::DType::bf16, attention_backward_bf16);
}

}  // namespace brisk::cpu
