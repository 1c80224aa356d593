// gelu and gelu_backward on CUDA (f32, bf16): GPT-2's tanh-approximated GELU.
//
// The arithmetic follows the CPU kernels (gelu_math.h): through the identity
// 1 + tanh(u) = 2 sigmoid(2u),
//   gelu(x) = x s,  s = 1 / (1 + e),  e = exp(-2u),  u = sqrt(2/pi) (x + 0.044715 x^3)
//   d gelu/dx = s (1 + 2 x (e s) sqrt(2/pi) (1 + 3 * 0.044715 x^2))
// which does not cancel for negative x the way 1 + tanh(u) does, and forms
// e s (<= 1) before multiplying by x so the far negative tail cannot overflow
// to inf * 0. exp's argument is capped at 80 so 1 + e stays finite.
// In f32, expf (not __expf) keeps the error near 1 ulp: there the kernels
// are bound by memory bandwidth. A bf16/f16 gelu moves half the bytes per
// element, so its arithmetic (about 25 instructions an element with the IEEE
// exp and division, by count) is about as long as its traffic on an
// H100/H200; it takes __expf and __fdividef, whose few fp32 ulp vanish in
// the 16-bit rounding (G1 on an H200: 0.85 -> 0.71 ms per step, traced).
//
// Each thread moves 128-bit packs (4 f32 or 8 bf16) when the pointers are
// 16-byte aligned, one element at a time otherwise; bf16 computes in f32 and
// rounds once.
//
// matmul_gelu_backward (dy, W, h) -> dh = (dy W) * gelu'(h) is here too: in
// bf16 one cuBLASLt product with the DGELU epilogue, which reads h as
// its "aux" input and applies gelu'(h) to the fp32 accumulator on the way
// out, so the (rows, in) product is never written and read back (the
// reference rounds the product to bf16 first: half an ulp inside gelu').
// f32 does not use it, for the reason linear_gelu.cu gives for GELU_AUX
// (cuBLASLt's GELU is an approximation, not the exact fp32 the default mode
// promises). f32, and any shape cuBLASLt refuses the epilogue for (in not a
// multiple of 8, misaligned buffers), run the product into dh and then
// gelu_backward_kernel over dh in place: the unfused graph's two kernels.
#include <cstdint>

#include "cuda_util.cuh"
#include "gemm.h"

namespace brisk::cuda {
namespace {

using core::DType;
using core::KernelCall;
using core::OpKind;

constexpr int kThreads = 256;
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

__device__ __forceinline__ float gelu_e(float x) {
  const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
  return expf(fminf(-2.f * u, 80.f));
}

__device__ __forceinline__ float gelu_one(float x) { return x / (1.f + gelu_e(x)); }

// The 16-bit forward's arithmetic (header): fast exp and division.
__device__ __forceinline__ float gelu_one_fast(float x) {
  const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
  return __fdividef(x, 1.f + __expf(fminf(-2.f * u, 80.f)));  // 1 + e <= 1 + e^80 < 2^126: no flush to 0
}
template <class T>
__device__ __forceinline__ float gelu_of(float x) {
  if constexpr (sizeof(T) == 2) return gelu_one_fast(x);
  else return gelu_one(x);
}

__device__ __forceinline__ float gelu_grad_one(float x, float dy) {
  const float e = gelu_e(x);
  const float s = 1.f / (1.f + e);
  const float es = e * s;
  return dy * s * (1.f + 2.f * x * es * kSqrt2OverPi * (1.f + 3.f * kCubic * x * x));
}

template <int N, class T>
__global__ void gelu_kernel(const T* x, T* y, int64_t n) {
  using P = Pack<T, N>;
  const int64_t np = n / N;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t i = first; i < np; i += stride) {
    const P px = reinterpret_cast<const P*>(x)[i];
    P py;
#pragma unroll
    for (int j = 0; j < N; ++j) py.v[j] = narrow<T>(gelu_of<T>(widen(px.v[j])));
    reinterpret_cast<P*>(y)[i] = py;
  }
  for (int64_t i = np * N + first; i < n; i += stride) y[i] = narrow<T>(gelu_of<T>(widen(x[i])));
}

template <int N, class T>
__global__ void gelu_backward_kernel(const T* x, const T* dy, T* dx, int64_t n) {
  using P = Pack<T, N>;
  const int64_t np = n / N;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t i = first; i < np; i += stride) {
    const P px = reinterpret_cast<const P*>(x)[i];
    const P pd = reinterpret_cast<const P*>(dy)[i];
    P po;
#pragma unroll
    for (int j = 0; j < N; ++j) po.v[j] = narrow<T>(gelu_grad_one(widen(px.v[j]), widen(pd.v[j])));
    reinterpret_cast<P*>(dx)[i] = po;
  }
  for (int64_t i = np * N + first; i < n; i += stride) dx[i] = narrow<T>(gelu_grad_one(widen(x[i]), widen(dy[i])));
}

template <DType D>
void gelu_op(const KernelCall& c) {
  using T = device_t<D>;
  constexpr int N = 16 / int(sizeof(T));
  const T* x = c.in(0).as<const T>();
  T* y = c.out(0).as<T>();
  const int64_t n = c.in(0).numel();
  if (n == 0) return;
  if (aligned16(x) && aligned16(y))
    gelu_kernel<N, T><<<grid_for((n + N - 1) / N, kThreads), kThreads, 0, stream_of(c)>>>(x, y, n);
  else
    gelu_kernel<1, T><<<grid_for(n, kThreads), kThreads, 0, stream_of(c)>>>(x, y, n);
  check_launch(D == DType::f32 ? "gelu(f32)" : "gelu(bf16)");
}

// dx = gelu'(x) * dy over n elements (dx may be dy), in packs where every
// pointer allows them.
template <class T>
void launch_gelu_backward(const T* x, const T* dy, T* dx, int64_t n, cudaStream_t s) {
  constexpr int N = 16 / int(sizeof(T));
  if (aligned16(x) && aligned16(dy) && aligned16(dx))
    gelu_backward_kernel<N, T><<<grid_for((n + N - 1) / N, kThreads), kThreads, 0, s>>>(x, dy, dx, n);
  else
    gelu_backward_kernel<1, T><<<grid_for(n, kThreads), kThreads, 0, s>>>(x, dy, dx, n);
}

template <DType D>
void gelu_backward_op(const KernelCall& c) {
  using T = device_t<D>;
  if (c.in(0).meta != c.in(1).meta)
    throw core::ShapeError("gelu_backward: x " + c.in(0).meta.str() + " and dy " + c.in(1).meta.str() +
                           " must have the same shape and dtype");
  const T* x = c.in(0).as<const T>();
  const T* dy = c.in(1).as<const T>();
  T* dx = c.out(0).as<T>();
  const int64_t n = c.in(0).numel();
  if (n == 0) return;
  launch_gelu_backward(x, dy, dx, n, stream_of(c));
  check_launch(D == DType::f32 ? "gelu_backward(f32)" : "gelu_backward(bf16)");
}

template <DType D>
void matmul_gelu_backward_op(const KernelCall& c) {
  using T = device_t<D>;
  const core::TensorView &dy = c.in(0), &w = c.in(1), &h = c.in(2), &dh = c.out(0);
  const int64_t out = w.shape()[0], in = w.shape()[1];
  const int64_t rows = in > 0 ? dh.numel() / in : 0;
  if (rows == 0 || in == 0) return;
  GemmArgs g;
  g.dtype = D;
  g.M = rows;  // (rows, out) x (out, in)
  g.N = in;
  g.K = out;
  g.A = dy.data;
  g.B = w.data;
  g.C = dh.data;
  const core::ExecContext& ctx = context_of(c);
  if (D != DType::f32 && out > 0) {
    GemmArgs fused = g;
    fused.epilogue = Epilogue::dgelu;
    fused.aux = h.data;
    if (lt_matmul(fused, ctx)) return;
  }
  run_gemm(g, ctx);
  launch_gelu_backward(h.as<const T>(), dh.as<const T>(), dh.as<T>(), rows * in, stream_of(c));
  check_launch("matmul_gelu_backward(gelu_backward)");
}

}  // namespace

void register_activation_kernels(core::KernelRegistry& r) {
  r.add(OpKind::gelu, DType::f32, gelu_op<DType::f32>);
  r.add(OpKind::gelu, DType::bf16, gelu_op<DType::bf16>);
  r.add(OpKind::gelu_backward, DType::f32, gelu_backward_op<DType::f32>);
  r.add(OpKind::gelu_backward, DType::bf16, gelu_backward_op<DType::bf16>);
  r.add(OpKind::matmul_gelu_backward, DType::f32, matmul_gelu_backward_op<DType::f32>);
  r.add(OpKind::matmul_gelu_backward, DType::bf16, matmul_gelu_backward_op<DType::bf16>);
}

}  // namespace brisk::cuda
