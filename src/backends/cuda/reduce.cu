// sum and mean (f32, bf16, f16) and expand (every dtype) on CUDA.
//
// A reduction over one axis is an (outer, n, inner) problem; over all axes it
// is (1, numel, 1). Accumulation is fp32 and every result is deterministic:
// no atomics, and each partial sum covers a fixed slice that depends only on
// the shape, combined in a fixed order.
//  - inner == 1 (last axis, or everything): short rows get one warp each;
//    long rows are cut into chunks, one block per (row, chunk), whose sums go
//    to fp32 partials in the backend's scratch (ExecContext::blas_workspace)
//    and a second pass, one warp per row, adds them in order. A single long
//    row (all axes) thus spreads over the whole GPU.
//  - inner > 1 (bias gradients: (N, C) summed over N): threads run across
//    columns, 128 bits of consecutive columns each, so every warp reads whole
//    contiguous row segments; the 8 warps of a block take interleaved rows of
//    a row chunk and combine through shared memory in fixed order. Chunks
//    split the rows so that about a thousand blocks run; their partials
//    (chunk, column) are reduced by the same kernel, now over chunks.
// Without scratch (or for small problems) everything runs in one pass.
//
// expand, the adjoint, only moves bytes: each input row (or element) repeats
// n times, copied in the widest unit the sizes and addresses allow.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "brisk/ops/layout.h"
#include "cuda_util.cuh"

namespace brisk::cuda {
namespace {

using core::DType;
using core::KernelCall;
using ops::AxisSplit;
using ops::split_at;
using core::OpKind;
using ops::ReduceParams;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int64_t kTargetBlocks = 1024;  // ~8 resident blocks of 256 threads per H100 SM
constexpr int64_t kMinColChunk = 64;     // rows per column chunk: 8 per warp at least
constexpr int64_t kMinRowChunk = 4096;   // elements per row chunk
constexpr int64_t kWarpRowMax = 1024;    // rows up to this long get one warp



template <class Out>
__device__ __forceinline__ Out narrow_out(float v) { return narrow<Out>(v); }

// ---- rows (inner == 1) -------------------------------------------------------------------
// One warp per row: y[r] = scale * sum(x[r * n .. r * n + n)). V > 1 needs
// n % V == 0 and x 16-byte aligned.
template <int V, class In, class Out>
__global__ void row_warp_kernel(const In* x, Out* y, int64_t rows, int64_t n, float scale) {
  using P = Pack<In, V>;
  const int lane = threadIdx.x & 31;
  const int64_t step = int64_t(gridDim.x) * (blockDim.x >> 5);
  for (int64_t r = int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5); r < rows; r += step) {
    const P* row = reinterpret_cast<const P*>(x + r * n);
    float acc = 0.f;
    for (int64_t p = lane; p < n / V; p += 32) {
      const P v = row[p];
#pragma unroll
      for (int j = 0; j < V; ++j) acc += widen(v.v[j]);
    }
    acc = warp_sum(acc);
    if (lane == 0) y[r] = narrow_out<Out>(acc * scale);
  }
}

// One block per (row, chunk) of `chunk` elements (a multiple of V). With
// `part` the chunk's sum goes to part[row * S + chunk]; without, S is 1 and
// the scaled row sum goes to y.
template <int V, class T>
__global__ void row_block_kernel(const T* x, float* part, T* y, int64_t rows, int64_t n, int64_t S, int64_t chunk,
                                 float scale) {
  using P = Pack<T, V>;
  __shared__ float scratch[32];
  for (int64_t w = blockIdx.x; w < rows * S; w += gridDim.x) {
    const int64_t r = w / S, s = w - r * S;
    const int64_t lo = s * chunk, hi = lo + chunk < n ? lo + chunk : n;
    const P* row = reinterpret_cast<const P*>(x + r * n);
    float acc = 0.f;
#pragma unroll 4
    for (int64_t p = lo / V + threadIdx.x; p < hi / V; p += blockDim.x) {
      const P v = row[p];
#pragma unroll
      for (int j = 0; j < V; ++j) acc += widen(v.v[j]);
    }
    acc = block_sum(acc, scratch);  // starts with a barrier: scratch is free again
    if (threadIdx.x == 0) {
      if (part) part[w] = acc;
      else y[r] = narrow<T>(acc * scale);
    }
  }
}

// ---- columns (inner > 1) ---------------------------------------------------------------
// Work item (o, s, tile): columns [tile * 32V, tile * 32V + 32V) of rows
// [s * chunk, s * chunk + chunk) of slab o. Thread (lane, warp) sums V
// consecutive columns over rows lo + warp, lo + warp + kLanes, ...; the
// block then adds its kLanes row sums in order. With `part` the sums go to
// part[(o * S + s) * inner + col], else scaled to y[o * inner + col] (added
// to y's value with `into`: sum's accumulator).
// V > 1 needs inner % V == 0 and x 16-byte aligned.
template <int V, int kLanes, class In, class Out>
__global__ void col_kernel(const In* x, float* part, Out* y, int64_t outer, int64_t n, int64_t inner, int64_t S,
                           int64_t chunk, float scale, bool into = false) {
  using P = Pack<In, V>;
  constexpr int kCols = 32 * V;
  __shared__ float sm[kLanes][kCols];
  const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
  const int64_t tiles = (inner + kCols - 1) / kCols;
  const int64_t work = outer * S * tiles;
  for (int64_t w = blockIdx.x; w < work; w += gridDim.x) {
    const int64_t os = w / tiles, tile = w - os * tiles;  // os = o * S + s
    const int64_t o = os / S, s = os - o * S;
    const int64_t c0 = tile * kCols + tx * V;
    const int64_t lo = s * chunk, hi = lo + chunk < n ? lo + chunk : n;
    float acc[V];
#pragma unroll
    for (int j = 0; j < V; ++j) acc[j] = 0.f;
    if (c0 < inner) {
      const In* base = x + o * n * inner + c0;
#pragma unroll 4
      for (int64_t k = lo + ty; k < hi; k += kLanes) {
        const P v = *reinterpret_cast<const P*>(base + k * inner);
#pragma unroll
        for (int j = 0; j < V; ++j) acc[j] += widen(v.v[j]);
      }
    }
#pragma unroll
    for (int j = 0; j < V; ++j) sm[ty][tx * V + j] = acc[j];
    __syncthreads();
    for (int cc = threadIdx.x; cc < kCols; cc += blockDim.x) {
      const int64_t col = tile * kCols + cc;
      if (col < inner) {
        float v = 0.f;
#pragma unroll
        for (int r = 0; r < kLanes; ++r) v += sm[r][cc];
        if (part) part[os * inner + col] = v;
        else y[o * inner + col] = narrow_out<Out>((into ? widen(y[o * inner + col]) : 0.f) + v * scale);
      }
    }
    __syncthreads();  // sm is rewritten by the next work item
  }
}

template <class T>
__global__ void fill_value_kernel(T* y, int64_t n, float v) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) y[i] = narrow<T>(v);
}

unsigned blocks_for(int64_t work) { return unsigned(std::clamp<int64_t>(work, 1, int64_t(1) << 20)); }

// Scratch for partial sums: the backend's BLAS workspace (stream-ordered, and
// free again once this op's last kernel has read it).
float* scratch_of(const KernelCall& c, int64_t floats) {
  const core::ExecContext& ctx = context_of(c);
  if (!ctx.blas_workspace || int64_t(ctx.blas_workspace_bytes) < floats * int64_t(sizeof(float))) return nullptr;
  return static_cast<float*>(ctx.blas_workspace);
}

template <int V, class T>
void reduce_rows(const KernelCall& c, const T* x, T* y, int64_t rows, int64_t n, float scale) {
  const cudaStream_t st = stream_of(c);
  if (n <= kWarpRowMax) {
    row_warp_kernel<V, T, T><<<blocks_for((rows + kWarps - 1) / kWarps), kThreads, 0, st>>>(x, y, rows, n, scale);
    return;
  }
  int64_t S = std::clamp<int64_t>((kTargetBlocks + rows - 1) / rows, 1, (n + kMinRowChunk - 1) / kMinRowChunk);
  const int64_t ws_floats = int64_t(context_of(c).blas_workspace_bytes / sizeof(float));
  S = std::min<int64_t>(S, std::max<int64_t>(ws_floats / rows, 1));
  int64_t chunk = (n + S - 1) / S;
  chunk = (chunk + V - 1) / V * V;
  S = (n + chunk - 1) / chunk;
  float* part = S > 1 ? scratch_of(c, rows * S) : nullptr;
  if (!part) {
    row_block_kernel<V, T><<<blocks_for(rows), kThreads, 0, st>>>(x, nullptr, y, rows, n, 1, n, scale);
    return;
  }
  row_block_kernel<V, T><<<blocks_for(rows * S), kThreads, 0, st>>>(x, part, nullptr, rows, n, S, chunk, scale);
  row_warp_kernel<1, float, T><<<blocks_for((rows + kWarps - 1) / kWarps), kThreads, 0, st>>>(part, y, rows, S,
                                                                                             scale);
}

template <int V, class T, class Out>
void reduce_cols(const KernelCall& c, const T* x, Out* y, const AxisSplit& a, float scale, bool into) {
  const cudaStream_t st = stream_of(c);
  constexpr int64_t kCols = 32 * V;
  const int64_t tiles = (a.inner + kCols - 1) / kCols;
  const int64_t items = a.outer * tiles;
  int64_t S = std::clamp<int64_t>((kTargetBlocks + items - 1) / items, 1, (a.n + kMinColChunk - 1) / kMinColChunk);
  const int64_t ws_floats = int64_t(context_of(c).blas_workspace_bytes / sizeof(float));
  S = std::min<int64_t>(S, std::max<int64_t>(ws_floats / (a.outer * a.inner), 1));
  const int64_t chunk = (a.n + S - 1) / S;
  S = (a.n + chunk - 1) / chunk;
  float* part = S > 1 ? scratch_of(c, a.outer * S * a.inner) : nullptr;
  if (!part) {
    col_kernel<V, kWarps, T, Out><<<blocks_for(items), kThreads, 0, st>>>(x, nullptr, y, a.outer, a.n, a.inner, 1,
                                                                          a.n, scale, into);
    return;
  }
  col_kernel<V, kWarps, T, Out><<<blocks_for(items * S), kThreads, 0, st>>>(x, part, nullptr, a.outer, a.n, a.inner, S,
                                                                            chunk, scale);
  // Second pass: the (outer, S, inner) partials summed over S, 32 columns and
  // 32 chunk lanes per block (few blocks, so more lanes hide the latency).
  col_kernel<1, 32, float, Out><<<blocks_for(a.outer * ((a.inner + 31) / 32)), 1024, 0, st>>>(
      part, nullptr, y, a.outer, S, a.inner, 1, S, scale, into);
}

template <DType D, bool kMean>
void reduce_op(const KernelCall& c) {
  using T = device_t<D>;
  const char* name = kMean ? "mean" : "sum";
  const auto& rp = c.p<ReduceParams>();
  if (rp.axis != ReduceParams::kAllAxes && (rp.axis < -c.in(0).shape().rank() || rp.axis >= c.in(0).shape().rank()))
    throw core::ShapeError(std::string(name) + ": axis " + std::to_string(rp.axis) + " is out of range for " +
                           c.in(0).meta.str());
  const AxisSplit a = split_at(c.in(0).shape(), rp.axis);
  if (c.out(0).numel() != a.outer * a.inner)
    throw core::ShapeError(std::string(name) + ": output " + c.out(0).meta.str() + " does not fit input " +
                           c.in(0).meta.str() + " reduced over axis " + std::to_string(rp.axis));
  const T* x = c.in(0).as<const T>();
  const int64_t m = a.outer * a.inner;
  if (m == 0) return;
  constexpr int V = 16 / int(sizeof(T));
  if (c.inputs.size() == 2) {  // sum's f32 accumulator (input 1, the output's memory; x (rows, C >= 2), axis 0)
    if (a.n == 0 || a.inner < 2) return;
    float* acc = c.out(0).as<float>();
    if (a.inner % V == 0 && aligned16(x)) reduce_cols<V, T, float>(c, x, acc, a, 1.f, true);
    else reduce_cols<1, T, float>(c, x, acc, a, 1.f, true);
    check_launch(name);
    return;
  }
  T* y = c.out(0).as<T>();
  if (a.n == 0) {  // an empty sum: 0; an empty mean: 0 / 0, as the reference
    fill_value_kernel<T><<<grid_for(m), kThreads, 0, stream_of(c)>>>(y, m, kMean ? NAN : 0.f);
    check_launch(name);
    return;
  }
  const float scale = kMean ? float(1.0 / double(a.n)) : 1.f;
  if (a.inner == 1) {
    if (a.n % V == 0 && aligned16(x)) reduce_rows<V, T>(c, x, y, a.outer, a.n, scale);
    else reduce_rows<1, T>(c, x, y, a.outer, a.n, scale);
  } else {
    if (a.inner % V == 0 && aligned16(x)) reduce_cols<V, T, T>(c, x, y, a, scale, false);
    else reduce_cols<1, T, T>(c, x, y, a, scale, false);
  }
  check_launch(name);
}

// ---- expand ---------------------------------------------------------------------------------
template <int W> struct UnitOf;
template <> struct UnitOf<1> { using type = uint8_t; };
template <> struct UnitOf<2> { using type = uint16_t; };
template <> struct UnitOf<4> { using type = uint32_t; };
template <> struct UnitOf<8> { using type = uint2; };
template <> struct UnitOf<16> { using type = uint4; };

// inner == 1: y[o * n + k] = x[o], stored V copies at a time (V > 1 needs
// n % V == 0 and y 16-byte aligned).
template <int V, class E>
__global__ void expand_repeat_kernel(const E* x, E* y, int64_t outer, int64_t n) {
  using P = Pack<E, V>;
  const int64_t rstep = int64_t(gridDim.y) * blockDim.y, cstep = int64_t(gridDim.x) * blockDim.x;
  const int64_t np = n / V;
  for (int64_t o = int64_t(blockIdx.y) * blockDim.y + threadIdx.y; o < outer; o += rstep) {
    P v;
#pragma unroll
    for (int j = 0; j < V; ++j) v.v[j] = x[o];
    P* row = reinterpret_cast<P*>(y + o * n);
    for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < np; k += cstep) row[k] = v;
  }
}

// inner > 1: output row r (of `width` units) is input row r / n.
template <class U>
__global__ void expand_rows_kernel(const U* x, U* y, int64_t rows, int64_t n, int64_t width) {
  const int64_t rstep = int64_t(gridDim.y) * blockDim.y, cstep = int64_t(gridDim.x) * blockDim.x;
  for (int64_t r = int64_t(blockIdx.y) * blockDim.y + threadIdx.y; r < rows; r += rstep) {
    const U* src = x + (r / n) * width;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < width; i += cstep) y[r * width + i] = src[i];
  }
}

// Threads across a row of `width` items, the rest of the block across rows.
void grid_2d(int64_t width, int64_t rows, dim3& grid, dim3& block) {
  const int bx = int(std::min<int64_t>(kThreads, (width + 31) / 32 * 32));
  const int by = kThreads / bx;
  block = dim3{unsigned(bx), unsigned(by), 1u};
  grid = dim3{unsigned(std::clamp<int64_t>((width + bx - 1) / bx, 1, 65535)),
              unsigned(std::clamp<int64_t>((rows + by - 1) / by, 1, 65535)), 1u};
}

template <class E>
void launch_expand_repeat(const KernelCall& c, int64_t outer, int64_t n) {
  constexpr int V = 16 / int(sizeof(E));
  const E* x = c.in(0).as<const E>();
  E* y = c.out(0).as<E>();
  dim3 grid, block;
  if (n % V == 0 && aligned16(y)) {
    grid_2d(n / V, outer, grid, block);
    expand_repeat_kernel<V, E><<<grid, block, 0, stream_of(c)>>>(x, y, outer, n);
  } else {
    grid_2d(n, outer, grid, block);
    expand_repeat_kernel<1, E><<<grid, block, 0, stream_of(c)>>>(x, y, outer, n);
  }
}

template <int W>
void launch_expand_rows(const KernelCall& c, int64_t rows, int64_t n, int64_t row_bytes) {
  using U = typename UnitOf<W>::type;
  dim3 grid, block;
  grid_2d(row_bytes / W, rows, grid, block);
  expand_rows_kernel<U><<<grid, block, 0, stream_of(c)>>>(c.in(0).as<const U>(), c.out(0).as<U>(), rows, n,
                                                          row_bytes / W);
}

void expand_op(const KernelCall& c) {
  const auto& ep = c.p<ops::ExpandParams>();
  if (ep.axis != ReduceParams::kAllAxes && (ep.axis < -ep.shape.rank() || ep.axis >= ep.shape.rank()))
    throw core::ShapeError("expand: axis " + std::to_string(ep.axis) + " is out of range for " + ep.shape.str());
  const AxisSplit a = split_at(ep.shape, ep.axis);
  if (c.in(0).numel() != a.outer * a.inner || c.out(0).numel() != ep.shape.numel() ||
      c.in(0).dtype() != c.out(0).dtype())
    throw core::ShapeError("expand: input " + c.in(0).meta.str() + " does not expand to " + c.out(0).meta.str() +
                           " along axis " + std::to_string(ep.axis));
  if (c.out(0).numel() == 0) return;
  const int64_t es = int64_t(core::dtype_size(c.in(0).dtype()));
  if (a.inner == 1) {
    switch (es) {
      case 1: launch_expand_repeat<uint8_t>(c, a.outer, a.n); break;
      case 2: launch_expand_repeat<uint16_t>(c, a.outer, a.n); break;
      case 4: launch_expand_repeat<uint32_t>(c, a.outer, a.n); break;
      default: launch_expand_repeat<uint64_t>(c, a.outer, a.n); break;
    }
  } else {
    const int64_t row_bytes = a.inner * es;
    const uint64_t bits = 16 | uint64_t(row_bytes) | reinterpret_cast<uintptr_t>(c.in(0).data) |
                          reinterpret_cast<uintptr_t>(c.out(0).data);
    const int64_t rows = a.outer * a.n;
    switch (int(bits & (~bits + 1))) {
      case 16: launch_expand_rows<16>(c, rows, a.n, row_bytes); break;
      case 8: launch_expand_rows<8>(c, rows, a.n, row_bytes); break;
      case 4: launch_expand_rows<4>(c, rows, a.n, row_bytes); break;
      case 2: launch_expand_rows<2>(c, rows, a.n, row_bytes); break;
      default: launch_expand_rows<1>(c, rows, a.n, row_bytes); break;
    }
  }
  check_launch("expand");
}

}  // namespace

void sum_kernel(const KernelCall& c) {
  switch (c.in(0).dtype()) {
    case DType::f32: return reduce_op<DType::f32, false>(c);
    case DType::bf16: return reduce_op<DType::bf16, false>(c);
    case DType::f16: return reduce_op<DType::f16, false>(c);
    default: throw core::DTypeError("cuda: sum: no kernel for " + c.in(0).meta.str());
  }
}

void register_reduce_kernels(core::KernelRegistry& r) {
  r.add(OpKind::sum, DType::f32, reduce_op<DType::f32, false>);
  r.add(OpKind::sum, DType::bf16, reduce_op<DType::bf16, false>);
  r.add(OpKind::sum, DType::f16, reduce_op<DType::f16, false>);
  r.add(OpKind::mean, DType::f32, reduce_op<DType::f32, true>);
  r.add(OpKind::mean, DType::bf16, reduce_op<DType::bf16, true>);
  r.add(OpKind::mean, DType::f16, reduce_op<DType::f16, true>);
  for (int t = 0; t < core::kNumDTypes; ++t) r.add(OpKind::expand, DType(t), expand_op);
}

}  // namespace brisk::cuda
