// Elementwise CUDA kernels: add and mul (b is a's shape, a's trailing dims,
// or a single element, repeating every nb elements) and scale; f32 and bf16,
// the pairs the CPU backend registers.
//
// These ops are bound by memory bandwidth, so each thread moves one 128-bit
// pack per step of a grid-stride loop (4 f32 or 8 bf16 values) whenever every
// pointer is 16-byte aligned and the broadcast period is a whole number of
// packs; otherwise the same kernel runs with one element per pack. The column
// of b is tracked incrementally instead of taking i % nb every step (64-bit
// division is dozens of instructions). bf16 widens to f32, computes and rounds
// to nearest even once, as the reference does.
//
// The launchers in elementwise_kernels.h take plain pointer types so that
// matmul.cpp (host-compiled) can add biases with them.
#include <cstdint>
#include <string>
#include <type_traits>

#include "cuda_util.cuh"
#include "elementwise_kernels.h"

namespace brisk::cuda {
namespace {

using core::DType;
using core::KernelCall;
using core::OpKind;

constexpr int kThreads = 256;

struct AddOp {
  __device__ float operator()(float x, float z) const { return x + z; }
};
struct MulOp {
  __device__ float operator()(float x, float z) const { return x * z; }
};

// y[i] = op(a[i], b[i % nb]). With N > 1 the caller guarantees 16-byte
// aligned pointers and nb == 1, nb == n or nb % N == 0, so a pack of a lines
// up with one pack of b (or one repeated scalar). y may be a (in place): each
// element is read before the same thread writes it.
// TB: b's storage, T's or (add under an f32 a) bf16/f16: its pack is N of
// them, 8 bytes for an f32 pack's bf16 partner.
template <int N, class T, class Op, class TB = T>
__global__ void binary_kernel(const T* a, const TB* b, T* y, int64_t n, int64_t nb, Op op) {
  using P = Pack<T, N>;
  using PB = Pack<TB, N>;
  const int64_t np = n / N;
  const int64_t nbp = nb >= N ? nb / N : 1;  // packs per period of b
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t col = first % nbp;
  const int64_t step = stride % nbp;
  for (int64_t i = first; i < np; i += stride) {
    const P pa = reinterpret_cast<const P*>(a)[i];
    PB pb;
    if (nb == 1) {
      const TB s = b[0];
#pragma unroll
      for (int j = 0; j < N; ++j) pb.v[j] = s;
    } else {
      pb = reinterpret_cast<const PB*>(b)[col];
    }
    P py;
#pragma unroll
    for (int j = 0; j < N; ++j) py.v[j] = narrow<T>(op(widen(pa.v[j]), widen(pb.v[j])));
    reinterpret_cast<P*>(y)[i] = py;
    col += step;
    if (col >= nbp) col -= nbp;
  }
  // The last n % N elements (only when nb == n or nb == 1 with N > 1).
  for (int64_t i = np * N + first; i < n; i += stride) y[i] = narrow<T>(op(widen(a[i]), widen(b[i % nb])));
}

template <int N, class T>
__global__ void scale_kernel(const T* a, T* y, float s, int64_t n) {
  using P = Pack<T, N>;
  const int64_t np = n / N;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t i = first; i < np; i += stride) {
    const P pa = reinterpret_cast<const P*>(a)[i];
    P py;
#pragma unroll
    for (int j = 0; j < N; ++j) py.v[j] = narrow<T>(widen(pa.v[j]) * s);
    reinterpret_cast<P*>(y)[i] = py;
  }
  for (int64_t i = np * N + first; i < n; i += stride) y[i] = narrow<T>(widen(a[i]) * s);
}

template <class T, class Op, class TB = T>
void launch_binary(const T* a, const TB* b, T* y, int64_t n, int64_t nb, cudaStream_t s) {
  if (n <= 0) return;
  constexpr int N = 16 / int(sizeof(T));
  const bool vec = aligned16(a) && aligned16(y) && (nb == 1 || (aligned16(b) && (nb == n || nb % N == 0)));
  if (vec)
    binary_kernel<N, T, Op, TB><<<grid_for((n + N - 1) / N, kThreads), kThreads, 0, s>>>(a, b, y, n, nb, Op{});
  else
    binary_kernel<1, T, Op, TB><<<grid_for(n, kThreads), kThreads, 0, s>>>(a, b, y, n, nb, Op{});
}

template <class T>
void launch_scale(const T* a, T* y, float scale, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  constexpr int N = 16 / int(sizeof(T));
  if (aligned16(a) && aligned16(y))
    scale_kernel<N, T><<<grid_for((n + N - 1) / N, kThreads), kThreads, 0, s>>>(a, y, scale, n);
  else
    scale_kernel<1, T><<<grid_for(n, kThreads), kThreads, 0, s>>>(a, y, scale, n);
}

const bf16_t* as_bf16(const uint16_t* p) { return reinterpret_cast<const bf16_t*>(p); }
bf16_t* as_bf16(uint16_t* p) { return reinterpret_cast<bf16_t*>(p); }

// The shape rule of the reference (b: a's shape or its trailing dims), checked
// again here because a kernel may be run directly, without the graph's infer.
void check_binary(const KernelCall& c, const char* op) {
  const core::Shape &a = c.in(0).shape(), &b = c.in(1).shape();
  bool ok = b.rank() <= a.rank() && c.out(0).numel() == c.in(0).numel();
  for (int i = 1; ok && i <= b.rank(); ++i) ok = a[a.rank() - i] == b[b.rank() - i];
  if (!ok)
    throw core::ShapeError(std::string(op) + ": second operand " + b.str() + " must have the first's shape " +
                           a.str() + " or its trailing dims");
}

template <DType D, class Op>
void binary_op(const KernelCall& c) {
  using T = device_t<D>;
  constexpr bool kMul = std::is_same_v<Op, MulOp>;
  check_binary(c, kMul ? "mul" : "add");
  if (c.in(1).dtype() != D)
    throw core::DTypeError(std::string(kMul ? "mul" : "add") + ": operands must have the same dtype");
  const int64_t n = c.in(0).numel(), nb = c.in(1).numel();
  if (n == 0) return;
  launch_binary<T, Op>(c.in(0).as<const T>(), c.in(1).as<const T>(), c.out(0).as<T>(), n, nb, stream_of(c));
  if constexpr (D == DType::f32) check_launch(kMul ? "mul(f32)" : "add(f32)");
  else check_launch(kMul ? "mul(bf16)" : "add(bf16)");
}

// add with an f32 a: b in f32, or the bf16/f16 branch of mixed precision.
void add_f32(const KernelCall& c) {
  check_binary(c, "add");
  const int64_t n = c.in(0).numel(), nb = c.in(1).numel();
  if (n == 0) return;
  const float* a = c.in(0).as<const float>();
  float* y = c.out(0).as<float>();
  switch (c.in(1).dtype()) {
    case DType::bf16: launch_binary<float, AddOp, bf16_t>(a, c.in(1).as<const bf16_t>(), y, n, nb, stream_of(c)); break;
    case DType::f16: launch_binary<float, AddOp, f16_t>(a, c.in(1).as<const f16_t>(), y, n, nb, stream_of(c)); break;
    case DType::f32: launch_binary<float, AddOp>(a, c.in(1).as<const float>(), y, n, nb, stream_of(c)); break;
    default: throw core::DTypeError("add: an f32 first operand takes an f32, bf16 or f16 second");
  }
  check_launch("add(f32)");
}

template <DType D>
void scale_op(const KernelCall& c) {
  using T = device_t<D>;
  launch_scale<T>(c.in(0).as<const T>(), c.out(0).as<T>(), c.p<core::ScaleParams>().scale, c.in(0).numel(),
                  stream_of(c));
  check_launch(D == DType::f32 ? "scale(f32)" : "scale(bf16)");
}

}  // namespace

void launch_add_f32(const float* a, const float* b, float* y, int64_t n, int64_t nb, cudaStream_t s) {
  launch_binary<float, AddOp>(a, b, y, n, nb, s);
}
void launch_add_bf16(const uint16_t* a, const uint16_t* b, uint16_t* y, int64_t n, int64_t nb, cudaStream_t s) {
  launch_binary<bf16_t, AddOp>(as_bf16(a), as_bf16(b), as_bf16(y), n, nb, s);
}
void launch_scale_f32(const float* a, float* y, float scale, int64_t n, cudaStream_t s) {
  launch_scale<float>(a, y, scale, n, s);
}
void launch_scale_bf16(const uint16_t* a, uint16_t* y, float scale, int64_t n, cudaStream_t s) {
  launch_scale<bf16_t>(as_bf16(a), as_bf16(y), scale, n, s);
}

void register_elementwise_kernels(core::KernelRegistry& r) {
  r.add(OpKind::add, DType::f32, add_f32);
  r.add(OpKind::add, DType::bf16, binary_op<DType::bf16, AddOp>);
  r.add(OpKind::mul, DType::f32, binary_op<DType::f32, MulOp>);
  r.add(OpKind::mul, DType::bf16, binary_op<DType::bf16, MulOp>);
  r.add(OpKind::scale, DType::f32, scale_op<DType::f32>);
  r.add(OpKind::scale, DType::bf16, scale_op<DType::bf16>);
}

}  // namespace brisk::cuda
