// CUDA kernels for the plain causal attention op (attention and its
// backward) on packed qkv (B, T, 3C), which keeps the (B, n_head, T, T) f32
// probabilities as a saved output. This op is the simple, memory-hungry
// variant (training uses flash_attention), so the kernels favour being
// obviously right over speed: one warp per row, f32 arithmetic throughout,
// bf16 only widened on load and rounded once on store.
//
// Forward: a warp per query row writes the row's scores into its probs row
// (lanes take keys), turns them into probabilities in place (and zeros
// above the diagonal, as the op's contract says), then the lanes split
// head_dim for y = P V, reading the row back after a __syncwarp.
//
// Backward, deterministic with no atomics and no T x T scratch: a warp per
// query row computes R_t = rowsum(P * dP) and dQ_t = scale sum_u dS_tu k_u
// (recomputing dP = dy_t . v_u in a second pass); a warp per key row then
// computes dK_u = scale sum_t dS_tu q_t and dV_u = sum_t P_tu dy_t with R
// from the first kernel. R (B * n_head * T floats) lives in the backend's
// BLAS workspace, in chunks of whole batches if it does not fit. Only the
// causal lower triangle of probs is ever read.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "brisk/core/error.h"
#include "cuda_util.cuh"

namespace brisk::cuda {
namespace {

using core::DType;
using core::KernelCall;

struct Dims {
  int64_t B, T, C, nh, hd;
  float scale;
};

Dims dims_of(const KernelCall& c, const char* op, const core::Shape& qkv) {
  const auto& p = c.p<core::AttentionParams>();
  if (qkv.rank() != 3 || qkv[2] % 3 != 0 || p.n_head < 1 || (qkv[2] / 3) % p.n_head != 0)
    throw core::ShapeError(std::string(op) + ": qkv must be (B, T, 3C) with C divisible by n_head = " +
                           std::to_string(p.n_head));
  if (p.dropout > 0.f)
    throw core::ShapeError(std::string(op) +
                           ": probability dropout has no CUDA kernel yet (model.attention_dropout is CPU only)");
  Dims d;
  d.B = qkv[0], d.T = qkv[1], d.C = qkv[2] / 3, d.nh = p.n_head, d.hd = d.C / p.n_head;
  d.scale = p.scale != 0.f ? p.scale : float(1.0 / std::sqrt(double(d.hd)));
  if (d.T > INT32_MAX / 2 || d.C > INT32_MAX / 4)
    throw core::ShapeError(std::string(op) + ": T or C too large for the CUDA kernels");
  return d;
}

template <class E>
__device__ __forceinline__ float dot_row(const float* s, const E* g, int hd) {
  float acc = 0.f;
  for (int i = 0; i < hd; ++i) acc += s[i] * widen(g[i]);
  return acc;
}

// Forward, one warp per query row. Shared memory per warp: q (scaled).
template <class E>
__global__ void attention_fwd_kernel(const E* __restrict__ qkv, E* __restrict__ y, float* __restrict__ probs,
                                     int64_t rows, int T, int nh, int C, int hd, float scale) {
  extern __shared__ float sm[];
  const int warps = int(blockDim.x) >> 5, warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
  const int64_t row = int64_t(blockIdx.x) * warps + warp;
  if (row >= rows) return;
  float* qs = sm + warp * hd;
  const int64_t bh = row / T, b = bh / nh, h = bh % nh;
  const int t = T - 1 - int(row % T);  // long rows first
  const int64_t ld = 3 * int64_t(C);
  const E* base = qkv + b * T * ld + h * hd;
  for (int i = lane; i < hd; i += 32) qs[i] = widen(base[t * ld + i]) * scale;
  __syncwarp();
  float* prow = probs + (bh * T + t) * int64_t(T);
  float mx = -INFINITY;
  for (int u = lane; u <= t; u += 32) {
    const float s = dot_row(qs, base + C + u * ld, hd);
    prow[u] = s;
    mx = fmaxf(mx, s);
  }
  mx = warp_max(mx);  // finite: key 0 is always there
  float sum = 0.f;
  for (int u = lane; u <= t; u += 32) {
    const float e = expf(prow[u] - mx);
    prow[u] = e;
    sum += e;
  }
  const float inv = 1.f / warp_sum(sum);
  for (int u = lane; u < T; u += 32) prow[u] = u <= t ? prow[u] * inv : 0.f;
  __syncwarp();  // the row is read across lanes below
  const E* vb = base + 2 * int64_t(C);
  E* yr = y + (b * T + t) * C + h * hd;
  for (int i = lane; i < hd; i += 32) {
    float acc = 0.f;
    for (int u = 0; u <= t; ++u) acc += prow[u] * widen(vb[u * ld + i]);
    yr[i] = narrow<E>(acc);
  }
}

// R_t = sum_u P_tu dP_tu and dQ_t, one warp per query row. Shared memory per
// warp: dy_t, the dQ accumulator, 32 dS.
template <class E>
__global__ void attention_bwd_q_kernel(const E* __restrict__ dy, const E* __restrict__ qkv,
                                       const float* __restrict__ probs, float* __restrict__ R, E* __restrict__ dqkv,
                                       int64_t rows, int T, int nh, int C, int hd, float scale) {
  extern __shared__ float sm[];
  const int warps = int(blockDim.x) >> 5, warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
  const int64_t row = int64_t(blockIdx.x) * warps + warp;
  if (row >= rows) return;
  float* gs = sm + warp * (2 * hd + 32);
  float* acc = gs + hd;
  float* dss = acc + hd;
  const int64_t bh = row / T, b = bh / nh, h = bh % nh;
  const int t = T - 1 - int(row % T);
  const int64_t ld = 3 * int64_t(C);
  const E* base = qkv + b * T * ld + h * hd;
  const E* gr = dy + (b * T + t) * C + h * hd;
  for (int i = lane; i < hd; i += 32) gs[i] = widen(gr[i]), acc[i] = 0.f;
  __syncwarp();
  const float* prow = probs + (bh * T + t) * int64_t(T);
  const E* vb = base + 2 * int64_t(C);
  float r = 0.f;
  for (int u = lane; u <= t; u += 32) r += prow[u] * dot_row(gs, vb + u * ld, hd);
  r = warp_sum(r);
  if (lane == 0) R[bh * T + t] = r;
  for (int u0 = 0; u0 <= t; u0 += 32) {
    const int n = min(32, t + 1 - u0);
    float ds = 0.f;
    if (lane < n) {
      const int u = u0 + lane;
      ds = prow[u] * (dot_row(gs, vb + u * ld, hd) - r);
    }
    dss[lane] = ds;
    __syncwarp();
    const E* kb = base + C + u0 * ld;
    for (int i = lane; i < hd; i += 32) {
      float a = acc[i];
      for (int j = 0; j < n; ++j) a += dss[j] * widen(kb[j * ld + i]);
      acc[i] = a;
    }
    __syncwarp();
  }
  E* dq = dqkv + (b * T + t) * ld + h * hd;
  for (int i = lane; i < hd; i += 32) dq[i] = narrow<E>(acc[i] * scale);
}

// dK_u and dV_u, one warp per key row. Shared memory per warp: v_u, the dK
// and dV accumulators, 32 P and 32 dS.
template <class E>
__global__ void attention_bwd_kv_kernel(const E* __restrict__ dy, const E* __restrict__ qkv,
                                        const float* __restrict__ probs, const float* __restrict__ R,
                                        E* __restrict__ dqkv, int64_t rows, int T, int nh, int C, int hd,
                                        float scale) {
  extern __shared__ float sm[];
  const int warps = int(blockDim.x) >> 5, warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
  const int64_t row = int64_t(blockIdx.x) * warps + warp;
  if (row >= rows) return;
  float* vs = sm + warp * (3 * hd + 64);
  float* dk = vs + hd;
  float* dv = dk + hd;
  float* ps = dv + hd;
  float* dss = ps + 32;
  const int64_t bh = row / T, b = bh / nh, h = bh % nh;
  const int u = int(row % T);  // long rows (small u) first
  const int64_t ld = 3 * int64_t(C);
  const E* base = qkv + b * T * ld + h * hd;
  const E* gbase = dy + b * T * C + h * hd;
  for (int i = lane; i < hd; i += 32) vs[i] = widen(base[u * ld + 2 * C + i]), dk[i] = dv[i] = 0.f;
  __syncwarp();
  const float* pcol = probs + bh * T * int64_t(T) + u;  // P_tu = pcol[t * T]
  const float* R_bh = R + bh * T;
  for (int t0 = u; t0 < T; t0 += 32) {
    const int n = min(32, T - t0);
    float p = 0.f, ds = 0.f;
    if (lane < n) {
      const int64_t t = t0 + lane;
      p = pcol[t * T];
      ds = p * (dot_row(vs, gbase + t * C, hd) - R_bh[t]);
    }
    ps[lane] = p, dss[lane] = ds;
    __syncwarp();
    const E* qb = base + t0 * ld;
    const E* gb = gbase + t0 * C;
    for (int i = lane; i < hd; i += 32) {
      float a = dk[i], c = dv[i];
      for (int j = 0; j < n; ++j) a += dss[j] * widen(qb[j * ld + i]), c += ps[j] * widen(gb[j * C + i]);
      dk[i] = a, dv[i] = c;
    }
    __syncwarp();
  }
  E* dst = dqkv + (b * T + u) * ld + h * hd;
  for (int i = lane; i < hd; i += 32) dst[C + i] = narrow<E>(dk[i] * scale), dst[2 * C + i] = narrow<E>(dv[i]);
}

template <DType DT>
void attention_fwd(const KernelCall& c) {
  using E = device_t<DT>;
  const Dims d = dims_of(c, "attention", c.in(0).shape());
  if (d.B == 0 || d.T == 0) return;
  const int64_t rows = d.B * d.nh * d.T;
  const int warps = rows_warps(d.hd, "attention");
  attention_fwd_kernel<E><<<blocks_for(rows, warps), warps * 32, size_t(warps * d.hd) * sizeof(float),
                            stream_of(c)>>>(c.in(0).as<E>(), c.out(0).as<E>(), c.out(1).as<float>(), rows,
                                            int(d.T), int(d.nh), int(d.C), int(d.hd), d.scale);
  check_launch(DT == DType::f32 ? "attention(f32)" : "attention(bf16)");
}

template <DType DT>
void attention_bwd(const KernelCall& c) {
  using E = device_t<DT>;
  constexpr const char* op = "attention_backward";
  const char* what = DT == DType::f32 ? "attention_backward(f32)" : "attention_backward(bf16)";
  const Dims d = dims_of(c, op, c.in(1).shape());
  if (c.in(0).numel() != d.B * d.T * d.C || c.in(2).numel() != d.B * d.nh * d.T * d.T)
    throw core::ShapeError(std::string(op) + ": dy must be (B, T, C) and probs (B, n_head, T, T) for qkv (B, T, 3C)");
  if (d.B == 0 || d.T == 0) return;
  const E* dy = c.in(0).as<E>();
  const E* qkv = c.in(1).as<E>();
  const float* probs = c.in(2).as<float>();
  E* dqkv = c.out(0).as<E>();
  cudaStream_t s = stream_of(c);

  // R (one float per row) in the BLAS workspace, in chunks of whole batches.
  const core::ExecContext& ctx = context_of(c);
  const int64_t per_batch = d.nh * d.T * int64_t(sizeof(float));
  const int64_t chunk = std::min<int64_t>(d.B, int64_t(ctx.blas_workspace_bytes) / per_batch);
  if (!ctx.blas_workspace || chunk < 1)
    throw core::ShapeError(std::string(op) + ": n_head * T too large for the CUDA scratch");
  float* R = static_cast<float*>(ctx.blas_workspace);

  const int64_t per_warp_q = 2 * d.hd + 32, per_warp_kv = 3 * d.hd + 64;
  const int warps_q = rows_warps(per_warp_q, op), warps_kv = rows_warps(per_warp_kv, op);
  const int T = int(d.T), nh = int(d.nh), C = int(d.C), hd = int(d.hd);
  for (int64_t b0 = 0; b0 < d.B; b0 += chunk) {
    const int64_t nb = std::min(chunk, d.B - b0);
    const int64_t rows = nb * d.nh * d.T;
    const E* dy_b = dy + b0 * d.T * d.C;
    const E* qkv_b = qkv + b0 * d.T * 3 * d.C;
    const float* probs_b = probs + b0 * d.nh * d.T * d.T;
    E* dqkv_b = dqkv + b0 * d.T * 3 * d.C;
    attention_bwd_q_kernel<E><<<blocks_for(rows, warps_q), warps_q * 32, size_t(warps_q * per_warp_q) * sizeof(float),
                                s>>>(dy_b, qkv_b, probs_b, R, dqkv_b, rows, T, nh, C, hd, d.scale);
    check_launch(what);
    attention_bwd_kv_kernel<E><<<blocks_for(rows, warps_kv), warps_kv * 32,
                                 size_t(warps_kv * per_warp_kv) * sizeof(float), s>>>(dy_b, qkv_b, probs_b, R,
                                                                                       dqkv_b, rows, T, nh, C, hd,
                                                                                       d.scale);
    check_launch(what);
  }
}

}  // namespace

void register_attention_kernels(core::KernelRegistry& r) {
  r.add(core::OpKind::attention, DType::f32, attention_fwd<DType::f32>);
  r.add(core::OpKind::attention, DType::bf16, attention_fwd<DType::bf16>);
  r.add(core::OpKind::attention_backward, DType::f32, attention_bwd<DType::f32>);
  r.add(core::OpKind::attention_backward, DType::bf16, attention_bwd<DType::bf16>);
}

}  // namespace brisk::cuda
