// cast, fill, copy (every dtype), cast_many (float tensors, one launch) and
// accumulate (f32, bf16) on CUDA.
//
// cast is picked by its input dtype, like on the CPU, so each registered
// kernel switches on the destination and launches one instantiation of a
// templated conversion kernel per (from, to) pair. Conversions follow the
// reference's store_from_double exactly: a value is read as a double (exact
// for every source but i64 beyond 2^53, which the reference rounds the same
// way), 16-bit floats take the double rounded to f32 and then to nearest
// even, integers truncate toward zero (through int32 for the narrow integer
// types, as the host's conversion does). Float-to-float pairs skip the double:
// widening a float is exact, so the result is the same bit for bit.
// Each thread converts a pack of 16 bytes of the wider type when both pointers
// are aligned, element by element otherwise.
//
// fill converts its value once on the host (store_from_double, the reference
// conversion) and replicates the element's bytes; all-zero bytes become a
// cudaMemsetAsync. copy is a device-to-device cudaMemcpyAsync. accumulate is
// the elementwise add with the output aliasing dst.
#include <climits>
#include <cstdint>
#include <cstring>
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

bool aligned_to(const void* p, size_t a) { return (reinterpret_cast<uintptr_t>(p) & (a - 1)) == 0; }

// Device storage of every dtype (floats from cuda_util.cuh).
template <DType D> struct Storage { using type = device_t<D>; };
template <> struct Storage<DType::i32> { using type = int32_t; };
template <> struct Storage<DType::i64> { using type = int64_t; };
template <> struct Storage<DType::u16> { using type = uint16_t; };
template <> struct Storage<DType::i8> { using type = int8_t; };
template <> struct Storage<DType::u8> { using type = uint8_t; };
template <DType D> using storage_t = typename Storage<D>::type;

template <class T>
constexpr bool kIsFloat = std::is_same_v<T, float> || std::is_same_v<T, bf16_t> || std::is_same_v<T, f16_t>;

template <class T> __device__ __forceinline__ double to_double(T x) {
  if constexpr (kIsFloat<T>) return double(widen(x));
  else return double(x);  // integers: round to nearest, as the host does
}

template <class To, class From>
__device__ __forceinline__ To convert(From x) {
  if constexpr (std::is_same_v<To, From>) {
    return x;
  } else if constexpr (kIsFloat<From> && kIsFloat<To>) {
    return narrow<To>(widen(x));
  } else if constexpr (kIsFloat<To>) {
    return narrow<To>(float(to_double(x)));  // double -> f32 rounds to nearest, then once more
  } else {
    const double d = to_double(x);
    if constexpr (std::is_same_v<To, int64_t> || std::is_same_v<To, int32_t>) return To(d);
    else return To(int32_t(d));  // u16, i8, u8 keep the low bits of the int32, as x86 does
  }
}

template <int N, class From, class To>
__global__ void cast_kernel(const From* x, To* y, int64_t n) {
  using PF = Pack<From, N>;
  using PT = Pack<To, N>;
  const int64_t np = n / N;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t i = first; i < np; i += stride) {
    const PF px = reinterpret_cast<const PF*>(x)[i];
    PT py;
#pragma unroll
    for (int j = 0; j < N; ++j) py.v[j] = convert<To>(px.v[j]);
    reinterpret_cast<PT*>(y)[i] = py;
  }
  for (int64_t i = np * N + first; i < n; i += stride) y[i] = convert<To>(x[i]);
}

template <class From, class To>
void launch_cast(const KernelCall& c) {
  constexpr size_t kWide = sizeof(From) > sizeof(To) ? sizeof(From) : sizeof(To);
  constexpr int N = int(16 / kWide);
  const From* x = c.in(0).as<const From>();
  To* y = c.out(0).as<To>();
  const int64_t n = c.in(0).numel();
  const cudaStream_t s = stream_of(c);
  if (aligned_to(x, sizeof(From) * N) && aligned_to(y, sizeof(To) * N))
    cast_kernel<N, From, To><<<grid_for((n + N - 1) / N, kThreads), kThreads, 0, s>>>(x, y, n);
  else
    cast_kernel<1, From, To><<<grid_for(n, kThreads), kThreads, 0, s>>>(x, y, n);
  check_launch("cast");
}

template <DType From>
void cast_op(const KernelCall& c) {
  const core::TensorView &x = c.in(0), &y = c.out(0);
  const DType to = c.p<core::CastParams>().to;
  if (y.dtype() != to || y.numel() != x.numel())
    throw core::ShapeError("cast: output " + y.meta.str() + " does not match input " + x.meta.str() + " cast to " +
                           std::string(core::dtype_name(to)));
  if (x.numel() == 0) return;
  if (to == From) {
    if (y.data != x.data)
      check_cuda(cudaMemcpyAsync(y.data, x.data, x.meta.bytes(), cudaMemcpyDeviceToDevice, stream_of(c)),
                 "cast: cudaMemcpyAsync");
    return;
  }
  using F = storage_t<From>;
  switch (to) {
    case DType::f32: return launch_cast<F, storage_t<DType::f32>>(c);
    case DType::bf16: return launch_cast<F, storage_t<DType::bf16>>(c);
    case DType::f16: return launch_cast<F, storage_t<DType::f16>>(c);
    case DType::i32: return launch_cast<F, storage_t<DType::i32>>(c);
    case DType::i64: return launch_cast<F, storage_t<DType::i64>>(c);
    case DType::u16: return launch_cast<F, storage_t<DType::u16>>(c);
    case DType::i8: return launch_cast<F, storage_t<DType::i8>>(c);
    case DType::u8: return launch_cast<F, storage_t<DType::u8>>(c);
  }
}

// ---- cast_many ----------------------------------------------------------------------
// Many float tensors in one launch: each block converts kCastChunk elements
// of one tensor (the batch's block_start says which), so G1's weight casts
// (97 per step, from 768 to 38.6M elements) are two kernels (96 tensors fit
// in one launch's 4 KB of parameters) whose blocks fill the GPU, instead of
// 97 launches, most too small to. Float to float, so each element rounds
// exactly as cast's kernel rounds it.
constexpr int kCastTensors = 96;
constexpr int kCastChunk = 8192;  // elements per block: 32 per thread, as 8 packs of 4

struct CastBatch {
  const void* x[kCastTensors];
  void* y[kCastTensors];
  int64_t n[kCastTensors];
  int32_t block_start[kCastTensors + 1];
  uint8_t from[kCastTensors], to[kCastTensors];  // 0 f32, 1 bf16, 2 f16
  uint8_t vec[kCastTensors];                     // both buffers aligned for packs of 4
  int count;
};
static_assert(sizeof(CastBatch) <= 4000, "kernel parameters are limited to 4 KB");

template <class From, class To>
__device__ void cast_chunk(const void* xv, void* yv, int64_t begin, int64_t end, bool vec) {
  const From* x = static_cast<const From*>(xv);
  To* y = static_cast<To*>(yv);
  int64_t i0 = begin;
  if (vec) {  // begin is a multiple of kCastChunk: the packs stay aligned
    const int64_t nq = (end - begin) / 4;
    for (int64_t q = threadIdx.x; q < nq; q += blockDim.x) {
      const Pack<From, 4> px = reinterpret_cast<const Pack<From, 4>*>(x + begin)[q];
      Pack<To, 4> py;
#pragma unroll
      for (int j = 0; j < 4; ++j) py.v[j] = narrow<To>(widen(px.v[j]));
      reinterpret_cast<Pack<To, 4>*>(y + begin)[q] = py;
    }
    i0 = begin + 4 * nq;
  }
  for (int64_t i = i0 + threadIdx.x; i < end; i += blockDim.x) y[i] = narrow<To>(widen(x[i]));
}

template <class From>
__device__ void cast_chunk_to(int to, const void* x, void* y, int64_t begin, int64_t end, bool vec) {
  switch (to) {
    case 0: cast_chunk<From, float>(x, y, begin, end, vec); break;
    case 1: cast_chunk<From, bf16_t>(x, y, begin, end, vec); break;
    default: cast_chunk<From, f16_t>(x, y, begin, end, vec); break;
  }
}

__global__ void __launch_bounds__(kThreads) cast_many_kernel(const __grid_constant__ CastBatch b) {
  const int t = tensor_of(b.block_start, b.count, int(blockIdx.x));
  const int64_t begin = int64_t(int(blockIdx.x) - b.block_start[t]) * kCastChunk;
  const int64_t end = begin + kCastChunk < b.n[t] ? begin + kCastChunk : b.n[t];
  switch (b.from[t]) {
    case 0: cast_chunk_to<float>(b.to[t], b.x[t], b.y[t], begin, end, b.vec[t]); break;
    case 1: cast_chunk_to<bf16_t>(b.to[t], b.x[t], b.y[t], begin, end, b.vec[t]); break;
    default: cast_chunk_to<f16_t>(b.to[t], b.x[t], b.y[t], begin, end, b.vec[t]); break;
  }
}

void cast_many_op(const KernelCall& c) {
  const DType to = c.p<core::CastParams>().to;
  if (c.inputs.size() != c.outputs.size())
    throw core::ShapeError("cast_many: expects one output per input");
  for (size_t t = 0; t < c.inputs.size(); ++t) {  // all checked before the first launch
    const core::TensorView &x = c.in(int(t)), &y = c.out(int(t));
    float_code(x.dtype(), "cast_many");
    if (y.dtype() != to || y.numel() != x.numel())
      throw core::ShapeError("cast_many: output " + std::to_string(t) + " " + y.meta.str() + " does not match input " +
                             x.meta.str() + " cast to " + std::string(core::dtype_name(to)));
    if ((x.numel() + kCastChunk - 1) / kCastChunk > INT_MAX)
      throw core::ShapeError("cast_many: input " + std::to_string(t) + " is too large for one launch");
  }
  const uint8_t to_code = float_code(to, "cast_many");
  const cudaStream_t st = stream_of(c);
  CastBatch b{};
  auto flush = [&] {
    if (b.count == 0) return;
    cast_many_kernel<<<unsigned(b.block_start[b.count]), kThreads, 0, st>>>(b);
    check_launch("cast_many");
    b = CastBatch{};
  };
  for (size_t t = 0; t < c.inputs.size(); ++t) {
    const core::TensorView &x = c.in(int(t)), &y = c.out(int(t));
    const int64_t n = x.numel();
    if (n == 0) continue;
    const int64_t blocks = (n + kCastChunk - 1) / kCastChunk;
    if (b.count == kCastTensors || int64_t(b.block_start[b.count]) + blocks > INT_MAX) flush();
    const int i = b.count;
    b.x[i] = x.data;
    b.y[i] = y.data;
    b.n[i] = n;
    b.from[i] = float_code(x.dtype(), "cast_many");
    b.to[i] = to_code;
    b.vec[i] = aligned_to(x.data, 4 * core::dtype_size(x.dtype())) && aligned_to(y.data, 4 * core::dtype_size(to));
    b.block_start[i + 1] = b.block_start[i] + int32_t(blocks);
    b.count = i + 1;
  }
  flush();
}

// ---- fill ---------------------------------------------------------------------------
// y holds `bytes` bytes; `pattern` is the element replicated over 16 bytes.
// Whole 16-byte packs first (y is 16-byte aligned), then the tail element by element.
template <class E>
__global__ void fill_kernel(void* y, int64_t bytes, uint4 pattern, E element) {
  const int64_t np = bytes / 16;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  uint4* y16 = static_cast<uint4*>(y);
  for (int64_t i = first; i < np; i += stride) y16[i] = pattern;
  E* ye = static_cast<E*>(y);
  const int64_t n = bytes / int64_t(sizeof(E));
  for (int64_t i = np * int64_t(16 / sizeof(E)) + first; i < n; i += stride) ye[i] = element;
}

// Unaligned fallback: element by element.
template <class E>
__global__ void fill_scalar_kernel(E* y, int64_t n, E element) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) y[i] = element;
}

template <class E>
void launch_fill(void* y, int64_t n, const unsigned char* element_bytes, cudaStream_t s) {
  E e;
  std::memcpy(&e, element_bytes, sizeof(E));
  if (aligned_to(y, 16)) {
    uint4 pattern;
    unsigned char buf[16];
    for (size_t k = 0; k < 16; ++k) buf[k] = element_bytes[k % sizeof(E)];
    std::memcpy(&pattern, buf, 16);
    const int64_t bytes = n * int64_t(sizeof(E));
    fill_kernel<E><<<grid_for(std::max<int64_t>(bytes / 16, 1), kThreads), kThreads, 0, s>>>(y, bytes, pattern, e);
  } else {
    fill_scalar_kernel<E><<<grid_for(n, kThreads), kThreads, 0, s>>>(static_cast<E*>(y), n, e);
  }
}

void fill_op(const KernelCall& c) {
  const core::TensorView& y = c.out(0);
  const auto& fp = c.p<core::FillParams>();
  if (y.dtype() != fp.dtype || y.numel() != fp.shape.numel())
    throw core::ShapeError("fill: output " + y.meta.str() + " is not " + core::TensorMeta{fp.shape, fp.dtype}.str());
  const int64_t n = y.numel();
  if (n == 0) return;
  unsigned char element[8] = {};  // the value converted once, as the dtype's bytes
  core::store_from_double(element, y.dtype(), 0, fp.value);
  const size_t es = core::dtype_size(y.dtype());
  bool zero = true;
  for (size_t k = 0; k < es; ++k) zero = zero && element[k] == 0;
  const cudaStream_t s = stream_of(c);
  if (zero) {
    check_cuda(cudaMemsetAsync(y.data, 0, y.meta.bytes(), s), "fill: cudaMemsetAsync");
    return;
  }
  switch (es) {
    case 1: launch_fill<uint8_t>(y.data, n, element, s); break;
    case 2: launch_fill<uint16_t>(y.data, n, element, s); break;
    case 4: launch_fill<uint32_t>(y.data, n, element, s); break;
    default: launch_fill<uint64_t>(y.data, n, element, s); break;
  }
  check_launch("fill");
}

// ---- copy, accumulate ------------------------------------------------------------------
void copy_op(const KernelCall& c) {
  const core::TensorView &x = c.in(0), &y = c.out(0);
  if (x.meta.bytes() != y.meta.bytes())
    throw core::ShapeError("copy: output " + y.meta.str() + " does not match input " + x.meta.str());
  if (y.data == x.data || x.meta.bytes() == 0) return;
  check_cuda(cudaMemcpyAsync(y.data, x.data, x.meta.bytes(), cudaMemcpyDeviceToDevice, stream_of(c)),
             "copy: cudaMemcpyAsync");
}

template <DType D>
void accumulate_op(const KernelCall& c) {
  const core::TensorView &a = c.in(0), &b = c.in(1), &y = c.out(0);
  if (a.meta != b.meta || y.dtype() != a.dtype() || y.numel() != a.numel())
    throw core::ShapeError("accumulate: dst " + a.meta.str() + " and src " + b.meta.str() +
                           " must have the same shape and dtype");
  const int64_t n = a.numel();
  if (n == 0) return;
  if constexpr (D == DType::f32) {
    launch_add_f32(a.as<const float>(), b.as<const float>(), y.as<float>(), n, n, stream_of(c));
    check_launch("accumulate(f32)");
  } else {
    launch_add_bf16(a.as<const uint16_t>(), b.as<const uint16_t>(), y.as<uint16_t>(), n, n, stream_of(c));
    check_launch("accumulate(bf16)");
  }
}

}  // namespace

void register_memory_ops_kernels(core::KernelRegistry& r) {
  r.add(OpKind::cast, DType::f32, cast_op<DType::f32>);
  r.add(OpKind::cast, DType::bf16, cast_op<DType::bf16>);
  r.add(OpKind::cast, DType::f16, cast_op<DType::f16>);
  r.add(OpKind::cast, DType::i32, cast_op<DType::i32>);
  r.add(OpKind::cast, DType::i64, cast_op<DType::i64>);
  r.add(OpKind::cast, DType::u16, cast_op<DType::u16>);
  r.add(OpKind::cast, DType::i8, cast_op<DType::i8>);
  r.add(OpKind::cast, DType::u8, cast_op<DType::u8>);
  for (int t = 0; t < core::kNumDTypes; ++t) {
    r.add(OpKind::fill, DType(t), fill_op);
    r.add(OpKind::copy, DType(t), copy_op);
  }
  for (DType t : {DType::f32, DType::bf16, DType::f16}) r.add(OpKind::cast_many, t, cast_many_op);
  r.add(OpKind::accumulate, DType::f32, accumulate_op<DType::f32>);
  r.add(OpKind::accumulate, DType::bf16, accumulate_op<DType::bf16>);
}

}  // namespace brisk::cuda
