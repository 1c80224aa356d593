// Softmax over the last dim and its backward on CUDA, f32 and bf16, as
// src/ops/softmax.cpp defines them: y = exp(x - max) / sum, and
// dx = y * (dy - sum(dy * y)) from the forward's output.
//
// Rows up to 1024 (f32) or 2048 (bf16) elements, 16-byte aligned, go to a
// warp-per-row kernel that holds the row in registers: one read, one write,
// shuffles for the max and the sums. Anything else (wide or odd rows) takes a
// block-per-row kernel: one pass computes the max and the sum together (an
// online softmax: the running sum is rescaled when the max grows), a second
// pass writes y. Arithmetic is fp32 with the accurate expf; bf16 rounds once.
#include <climits>
#include <cstdint>
#include <string>

#include "cuda_util.cuh"

namespace brisk::cuda {
namespace {

using core::DType;
using core::KernelCall;
using core::OpKind;

constexpr int kWarps = 8;  // rows per block of the warp-per-row kernels
constexpr int kThreads = kWarps * 32;
constexpr int kBlockThreads = 512;  // block-per-row fallback

template <class T>
struct alignas(16) Pack {
  static constexpr int n = 16 / int(sizeof(T));
  T e[n];
};


// Packs per lane for the register path (an instantiated count), 0 for the fallback.
template <class T>
int packs_per_lane(int64_t C) {
  constexpr int P = Pack<T>::n;
  if (C <= 0 || C % P != 0 || C > INT_MAX) return 0;
  const int64_t per = (C / P + 31) / 32;
  for (int o : {1, 2, 4, 8})
    if (per <= o) return o;
  return 0;
}

// (max, sum of exp(x - max)) of two parts merged. A part whose max is not the
// new max is rescaled; the equality test keeps (-inf, 0) parts from turning
// into NaN (exp(-inf - -inf)).
__device__ __forceinline__ void merge_max_sum(float& m, float& s, float mo, float so) {
  const float mn = fmaxf(m, mo);
  s = (m == mn ? s : s * expf(m - mn)) + (mo == mn ? so : so * expf(mo - mn));
  m = mn;
}

// ---- forward -----------------------------------------------------------------------

template <class T, int NV>
__global__ void __launch_bounds__(kThreads)
    softmax_warp_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int C) {
  constexpr int P = Pack<T>::n;
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= rows) return;  // per warp: the shuffles below see full warps
  const int nvec = C / P;
  const Pack<T>* xr = reinterpret_cast<const Pack<T>*>(x + row * C);
  float v[NV][P];
  float mx = -INFINITY;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int j = lane + 32 * k;
    if (j < nvec) {
      const Pack<T> px = xr[j];
#pragma unroll
      for (int e = 0; e < P; ++e) {
        v[k][e] = widen(px.e[e]);
        mx = fmaxf(mx, v[k][e]);
      }
    }
  }
  mx = warp_max(mx);
  float sum = 0.f;
#pragma unroll
  for (int k = 0; k < NV; ++k)
    if (lane + 32 * k < nvec) {
#pragma unroll
      for (int e = 0; e < P; ++e) {
        v[k][e] = expf(v[k][e] - mx);
        sum += v[k][e];
      }
    }
  const float inv = 1.f / warp_sum(sum);
  Pack<T>* yr = reinterpret_cast<Pack<T>*>(y + row * C);
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int j = lane + 32 * k;
    if (j < nvec) {
      Pack<T> out;
#pragma unroll
      for (int e = 0; e < P; ++e) out.e[e] = narrow<T>(v[k][e] * inv);
      yr[j] = out;
    }
  }
}

template <class T>
__global__ void __launch_bounds__(kBlockThreads)
    softmax_block_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t C) {
  __shared__ float sm[32], ss[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * C;
  float m = -INFINITY, s = 0.f;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) {
    const float v = widen(xr[i]);
    if (v > m) {
      s = s * expf(m - v) + 1.f;
      m = v;
    } else {
      s += expf(v - m);
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float mo = __shfl_xor_sync(0xffffffffu, m, o), so = __shfl_xor_sync(0xffffffffu, s, o);
    merge_max_sum(m, s, mo, so);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  if (lane == 0) {
    sm[warp] = m;
    ss[warp] = s;
  }
  __syncthreads();
  m = lane < nwarps ? sm[lane] : -INFINITY;
  s = lane < nwarps ? ss[lane] : 0.f;
  for (int o = 16; o > 0; o >>= 1) {
    const float mo = __shfl_xor_sync(0xffffffffu, m, o), so = __shfl_xor_sync(0xffffffffu, s, o);
    merge_max_sum(m, s, mo, so);
  }
  const float inv = 1.f / s;
  T* yr = y + row * C;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) yr[i] = narrow<T>(expf(widen(xr[i]) - m) * inv);
}

template <DType D>
void softmax_kernel(const KernelCall& c) {
  using T = device_t<D>;
  const char* what = D == DType::f32 ? "softmax(f32)" : "softmax(bf16)";
  const T* x = c.in(0).as<const T>();
  T* y = c.out(0).as<T>();
  const int64_t C = c.in(0).shape().last(), rows = c.in(0).shape().rows();
  if (c.out(0).numel() != c.in(0).numel()) throw core::ShapeError("softmax: y must have x's shape");
  if (rows <= 0 || C <= 0) return;
  if (rows > INT_MAX) throw core::ShapeError("softmax: too many rows for one launch");
  const cudaStream_t st = stream_of(c);
  const int nv = aligned16(x) && aligned16(y) ? packs_per_lane<T>(C) : 0;
  const unsigned blocks = unsigned((rows + kWarps - 1) / kWarps);
  switch (nv) {
    case 1: softmax_warp_kernel<T, 1><<<blocks, kThreads, 0, st>>>(x, y, rows, int(C)); break;
    case 2: softmax_warp_kernel<T, 2><<<blocks, kThreads, 0, st>>>(x, y, rows, int(C)); break;
    case 4: softmax_warp_kernel<T, 4><<<blocks, kThreads, 0, st>>>(x, y, rows, int(C)); break;
    case 8: softmax_warp_kernel<T, 8><<<blocks, kThreads, 0, st>>>(x, y, rows, int(C)); break;
    default: softmax_block_kernel<T><<<unsigned(rows), kBlockThreads, 0, st>>>(x, y, C);
  }
  check_launch(what);
}

// ---- backward ----------------------------------------------------------------------

template <class T, int NV>
__global__ void __launch_bounds__(kThreads)
    softmax_backward_warp_kernel(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx,
                                 int64_t rows, int C) {
  constexpr int P = Pack<T>::n;
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int nvec = C / P;
  const Pack<T>* yr = reinterpret_cast<const Pack<T>*>(y + row * C);
  const Pack<T>* gr = reinterpret_cast<const Pack<T>*>(dy + row * C);
  Pack<T> py[NV], pg[NV];
  float dot = 0.f;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int j = lane + 32 * k;
    if (j < nvec) {
      py[k] = yr[j];
      pg[k] = gr[j];
#pragma unroll
      for (int e = 0; e < P; ++e) dot += widen(pg[k].e[e]) * widen(py[k].e[e]);
    }
  }
  dot = warp_sum(dot);
  Pack<T>* dr = reinterpret_cast<Pack<T>*>(dx + row * C);
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int j = lane + 32 * k;
    if (j < nvec) {
      Pack<T> out;
#pragma unroll
      for (int e = 0; e < P; ++e) out.e[e] = narrow<T>(widen(py[k].e[e]) * (widen(pg[k].e[e]) - dot));
      dr[j] = out;
    }
  }
}

template <class T>
__global__ void __launch_bounds__(kBlockThreads)
    softmax_backward_block_kernel(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx,
                                  int64_t C) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const T* yr = y + row * C;
  const T* gr = dy + row * C;
  float dot = 0.f;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) dot += widen(gr[i]) * widen(yr[i]);
  dot = block_sum(dot, scratch);
  T* dr = dx + row * C;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) dr[i] = narrow<T>(widen(yr[i]) * (widen(gr[i]) - dot));
}

template <DType D>
void softmax_backward_kernel(const KernelCall& c) {
  using T = device_t<D>;
  const char* what = D == DType::f32 ? "softmax_backward(f32)" : "softmax_backward(bf16)";
  const T* y = c.in(0).as<const T>();
  const T* dy = c.in(1).as<const T>();
  T* dx = c.out(0).as<T>();
  const int64_t C = c.in(0).shape().last(), rows = c.in(0).shape().rows();
  if (c.in(1).numel() != c.in(0).numel() || c.out(0).numel() != c.in(0).numel())
    throw core::ShapeError("softmax_backward: y, dy and dx must have one shape");
  if (rows <= 0 || C <= 0) return;
  if (rows > INT_MAX) throw core::ShapeError("softmax_backward: too many rows for one launch");
  const cudaStream_t st = stream_of(c);
  const int nv = aligned16(y) && aligned16(dy) && aligned16(dx) ? packs_per_lane<T>(C) : 0;
  const unsigned blocks = unsigned((rows + kWarps - 1) / kWarps);
  switch (nv) {
    case 1: softmax_backward_warp_kernel<T, 1><<<blocks, kThreads, 0, st>>>(y, dy, dx, rows, int(C)); break;
    case 2: softmax_backward_warp_kernel<T, 2><<<blocks, kThreads, 0, st>>>(y, dy, dx, rows, int(C)); break;
    case 4: softmax_backward_warp_kernel<T, 4><<<blocks, kThreads, 0, st>>>(y, dy, dx, rows, int(C)); break;
    case 8: softmax_backward_warp_kernel<T, 8><<<blocks, kThreads, 0, st>>>(y, dy, dx, rows, int(C)); break;
    default: softmax_backward_block_kernel<T><<<unsigned(rows), kBlockThreads, 0, st>>>(y, dy, dx, C);
  }
  check_launch(what);
}

}  // namespace

void register_softmax_kernels(core::KernelRegistry& r) {
  r.add(OpKind::softmax, DType::f32, softmax_kernel<DType::f32>);
  r.add(OpKind::softmax, DType::bf16, softmax_kernel<DType::bf16>);
  r.add(OpKind::softmax_backward, DType::f32, softmax_backward_kernel<DType::f32>);
  r.add(OpKind::softmax_backward, DType::bf16, softmax_backward_kernel<DType::bf16>);
}

}  // namespace brisk::cuda
