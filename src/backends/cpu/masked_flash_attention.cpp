// CPU kernels for memory-efficient bidirectional attention over a
// right-padded batch (masked_flash_attention and its backward).
//
// bf16 (native or emulated) runs flash_gemm.h's kernels, shared with the
// causal op: they round a sequence's last key tile up to 16 keys and mask the
// rest, so that oneDNN meets a few widths rather than one per length.
//
// f32 has kernels of its own, with the structure of flash_gemm.cpp: threads
// split the (batch, head) pairs, queries go in tiles of kTileQ rows and keys
// in tiles of kTileK, each (query tile, key tile) product is one cblas_sgemm
// into a per-thread tile, and y serves as the online softmax's accumulator.
// Sequence b's key tiles cover [0, L) with L = lengths[b] and stop there, the
// last one narrowed to the valid keys, so every key a tile holds is valid for
// every query row and no tile needs a per-row mask. All T query rows are
// computed (padded ones attend over the valid keys, the op's contract).
// Backward (FlashAttention-2): P = exp(S - lse) per tile, D = rowsum(dY * Y),
// dV += P^T dY, dS = P (dY V^T - D) scale, dQ += dS K, dK += dS^T Q; dK and
// dV rows of padded keys are zeroed and never touched. On AVX2 + FMA CPUs
// (cpu_features().attention_tiles) the same blocks run as register tiles
// instead (flash_tiles.h), heads handed out one at a time as in
// masked_attention.cpp.
#include <cblas.h>

#include <cmath>
#include <limits>

#include "brisk/core/op.h"
#include "brisk/cpu/cpu_features.h"
#include "brisk/ops/layout.h"
#include "attention_util.h"
#include "cpu_util.h"
#include "flash_gemm.h"
#include "flash_tiles.h"
#include "kernels.h"
#include "vec_math.h"

namespace brisk::cpu {
namespace {

using core::KernelCall;
using Dims = AttentionDims;

// Must not exceed the sizes the op's workspace_bytes assumes (src/ops/masked_flash_attention.cpp).
constexpr int64_t kTileQ = 64, kTileK = 256;

size_t tile_floats() { return size_t(2 * kTileQ * kTileK + 4 * kTileQ); }

inline void sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                  const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, blasint(m), blasint(n),
              blasint(k), alpha, a, blasint(lda), b, blasint(ldb), beta, c, blasint(ldc));
}

// One head of the forward. q, k, v: T rows of hd floats `ld` apart; y: rows
// `ldy` apart; lse: T floats; L valid keys. work: tile_floats().
void forward_head(const float* q, const float* k, const float* v, int64_t ld, float* y, int64_t ldy, float* lse,
                  int64_t T, int64_t L, int64_t hd, float scale, float* work) {
  float* S = work;                        // (bs, w) scores, then probabilities
  float* m = work + 2 * kTileQ * kTileK;  // running max per row
  float* l = m + kTileQ;                  // running sum per row
  for (int64_t i0 = 0; i0 < T; i0 += kTileQ) {
    const int64_t bs = std::min(kTileQ, T - i0);
    float* yb = y + i0 * ldy;
    for (int64_t j0 = 0; j0 < L; j0 += kTileK) {
      const int64_t w = std::min(kTileK, L - j0);
      const bool first = j0 == 0;
      // S = scale * Q[i0:i0+bs] K[j0:j0+w]^T
      sgemm(false, true, bs, w, hd, scale, q + i0 * ld, ld, k + j0 * ld, ld, 0.f, S, w);
      for (int64_t r = 0; r < bs; ++r) {
        float* s = S + r * w;
        float mx = first ? -std::numeric_limits<float>::infinity() : m[r];
#pragma omp simd reduction(max : mx)
        for (int64_t j = 0; j < w; ++j) mx = max_step(mx, s[j]);
        float sum = 0.f;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < w; ++j) {
          s[j] = fast_exp(s[j] - mx);
          sum += s[j];
        }
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
      // Y[i0:i0+bs] (+)= P V[j0:j0+w]
      sgemm(false, false, bs, hd, w, 1.f, S, w, v + j0 * ld, ld, first ? 0.f : 1.f, yb, ldy);
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
void backward_head(const float* q, const float* k, const float* v, int64_t ld, const float* dy, const float* y,
                   int64_t ldg, const float* lse, float* dq, float* dk, float* dv, int64_t ldd, int64_t T, int64_t L,
                   int64_t hd, float scale, float* work) {
  for (int64_t t = 0; t < T; ++t) {
    std::fill(dk + t * ldd, dk + t * ldd + hd, 0.f);
    std::fill(dv + t * ldd, dv + t * ldd + hd, 0.f);
  }
  float* P = work;                     // (bs, w) probabilities
  float* dS = work + kTileQ * kTileK;  // (bs, w) dP, then dS
  float* D = dS + kTileQ * kTileK;     // rowsum(dY * Y)
  for (int64_t i0 = 0; i0 < T; i0 += kTileQ) {
    const int64_t bs = std::min(kTileQ, T - i0);
    const float* dyb = dy + i0 * ldg;
    flash_row_dots(dyb, ldg, y + i0 * ldg, ldg, bs, hd, D);
    for (int64_t j0 = 0; j0 < L; j0 += kTileK) {
      const int64_t w = std::min(kTileK, L - j0);
      // P = exp(scale * Q K^T - lse)
      sgemm(false, true, bs, w, hd, scale, q + i0 * ld, ld, k + j0 * ld, ld, 0.f, P, w);
      for (int64_t r = 0; r < bs; ++r) {
        float* p = P + r * w;
        const float lr = lse[i0 + r];
#pragma omp simd
        for (int64_t j = 0; j < w; ++j) p[j] = fast_exp(p[j] - lr);
      }
      // dV[j0:j0+w] += P^T dY[i0:i0+bs]
      sgemm(true, false, w, hd, bs, 1.f, P, w, dyb, ldg, 1.f, dv + j0 * ldd, ldd);
      // dP = dY[i0:i0+bs] V[j0:j0+w]^T
      sgemm(false, true, bs, w, hd, 1.f, dyb, ldg, v + j0 * ld, ld, 0.f, dS, w);
      flash_softmax_backward(P, dS, bs, w, D, scale);
      // dQ[i0:i0+bs] (+)= dS K[j0:j0+w]
      sgemm(false, false, bs, hd, w, 1.f, dS, w, k + j0 * ld, ld, j0 == 0 ? 0.f : 1.f, dq + i0 * ldd, ldd);
      // dK[j0:j0+w] += dS^T Q[i0:i0+bs]
      sgemm(true, false, w, hd, bs, 1.f, dS, w, q + i0 * ld, ld, 1.f, dk + j0 * ldd, ldd);
    }
  }
}

void masked_flash_attention_f32(const KernelCall& c) {
  const Dims d = attention_dims(c, c.in(0).shape());
  const int32_t* lengths = c.in(1).as<const int32_t>();
  ops::check_lengths("masked_flash_attention", lengths, d.B, d.T);  // before the parallel region: it throws
  const float* qkv = c.in(0).as<float>();
  float* y = c.out(0).as<float>();
  float* lse = c.out(1).as<float>();
  if (cpu_features().attention_tiles) {
    for_each_head(d, flash_tiles::Work::floats(d.T, d.hd), [&](const HeadOffsets& o, float* w) {
      const float* q = qkv + o.qkv;
      flash_tiles::forward_head(q, q + d.C, q + 2 * d.C, 3 * d.C, y + o.y, d.C, lse + o.lse, d.T,
                                {lengths[o.b], false}, d.hd, d.scale, flash_tiles::Work(w, d.T, d.hd));
    });
    return;
  }
  const Scratch scratch(c, tile_floats());
  parallel_for(d.B * d.nh, 1, [&](int64_t lo, int64_t hi) {
    float* work = scratch.get();
    for (int64_t bh = lo; bh < hi; ++bh) {
      const int64_t b = bh / d.nh, h = bh % d.nh;
      const float* q = qkv + b * d.T * 3 * d.C + h * d.hd;
      forward_head(q, q + d.C, q + 2 * d.C, 3 * d.C, y + b * d.T * d.C + h * d.hd, d.C, lse + bh * d.T, d.T,
                   lengths[b], d.hd, d.scale, work);
    }
  });
}

void masked_flash_attention_backward_f32(const KernelCall& c) {
  const Dims d = attention_dims(c, c.in(1).shape());
  const int32_t* lengths = c.in(4).as<const int32_t>();
  ops::check_lengths("masked_flash_attention_backward", lengths, d.B, d.T);
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
                                 dq + 2 * d.C, 3 * d.C, d.T, {lengths[o.b], false}, d.hd, d.scale,
                                 flash_tiles::Work(w, d.T, d.hd));
    });
    return;
  }
  const Scratch scratch(c, tile_floats());
  parallel_for(d.B * d.nh, 1, [&](int64_t lo, int64_t hi) {
    float* work = scratch.get();
    for (int64_t bh = lo; bh < hi; ++bh) {
      const int64_t b = bh / d.nh, h = bh % d.nh;
      const int64_t off = b * d.T * 3 * d.C + h * d.hd, goff = b * d.T * d.C + h * d.hd;
      const float* q = qkv + off;
      float* dq = dqkv + off;
      backward_head(q, q + d.C, q + 2 * d.C, 3 * d.C, dy + goff, y + goff, d.C, lse + bh * d.T, dq, dq + d.C,
                    dq + 2 * d.C, 3 * d.C, d.T, lengths[b], d.hd, d.scale, work);
    }
  });
}

// ---- bf16: native or emulated (flash_gemm.h) -----------------------------------------

void masked_flash_attention_bf16(const KernelCall& c) {
  const Dims d = attention_dims(c, c.in(0).shape());
  const int32_t* lengths = c.in(1).as<const int32_t>();
  ops::check_lengths("masked_flash_attention", lengths, d.B, d.T);
  flash_gemm::forward_bf16(c, d, lengths);
}

void masked_flash_attention_backward_bf16(const KernelCall& c) {
  const Dims d = attention_dims(c, c.in(1).shape());
  const int32_t* lengths = c.in(4).as<const int32_t>();
  ops::check_lengths("masked_flash_attention_backward", lengths, d.B, d.T);
  flash_gemm::backward_bf16(c, d, lengths);
}

}  // namespace

void register_masked_flash_attention_kernels(core::KernelRegistry& r) {
  r.add(core::OpKind::masked_flash_attention, core::DType::f32, masked_flash_attention_f32);
  r.add(core::OpKind::masked_flash_attention, core::DType::bf16, masked_flash_attention_bf16);
  r.add(core::OpKind::masked_flash_attention_backward, core::DType::f32, masked_flash_attention_backward_f32);
  r.add(core::OpKind::masked_flash_attention_backward, core::DType::bf16, masked_flash_attention_backward_bf16);
}

}  // namespace brisk::cpu
