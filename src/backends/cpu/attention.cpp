// CPU kernels for causal attention (forward and backward) on packed qkv.
//
// Threads split the (batch, head) pairs: each pair writes its own columns of
// y / dqkv and its own (T, T) block of probs, so no two threads touch the same
// bytes and nothing needs a reduction across threads. Within a pair the query
// rows go in blocks of kBlock; block [i0, i1) only needs keys [0, i1), so the
// matrix products (OpenBLAS, single-threaded inside our parallel region) cover
// the causal lower triangle plus half of one diagonal block, and the masked
// work is skipped. Scores are written straight into the probs output, so the
// f32 forward needs no scratch at all.
//
// bf16 widens one head's q, k, v (and dy) into per-thread f32 buffers, runs
// the same f32 code and narrows the result: bf16 is storage only.
//
// attention_backward never reads the masked (upper) entries of probs: the
// diagonal block is copied with zeros above the diagonal before it enters a
// matrix product. The forward writes zeros there anyway, but the op's contract
// (and the reference kernel) only define the lower triangle.
#include <cblas.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "brisk/core/op.h"
#include "attention_util.h"
#include "cpu_util.h"
#include "kernels.h"
#include "vec_math.h"

namespace brisk::cpu {
namespace {

using core::KernelCall;

// Query rows per block: large enough for efficient GEMMs, small enough that
// the wasted half of a diagonal block stays a small fraction for T >= 128.
constexpr int64_t kBlock = 64;

using Dims = AttentionDims;

// Per-thread scratch that keeps its capacity between calls, so the steady
// state allocates nothing.
float* scratch(size_t n) {
  thread_local std::vector<float> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

// Row [0, n) of scores in place -> softmax, then zeros in [n, len).
void softmax_row(float* row, int64_t n, int64_t len) {
  float mx = row[0];
#pragma omp simd reduction(max : mx)
  for (int64_t j = 1; j < n; ++j) mx = std::max(mx, row[j]);
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; ++j) {
    row[j] = fast_exp(row[j] - mx);
    sum += row[j];
  }
  const float inv = 1.f / sum;
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) row[j] *= inv;
  std::fill(row + n, row + len, 0.f);
}

// One head. q, k, v: T rows of hd floats, `ld` apart; y: T rows `ldy` apart;
// P: the head's (T, T) probabilities.
void forward_head(const float* q, const float* k, const float* v, int64_t ld, float* y, int64_t ldy, float* P,
                  int64_t T, int64_t hd, float scale) {
  for (int64_t i0 = 0; i0 < T; i0 += kBlock) {
    const int64_t bs = std::min(kBlock, T - i0), i1 = i0 + bs;
    float* Pb = P + i0 * T;
    // S = scale * Q[i0:i1] K[0:i1]^T
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(bs), int(i1), int(hd), scale, q + i0 * ld, int(ld), k,
                int(ld), 0.f, Pb, int(T));
    for (int64_t r = 0; r < bs; ++r) softmax_row(Pb + r * T, i0 + r + 1, T);
    // Y[i0:i1] = P[i0:i1, 0:i1] V[0:i1]  (masked entries are zero by now)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(bs), int(hd), int(i1), 1.f, Pb, int(T), v, int(ld),
                0.f, y + i0 * ldy, int(ldy));
  }
}

// One head of the backward. Inputs as in forward_head plus dy (rows `lddy`
// apart) and P; outputs dq, dk, dv (rows `ldd` apart). `work` holds
// 2 * kBlock * T floats.
void backward_head(const float* q, const float* k, const float* v, int64_t ld, const float* dy, int64_t lddy,
                   const float* P, float* dq, float* dk, float* dv, int64_t ldd, int64_t T, int64_t hd, float scale,
                   float* work) {
  for (int64_t t = 0; t < T; ++t) {
    std::fill(dk + t * ldd, dk + t * ldd + hd, 0.f);
    std::fill(dv + t * ldd, dv + t * ldd + hd, 0.f);
  }
  float* dS = work;              // (bs, i1): dP, then dS
  float* Pm = work + kBlock * T;  // (bs, i1): P with the mask applied
  for (int64_t i0 = 0; i0 < T; i0 += kBlock) {
    const int64_t bs = std::min(kBlock, T - i0), i1 = i0 + bs;
    const float* dyb = dy + i0 * lddy;
    for (int64_t r = 0; r < bs; ++r) {
      const int64_t n = i0 + r + 1;
      std::memcpy(Pm + r * i1, P + (i0 + r) * T, size_t(n) * sizeof(float));
      std::fill(Pm + r * i1 + n, Pm + (r + 1) * i1, 0.f);
    }
    // dP = dY[i0:i1] V[0:i1]^T
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(bs), int(i1), int(hd), 1.f, dyb, int(lddy), v, int(ld),
                0.f, dS, int(i1));
    // dV[0:i1] += P^T dY[i0:i1]
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(i1), int(hd), int(bs), 1.f, Pm, int(i1), dyb,
                int(lddy), 1.f, dv, int(ldd));
    // dS = scale * P * (dP - rowsum(P * dP)); masked entries of Pm are zero.
    for (int64_t r = 0; r < bs; ++r) {
      float* ds = dS + r * i1;
      const float* pr = Pm + r * i1;
      float pdp = 0.f;
#pragma omp simd reduction(+ : pdp)
      for (int64_t j = 0; j < i1; ++j) pdp += pr[j] * ds[j];
#pragma omp simd
      for (int64_t j = 0; j < i1; ++j) ds[j] = scale * pr[j] * (ds[j] - pdp);
    }
    // dQ[i0:i1] = dS K[0:i1]
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(bs), int(hd), int(i1), 1.f, dS, int(i1), k, int(ld),
                0.f, dq + i0 * ldd, int(ldd));
    // dK[0:i1] += dS^T Q[i0:i1]
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(i1), int(hd), int(bs), 1.f, dS, int(i1), q + i0 * ld,
                int(ld), 1.f, dk, int(ldd));
  }
}

// ---- f32: work directly on the packed layout -----------------------------------------
void attention_f32(const KernelCall& c) {
  const Dims d = attention_dims(c, c.in(0).shape());
  const float* qkv = c.in(0).as<float>();
  float* y = c.out(0).as<float>();
  float* probs = c.out(1).as<float>();
  parallel_for(d.B * d.nh, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t bh = lo; bh < hi; ++bh) {
      const int64_t b = bh / d.nh, h = bh % d.nh;
      const float* q = qkv + b * d.T * 3 * d.C + h * d.hd;
      forward_head(q, q + d.C, q + 2 * d.C, 3 * d.C, y + b * d.T * d.C + h * d.hd, d.C, probs + bh * d.T * d.T, d.T,
                   d.hd, d.scale);
    }
  });
}

void attention_backward_f32(const KernelCall& c) {
  const Dims d = attention_dims(c, c.in(1).shape());
  const float* dy = c.in(0).as<float>();
  const float* qkv = c.in(1).as<float>();
  const float* probs = c.in(2).as<float>();
  float* dqkv = c.out(0).as<float>();
  parallel_for(d.B * d.nh, 1, [&](int64_t lo, int64_t hi) {
    float* work = scratch(size_t(2 * kBlock * d.T));
    for (int64_t bh = lo; bh < hi; ++bh) {
      const int64_t b = bh / d.nh, h = bh % d.nh;
      const int64_t off = b * d.T * 3 * d.C + h * d.hd;
      const float* q = qkv + off;
      float* dq = dqkv + off;
      backward_head(q, q + d.C, q + 2 * d.C, 3 * d.C, dy + b * d.T * d.C + h * d.hd, d.C, probs + bh * d.T * d.T, dq,
                    dq + d.C, dq + 2 * d.C, 3 * d.C, d.T, d.hd, d.scale, work);
    }
  });
}

// ---- bf16: widen one head, run the f32 code, narrow -----------------------------------

void attention_bf16(const KernelCall& c) {
  const Dims d = attention_dims(c, c.in(0).shape());
  const uint16_t* qkv = c.in(0).as<uint16_t>();
  uint16_t* y = c.out(0).as<uint16_t>();
  float* probs = c.out(1).as<float>();
  const int64_t n = d.T * d.hd;
  parallel_for(d.B * d.nh, 1, [&](int64_t lo, int64_t hi) {
    float* buf = scratch(size_t(4 * n));
    float *q = buf, *k = buf + n, *v = buf + 2 * n, *yh = buf + 3 * n;
    for (int64_t bh = lo; bh < hi; ++bh) {
      const int64_t b = bh / d.nh, h = bh % d.nh;
      const uint16_t* src = qkv + b * d.T * 3 * d.C + h * d.hd;
      widen_head(src, 3 * d.C, q, d.T, d.hd);
      widen_head(src + d.C, 3 * d.C, k, d.T, d.hd);
      widen_head(src + 2 * d.C, 3 * d.C, v, d.T, d.hd);
      forward_head(q, k, v, d.hd, yh, d.hd, probs + bh * d.T * d.T, d.T, d.hd, d.scale);
      narrow_head(yh, y + b * d.T * d.C + h * d.hd, d.C, d.T, d.hd);
    }
  });
}

void attention_backward_bf16(const KernelCall& c) {
  const Dims d = attention_dims(c, c.in(1).shape());
  const uint16_t* dy = c.in(0).as<uint16_t>();
  const uint16_t* qkv = c.in(1).as<uint16_t>();
  const float* probs = c.in(2).as<float>();
  uint16_t* dqkv = c.out(0).as<uint16_t>();
  const int64_t n = d.T * d.hd;
  parallel_for(d.B * d.nh, 1, [&](int64_t lo, int64_t hi) {
    float* buf = scratch(size_t(7 * n + 2 * kBlock * d.T));
    float *q = buf, *k = buf + n, *v = buf + 2 * n, *g = buf + 3 * n;
    float *dq = buf + 4 * n, *dk = buf + 5 * n, *dv = buf + 6 * n, *work = buf + 7 * n;
    for (int64_t bh = lo; bh < hi; ++bh) {
      const int64_t b = bh / d.nh, h = bh % d.nh;
      const int64_t off = b * d.T * 3 * d.C + h * d.hd;
      widen_head(qkv + off, 3 * d.C, q, d.T, d.hd);
      widen_head(qkv + off + d.C, 3 * d.C, k, d.T, d.hd);
      widen_head(qkv + off + 2 * d.C, 3 * d.C, v, d.T, d.hd);
      widen_head(dy + b * d.T * d.C + h * d.hd, d.C, g, d.T, d.hd);
      backward_head(q, k, v, d.hd, g, d.hd, probs + bh * d.T * d.T, dq, dk, dv, d.hd, d.T, d.hd, d.scale, work);
      narrow_head(dq, dqkv + off, 3 * d.C, d.T, d.hd);
      narrow_head(dk, dqkv + off + d.C, 3 * d.C, d.T, d.hd);
      narrow_head(dv, dqkv + off + 2 * d.C, 3 * d.C, d.T, d.hd);
    }
  });
}

}  // namespace

void register_attention_kernels(core::KernelRegistry& r) {
  r.add(core::OpKind::attention, core::DType::f32, attention_f32);
  r.add(core::OpKind::attention, core::DType::bf16, attention_bf16);
  r.add(core::OpKind::attention_backward, core::DType::f32, attention_backward_f32);
  r.add(core::OpKind::attention_backward, core::DType::bf16, attention_backward_bf16);
}

}  // namespace brisk::cpu
