// Pieces shared by the CPU attention kernels (plain and flash, causal and
// masked): the problem dims of packed qkv (B, T, 3C), per-thread scratch,
// the plain kernels' row softmax, and moving one head's strided bf16 rows in and out of
// dense f32 buffers (the bf16-emulated paths, where bf16 is storage only).
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "brisk/core/op.h"
#include "cpu_util.h"
#include "vec_math.h"

namespace brisk::cpu {

struct AttentionDims {
  int64_t B, T, C, nh, hd;
  float scale;
};

inline AttentionDims attention_dims(const core::KernelCall& c, const core::Shape& qkv) {
  const auto& p = c.p<core::AttentionParams>();
  const int64_t C = qkv[2] / 3, hd = C / p.n_head;
  const float scale = p.scale != 0.f ? p.scale : float(1.0 / std::sqrt(double(hd)));
  return {qkv[0], qkv[1], C, p.n_head, hd, scale};
}

// Where (batch, head) pair bh's data starts, in floats: its q columns in
// packed qkv (k and v follow C and 2C later; rows 3C apart), its columns of
// y or dy (rows C apart), its (T, T) block of probs and its T values of lse.
struct HeadOffsets {
  int64_t b, qkv, y, probs, lse;
  int64_t bh;  // the pair's index, b * n_head + h
};
inline HeadOffsets head_offsets(const AttentionDims& d, int64_t bh) {
  const int64_t b = bh / d.nh, h = bh % d.nh;
  return {b, b * d.T * 3 * d.C + h * d.hd, b * d.T * d.C + h * d.hd, bh * d.T * d.T, bh * d.T, bh};
}

// Per-thread scratch: a slice of the planned workspace when it is big enough
// for this many threads, otherwise a thread_local buffer that keeps its
// capacity (run_op without a workspace, or more threads than planned).
class Scratch {
 public:
  Scratch(const core::KernelCall& c, size_t per_thread) : per_thread_(per_thread) {
    const size_t threads = size_t(omp_get_max_threads());
    if (c.workspace && c.workspace_bytes >= threads * per_thread * sizeof(float)) base_ = static_cast<float*>(c.workspace);
  }
  float* get() const {
    if (base_) return base_ + size_t(omp_get_thread_num()) * per_thread_;
    thread_local std::vector<float> buf;
    if (buf.size() < per_thread_) buf.resize(per_thread_);
    return buf.data();
  }

 private:
  size_t per_thread_;
  float* base_ = nullptr;
};

// Per-thread scratch that keeps its capacity between calls, so the steady
// state allocates nothing (the plain kernels' per-block work buffers).
inline float* scratch(size_t n) {
  thread_local std::vector<float> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

// Calls fn(head_offsets(d, bh), work) for every (batch, head) pair bh,
// handed to threads as they finish (parallel_for_each); work is the calling
// thread's scratch() of `floats` floats, null when floats is 0.
template <class Fn>
void for_each_head(const AttentionDims& d, size_t floats, Fn&& fn) {
  parallel_for_each(
      d.B * d.nh, [&] { return floats ? scratch(floats) : nullptr; },
      [&](int64_t bh, float* work) { fn(head_offsets(d, bh), work); });
}

// Row [0, n) of scores in place -> softmax, then zeros in [n, len).
inline void softmax_row(float* row, int64_t n, int64_t len) {
  float mx = row[0];
#pragma omp simd reduction(max : mx)
  for (int64_t j = 1; j < n; ++j) mx = max_step(mx, row[j]);
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

// The softmax's backward for a block of rows: dS = scale * P * (dP -
// rowsum(P * dP)) over rows [0, bs) and keys [0, L), in place over dP (rows
// L apart); P rows `ldp` apart.
inline void softmax_backward_rows(const float* P, int64_t ldp, float* dS, int64_t bs, int64_t L, float scale) {
  for (int64_t r = 0; r < bs; ++r) {
    float* ds = dS + r * L;
    const float* pr = P + r * ldp;
    float pdp = 0.f;
#pragma omp simd reduction(+ : pdp)
    for (int64_t j = 0; j < L; ++j) pdp += pr[j] * ds[j];
#pragma omp simd
    for (int64_t j = 0; j < L; ++j) ds[j] = scale * pr[j] * (ds[j] - pdp);
  }
}

// The flash backward's D = rowsum(dY * Y) (FlashAttention-2's stand-in for
// rowsum(P * dP)) for `rows` rows hd wide: dy rows `lddy` apart, y `ldy`;
// E is float or bf16 (uint16_t, widened as read), the sum f32.
template <class E>
void flash_row_dots(const E* dy, int64_t lddy, const E* y, int64_t ldy, int64_t rows, int64_t hd, float* D) {
  for (int64_t r = 0; r < rows; ++r) {
    const E *g = dy + r * lddy, *yr = y + r * ldy;
    float acc = 0.f;
#pragma omp simd reduction(+ : acc)
    for (int64_t i = 0; i < hd; ++i) acc += widen(g[i]) * widen(yr[i]);
    D[r] = acc;
  }
}

// The flash backward's dS = scale * P * (dP - D) for a (rows, w) tile, in
// place over dP; P and dP rows w apart. Zero wherever P is (masked keys).
inline void flash_softmax_backward(const float* P, float* dS, int64_t rows, int64_t w, const float* D, float scale) {
  for (int64_t r = 0; r < rows; ++r) {
    float* ds = dS + r * w;
    const float* p = P + r * w;
    const float Dr = D[r];
#pragma omp simd
    for (int64_t j = 0; j < w; ++j) ds[j] = scale * p[j] * (ds[j] - Dr);
  }
}

// Zeros rows [0, T) of dK and dV (rows `ldd` apart, hd wide) before the
// backward accumulates into them (block by block; padded keys get nothing).
inline void zero_key_grads(float* dk, float* dv, int64_t ldd, int64_t T, int64_t hd) {
  for (int64_t t = 0; t < T; ++t) {
    std::fill(dk + t * ldd, dk + t * ldd + hd, 0.f);
    std::fill(dv + t * ldd, dv + t * ldd + hd, 0.f);
  }
}

// Copies `rows` rows of hd bf16 values `ld` apart into a dense f32 (rows, hd).
inline void widen_head(const uint16_t* src, int64_t ld, float* dst, int64_t rows, int64_t hd) {
  for (int64_t t = 0; t < rows; ++t) bf16_to_f32_row(src + t * ld, dst + t * hd, hd);
}
// One head's q, k and v from packed bf16 qkv (`q_at`: its q columns; k and
// v follow C and 2C later, rows 3C apart) into three dense f32 (T, hd).
inline void widen_qkv_head(const uint16_t* q_at, const AttentionDims& d, float* q, float* k, float* v) {
  widen_head(q_at, 3 * d.C, q, d.T, d.hd);
  widen_head(q_at + d.C, 3 * d.C, k, d.T, d.hd);
  widen_head(q_at + 2 * d.C, 3 * d.C, v, d.T, d.hd);
}
// The reverse: a dense f32 (rows, hd) into bf16 rows `ld` apart.
inline void narrow_head(const float* src, uint16_t* dst, int64_t ld, int64_t rows, int64_t hd) {
  for (int64_t t = 0; t < rows; ++t) f32_to_bf16_row(src + t * hd, dst + t * ld, hd);
}

}  // namespace brisk::cpu
