// CUDA kernels for memory-efficient causal attention (flash_attention and its
// backward) on packed qkv (B, T, 3C); the function is the one the CPU and
// reference kernels compute (y and the per-row lse, never a T x T matrix).
//
// Two paths. The tensor-core path (bf16, head_dim 64, 16-byte aligned rows)
// is FlashAttention-2: mma.sync m16n8k16 bf16 with f32 accumulation, tiles
// of 64 keys through double-buffered shared memory (cp.async), each warp
// owning 16 or 32 rows so that row statistics stay in registers and only
// quad shuffles are needed. With 32 rows a warp uses every B fragment it
// reads from shared memory twice, which is what bounds these kernels (two
// mma per ldmatrix.x4 is about half the tensor-core rate). Rows are padded
// to 72 elements (144 B), so every ldmatrix phase hits 8 distinct 16-byte
// bank groups. Key tiles above the diagonal are never visited; only tiles
// crossing it are masked. The operands that stay in registers (Q in the
// forward; K, V or Q, dO in the backward) are staged in the buffers the
// pipeline uses later, so each kernel needs at most 37 KB of static shared
// memory (no opt-in, nothing to set up before a graph capture).
//
// The backward is deterministic without atomics: one kernel per key tile
// walks the query tiles below it and accumulates dK, dV in registers (64
// keys, 16 per warp; from T 512 on, 128 keys, 32 per warp); a
// second kernel per query tile walks the key tiles and accumulates dQ (32
// rows per warp, each key tile in two halves of 32 keys to stay within 255
// registers). That recomputes S and dP once more (7 products instead of
// FA2's 5) but no dQ ever goes through float atomics. D = rowsum(dY * Y) is computed first into
// scratch: the op's workspace when it is large enough, else the backend's
// BLAS workspace, in chunks of whole batches if even that is short.
//
// The general path (f32, any head_dim) keeps one warp per row: lanes take 32
// keys (or queries) at a time for the dot products, then split head_dim for
// the accumulation, with the row's vectors in shared memory. It is simple,
// exact in f32 and fine for the shapes that take it (f32 runs, odd heads).
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

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// ---- problem dims ----------------------------------------------------------------

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


// ---- tensor-core helpers -----------------------------------------------------------

constexpr int kHd = 64;         // head_dim of the tensor-core path
constexpr int kTile = 64;       // rows per shared-memory tile
constexpr int kLd = kHd + 8;    // padded row of a tile (144 B)
constexpr int kThreads = 128;   // 4 warps
constexpr int kTileElems = kTile * kLd;

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16 bytes global -> shared, zero-filled when !full (src is then not read).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool full) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(full ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const bf16_t* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const bf16_t* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
// d += a (16x16, row) * b (16x8, col), bf16 in, f32 accumulate.
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
// The A fragments of a 16-row x 16-column slice (columns 16 kk ..) of a
// 16 x 8 NT accumulator tile (NT n-tiles of 8 columns), rounded to bf16.
template <int NT>
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&s)[NT][4], int kk) {
  a[0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
  a[1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
  a[2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
  a[3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

// Lane offsets into a padded tile for the three ldmatrix patterns.
// A operand (rows r0.., columns c0..): rows lane%16, column half lane/16.
__device__ __forceinline__ int a_off(int lane) { return (lane & 15) * kLd + (lane >> 4) * 8; }
// B operand from a row-major [n][k] tile (S = X Y^T: Y's rows are the n index).
__device__ __forceinline__ int bn_off(int lane) { return ((lane & 7) + ((lane >> 4) << 3)) * kLd + ((lane >> 3) & 1) * 8; }
// B operand from a row-major [k][n] tile, transposed by ldmatrix (O = P V).
__device__ __forceinline__ int bk_off(int lane) { return ((lane & 7) + (((lane >> 3) & 1) << 3)) * kLd + (lane >> 4) * 8; }

// acc[mi] (16 x 8 NT) += A[mi] (16 x 64, 4 k-steps in registers) * Y^T, with
// Y the 8 NT rows [n][k] of a tile from `y` on. Each B fragment read from
// shared memory serves all MI row slices of the warp.
template <int MI, int NT>
__device__ __forceinline__ void mma_abt(float (&acc)[MI][NT][4], const uint32_t (&a)[MI][4][4], const bf16_t* y,
                                        int lane) {
  const bf16_t* base = y + bn_off(lane);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t b[4];
      ldsm_x4(b, base + np * 16 * kLd + kk * 16);
#pragma unroll
      for (int mi = 0; mi < MI; ++mi) {
        mma(acc[mi][2 * np], a[mi][kk], b[0], b[1]);
        mma(acc[mi][2 * np + 1], a[mi][kk], b[2], b[3]);
      }
    }
}
// As mma_abt, with the A operand X[mi] (16 x 64, rows 16 mi.. of the tile at
// `x`) read from shared memory one k-step at a time instead of held in
// registers.
template <int MI, int NT>
__device__ __forceinline__ void mma_abt_sa(float (&acc)[MI][NT][4], const bf16_t* x, const bf16_t* y, int lane) {
  const bf16_t* base = y + bn_off(lane);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    uint32_t a[MI][4];
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) ldsm_x4(a[mi], x + mi * 16 * kLd + a_off(lane) + kk * 16);
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t b[4];
      ldsm_x4(b, base + np * 16 * kLd + kk * 16);
#pragma unroll
      for (int mi = 0; mi < MI; ++mi) {
        mma(acc[mi][2 * np], a[mi], b[0], b[1]);
        mma(acc[mi][2 * np + 1], a[mi], b[2], b[3]);
      }
    }
  }
}
// acc[mi] (16 x 64) += P[mi] (16 x 8 NT accumulator, rounded to bf16) * Y,
// with Y the 8 NT rows [k][n] of a tile from `y` on.
template <int MI, int NT>
__device__ __forceinline__ void mma_pb(float (&acc)[MI][8][4], const float (&p)[MI][NT][4], const bf16_t* y,
                                       int lane) {
  const bf16_t* base = y + bk_off(lane);
#pragma unroll
  for (int kk = 0; kk < NT / 2; ++kk) {
    uint32_t a[MI][4];
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) acc_to_a(a[mi], p[mi], kk);
#pragma unroll
    for (int dp = 0; dp < 4; ++dp) {
      uint32_t b[4];
      ldsm_x4_t(b, base + kk * 16 * kLd + dp * 16);
#pragma unroll
      for (int mi = 0; mi < MI; ++mi) {
        mma(acc[mi][2 * dp], a[mi], b[0], b[1]);
        mma(acc[mi][2 * dp + 1], a[mi], b[2], b[3]);
      }
    }
  }
}
// f(mi, n, r, e, x) for every element x of an accumulator tile: row slice mi,
// n-tile n, row g + 8 r, column 8 n + 2 t4 + e (t4 = lane % 4).
template <int MI, int NT, class F>
__device__ __forceinline__ void for_each_elem(float (&acc)[MI][NT][4], F&& f) {
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) f(mi, n, i >> 1, i & 1, acc[mi][n][i]);
}

__device__ __forceinline__ void load_a(uint32_t (&a)[4][4], const bf16_t* tile, int lane) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) ldsm_x4(a[kk], tile + a_off(lane) + kk * 16);
}

// `rows` rows x 64 of one head (rows `ld` apart, starting at row r0) into a
// padded tile; rows at or past T are zero-filled.
template <int kRows>
__device__ __forceinline__ void load_tile(bf16_t* s, const bf16_t* g, int64_t ld, int r0, int T) {
#pragma unroll
  for (int it = 0; it < kRows * 8 / kThreads; ++it) {
    const int idx = int(threadIdx.x) + it * kThreads, row = idx >> 3, ch = idx & 7;
    const int gr = r0 + row;
    const bool ok = gr < T;
    cp_async16(s + row * kLd + ch * 8, g + int64_t(ok ? gr : 0) * ld + ch * 8, ok);
  }
}

// 2^x on the SFU (relative error ~2^-22, flushes denormals): the inputs are
// scores minus their running max, and the results are rounded to bf16.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// ---- tensor-core forward -----------------------------------------------------------
// One CTA per (batch*head, query tile of 64*MI rows); warp w owns rows
// w*16*MI .. +16*MI. grid.y runs over query tiles, heaviest first.
template <int MI>
__global__ void __launch_bounds__(kThreads) fwd_tc_kernel(const bf16_t* __restrict__ qkv, bf16_t* __restrict__ y,
                                                          float* __restrict__ lse, int T, int nh, int C,
                                                          float scale_log2) {
  constexpr int kRowsQ = 64 * MI;
  // [0] K0 [1] V0 [2] K1 [3] V1; the Q tile is staged over [2..] first.
  __shared__ __align__(16) bf16_t smem[4 * kTileElems];
  const int bh = int(blockIdx.x), b = bh / nh, h = bh % nh;
  const int qt = int(gridDim.y) - 1 - int(blockIdx.y), q0 = qt * kRowsQ;
  const int64_t ld = 3 * int64_t(C);
  const bf16_t* q = qkv + int64_t(b) * T * ld + int64_t(h) * kHd;
  const bf16_t* k = q + C;
  const bf16_t* v = q + 2 * int64_t(C);
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31, g = lane >> 2, t4 = lane & 3;

  load_tile<kRowsQ>(smem + 2 * kTileElems, q, ld, q0, T);
  load_tile<kTile>(smem, k, ld, 0, T);
  load_tile<kTile>(smem + kTileElems, v, ld, 0, T);
  cp_async_commit();

  const int key_end = min(T, q0 + kRowsQ);
  const int n_kt = (key_end + kTile - 1) / kTile;
  const int row0 = q0 + warp * 16 * MI + g;  // rows row0 + 16 mi + 8 r
  uint32_t qf[MI][4][4];
  float o[MI][8][4] = {};
  float m[MI][2], l[MI][2];
#pragma unroll
  for (int mi = 0; mi < MI; ++mi) m[mi][0] = m[mi][1] = -INFINITY, l[mi][0] = l[mi][1] = 0.f;

  for (int j = 0; j < n_kt; ++j) {
    const int buf = j & 1;
    cp_async_wait_all();
    __syncthreads();  // tile j landed; every warp is done with tile j-1
    if (j == 0) {
#pragma unroll
      for (int mi = 0; mi < MI; ++mi) load_a(qf[mi], smem + 2 * kTileElems + (warp * MI + mi) * 16 * kLd, lane);
      __syncthreads();  // buffer 1 is free for the prefetch
    }
    if (j + 1 < n_kt) {
      load_tile<kTile>(smem + (2 * (buf ^ 1)) * kTileElems, k, ld, (j + 1) * kTile, T);
      load_tile<kTile>(smem + (2 * (buf ^ 1) + 1) * kTileElems, v, ld, (j + 1) * kTile, T);
      cp_async_commit();
    }
    const bf16_t* sk = smem + 2 * buf * kTileElems;
    const bf16_t* sv = sk + kTileElems;
    const int k0 = j * kTile;
    const bool masked = k0 + kTile - 1 > q0;  // the tile crosses the diagonal
    // With 128-row query tiles, the upper rows of the CTA see no key of its last tile.
    if (k0 > q0 + (warp + 1) * 16 * MI - 1) continue;
    float s[MI][8][4] = {};
    mma_abt<MI, 8>(s, qf, sk, lane);
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int qi = row0 + 16 * mi + 8 * r;
        float mx = m[mi][r];
#pragma unroll
        for (int n = 0; n < 8; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float x = s[mi][n][2 * r + e] * scale_log2;
            if (masked && k0 + n * 8 + 2 * t4 + e > qi) x = -INFINITY;
            s[mi][n][2 * r + e] = x;
            mx = fmaxf(mx, x);
          }
        mx = quad_max(mx);
        // Every row sees key 0 in tile 0, so mx is finite; the guard keeps
        // exp2 away from inf - inf all the same.
        const float mref = mx == -INFINITY ? 0.f : mx;
        const float alpha = fast_exp2(m[mi][r] - mref);
        m[mi][r] = mx;
        float sum = 0.f;
#pragma unroll
        for (int n = 0; n < 8; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float p = fast_exp2(s[mi][n][2 * r + e] - mref);
            s[mi][n][2 * r + e] = p;
            sum += p;
          }
        l[mi][r] = l[mi][r] * alpha + sum;
#pragma unroll
        for (int n = 0; n < 8; ++n) o[mi][n][2 * r] *= alpha, o[mi][n][2 * r + 1] *= alpha;
      }
    mma_pb<MI, 8>(o, s, sv, lane);
  }

#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float sum = quad_sum(l[mi][r]);
      const int qi = row0 + 16 * mi + 8 * r;
      if (qi >= T) continue;
      const float inv = 1.f / sum;
      bf16_t* yr = y + (int64_t(b) * T + qi) * C + int64_t(h) * kHd + 2 * t4;
#pragma unroll
      for (int n = 0; n < 8; ++n)
        *reinterpret_cast<__nv_bfloat162*>(yr + 8 * n) =
            __floats2bfloat162_rn(o[mi][n][2 * r] * inv, o[mi][n][2 * r + 1] * inv);
      if (t4 == 0) lse[int64_t(bh) * T + qi] = (m[mi][r] + log2f(sum)) * kLn2;
    }
}

// ---- tensor-core backward ------------------------------------------------------------

// lse (as log2) and D of kRows rows r0.. of a tile into shared memory (the
// first kRows threads take lse, the next kRows D); rows past T get lse =
// +inf, which makes their probabilities exactly zero.
template <int kRows = kTile>
__device__ __forceinline__ void load_stats(float* sl, float* sd, const float* lse, const float* D, int r0, int T) {
  static_assert(2 * kRows <= kThreads);
  const int t = int(threadIdx.x);
  if (t < kRows) {
    sl[t] = r0 + t < T ? lse[r0 + t] * kLog2e : INFINITY;
  } else if (t < 2 * kRows) {
    const int i = t - kRows;
    sd[i] = r0 + i < T ? D[r0 + i] : 0.f;
  }
}

// dK, dV of one key tile (64 keys, 16 per warp): walks the query tiles from
// the diagonal down. grid.y = key tiles, lightest last.
__global__ void __launch_bounds__(kThreads) bwd_dkdv_tc_kernel(const bf16_t* __restrict__ qkv,
                                                               const bf16_t* __restrict__ dy,
                                                               const float* __restrict__ lse,
                                                               const float* __restrict__ Dv,
                                                               bf16_t* __restrict__ dqkv, int T, int nh, int C,
                                                               float scale_log2, float scale) {
  // [0] Q0 [1] dO0 [2] Q1 [3] dO1; K, V are staged in buffer 1 first.
  __shared__ __align__(16) bf16_t smem[4 * kTileElems];
  __shared__ float s_l[2][kTile], s_d[2][kTile];
  const int bh = int(blockIdx.x), b = bh / nh, h = bh % nh;
  const int kt = int(blockIdx.y), k0 = kt * kTile, nq = int(gridDim.y);
  const int64_t ld = 3 * int64_t(C);
  const bf16_t* q = qkv + int64_t(b) * T * ld + int64_t(h) * kHd;
  const bf16_t* k = q + C;
  const bf16_t* v = q + 2 * int64_t(C);
  const bf16_t* go = dy + int64_t(b) * T * C + int64_t(h) * kHd;
  const float* lse_bh = lse + int64_t(bh) * T;
  const float* D_bh = Dv + int64_t(bh) * T;
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31, g = lane >> 2, t4 = lane & 3;

  load_tile<kTile>(smem + 2 * kTileElems, k, ld, k0, T);
  load_tile<kTile>(smem + 3 * kTileElems, v, ld, k0, T);
  load_tile<kTile>(smem, q, ld, k0, T);
  load_tile<kTile>(smem + kTileElems, go, C, k0, T);
  load_stats(s_l[0], s_d[0], lse_bh, D_bh, k0, T);
  cp_async_commit();

  const int key0 = k0 + warp * 16 + g;  // keys key0, key0 + 8
  uint32_t kf[1][4][4], vf[1][4][4];
  float dk[1][8][4] = {}, dv[1][8][4] = {};
  for (int i = kt; i < nq; ++i) {
    const int buf = (i - kt) & 1;
    cp_async_wait_all();
    __syncthreads();
    if (i == kt) {
      load_a(kf[0], smem + 2 * kTileElems + warp * 16 * kLd, lane);
      load_a(vf[0], smem + 3 * kTileElems + warp * 16 * kLd, lane);
      __syncthreads();
    }
    if (i + 1 < nq) {
      load_tile<kTile>(smem + 2 * (buf ^ 1) * kTileElems, q, ld, (i + 1) * kTile, T);
      load_tile<kTile>(smem + (2 * (buf ^ 1) + 1) * kTileElems, go, C, (i + 1) * kTile, T);
      load_stats(s_l[buf ^ 1], s_d[buf ^ 1], lse_bh, D_bh, (i + 1) * kTile, T);
      cp_async_commit();
    }
    const bf16_t* sq = smem + 2 * buf * kTileElems;
    const bf16_t* sg = sq + kTileElems;
    const float* sl = s_l[buf];
    const float* sd = s_d[buf];
    const int q0 = i * kTile;
    // P^T = exp2(K Q^T * scale log2e - lse): rows are keys, columns queries.
    float p[1][8][4] = {};
    mma_abt<1, 8>(p, kf, sq, lane);
    for_each_elem(p, [&](int, int n, int r, int e, float& x) {
      const int col = n * 8 + 2 * t4 + e;
      x = fast_exp2(x * scale_log2 - sl[col]);
      if (i == kt && q0 + col < key0 + 8 * r) x = 0.f;
    });
    mma_pb<1, 8>(dv, p, sg, lane);  // dV += P^T dO
    // dS^T = P^T (V dO^T - D)
    float ds[1][8][4] = {};
    mma_abt<1, 8>(ds, vf, sg, lane);
    for_each_elem(ds, [&](int, int n, int r, int e, float& x) { x = p[0][n][2 * r + e] * (x - sd[n * 8 + 2 * t4 + e]); });
    mma_pb<1, 8>(dk, ds, sq, lane);  // dK += dS^T Q
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int kj = key0 + 8 * r;
    if (kj >= T) continue;
    bf16_t* dst = dqkv + (int64_t(b) * T + kj) * ld + int64_t(h) * kHd + 2 * t4;
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      *reinterpret_cast<__nv_bfloat162*>(dst + C + 8 * n) =
          __floats2bfloat162_rn(dk[0][n][2 * r] * scale, dk[0][n][2 * r + 1] * scale);
      *reinterpret_cast<__nv_bfloat162*>(dst + 2 * int64_t(C) + 8 * n) =
          __floats2bfloat162_rn(dv[0][n][2 * r], dv[0][n][2 * r + 1]);
    }
  }
}

// dK, dV of one tile of 128 keys, 32 per warp: the same function as
// bwd_dkdv_tc_kernel, but each B fragment read from shared memory serves two
// 16-key slices (4 mma per ldmatrix.x4 instead of 2, the bound above). To fit
// the dK, dV accumulators of 32 keys in registers, the query tiles are 32
// rows (S^T and dP^T are 32 x 32 per warp) and V stays in shared memory, its
// A fragments read per product. K is staged in the query buffers first.
// grid.y = key tiles, lightest last.
constexpr int kKeysWide = 128;
constexpr int kRowsNarrow = 32;
__global__ void __launch_bounds__(kThreads) bwd_dkdv_wide_tc_kernel(const bf16_t* __restrict__ qkv,
                                                                    const bf16_t* __restrict__ dy,
                                                                    const float* __restrict__ lse,
                                                                    const float* __restrict__ Dv,
                                                                    bf16_t* __restrict__ dqkv, int T, int nh, int C,
                                                                    float scale_log2, float scale) {
  constexpr int kRowsQ = kRowsNarrow;
  // V (128 rows), then two buffers of (Q, dO) tiles of 32 rows, which hold
  // the K tile (128 rows) until its fragments are in registers.
  __shared__ __align__(16) bf16_t smem[2 * kKeysWide * kLd];
  __shared__ float s_l[2][kRowsQ], s_d[2][kRowsQ];
  bf16_t* const sv = smem;
  bf16_t* const bufs = smem + kKeysWide * kLd;
  const int bh = int(blockIdx.x), b = bh / nh, h = bh % nh;
  const int k0 = int(blockIdx.y) * kKeysWide;
  const int64_t ld = 3 * int64_t(C);
  const bf16_t* q = qkv + int64_t(b) * T * ld + int64_t(h) * kHd;
  const bf16_t* k = q + C;
  const bf16_t* v = q + 2 * int64_t(C);
  const bf16_t* go = dy + int64_t(b) * T * C + int64_t(h) * kHd;
  const float* lse_bh = lse + int64_t(bh) * T;
  const float* D_bh = Dv + int64_t(bh) * T;
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31, g = lane >> 2, t4 = lane & 3;

  load_tile<kKeysWide>(bufs, k, ld, k0, T);
  load_tile<kKeysWide>(sv, v, ld, k0, T);
  cp_async_commit();
  const int kw0 = k0 + warp * 32;  // the warp's keys: kw0 + 16 mi + g + 8 r
  uint32_t kf[2][4][4];
  cp_async_wait_all();
  __syncthreads();
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) load_a(kf[mi], bufs + (warp * 32 + mi * 16) * kLd, lane);
  __syncthreads();  // the K staging area becomes the query buffers

  // Queries before k0 see none of the tile's keys.
  const int i0 = k0 / kRowsQ, nq = (T + kRowsQ - 1) / kRowsQ;
  load_tile<kRowsQ>(bufs, q, ld, k0, T);
  load_tile<kRowsQ>(bufs + kRowsQ * kLd, go, C, k0, T);
  load_stats<kRowsQ>(s_l[0], s_d[0], lse_bh, D_bh, k0, T);
  cp_async_commit();

  float dk[2][8][4] = {}, dv[2][8][4] = {};
  for (int i = i0; i < nq; ++i) {
    const int buf = (i - i0) & 1;
    cp_async_wait_all();
    __syncthreads();  // tile i landed; every warp is done with tile i-1
    if (i + 1 < nq) {
      bf16_t* next = bufs + 2 * (buf ^ 1) * kRowsQ * kLd;
      load_tile<kRowsQ>(next, q, ld, (i + 1) * kRowsQ, T);
      load_tile<kRowsQ>(next + kRowsQ * kLd, go, C, (i + 1) * kRowsQ, T);
      load_stats<kRowsQ>(s_l[buf ^ 1], s_d[buf ^ 1], lse_bh, D_bh, (i + 1) * kRowsQ, T);
      cp_async_commit();
    }
    const int q0 = i * kRowsQ;
    if (q0 + kRowsQ - 1 < kw0) continue;  // every query of the tile comes before the warp's keys
    const bool masked = q0 < kw0 + 31;    // the tile crosses the warp's diagonal
    const bf16_t* sq = bufs + 2 * buf * kRowsQ * kLd;
    const bf16_t* sg = sq + kRowsQ * kLd;
    const float* sl = s_l[buf];
    const float* sd = s_d[buf];
    // P^T = exp2(K Q^T * scale log2e - lse): rows are keys, columns queries.
    float p[2][4][4] = {};
    mma_abt<2, 4>(p, kf, sq, lane);
    for_each_elem(p, [&](int mi, int n, int r, int e, float& x) {
      const int col = n * 8 + 2 * t4 + e;
      x = fast_exp2(x * scale_log2 - sl[col]);
      if (masked && q0 + col < kw0 + 16 * mi + g + 8 * r) x = 0.f;
    });
    mma_pb<2, 4>(dv, p, sg, lane);  // dV += P^T dO
    // dS^T = P^T (V dO^T - D)
    float ds[2][4][4] = {};
    mma_abt_sa<2, 4>(ds, sv + warp * 32 * kLd, sg, lane);
    for_each_elem(ds, [&](int mi, int n, int r, int e, float& x) {
      x = p[mi][n][2 * r + e] * (x - sd[n * 8 + 2 * t4 + e]);
    });
    mma_pb<2, 4>(dk, ds, sq, lane);  // dK += dS^T Q
  }

#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int kj = kw0 + 16 * mi + g + 8 * r;
      if (kj >= T) continue;
      bf16_t* dst = dqkv + (int64_t(b) * T + kj) * ld + int64_t(h) * kHd + 2 * t4;
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        *reinterpret_cast<__nv_bfloat162*>(dst + C + 8 * n) =
            __floats2bfloat162_rn(dk[mi][n][2 * r] * scale, dk[mi][n][2 * r + 1] * scale);
        *reinterpret_cast<__nv_bfloat162*>(dst + 2 * int64_t(C) + 8 * n) =
            __floats2bfloat162_rn(dv[mi][n][2 * r], dv[mi][n][2 * r + 1]);
      }
    }
}

// dQ of one query tile (64 MI rows, 16 MI per warp): walks the key tiles up
// to the diagonal, each in two halves of 32 keys so that S, dP and the dQ
// accumulator of 32 rows fit in registers. grid.y = query tiles, heaviest first.
template <int MI>
__global__ void __launch_bounds__(kThreads) bwd_dq_tc_kernel(const bf16_t* __restrict__ qkv,
                                                             const bf16_t* __restrict__ dy,
                                                             const float* __restrict__ lse,
                                                             const float* __restrict__ Dv,
                                                             bf16_t* __restrict__ dqkv, int T, int nh, int C,
                                                             float scale_log2, float scale) {
  constexpr int kRowsQ = 64 * MI;
  // [0] K0 [1] V0 [2] K1 [3] V1; dO is staged over [0..] and Q over [2..]
  // before the first K, V tile is loaded.
  __shared__ __align__(16) bf16_t smem[4 * kTileElems];
  const int bh = int(blockIdx.x), b = bh / nh, h = bh % nh;
  const int qt = int(gridDim.y) - 1 - int(blockIdx.y), q0 = qt * kRowsQ;
  const int64_t ld = 3 * int64_t(C);
  const bf16_t* q = qkv + int64_t(b) * T * ld + int64_t(h) * kHd;
  const bf16_t* k = q + C;
  const bf16_t* v = q + 2 * int64_t(C);
  const bf16_t* go = dy + int64_t(b) * T * C + int64_t(h) * kHd;
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31, g = lane >> 2, t4 = lane & 3;

  load_tile<kRowsQ>(smem + 2 * kTileElems, q, ld, q0, T);
  load_tile<kRowsQ>(smem, go, C, q0, T);
  cp_async_commit();

  const int row0 = q0 + warp * 16 * MI + g;  // rows row0 + 16 mi + 8 r
  float lr[MI][2], dr[MI][2];
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int qi = row0 + 16 * mi + 8 * r;
      lr[mi][r] = qi < T ? lse[int64_t(bh) * T + qi] * kLog2e : INFINITY;
      dr[mi][r] = qi < T ? Dv[int64_t(bh) * T + qi] : 0.f;
    }
  uint32_t qf[MI][4][4], gf[MI][4][4];
  cp_async_wait_all();
  __syncthreads();
#pragma unroll
  for (int mi = 0; mi < MI; ++mi) {
    load_a(qf[mi], smem + 2 * kTileElems + (warp * MI + mi) * 16 * kLd, lane);
    load_a(gf[mi], smem + (warp * MI + mi) * 16 * kLd, lane);
  }
  __syncthreads();
  load_tile<kTile>(smem, k, ld, 0, T);
  load_tile<kTile>(smem + kTileElems, v, ld, 0, T);
  cp_async_commit();

  const int n_kt = (min(T, q0 + kRowsQ) + kTile - 1) / kTile;
  const int warp_last = q0 + (warp + 1) * 16 * MI - 1;  // the warp's last row
  float dq[MI][8][4] = {};
  for (int j = 0; j < n_kt; ++j) {
    const int buf = j & 1;
    cp_async_wait_all();
    __syncthreads();
    if (j + 1 < n_kt) {
      load_tile<kTile>(smem + 2 * (buf ^ 1) * kTileElems, k, ld, (j + 1) * kTile, T);
      load_tile<kTile>(smem + (2 * (buf ^ 1) + 1) * kTileElems, v, ld, (j + 1) * kTile, T);
      cp_async_commit();
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int k0 = j * kTile + half * 32;
      if (k0 > warp_last) continue;  // every key of the half is above the warp's rows
      const bf16_t* sk = smem + 2 * buf * kTileElems + half * 32 * kLd;
      const bf16_t* sv = sk + kTileElems;
      const bool masked = k0 + 31 > q0 + warp * 16 * MI;
      float p[MI][4][4] = {};
      mma_abt<MI, 4>(p, qf, sk, lane);  // S = Q K^T
      for_each_elem(p, [&](int mi, int n, int r, int e, float& x) {
        x = fast_exp2(x * scale_log2 - lr[mi][r]);
        if (masked && k0 + n * 8 + 2 * t4 + e > row0 + 16 * mi + 8 * r) x = 0.f;
      });
      float ds[MI][4][4] = {};
      mma_abt<MI, 4>(ds, gf, sv, lane);  // dP = dO V^T
      for_each_elem(ds, [&](int mi, int n, int r, int e, float& x) { x = p[mi][n][2 * r + e] * (x - dr[mi][r]); });
      mma_pb<MI, 4>(dq, ds, sk, lane);  // dQ += dS K
    }
  }

#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int qi = row0 + 16 * mi + 8 * r;
      if (qi >= T) continue;
      bf16_t* dst = dqkv + (int64_t(b) * T + qi) * ld + int64_t(h) * kHd + 2 * t4;
#pragma unroll
      for (int n = 0; n < 8; ++n)
        *reinterpret_cast<__nv_bfloat162*>(dst + 8 * n) =
            __floats2bfloat162_rn(dq[mi][n][2 * r] * scale, dq[mi][n][2 * r + 1] * scale);
    }
}

// ---- general path: one warp per row --------------------------------------------------
// Rows are numbered (batch*head, t); `row` below is the warp's global index.

template <class E>
__device__ __forceinline__ float dot_row(const float* s, const E* g, int hd) {
  float acc = 0.f;
  for (int i = 0; i < hd; ++i) acc += s[i] * widen(g[i]);
  return acc;
}

// Forward. Shared memory per warp: q (scaled), the output accumulator, 32 p.
template <class E>
__global__ void fwd_rows_kernel(const E* __restrict__ qkv, E* __restrict__ y, float* __restrict__ lse, int64_t rows,
                                int T, int nh, int C, int hd, float scale) {
  extern __shared__ float sm[];
  const int warps = int(blockDim.x) >> 5, warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
  const int64_t row = int64_t(blockIdx.x) * warps + warp;
  if (row >= rows) return;
  float* qs = sm + warp * (2 * hd + 32);
  float* os = qs + hd;
  float* ps = os + hd;
  const int64_t bh = row / T, b = bh / nh, h = bh % nh;
  const int t = T - 1 - int(row % T);  // long rows first
  const int64_t ld = 3 * int64_t(C);
  const E* base = qkv + b * T * ld + h * hd;
  for (int i = lane; i < hd; i += 32) qs[i] = widen(base[t * ld + i]) * scale, os[i] = 0.f;
  __syncwarp();
  float m = -INFINITY, l = 0.f;
  for (int u0 = 0; u0 <= t; u0 += 32) {
    const int n = min(32, t + 1 - u0);
    const float s = lane < n ? dot_row(qs, base + C + (u0 + lane) * ld, hd) : -INFINITY;
    const float mn = fmaxf(m, warp_max(s));  // finite: lane 0 holds a valid key
    const float p = lane < n ? expf(s - mn) : 0.f;
    const float alpha = expf(m - mn);
    l = l * alpha + warp_sum(p);
    ps[lane] = p;
    __syncwarp();
    const E* vb = base + 2 * int64_t(C) + u0 * ld;
    for (int i = lane; i < hd; i += 32) {
      float acc = os[i] * alpha;
      for (int j = 0; j < n; ++j) acc += ps[j] * widen(vb[j * ld + i]);
      os[i] = acc;
    }
    __syncwarp();
    m = mn;
  }
  E* yr = y + (b * T + t) * C + h * hd;
  const float inv = 1.f / l;
  for (int i = lane; i < hd; i += 32) yr[i] = narrow<E>(os[i] * inv);
  if (lane == 0) lse[bh * T + t] = m + logf(l);
}

// D = rowsum(dY * Y) per (batch*head, t), one warp per row.
template <class E>
__global__ void rowdot_kernel(const E* __restrict__ dy, const E* __restrict__ y, float* __restrict__ D, int64_t rows,
                              int T, int nh, int C, int hd) {
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = int(threadIdx.x) & 31;
  if (row >= rows) return;
  const int64_t bh = row / T, b = bh / nh, h = bh % nh, t = row % T;
  const int64_t off = (b * T + t) * C + h * hd;
  float acc = 0.f;
  for (int i = lane; i < hd; i += 32) acc += widen(dy[off + i]) * widen(y[off + i]);
  acc = warp_sum(acc);
  if (lane == 0) D[row] = acc;
}

// The same D with 16-byte loads, for heads of G 16-byte chunks (G a power of
// two up to 32; head_dim 64 in bf16 is 8): thread i takes chunk i of the
// (B, T, C) tensors in memory order, and the G lanes holding one head's row
// add by shuffles. The kernel above reads 2 bytes a lane per load at
// head_dim 64 and, under ncu at G1's shape, moved 1.15 TB/s.
template <class E, int G>
__global__ void rowdot_vec_kernel(const E* __restrict__ dy, const E* __restrict__ y, float* __restrict__ D,
                                  int64_t chunks, int T, int nh) {
  constexpr int N = 16 / int(sizeof(E));
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  float acc = 0.f;
  if (i < chunks) {
    const Pack<E, N> a = reinterpret_cast<const Pack<E, N>*>(dy)[i];
    const Pack<E, N> b = reinterpret_cast<const Pack<E, N>*>(y)[i];
#pragma unroll
    for (int j = 0; j < N; ++j) acc += widen(a.v[j]) * widen(b.v[j]);
  }
  // Every lane takes part (blocks are whole warps, and G divides 32).
#pragma unroll
  for (int o = 1; o < G; o <<= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (i < chunks && i % G == 0) {
    const int64_t head_row = i / G;  // (b T + t) nh + h
    const int64_t bt = head_row / nh, h = head_row % nh, b = bt / T, t = bt % T;
    D[(b * nh + h) * T + t] = acc;
  }
}

// D for `rows` (batch, head, t) rows: the 16-byte kernel where the head's
// row is a power-of-two number of aligned 16-byte chunks, else one warp per row.
template <class E>
void launch_rowdot(const E* dy, const E* y, float* D, int64_t rows, int T, int nh, int C, int hd, cudaStream_t s) {
  constexpr int N = 16 / int(sizeof(E));
  const int G = hd / N;
  const int64_t chunks = rows * G;
  const unsigned blocks = unsigned((chunks + 255) / 256);
  if (hd % N == 0 && G <= 32 && (G & (G - 1)) == 0 && aligned16(dy) && aligned16(y)) {
    switch (G) {
      case 1: rowdot_vec_kernel<E, 1><<<blocks, 256, 0, s>>>(dy, y, D, chunks, T, nh); return;
      case 2: rowdot_vec_kernel<E, 2><<<blocks, 256, 0, s>>>(dy, y, D, chunks, T, nh); return;
      case 4: rowdot_vec_kernel<E, 4><<<blocks, 256, 0, s>>>(dy, y, D, chunks, T, nh); return;
      case 8: rowdot_vec_kernel<E, 8><<<blocks, 256, 0, s>>>(dy, y, D, chunks, T, nh); return;
      case 16: rowdot_vec_kernel<E, 16><<<blocks, 256, 0, s>>>(dy, y, D, chunks, T, nh); return;
      case 32: rowdot_vec_kernel<E, 32><<<blocks, 256, 0, s>>>(dy, y, D, chunks, T, nh); return;
      default: break;
    }
  }
  rowdot_kernel<E><<<unsigned((rows + 7) / 8), 256, 0, s>>>(dy, y, D, rows, T, nh, C, hd);
}

// dQ, one warp per query row. Shared memory per warp: q, dO, dQ accumulator, 32 dS.
template <class E>
__global__ void bwd_dq_rows_kernel(const E* __restrict__ qkv, const E* __restrict__ dy, const float* __restrict__ lse,
                                   const float* __restrict__ Dv, E* __restrict__ dqkv, int64_t rows, int T, int nh,
                                   int C, int hd, float scale) {
  extern __shared__ float sm[];
  const int warps = int(blockDim.x) >> 5, warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
  const int64_t row = int64_t(blockIdx.x) * warps + warp;
  if (row >= rows) return;
  float* qs = sm + warp * (3 * hd + 32);
  float* gs = qs + hd;
  float* acc = gs + hd;
  float* dss = acc + hd;
  const int64_t bh = row / T, b = bh / nh, h = bh % nh;
  const int t = T - 1 - int(row % T);
  const int64_t ld = 3 * int64_t(C);
  const E* base = qkv + b * T * ld + h * hd;
  const E* gr = dy + (b * T + t) * C + h * hd;
  for (int i = lane; i < hd; i += 32) qs[i] = widen(base[t * ld + i]), gs[i] = widen(gr[i]), acc[i] = 0.f;
  __syncwarp();
  const float lt = lse[bh * T + t], Dt = Dv[bh * T + t];
  for (int u0 = 0; u0 <= t; u0 += 32) {
    const int n = min(32, t + 1 - u0);
    float ds = 0.f;
    if (lane < n) {
      const int64_t u = u0 + lane;
      const float p = expf(dot_row(qs, base + C + u * ld, hd) * scale - lt);
      ds = p * (dot_row(gs, base + 2 * int64_t(C) + u * ld, hd) - Dt);
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

// dK, dV, one warp per key row. Shared memory per warp: k, v, dK, dV, 32 p, 32 dS.
template <class E>
__global__ void bwd_dkdv_rows_kernel(const E* __restrict__ qkv, const E* __restrict__ dy,
                                     const float* __restrict__ lse, const float* __restrict__ Dv,
                                     E* __restrict__ dqkv, int64_t rows, int T, int nh, int C, int hd, float scale) {
  extern __shared__ float sm[];
  const int warps = int(blockDim.x) >> 5, warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
  const int64_t row = int64_t(blockIdx.x) * warps + warp;
  if (row >= rows) return;
  float* ks = sm + warp * (4 * hd + 64);
  float* vs = ks + hd;
  float* dk = vs + hd;
  float* dv = dk + hd;
  float* ps = dv + hd;
  float* dss = ps + 32;
  const int64_t bh = row / T, b = bh / nh, h = bh % nh;
  const int u = int(row % T);  // long rows (small u) first
  const int64_t ld = 3 * int64_t(C);
  const E* base = qkv + b * T * ld + h * hd;
  const E* gbase = dy + b * T * C + h * hd;
  for (int i = lane; i < hd; i += 32) {
    ks[i] = widen(base[u * ld + C + i]), vs[i] = widen(base[u * ld + 2 * C + i]);
    dk[i] = dv[i] = 0.f;
  }
  __syncwarp();
  const float* lse_bh = lse + bh * T;
  const float* D_bh = Dv + bh * T;
  for (int t0 = u; t0 < T; t0 += 32) {
    const int n = min(32, T - t0);
    float p = 0.f, ds = 0.f;
    if (lane < n) {
      const int64_t t = t0 + lane;
      p = expf(dot_row(ks, base + t * ld, hd) * scale - lse_bh[t]);
      ds = p * (dot_row(vs, gbase + t * C, hd) - D_bh[t]);
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

// ---- kernel functions ----------------------------------------------------------------

template <DType DT>
void flash_attention_fwd(const KernelCall& c) {
  using E = device_t<DT>;
  const Dims d = dims_of(c, "flash_attention", c.in(0).shape());
  if (d.B == 0 || d.T == 0) return;
  const E* qkv = c.in(0).as<E>();
  E* y = c.out(0).as<E>();
  float* lse = c.out(1).as<float>();
  cudaStream_t s = stream_of(c);
  const int T = int(d.T), nh = int(d.nh), C = int(d.C), hd = int(d.hd);
  if constexpr (DT == DType::bf16) {
    if (hd == kHd && aligned16(qkv) && aligned16(y)) {
      // 128-row query tiles halve the K/V traffic once there are enough of
      // them to fill the GPU; short sequences keep 64 for parallelism.
      const bool big = d.T >= 512;
      const int rows_q = big ? 128 : 64;
      const dim3 grid(unsigned(d.B * d.nh), unsigned((d.T + rows_q - 1) / rows_q));
      if (big)
        fwd_tc_kernel<2><<<grid, kThreads, 0, s>>>(qkv, y, lse, T, nh, C, d.scale * kLog2e);
      else
        fwd_tc_kernel<1><<<grid, kThreads, 0, s>>>(qkv, y, lse, T, nh, C, d.scale * kLog2e);
      check_launch("flash_attention(bf16)");
      return;
    }
  }
  const int64_t rows = d.B * d.nh * d.T;
  const int64_t per_warp = 2 * d.hd + 32;
  const int warps = rows_warps(per_warp, "flash_attention");
  fwd_rows_kernel<E><<<blocks_for(rows, warps), warps * 32, size_t(warps * per_warp) * sizeof(float), s>>>(
      qkv, y, lse, rows, T, nh, C, hd, d.scale);
  check_launch(DT == DType::f32 ? "flash_attention(f32)" : "flash_attention(bf16)");
}

template <DType DT>
void flash_attention_bwd(const KernelCall& c) {
  using E = device_t<DT>;
  constexpr const char* op = "flash_attention_backward";
  const char* what = DT == DType::f32 ? "flash_attention_backward(f32)" : "flash_attention_backward(bf16)";
  const Dims d = dims_of(c, op, c.in(1).shape());
  if (c.in(0).numel() != d.B * d.T * d.C || c.in(2).numel() != d.B * d.T * d.C ||
      c.in(3).numel() != d.B * d.nh * d.T)
    throw core::ShapeError(std::string(op) + ": dy, y must be (B, T, C) and lse (B, n_head, T) for qkv (B, T, 3C)");
  if (d.B == 0 || d.T == 0) return;
  const E* dy = c.in(0).as<E>();
  const E* qkv = c.in(1).as<E>();
  const E* y = c.in(2).as<E>();
  const float* lse = c.in(3).as<float>();
  E* dqkv = c.out(0).as<E>();
  cudaStream_t s = stream_of(c);
  const int T = int(d.T), nh = int(d.nh), C = int(d.C), hd = int(d.hd);

  // Scratch for D (one float per row), in chunks of whole batches.
  const int64_t per_batch = d.nh * d.T * int64_t(sizeof(float));
  float* Dbuf = nullptr;
  int64_t chunk = d.B;
  if (c.workspace && int64_t(c.workspace_bytes) >= d.B * per_batch) {
    Dbuf = static_cast<float*>(c.workspace);
  } else {
    const core::ExecContext& ctx = context_of(c);
    chunk = std::min<int64_t>(d.B, int64_t(ctx.blas_workspace_bytes) / per_batch);
    if (!ctx.blas_workspace || chunk < 1)
      throw core::ShapeError(std::string(op) + ": n_head * T too large for the CUDA scratch");
    Dbuf = static_cast<float*>(ctx.blas_workspace);
  }

  bool fast = false;
  if constexpr (DT == DType::bf16) fast = hd == kHd && aligned16(qkv) && aligned16(dy) && aligned16(dqkv);
  const int64_t per_warp_dq = 3 * d.hd + 32, per_warp_kv = 4 * d.hd + 64;
  const int warps_dq = fast ? 0 : rows_warps(per_warp_dq, op);
  const int warps_kv = fast ? 0 : rows_warps(per_warp_kv, op);

  for (int64_t b0 = 0; b0 < d.B; b0 += chunk) {
    const int64_t nb = std::min(chunk, d.B - b0);
    const int64_t rows = nb * d.nh * d.T;
    const E* dy_b = dy + b0 * d.T * d.C;
    const E* y_b = y + b0 * d.T * d.C;
    const E* qkv_b = qkv + b0 * d.T * 3 * d.C;
    const float* lse_b = lse + b0 * d.nh * d.T;
    E* dqkv_b = dqkv + b0 * d.T * 3 * d.C;
    launch_rowdot<E>(dy_b, y_b, Dbuf, rows, T, nh, C, hd, s);
    check_launch(what);
    if (fast) {
      if constexpr (DT == DType::bf16) {
        // 128-key tiles once there are enough of them to fill the GPU (as
        // the forward's 128-row query tiles); short sequences keep 64.
        if (d.T >= 512) {
          const dim3 grid(unsigned(nb * d.nh), unsigned((d.T + kKeysWide - 1) / kKeysWide));
          bwd_dkdv_wide_tc_kernel<<<grid, kThreads, 0, s>>>(qkv_b, dy_b, lse_b, Dbuf, dqkv_b, T, nh, C,
                                                            d.scale * kLog2e, d.scale);
        } else {
          const dim3 grid(unsigned(nb * d.nh), unsigned((d.T + kTile - 1) / kTile));
          bwd_dkdv_tc_kernel<<<grid, kThreads, 0, s>>>(qkv_b, dy_b, lse_b, Dbuf, dqkv_b, T, nh, C,
                                                       d.scale * kLog2e, d.scale);
        }
        check_launch(what);
        const dim3 grid_q(unsigned(nb * d.nh), unsigned((d.T + 2 * kTile - 1) / (2 * kTile)));
        bwd_dq_tc_kernel<2><<<grid_q, kThreads, 0, s>>>(qkv_b, dy_b, lse_b, Dbuf, dqkv_b, T, nh, C,
                                                        d.scale * kLog2e, d.scale);
        check_launch(what);
      }
    } else {
      bwd_dkdv_rows_kernel<E><<<blocks_for(rows, warps_kv), warps_kv * 32,
                                size_t(warps_kv * per_warp_kv) * sizeof(float), s>>>(qkv_b, dy_b, lse_b, Dbuf,
                                                                                      dqkv_b, rows, T, nh, C, hd,
                                                                                      d.scale);
      check_launch(what);
      bwd_dq_rows_kernel<E><<<blocks_for(rows, warps_dq), warps_dq * 32,
                              size_t(warps_dq * per_warp_dq) * sizeof(float), s>>>(qkv_b, dy_b, lse_b, Dbuf, dqkv_b,
                                                                                    rows, T, nh, C, hd, d.scale);
      check_launch(what);
    }
  }
}

}  // namespace

void register_flash_attention_kernels(core::KernelRegistry& r) {
  r.add(core::OpKind::flash_attention, DType::f32, flash_attention_fwd<DType::f32>);
  r.add(core::OpKind::flash_attention, DType::bf16, flash_attention_fwd<DType::bf16>);
  r.add(core::OpKind::flash_attention_backward, DType::f32, flash_attention_bwd<DType::f32>);
  r.add(core::OpKind::flash_attention_backward, DType::bf16, flash_attention_bwd<DType::bf16>);
}

}  // namespace brisk::cuda
