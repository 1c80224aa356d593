// Flash attention through gemm.h (flash_gemm.h), causal or masked at padding.
//
// Threads split the (batch, head) pairs, and each pair owns its columns of y
// / dqkv and its lse row, so nothing is reduced across threads and (f32) dK,
// dV can be accumulated straight into the output. Within a pair, queries go
// in tiles of kTileQ rows and keys in tiles of kTileK; each (query tile, key
// tile) product is one gemm() (gemm.h: oneDNN on AVX-512 CPUs, OpenBLAS
// elsewhere; nested in our parallel region, so on one thread) into a
// kTileQ x kTileK scratch tile, so the f32 kernels' only scratch is two tiles
// per thread whatever T is (bf16 adds O(T x hd) per thread, below).
//
// Which keys a tile holds (Keys):
// - causal: key tiles stop at the query tile's last row, and only the
//   diagonal tiles need a mask. kTileQ divides kTileK, so a key tile never
//   starts after its query tile's first row (every row of every visited tile
//   has at least one unmasked key).
// - masked at padding: sequence b's key tiles cover its L = lengths[b] valid
//   keys and stop there; every query row (padded ones too: the op's contract)
//   sees all L. The last tile's width is rounded up to a multiple of
//   kKeyStep keys (within the sequence's T rows), and the keys past L in it
//   are masked like the causal diagonal's: gemm.h then meets a few widths
//   instead of one per length (oneDNN creates and caches a primitive per
//   shape). A padded key's probability is exactly zero, so it adds nothing
//   to y, and its rows of dK and dV stay zero.
//
// Forward: the output rows of y (f32; bf16 uses f32 scratch rows) serve as
// the accumulator of the online softmax: per key tile, the running max m
// rises to m', y is rescaled by exp(m - m') and P V is added (beta 1); at the
// end y /= l and lse = m + log(l). Backward (FlashAttention-2): P = exp(S -
// lse) is recomputed per tile, D = rowsum(dY * Y) replaces rowsum(P * dP),
// and dV += P^T dY, dS = P (dY V^T - D) scale, dQ += dS K, dK += dS^T Q.
//
// Tile sizes: 128 query rows and 256 keys. bench_attention on a Zen 5
// (oneDNN products, 2 threads, hd 64, causal), flash / plain fwd+bwd time,
// tiles of 64 x 256 against 128 x 256: at T 1024 (B 2) f32 1.13 -> 1.05,
// bf16-native 1.22 -> 1.11; at W2's T 256 (B 8) bf16-native 1.22 -> 1.15,
// f32 the same within the runs' spread; 32-row and 128-key tiles were
// slower. (Through OpenBLAS on an AVX2 EPYC, 64 rows had measured best.) Two
// 128 x 256 f32 tiles are 256 KiB, inside a 1 MiB L2.
//
// Probability dropout (AttentionParams::dropout): the forward multiplies each
// tile of P by its keep factors after the row sums and before P V; the
// backward makes the tile's factors Z once, takes P Z for dV, multiplies dP by
// Z, and keeps the undropped P for dS. The factors come from each
// probability's (B, n_head, T, T) index (dropout_factors.h), so no mask is
// stored and every tiling drops the same entries.
//
// bf16 on the bf16-native path (CPUs with avx512_bf16, as the plain kernels)
// reads q, k, v, dy and y as bf16 where they lie and runs every product on
// bf16 operands with f32 accumulation: the scores, the online softmax and its
// gradient stay f32, P and dS are rounded to bf16 only as the operands of the
// next product, and Y, dQ, dK, dV accumulate in f32 scratch and are rounded
// once. bf16-emulated widens one head's q, k, v (and dy, y) into f32 scratch,
// runs the f32 code and narrows.
#include "flash_gemm.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "attention_gemm.h"
#include "brisk/cpu/cpu_features.h"
#include "cpu_util.h"
#include "dropout_factors.h"
#include "flash_tiles.h"
#include "vec_math.h"

namespace brisk::cpu::flash_gemm {
namespace {

using core::KernelCall;
using Dims = AttentionDims;

static_assert(kTileK % kTileQ == 0);

// A masked tile's width is rounded up to a multiple of this many keys.
constexpr int64_t kKeyStep = 16;

// The keys one head's query rows see.
struct Keys {
  int64_t T;    // rows of the sequence
  int64_t L;    // valid keys (masked); T when causal
  bool causal;  // row t sees [0, t]; otherwise every row sees [0, L)

  // Key tiles of the query rows [i0, i1) start below this.
  int64_t end(int64_t i1) const { return causal ? i1 : L; }
  // Width of the key tile at j0 for query rows below i1.
  int64_t width(int64_t j0, int64_t i1) const {
    if (causal) return std::min(j0 + kTileK, i1) - j0;  // keys past i1 are masked for the whole tile
    const int64_t n = std::min(kTileK, L - j0);
    return std::min((n + kKeyStep - 1) / kKeyStep * kKeyStep, T - j0);
  }
  // Valid keys of query row t in the tile at j0, out of its w.
  int64_t valid(int64_t t, int64_t j0, int64_t w) const {
    return causal ? std::min(w, t + 1 - j0) : std::min(w, L - j0);
  }
};

Keys keys_of(const Dims& d, const int32_t* lengths, int64_t b) {
  return lengths ? Keys{d.T, lengths[b], false} : Keys{d.T, d.T, true};
}
// The same for the register tiles.
flash_tiles::KeyRange tile_keys(const Dims& d, const int32_t* lengths, int64_t b) {
  return lengths ? flash_tiles::KeyRange{lengths[b], false} : flash_tiles::KeyRange{d.T, true};
}

size_t tile_floats() { return size_t(2 * kTileQ * kTileK + 4 * kTileQ); }
// Per-thread scratch of the bf16-native kernels: the tiles, P (and dS) as bf16
// operands, the query tile's f32 rows of Y (dQ), and for the backward the
// head's f32 dK and dV.
size_t native_forward_floats(int64_t hd) { return tile_floats() + size_t(kTileQ * hd); }
size_t native_backward_floats(int64_t T, int64_t hd) {
  return tile_floats() + size_t(kTileQ * kTileK + kTileQ * hd + 2 * T * hd);
}
// With probability dropout, a tile of its factors first.
size_t dropout_floats(const ProbDropout& drop) { return drop.on() ? size_t(kTileQ * kTileK) : 0; }

// One head of the forward. q, k, v: T rows of hd values `ld` apart; y: rows
// `ldy` apart; lse: T floats. work: native_forward_floats(hd) for bf16
// operands, tile_floats() for f32. The scores and the online softmax are f32 either
// way; with bf16 operands P is rounded to bf16 (into the second tile) only as
// the operand of P V, and the query tile's rows of Y accumulate in f32
// scratch until they are normalised and rounded once. With dropout, P is
// dropped after its row sums (l is the softmax's) and before P V.
template <class E>
void forward_head(GemmCache& cache, const E* q, const E* k, const E* v, int64_t ld, E* y, int64_t ldy, float* lse,
                  const Keys& keys, int64_t hd, float scale, float* work, const HeadDropout& drop) {
  constexpr bool f32 = std::is_same_v<E, float>;
  const int64_t T = keys.T;
  float* S = work;                        // (kTileQ, kTileK) scores, then probabilities
  float* m = work + 2 * kTileQ * kTileK;  // running max per row
  float* l = m + kTileQ;                  // running sum per row
  E* Pe = nullptr;                        // bf16: P as an operand, in the second tile
  float* acc = nullptr;                   // bf16: Y's f32 rows, hd apart
  if constexpr (!f32) Pe = reinterpret_cast<E*>(work + kTileQ * kTileK), acc = work + tile_floats();
  for (int64_t i0 = 0; i0 < T; i0 += kTileQ) {
    const int64_t bs = std::min(kTileQ, T - i0), i1 = i0 + bs;
    float* ya;
    int64_t lda;
    if constexpr (f32) {
      ya = y + i0 * ldy, lda = ldy;  // the output rows are the accumulator
    } else {
      ya = acc, lda = hd;
    }
    for (int64_t j0 = 0; j0 < keys.end(i1); j0 += kTileK) {
      const int64_t w = keys.width(j0, i1);
      const bool first = j0 == 0;
      // S = scale * Q[i0:i1] K[j0:j0+w]^T
      mm(cache, false, true, bs, w, hd, scale, q + i0 * ld, ld, k + j0 * ld, ld, 0.f, S, w);
      for (int64_t r = 0; r < bs; ++r) {
        float* s = S + r * w;
        const int64_t n = keys.valid(i0 + r, j0, w);
        float mx = first ? -std::numeric_limits<float>::infinity() : m[r];
#pragma omp simd reduction(max : mx)
        for (int64_t j = 0; j < n; ++j) mx = max_step(mx, s[j]);
        float sum = 0.f;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < n; ++j) {
          s[j] = fast_exp(s[j] - mx);
          sum += s[j];
        }
        std::fill(s + n, s + w, 0.f);
        if (first) {
          l[r] = sum;
        } else {
          const float alpha = fast_exp(m[r] - mx);
          l[r] = l[r] * alpha + sum;
          float* yr = ya + r * lda;
#pragma omp simd
          for (int64_t i = 0; i < hd; ++i) yr[i] *= alpha;
        }
        m[r] = mx;
      }
      if (drop.on()) multiply_rows(S, w, drop.factors(i0, bs, j0, w), bs, w);
      // Y[i0:i1] (+)= P V[j0:j0+w]
      if constexpr (f32) {
        mm(cache, false, false, bs, hd, w, 1.f, S, w, v + j0 * ld, ld, first ? 0.f : 1.f, ya, lda);
      } else {
        f32_to_bf16_row(S, Pe, bs * w);
        mm(cache, false, false, bs, hd, w, 1.f, Pe, w, v + j0 * ld, ld, first ? 0.f : 1.f, ya, lda);
      }
    }
    for (int64_t r = 0; r < bs; ++r) {
      const float inv = 1.f / l[r];
      float* yr = ya + r * lda;
#pragma omp simd
      for (int64_t i = 0; i < hd; ++i) yr[i] *= inv;
      if constexpr (!f32) f32_to_bf16_row(yr, y + (i0 + r) * ldy, hd);
      lse[i0 + r] = m[r] + std::log(l[r]);
    }
  }
}

// One head of the backward. Inputs as in forward_head plus dy and y (rows
// `ldg` apart) and lse. dq: the output (rows `lddq` apart); dk, dv: f32
// accumulators (rows `ldd` apart), the outputs themselves for f32. work:
// tile_floats() + kTileQ * (kTileK + hd) for bf16 operands (what
// native_backward_floats leaves after dK and dV), tile_floats() for f32. With bf16
// operands P and dS are rounded to bf16 only as the operands of their
// products (dV, dQ, dK), and the query tile's dQ accumulates in f32 scratch.
// With dropout (factors Z): dV += (P Z)^T dY and dP = (dY V^T) Z, while dS
// takes the undropped P; D = rowsum(dY * Y) already holds Y's dropout.
template <class E>
void backward_head(GemmCache& cache, const E* q, const E* k, const E* v, int64_t ld, const E* dy, const E* y,
                   int64_t ldg, const float* lse, E* dq, int64_t lddq, float* dk, float* dv, int64_t ldd,
                   const Keys& keys, int64_t hd, float scale, float* work, const HeadDropout& drop) {
  constexpr bool f32 = std::is_same_v<E, float>;
  const int64_t T = keys.T;
  zero_key_grads(dk, dv, ldd, T, hd);
  float* P = work;                     // (bs, w) probabilities
  float* dS = work + kTileQ * kTileK;  // (bs, w) dP, then dS
  float* D = dS + kTileQ * kTileK;     // rowsum(dY * Y)
  E *Pe, *dSe;          // P and dS as operands: bf16 copies past the tiles, or the tiles themselves
  float* dqa = nullptr;  // bf16: dQ's f32 rows, hd apart
  if constexpr (f32) {
    Pe = P, dSe = dS;
  } else {
    Pe = reinterpret_cast<E*>(work + tile_floats()), dSe = Pe + kTileQ * kTileK;
    dqa = work + tile_floats() + kTileQ * kTileK;
  }
  for (int64_t i0 = 0; i0 < T; i0 += kTileQ) {
    const int64_t bs = std::min(kTileQ, T - i0), i1 = i0 + bs;
    const E* dyb = dy + i0 * ldg;
    float* dqb;
    int64_t ldq;
    if constexpr (f32) {
      dqb = dq + i0 * lddq, ldq = lddq;
    } else {
      dqb = dqa, ldq = hd;
    }
    flash_row_dots(dyb, ldg, y + i0 * ldg, ldg, bs, hd, D);
    for (int64_t j0 = 0; j0 < keys.end(i1); j0 += kTileK) {
      const int64_t w = keys.width(j0, i1);
      // P = exp(scale * Q K^T - lse), zero where masked
      mm(cache, false, true, bs, w, hd, scale, q + i0 * ld, ld, k + j0 * ld, ld, 0.f, P, w);
      for (int64_t r = 0; r < bs; ++r) {
        float* p = P + r * w;
        const int64_t n = keys.valid(i0 + r, j0, w);
        const float lr = lse[i0 + r];
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) p[j] = fast_exp(p[j] - lr);
        std::fill(p + n, p + w, 0.f);
      }
      // dV's operand: P, or with dropout P Z (made in the dS tile, free until dP)
      const float* Z = drop.on() ? drop.factors(i0, bs, j0, w) : nullptr;
      const float* Pd = P;
      if (Z) times_rows(P, w, Z, bs, w, dS), Pd = dS;
      const E* Pde;
      if constexpr (f32) {
        Pde = Pd;
      } else {
        f32_to_bf16_row(Pd, Pe, bs * w);
        Pde = Pe;
      }
      // dV[j0:j0+w] += P^T dY[i0:i1]
      mm(cache, true, false, w, hd, bs, 1.f, Pde, w, dyb, ldg, 1.f, dv + j0 * ldd, ldd);
      // dP = dY[i0:i1] V[j0:j0+w]^T
      mm(cache, false, true, bs, w, hd, 1.f, dyb, ldg, v + j0 * ld, ld, 0.f, dS, w);
      if (Z) multiply_rows(dS, w, Z, bs, w);
      flash_softmax_backward(P, dS, bs, w, D, scale);  // masked entries of P are zero
      if constexpr (!f32) f32_to_bf16_row(dS, dSe, bs * w);
      // dQ[i0:i1] (+)= dS K[j0:j0+w]
      mm(cache, false, false, bs, hd, w, 1.f, dSe, w, k + j0 * ld, ld, j0 == 0 ? 0.f : 1.f, dqb, ldq);
      // dK[j0:j0+w] += dS^T Q[i0:i1]
      mm(cache, true, false, w, hd, bs, 1.f, dSe, w, q + i0 * ld, ld, 1.f, dk + j0 * ldd, ldd);
    }
    if constexpr (!f32)
      for (int64_t r = 0; r < bs; ++r) f32_to_bf16_row(dqb + r * hd, dq + (i0 + r) * lddq, hd);
  }
}

}  // namespace

// ---- every (batch, head) pair on the operands where they lie ---------------------------

template <class E>
void forward(const KernelCall& c, const Dims& d, const int32_t* lengths) {
  const E* qkv = c.in(0).as<E>();
  E* y = c.out(0).as<E>();
  float* lse = c.out(1).as<float>();
  GemmCache& cache = gemm_cache_of(c.ctx);
  const ProbDropout drop(c, d.T);
  const size_t dz = dropout_floats(drop);
  const Scratch scratch(c, dz + (std::is_same_v<E, float> ? tile_floats() : native_forward_floats(d.hd)));
  parallel_for(d.B * d.nh, 1, [&](int64_t lo, int64_t hi) {
    float* buf = scratch.get();
    for (int64_t bh = lo; bh < hi; ++bh) {
      const int64_t b = bh / d.nh, h = bh % d.nh;
      const E* q = qkv + b * d.T * 3 * d.C + h * d.hd;
      forward_head(cache, q, q + d.C, q + 2 * d.C, 3 * d.C, y + b * d.T * d.C + h * d.hd, d.C, lse + bh * d.T,
                   keys_of(d, lengths, b), d.hd, d.scale, buf + dz, HeadDropout(drop, bh, buf));
    }
  });
}

// f32 accumulates dK and dV straight into dqkv; bf16 in f32 scratch, rounded once per head.
template <class E>
void backward(const KernelCall& c, const Dims& d, const int32_t* lengths) {
  constexpr bool f32 = std::is_same_v<E, float>;
  const E* dy = c.in(0).as<E>();
  const E* qkv = c.in(1).as<E>();
  const E* y = c.in(2).as<E>();
  const float* lse = c.in(3).as<float>();
  E* dqkv = c.out(0).as<E>();
  const int64_t n = d.T * d.hd;
  GemmCache& cache = gemm_cache_of(c.ctx);
  const ProbDropout drop(c, d.T);
  const size_t dz = dropout_floats(drop);
  const Scratch scratch(c, dz + (f32 ? tile_floats() : native_backward_floats(d.T, d.hd)));
  parallel_for(d.B * d.nh, 1, [&](int64_t lo, int64_t hi) {
    float* z = scratch.get();
    float* buf = z + dz;
    for (int64_t bh = lo; bh < hi; ++bh) {
      const int64_t b = bh / d.nh, h = bh % d.nh;
      const int64_t off = b * d.T * 3 * d.C + h * d.hd, goff = b * d.T * d.C + h * d.hd;
      const Keys keys = keys_of(d, lengths, b);
      const HeadDropout hdrop(drop, bh, z);
      const E* q = qkv + off;
      E* dq = dqkv + off;
      if constexpr (f32) {
        backward_head(cache, q, q + d.C, q + 2 * d.C, 3 * d.C, dy + goff, y + goff, d.C, lse + bh * d.T, dq, 3 * d.C,
                      dq + d.C, dq + 2 * d.C, 3 * d.C, keys, d.hd, d.scale, buf, hdrop);
      } else {
        float *dk = buf, *dv = buf + n;
        backward_head(cache, q, q + d.C, q + 2 * d.C, 3 * d.C, dy + goff, y + goff, d.C, lse + bh * d.T, dq, 3 * d.C,
                      dk, dv, d.hd, keys, d.hd, d.scale, buf + 2 * n, hdrop);
        narrow_head(dk, dq + d.C, 3 * d.C, d.T, d.hd);
        narrow_head(dv, dq + 2 * d.C, 3 * d.C, d.T, d.hd);
      }
    }
  });
}

template void forward<float>(const KernelCall&, const Dims&, const int32_t*);
template void forward<uint16_t>(const KernelCall&, const Dims&, const int32_t*);
template void backward<float>(const KernelCall&, const Dims&, const int32_t*);
template void backward<uint16_t>(const KernelCall&, const Dims&, const int32_t*);

// ---- bf16-emulated: widen one head, run the f32 code, narrow --------------------------

void forward_bf16_emulated(const KernelCall& c, const Dims& d, const int32_t* lengths) {
  const uint16_t* qkv = c.in(0).as<uint16_t>();
  uint16_t* y = c.out(0).as<uint16_t>();
  float* lse = c.out(1).as<float>();
  const int64_t n = d.T * d.hd;
  GemmCache& cache = gemm_cache_of(c.ctx);
  const ProbDropout drop(c, d.T);
  const size_t dz = dropout_floats(drop);
  const Scratch scratch(c, dz + tile_floats() + size_t(4 * n));
  parallel_for(d.B * d.nh, 1, [&](int64_t lo, int64_t hi) {
    float* z = scratch.get();
    float* buf = z + dz;
    float *q = buf, *k = buf + n, *v = buf + 2 * n, *yh = buf + 3 * n, *work = buf + 4 * n;
    for (int64_t bh = lo; bh < hi; ++bh) {
      const int64_t b = bh / d.nh, h = bh % d.nh;
      const uint16_t* src = qkv + b * d.T * 3 * d.C + h * d.hd;
      widen_qkv_head(src, d, q, k, v);
      forward_head(cache, q, k, v, d.hd, yh, d.hd, lse + bh * d.T, keys_of(d, lengths, b), d.hd, d.scale, work,
                   HeadDropout(drop, bh, z));
      narrow_head(yh, y + b * d.T * d.C + h * d.hd, d.C, d.T, d.hd);
    }
  });
}

void backward_bf16_emulated(const KernelCall& c, const Dims& d, const int32_t* lengths) {
  const uint16_t* dy = c.in(0).as<uint16_t>();
  const uint16_t* qkv = c.in(1).as<uint16_t>();
  const uint16_t* y = c.in(2).as<uint16_t>();
  const float* lse = c.in(3).as<float>();
  uint16_t* dqkv = c.out(0).as<uint16_t>();
  const int64_t n = d.T * d.hd;
  GemmCache& cache = gemm_cache_of(c.ctx);
  const ProbDropout drop(c, d.T);
  const size_t dz = dropout_floats(drop);
  const Scratch scratch(c, dz + tile_floats() + size_t(8 * n));
  parallel_for(d.B * d.nh, 1, [&](int64_t lo, int64_t hi) {
    float* z = scratch.get();
    float* buf = z + dz;
    float *q = buf, *k = buf + n, *v = buf + 2 * n, *g = buf + 3 * n, *yh = buf + 4 * n;
    float *dq = buf + 5 * n, *dk = buf + 6 * n, *dv = buf + 7 * n, *work = buf + 8 * n;
    for (int64_t bh = lo; bh < hi; ++bh) {
      const int64_t b = bh / d.nh, h = bh % d.nh;
      const int64_t off = b * d.T * 3 * d.C + h * d.hd, goff = b * d.T * d.C + h * d.hd;
      widen_qkv_head(qkv + off, d, q, k, v);
      widen_head(dy + goff, d.C, g, d.T, d.hd);
      widen_head(y + goff, d.C, yh, d.T, d.hd);
      backward_head(cache, q, k, v, d.hd, g, yh, d.hd, lse + bh * d.T, dq, d.hd, dk, dv, d.hd,
                    keys_of(d, lengths, b), d.hd, d.scale, work, HeadDropout(drop, bh, z));
      narrow_head(dq, dqkv + off, 3 * d.C, d.T, d.hd);
      narrow_head(dk, dqkv + off + d.C, 3 * d.C, d.T, d.hd);
      narrow_head(dv, dqkv + off + 2 * d.C, 3 * d.C, d.T, d.hd);
    }
  });
}

// ---- f32: the register tiles, or the heads above ----------------------------------

void forward_f32(const KernelCall& c, const Dims& d, const int32_t* lengths) {
  if (!cpu_features().attention_tiles) return forward<float>(c, d, lengths);
  const float* qkv = c.in(0).as<float>();
  float* y = c.out(0).as<float>();
  float* lse = c.out(1).as<float>();
  const ProbDropout drop(c, d.T);
  for_each_head(d, flash_tiles::Work::floats(d.T, d.hd, drop.on()), [&](const HeadOffsets& o, float* w) {
    const float* q = qkv + o.qkv;
    const flash_tiles::Work work(w, d.T, d.hd, drop.on());
    flash_tiles::forward_head(q, q + d.C, q + 2 * d.C, 3 * d.C, y + o.y, d.C, lse + o.lse, d.T,
                              tile_keys(d, lengths, o.b), d.hd, d.scale, work, HeadDropout(drop, o.bh, work.z));
  });
}

void backward_f32(const KernelCall& c, const Dims& d, const int32_t* lengths) {
  if (!cpu_features().attention_tiles) return backward<float>(c, d, lengths);
  const float* dy = c.in(0).as<float>();
  const float* qkv = c.in(1).as<float>();
  const float* y = c.in(2).as<float>();
  const float* lse = c.in(3).as<float>();
  float* dqkv = c.out(0).as<float>();
  const ProbDropout drop(c, d.T);
  for_each_head(d, flash_tiles::Work::floats(d.T, d.hd, drop.on()), [&](const HeadOffsets& o, float* w) {
    const float* q = qkv + o.qkv;
    float* dq = dqkv + o.qkv;
    const flash_tiles::Work work(w, d.T, d.hd, drop.on());
    flash_tiles::backward_head(q, q + d.C, q + 2 * d.C, 3 * d.C, dy + o.y, y + o.y, d.C, lse + o.lse, dq, dq + d.C,
                               dq + 2 * d.C, 3 * d.C, d.T, tile_keys(d, lengths, o.b), d.hd, d.scale, work,
                               HeadDropout(drop, o.bh, work.z));
  });
}

// ---- bf16: native or emulated -----------------------------------------------------

void forward_bf16(const KernelCall& c, const Dims& d, const int32_t* lengths) {
  gemm_bf16_native() ? forward<uint16_t>(c, d, lengths) : forward_bf16_emulated(c, d, lengths);
}
void backward_bf16(const KernelCall& c, const Dims& d, const int32_t* lengths) {
  gemm_bf16_native() ? backward<uint16_t>(c, d, lengths) : backward_bf16_emulated(c, d, lengths);
}

}  // namespace brisk::cpu::flash_gemm
