// Launchers of the elementwise CUDA kernels (elementwise.cu) for host-compiled
// callers: plain C++ types only (bf16 travels as its uint16_t bits), so
// matmul.cpp can add biases without going through nvcc. They launch on `s`
// and return at once; the caller checks the launch (cudaGetLastError).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace brisk::cuda {

// y[i] = a[i] + b[i % nb] for i < n: b is a's shape, a's trailing dims or a
// single element. y may be a (in place).
void launch_add_f32(const float* a, const float* b, float* y, int64_t n, int64_t nb, cudaStream_t s);
void launch_add_bf16(const uint16_t* a, const uint16_t* b, uint16_t* y, int64_t n, int64_t nb, cudaStream_t s);
// y[i] = a[i] * scale
void launch_scale_f32(const float* a, float* y, float scale, int64_t n, cudaStream_t s);
void launch_scale_bf16(const uint16_t* a, uint16_t* y, float scale, int64_t n, cudaStream_t s);

}  // namespace brisk::cuda
