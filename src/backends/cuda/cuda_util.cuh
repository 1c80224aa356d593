// Device helpers shared by the CUDA kernel files: dtype widening/narrowing
// (bf16 and f16 are storage types, arithmetic is fp32, results round once to
// nearest even, as the reference kernels do), grid sizing, warp and block
// reductions, and the launch check. Kernel files are CUDA C++20 and include
// the engine headers directly; only this backend's library compiles them.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "brisk/core/error.h"
#include "brisk/core/op.h"
#include "cuda_backend.h"

namespace brisk::cuda {

using bf16_t = __nv_bfloat16;
using f16_t = __half;

// Storage type of a brisk dtype on the device.
template <core::DType T> struct DeviceType;
template <> struct DeviceType<core::DType::f32> { using type = float; };
template <> struct DeviceType<core::DType::bf16> { using type = bf16_t; };
template <> struct DeviceType<core::DType::f16> { using type = f16_t; };
template <core::DType T> using device_t = typename DeviceType<T>::type;

__device__ __forceinline__ float widen(float x) { return x; }
__device__ __forceinline__ float widen(bf16_t x) { return __bfloat162float(x); }
__device__ __forceinline__ float widen(f16_t x) { return __half2float(x); }
template <class T> __device__ __forceinline__ T narrow(float x);
template <> __device__ __forceinline__ float narrow<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16_t narrow<bf16_t>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ f16_t narrow<f16_t>(float x) { return __float2half_rn(x); }

// Blocks for a grid-stride loop over n elements: enough to fill any current
// GPU several times over, far below launch limits.
inline unsigned grid_for(int64_t n, int threads = 256) {
  const int64_t blocks = (n + threads - 1) / threads;
  return unsigned(std::min<int64_t>(std::max<int64_t>(blocks, 1), 65536));
}

// N elements of T moved as one aligned vector (128-bit loads and stores when
// sizeof(T) * N == 16); callers check aligned16() and keep a scalar path.
template <class T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};
// Warps per block for a one-warp-per-row kernel with `floats` of shared
// memory per warp (at most 48 KB per block, no opt-in); plain and flash
// attention's row kernels size their blocks with it.
inline int rows_warps(int64_t floats, const char* op) {
  const int64_t per_warp = std::max<int64_t>(floats, 1) * int64_t(sizeof(float));
  const int64_t w = std::min<int64_t>(4, (48 * 1024) / per_warp);
  if (w < 1) throw core::ShapeError(std::string(op) + ": head_dim too large for the CUDA kernels");
  return int(w);
}

// Blocks of `warps` rows each that cover `rows`.
inline unsigned blocks_for(int64_t rows, int warps) { return unsigned((rows + warps - 1) / warps); }

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Device code of a float dtype for the multi-tensor kernels: 0 f32, 1 bf16, 2 f16.
inline uint8_t float_code(core::DType t, const char* op) {
  switch (t) {
    case core::DType::f32: return 0;
    case core::DType::bf16: return 1;
    case core::DType::f16: return 2;
    default: throw core::DTypeError(std::string(op) + ": expects f32, bf16 or f16 tensors, got " +
                                    std::string(core::dtype_name(t)));
  }
}

// Multi-tensor kernels (AdamW, the gradient norm, cast_many): the tensor of
// a batch that block `b` belongs to, the last t with start[t] <= b.
__device__ __forceinline__ int tensor_of(const int32_t* start, int count, int b) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (start[mid] <= b) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every
// thread gets the result. `scratch` holds 32 floats of shared memory.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read from a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : 0.f;
  return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : -INFINITY;
  return warp_max(v);
}

// After a launch: names the op if the launch itself failed (bad config),
// without synchronising (errors inside the kernel surface at the next sync).
inline void check_launch(const char* what) { check_cuda(cudaGetLastError(), what); }

}  // namespace brisk::cuda
