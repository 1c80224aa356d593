// Elementwise CUDA kernels: add (with trailing-dims broadcast of b) and scale,
// f32 and bf16. Memory-bound, so each thread moves one element per step of a
// grid-stride loop; bf16 widens to f32, computes, and rounds to nearest even
// once, matching the reference kernel's single rounding of the result.
//
// Vectorised (128-bit) loads are a later optimisation: they need the
// alignment and size checks that the fallback path here already covers.
#include <cuda_bf16.h>

#include <algorithm>

#include "elementwise_kernels.h"

namespace brisk::cuda {
namespace {

constexpr int kThreads = 256;

// Enough blocks to fill any current GPU several times over; the grid-stride
// loop covers the rest, and the grid size stays far below launch limits.
unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return unsigned(std::min<int64_t>(std::max<int64_t>(blocks, 1), 65536));
}

__device__ inline float widen(float x) { return x; }
__device__ inline float widen(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T> __device__ inline T narrow(float x);
template <> __device__ inline float narrow<float>(float x) { return x; }
template <> __device__ inline __nv_bfloat16 narrow<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

template <class T>
__global__ void add_kernel(const T* a, const T* b, T* y, int64_t n,
                           int64_t nb) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  if (nb == n) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
      y[i] = narrow<T>(widen(a[i]) + widen(b[i]));
  } else {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
      y[i] = narrow<T>(widen(a[i]) + widen(b[i % nb]));
  }
}

template <class T>
__global__ void scale_kernel(const T* a, T* y, float s, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    y[i] = narrow<T>(widen(a[i]) * s);
}

const __nv_bfloat16* as_bf16(const uint16_t* p) { return reinterpret_cast<const __nv_bfloat16*>(p); }
__nv_bfloat16* as_bf16(uint16_t* p) { return reinterpret_cast<__nv_bfloat16*>(p); }

}  // namespace

// on add_kernel is only a hint about a and y when they differ; an
// in-place call (y == a) still reads each element before writing it.
void launch_add_f32(const float* a, const float* b, float* y, int64_t n, int64_t nb, cudaStream_t s) {
  if (n == 0) return;
  add_kernel<float><<<grid_for(n), kThreads, 0, s>>>(a, b, y, n, nb);
}
void launch_add_bf16(const uint16_t* a, const uint16_t* b, uint16_t* y, int64_t n, int64_t nb, cudaStream_t s) {
  if (n == 0) return;
  add_kernel<__nv_bfloat16><<<grid_for(n), kThreads, 0, s>>>(as_bf16(a), as_bf16(b), as_bf16(y), n, nb);
}
void launch_scale_f32(const float* a, float* y, float scale, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  scale_kernel<float><<<grid_for(n), kThreads, 0, s>>>(a, y, scale, n);
}
void launch_scale_bf16(const uint16_t* a, uint16_t* y, float scale, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  scale_kernel<__nv_bfloat16><<<grid_for(n), kThreads, 0, s>>>(as_bf16(a), as_bf16(y), scale, n);
}

}  // namespace brisk::cuda
