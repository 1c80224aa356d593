// CPU kernels for memory-efficient causal attention (flash_attention and its
// backward) on packed qkv.
//
// As in the plain kernels, threads split the (batch, head) pairs, and each
// pair owns its columns of y / dqkv and its lse row, so nothing is reduced
// across threads and dK, dV can be accumulated straight into the output.
// Within a pair, queries go in tiles of kTileQ rows and keys in tiles of
// kTileK; each (query tile, key tile) product is one gemm() (gemm.h: oneDNN
// on AVX-512 CPUs, OpenBLAS elsewhere; nested in our parallel region, so on
// one thread) into a kTileQ x kTileK scratch tile, so the only scratch is
// two tiles per thread whatever T is. Key tiles stop at the query tile's
// last row (causal), and only the diagonal tiles need a mask.
//
// Forward: the output rows of y serve as the accumulator of the online
// softmax: per key tile, the running max m rises to m', y is rescaled by
// exp(m - m') and P V is added (beta 1); at the end y /= l and
// lse = m + log(l). Backward (FlashAttention-2): P = exp(S - lse) is
// recomputed per tile, D = rowsum(dY * Y) replaces rowsum(P * dP), and
// dV += P^T dY, dS = P (dY V^T - D) scale, dQ += dS K, dK += dS^T Q.
//
// Tile sizes (measured at W2's B 8, T 256, hd 64 on 2 threads with
// bench_attention, through OpenBLAS; unmeasured through oneDNN): 64 query
// rows beat 32 and 128 (product efficiency vs the wasted upper half of
// diagonal tiles), and 256 keys beat 128 (fewer, larger products: fwd+bwd
// 1.13x plain's time against 1.21x). Two 64 x 256 f32 tiles
// are 128 KiB, well inside a 512 KiB L2. kTileQ divides kTileK, so a key tile
// never starts after its query tile's first row (every row of every visited
// tile has at least one unmasked key).
//
// On AVX2 + FMA CPUs (cpu_features().attention_tiles) the f32 kernels run
// the same blocks as register tiles instead (flash_tiles.h), heads handed out
// one at a time as in attention.cpp.
//
// bf16 widens one head's q, k, v (and dy, y) into f32 scratch, runs the same
// f32 code and narrows: bf16 is storage only, as in the plain kernels.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "brisk/core/op.h"
#include "brisk/cpu/cpu_features.h"
#include "attention_gemm.h"
#include "attention_util.h"
#include "cpu_util.h"
#include "flash_tiles.h"
#include "kernels.h"
#include "vec_math.h"

namespace brisk::cpu {
namespace {

using core::KernelCall;

// Must not exceed the sizes the op's workspace_bytes assumes (src/ops/flash_attention.cpp).
constexpr int64_t kTileQ = 64, kTileK = 256;
static_assert(kTileK % kTileQ == 0);

using Dims = AttentionDims;

size_t tile_floats() { return size_t(2 * kTileQ * kTileK + 4 * kTileQ); }

// Valid keys of query row t in the key tile starting at j0, out of `width`.
inline int64_t valid_keys(int64_t t, int64_t j0, int64_t width) { return std::min(width, t + 1 - j0); }

// One head of the forward. q, k, v: T rows of hd floats `ld` apart; y: rows
// `ldy` apart; lse: T floats. work: tile_floats().
void forward_head(GemmCache& cache, const float* q, const float* k, const float* v, int64_t ld, float* y,
                  int64_t ldy, float* lse, int64_t T, int64_t hd, float scale, float* work) {
  float* S = work;                       // (kTileQ, kTileK) scores, then probabilities
  float* m = work + 2 * kTileQ * kTileK;  // running max per row
  float* l = m + kTileQ;                  // running sum per row
  for (int64_t i0 = 0; i0 < T; i0 += kTileQ) {
    const int64_t bs = std::min(kTileQ, T - i0), i1 = i0 + bs;
    float* yb = y + i0 * ldy;
    for (int64_t j0 = 0; j0 < i1; j0 += kTileK) {
      const int64_t w = std::min(j0 + kTileK, i1) - j0;  // keys past i1 are masked for the whole tile
      const bool first = j0 == 0;
      // S = scale * Q[i0:i1] K[j0:j0+w]^T
      mm(cache, false, true, bs, w, hd, scale, q + i0 * ld, ld, k + j0 * ld, ld, 0.f, S, w);
      for (int64_t r = 0; r < bs; ++r) {
        float* s = S + r * w;
        const int64_t n = valid_keys(i0 + r, j0, w);
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
          float* yr = yb + r * ldy;
#pragma omp simd
          for (int64_t i = 0; i < hd; ++i) yr[i] *= alpha;
        }
        m[r] = mx;
      }
      // Y[i0:i1] (+)= P V[j0:j0+w]
      mm(cache, false, false, bs, hd, w, 1.f, S, w, v + j0 * ld, ld, first ? 0.f : 1.f, yb, ldy);
    }
    for (int64_t r = 0; r < bs; ++r) {
      const float inv = 1.f / l[r];
      float* yr = yb + r * ldy;
#pragma omp simd
      for (int64_t i = 0; i < hd; ++i) yr[i] *= inv;
      lse[i0 + r] = m[r] + std::log(l[r]);
    }
  }
}

// One head of the backward. Inputs as in forward_head plus dy and y (rows
// `ldg` apart) and lse; outputs dq, dk, dv (rows `ldd` apart). work: tile_floats().
void backward_head(GemmCache& cache, const float* q, const float* k, const float* v, int64_t ld, const float* dy,
                   const float* y, int64_t ldg, const float* lse, float* dq, float* dk, float* dv, int64_t ldd,
                   int64_t T, int64_t hd, float scale, float* work) {
  for (int64_t t = 0; t < T; ++t) {
    std::fill(dk + t * ldd, dk + t * ldd + hd, 0.f);
    std::fill(dv + t * ldd, dv + t * ldd + hd, 0.f);
  }
  float* P = work;                       // (bs, w) probabilities
  float* dS = work + kTileQ * kTileK;    // (bs, w) dP, then dS
  float* D = dS + kTileQ * kTileK;       // rowsum(dY * Y)
  for (int64_t i0 = 0; i0 < T; i0 += kTileQ) {
    const int64_t bs = std::min(kTileQ, T - i0), i1 = i0 + bs;
    const float* dyb = dy + i0 * ldg;
    flash_row_dots(dyb, ldg, y + i0 * ldg, ldg, bs, hd, D);
    for (int64_t j0 = 0; j0 < i1; j0 += kTileK) {
      const int64_t w = std::min(j0 + kTileK, i1) - j0;
      // P = exp(scale * Q K^T - lse), zero where masked
      mm(cache, false, true, bs, w, hd, scale, q + i0 * ld, ld, k + j0 * ld, ld, 0.f, P, w);
      for (int64_t r = 0; r < bs; ++r) {
        float* p = P + r * w;
        const int64_t n = valid_keys(i0 + r, j0, w);
        const float lr = lse[i0 + r];
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) p[j] = fast_exp(p[j] - lr);
        std::fill(p + n, p + w, 0.f);
      }
      // dV[j0:j0+w] += P^T dY[i0:i1]
      mm(cache, true, false, w, hd, bs, 1.f, P, w, dyb, ldg, 1.f, dv + j0 * ldd, ldd);
      // dP = dY[i0:i1] V[j0:j0+w]^T
      mm(cache, false, true, bs, w, hd, 1.f, dyb, ldg, v + j0 * ld, ld, 0.f, dS, w);
      flash_softmax_backward(P, dS, bs, w, D, scale);  // masked entries of P are zero
      // dQ[i0:i1] (+)= dS K[j0:j0+w]
      mm(cache, false, false, bs, hd, w, 1.f, dS, w, k + j0 * ld, ld, j0 == 0 ? 0.f : 1.f, dq + i0 * ldd, ldd);
      // dK[j0:j0+w] += dS^T Q[i0:i1]
      mm(cache, true, false, w, hd, bs, 1.f, dS, w, q + i0 * ld, ld, 1.f, dk + j0 * ldd, ldd);
    }
  }
}

// ---- f32: work directly on the packed layout -----------------------------------------
void flash_attention_f32(const KernelCall& c) {
  const Dims d = attention_dims(c, c.in(0).shape());
  const float* qkv = c.in(0).as<float>();
  float* y = c.out(0).as<float>();
  float* lse = c.out(1).as<float>();
  if (cpu_features().attention_tiles) {
    for_each_head(d, flash_tiles::Work::floats(d.T, d.hd), [&](const HeadOffsets& o, float* w) {
      const float* q = qkv + o.qkv;
      flash_tiles::forward_head(q, q + d.C, q + 2 * d.C, 3 * d.C, y + o.y, d.C, lse + o.lse, d.T, {d.T, true}, d.hd,
                                d.scale, flash_tiles::Work(w, d.T, d.hd));
    });
    return;
  }
  GemmCache& cache = gemm_cache_of(c.ctx);
  const Scratch scratch(c, tile_floats());
  parallel_for(d.B * d.nh, 1, [&](int64_t lo, int64_t hi) {
    float* work = scratch.get();
    for (int64_t bh = lo; bh < hi; ++bh) {
      const int64_t b = bh / d.nh, h = bh % d.nh;
      const float* q = qkv + b * d.T * 3 * d.C + h * d.hd;
      forward_head(cache, q, q + d.C, q + 2 * d.C, 3 * d.C, y + b * d.T * d.C + h * d.hd, d.C, lse + bh * d.T, d.T,
                   d.hd, d.scale, work);
    }
  });
}

void flash_attention_backward_f32(const KernelCall& c) {
  const Dims d = attention_dims(c, c.in(1).shape());
  const float* dy = c.in(0).as<float>();
  const float* qkv = c.in(1).as<float>();
  const float* y = c.in(2).as<float>();
  const float* lse = c.in(3).as<float>();
  float* dqkv = c.out(0).as<float>();
  if (cpu_features().attention_tiles) {
    for_each_head(d, flash_tiles::Work::floats(d.T, d.hd), [&](const HeadOffsets& o, float* w) {
      const float* q = qkv + o.qkv;
      float* dq = dqkv + o.qkv;
      flash_tiles::backward_head(q, q + d.C, q + 2 * d.C, 3 * d.C, dy + o.y, y + o.y, d.C, lse + o.lse, dq, dq + d.C,
                                 dq + 2 * d.C, 3 * d.C, d.T, {d.T, true}, d.hd, d.scale,
                                 flash_tiles::Work(w, d.T, d.hd));
    });
    return;
  }
  GemmCache& cache = gemm_cache_of(c.ctx);
  const Scratch scratch(c, tile_floats());
  parallel_for(d.B * d.nh, 1, [&](int64_t lo, int64_t hi) {
    float* work = scratch.get();
    for (int64_t bh = lo; bh < hi; ++bh) {
      const int64_t b = bh / d.nh, h = bh % d.nh;
      const int64_t off = b * d.T * 3 * d.C + h * d.hd, goff = b * d.T * d.C + h * d.hd;
      const float* q = qkv + off;
      float* dq = dqkv + off;
      backward_head(cache, q, q + d.C, q + 2 * d.C, 3 * d.C, dy + goff, y + goff, d.C, lse + bh * d.T, dq, dq + d.C,
                    dq + 2 * d.C, 3 * d.C, d.T, d.hd, d.scale, work);
    }
  });
}

// ---- bf16: widen one head, run the f32 code, narrow -----------------------------------

void flash_attention_bf16(const KernelCall& c) {
  const Dims d = attention_dims(c, c.in(0).shape());
  const uint16_t* qkv = c.in(0).as<uint16_t>();
  uint16_t* y = c.out(0).as<uint16_t>();
  float* lse = c.out(1).as<float>();
  const int64_t n = d.T * d.hd;
  GemmCache& cache = gemm_cache_of(c.ctx);
  const Scratch scratch(c, tile_floats() + size_t(4 * n));
  parallel_for(d.B * d.nh, 1, [&](int64_t lo, int64_t hi) {
    float* buf = scratch.get();
    float *q = buf, *k = buf + n, *v = buf + 2 * n, *yh = buf + 3 * n, *work = buf + 4 * n;
    for (int64_t bh = lo; bh < hi; ++bh) {
      const int64_t b = bh / d.nh, h = bh % d.nh;
      const uint16_t* src = qkv + b * d.T * 3 * d.C + h * d.hd;
      widen_head(src, 3 * d.C, q, d.T, d.hd);
      widen_head(src + d.C, 3 * d.C, k, d.T, d.hd);
      widen_head(src + 2 * d.C, 3 * d.C, v, d.T, d.hd);
      forward_head(cache, q, k, v, d.hd, yh, d.hd, lse + bh * d.T, d.T, d.hd, d.scale, work);
      narrow_head(yh, y + b * d.T * d.C + h * d.hd, d.C, d.T, d.hd);
    }
  });
}

void flash_attention_backward_bf16(const KernelCall& c) {
  const Dims d = attention_dims(c, c.in(1).shape());
  const uint16_t* dy = c.in(0).as<uint16_t>();
  const uint16_t* qkv = c.in(1).as<uint16_t>();
  const uint16_t* y = c.in(2).as<uint16_t>();
  const float* lse = c.in(3).as<float>();
  uint16_t* dqkv = c.out(0).as<uint16_t>();
  const int64_t n = d.T * d.hd;
  GemmCache& cache = gemm_cache_of(c.ctx);
  const Scratch scratch(c, tile_floats() + size_t(8 * n));
  parallel_for(d.B * d.nh, 1, [&](int64_t lo, int64_t hi) {
    float* buf = scratch.get();
    float *q = buf, *k = buf + n, *v = buf + 2 * n, *g = buf + 3 * n, *yh = buf + 4 * n;
    float *dq = buf + 5 * n, *dk = buf + 6 * n, *dv = buf + 7 * n, *work = buf + 8 * n;
    for (int64_t bh = lo; bh < hi; ++bh) {
      const int64_t b = bh / d.nh, h = bh % d.nh;
      const int64_t off = b * d.T * 3 * d.C + h * d.hd, goff = b * d.T * d.C + h * d.hd;
      widen_head(qkv + off, 3 * d.C, q, d.T, d.hd);
      widen_head(qkv + off + d.C, 3 * d.C, k, d.T, d.hd);
      widen_head(qkv + off + 2 * d.C, 3 * d.C, v, d.T, d.hd);
      widen_head(dy + goff, d.C, g, d.T, d.hd);
      widen_head(y + goff, d.C, yh, d.T, d.hd);
      backward_head(cache, q, k, v, d.hd, g, yh, d.hd, lse + bh * d.T, dq, dk, dv, d.hd, d.T, d.hd, d.scale, work);
      narrow_head(dq, dqkv + off, 3 * d.C, d.T, d.hd);
      narrow_head(dk, dqkv + off + d.C, 3 * d.C, d.T, d.hd);
      narrow_head(dv, dqkv + off + 2 * d.C, 3 * d.C, d.T, d.hd);
    }
  });
}

}  // namespace

void register_flash_attention_kernels(core::KernelRegistry& r) {
  r.add(core::OpKind::flash_attention, core::DType::f32, flash_attention_f32);
  r.add(core::OpKind::flash_attention, core::DType::bf16, flash_attention_bf16);
  r.add(core::OpKind::flash_attention_backward, core::DType::f32, flash_attention_backward_f32);
  r.add(core::OpKind::flash_attention_backward, core::DType::bf16, flash_attention_backward_bf16);
}

}  // namespace brisk::cpu
