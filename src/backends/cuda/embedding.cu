// embedding (rows of a (V, C) table gathered by i32 ids; f32, bf16, f16) and
// embedding_backward (the output gradient's rows summed into a (V, C)
// gradient that is fully overwritten, or added to the f32 accumulator given
// as a third input; f32, bf16) on CUDA, as
// src/ops/embedding.cpp defines them.
//
// The gather is a copy: one warp per id moves the row in the widest unit
// (up to 16 bytes) that the row size and the buffers' alignment allow.
//
// The backward is a scatter-add with colliding rows (frequent tokens), and
// it must give the same bits on every run, so float atomics are out. The ids
// are sorted instead (a stable radix sort of (id, position) pairs, CUB, in
// the backend's scratch), which lists every table row's positions in
// increasing order; a binary search per table row gives where its list
// starts. Then one block per table row writes that row exactly once: the sum
// of its gradient rows in position order (the reference's order) in fp32,
// or zeros. Rows hit by many ids (the long tail of a token distribution) are
// split across the block's warps, whose sums are added in warp order. The
// sort costs a few small launches on 16k ids; writing the (V, C) gradient,
// which the op must do anyway, dominates.
//
// Out-of-range ids are a user error that the reference reports by throwing.
// A device kernel cannot throw: the forward writes zeros for such rows and
// the backward leaves those positions out of every sum.
#include <cub/device/device_radix_sort.cuh>

#include <climits>
#include <cstdint>
#include <string>

#include "cuda_util.cuh"

namespace brisk::cuda {
namespace {

using core::DType;
using core::KernelCall;
using core::OpKind;

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kSliceMin = 16;  // ids per table row from which the block's warps split the row's list

// P elements of T loaded or stored as one unit.
template <class T, int P>
struct alignas(sizeof(T) * P) Vec {
  T e[P];
};

bool aligned(const void* p, size_t bytes) { return (reinterpret_cast<uintptr_t>(p) % bytes) == 0; }

// ---- forward -----------------------------------------------------------------------

// One warp per id; U is the copy unit, row_units units per row.
template <class U>
__global__ void __launch_bounds__(kThreads)
    embedding_kernel(const int32_t* __restrict__ ids, const U* __restrict__ table, U* __restrict__ y, int64_t n,
                     int64_t V, int64_t row_units) {
  const int lane = threadIdx.x & 31;
  const int64_t stride = int64_t(gridDim.x) * kWarps;
  for (int64_t i = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5); i < n; i += stride) {
    const int64_t id = ids[i];
    U* dst = y + i * row_units;
    if (id >= 0 && id < V) {
      const U* src = table + id * row_units;
      for (int64_t k = lane; k < row_units; k += 32) dst[k] = src[k];
    } else {
      for (int64_t k = lane; k < row_units; k += 32) dst[k] = U{};
    }
  }
}

template <class U>
void launch_embedding(const int32_t* ids, const void* table, void* y, int64_t n, int64_t V, int64_t row_bytes,
                      cudaStream_t st) {
  const int64_t blocks = std::min<int64_t>((n + kWarps - 1) / kWarps, int64_t(1) << 20);
  embedding_kernel<U><<<unsigned(blocks), kThreads, 0, st>>>(ids, static_cast<const U*>(table), static_cast<U*>(y),
                                                             n, V, row_bytes / int64_t(sizeof(U)));
}

void embedding_fn(const KernelCall& c) {
  const core::TensorView &ids = c.in(0), &table = c.in(1);
  if (table.shape().rank() != 2 || c.out(0).numel() != ids.numel() * table.shape()[1])
    throw core::ShapeError("embedding: expects a (V, C) table and an output of shape (ids..., C)");
  const int64_t n = ids.numel(), V = table.shape()[0];
  const int64_t row_bytes = table.shape()[1] * int64_t(core::dtype_size(table.dtype()));
  if (n == 0 || row_bytes == 0) return;
  const int32_t* id = ids.as<const int32_t>();
  const void* src = table.data;
  void* dst = c.out(0).data;
  const cudaStream_t st = stream_of(c);
  // The widest unit dividing the row and both buffers' alignment.
  auto fits = [&](size_t u) { return row_bytes % int64_t(u) == 0 && aligned(src, u) && aligned(dst, u); };
  if (fits(16)) launch_embedding<int4>(id, src, dst, n, V, row_bytes, st);
  else if (fits(8)) launch_embedding<uint2>(id, src, dst, n, V, row_bytes, st);
  else if (fits(4)) launch_embedding<uint32_t>(id, src, dst, n, V, row_bytes, st);
  else launch_embedding<uint16_t>(id, src, dst, n, V, row_bytes, st);
  check_launch("embedding");
}

// ---- backward ----------------------------------------------------------------------

// Sort keys: the id, or V (sorted past every real row) when out of range.
__global__ void embedding_keys_kernel(const int32_t* __restrict__ ids, uint32_t* __restrict__ keys,
                                      int32_t* __restrict__ pos, int64_t n, int64_t V) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t id = ids[i];
    keys[i] = id >= 0 && id < V ? uint32_t(id) : uint32_t(V);
    pos[i] = int32_t(i);
  }
}

// start[v] = first k with keys[k] >= v, for v in [0, V]: row v's positions
// are pos[start[v] .. start[v + 1]).
__global__ void embedding_starts_kernel(const uint32_t* __restrict__ keys, int32_t* __restrict__ start, int n,
                                        int64_t V) {
  for (int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v <= V; v += int64_t(gridDim.x) * blockDim.x) {
    int lo = 0, hi = n;
    while (lo < hi) {
      const int mid = lo + (hi - lo) / 2;
      if (int64_t(keys[mid]) < v) lo = mid + 1;
      else hi = mid;
    }
    start[v] = lo;
  }
}

// Row v of the gradient: the sum of dy rows pos[start[v] .. start[v+1]) in
// that order, P elements per unit (P = 1 for the unaligned fallback); with
// `into`, added to the row's current value (one read and one write per
// element, as without).
template <class T, int P>
__global__ void __launch_bounds__(kThreads)
    embedding_backward_rows_kernel(const T* __restrict__ dy, const int32_t* __restrict__ pos,
                                   const int32_t* __restrict__ start, T* __restrict__ out, int64_t C, bool into) {
  using U = Vec<T, P>;
  __shared__ float part[kWarps][32 * P];
  const int64_t v = blockIdx.x;
  const int lo = start[v], hi = start[v + 1];
  const int64_t nvec = C / P;
  const U* g = reinterpret_cast<const U*>(dy);
  U* o = reinterpret_cast<U*>(out + v * C);
  // Summing into an accumulator, a row no id picked keeps its value: no
  // read-back-and-write of it (most of a 50k-row table in a step). The same
  // for every thread of the block, and before any barrier.
  if (into && lo == hi) return;

  if (hi - lo < kSliceMin) {
    // Few ids (most rows have none): every thread owns units and walks the list.
    for (int64_t j = threadIdx.x; j < nvec; j += blockDim.x) {
      float acc[P];
      if (into) {
        const U cur = o[j];
#pragma unroll
        for (int e = 0; e < P; ++e) acc[e] = widen(cur.e[e]);
      } else {
#pragma unroll
        for (int e = 0; e < P; ++e) acc[e] = 0.f;
      }
      for (int k = lo; k < hi; ++k) {
        const U u = g[int64_t(pos[k]) * nvec + j];
#pragma unroll
        for (int e = 0; e < P; ++e) acc[e] += widen(u.e[e]);
      }
      U r;
#pragma unroll
      for (int e = 0; e < P; ++e) r.e[e] = narrow<T>(acc[e]);
      o[j] = r;
    }
    return;
  }

  // Many ids: warp w sums list entries w, w + 8, ... for 32 units at a time;
  // the eight partial sums are then added in warp order.
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  T* orow = out + v * C;
  for (int64_t j0 = 0; j0 < nvec; j0 += 32) {
    const int64_t j = j0 + lane;
    float acc[P];
#pragma unroll
    for (int e = 0; e < P; ++e) acc[e] = 0.f;
    if (j < nvec) {
#pragma unroll 4
      for (int k = lo + warp; k < hi; k += kWarps) {
        const U u = g[int64_t(pos[k]) * nvec + j];
#pragma unroll
        for (int e = 0; e < P; ++e) acc[e] += widen(u.e[e]);
      }
    }
#pragma unroll
    for (int e = 0; e < P; ++e) part[warp][lane * P + e] = acc[e];
    __syncthreads();
    for (int q = threadIdx.x; q < 32 * P; q += blockDim.x) {
      const int64_t col = j0 * P + q;
      if (col < C) {
        float s = into ? widen(orow[col]) : 0.f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) s += part[w][q];
        orow[col] = narrow<T>(s);
      }
    }
    __syncthreads();
  }
}

size_t round_up(size_t b) { return (b + 255) / 256 * 256; }

template <DType D>
void embedding_backward_fn(const KernelCall& c) {
  using T = device_t<D>;
  const char* what = D == DType::f32 ? "embedding_backward(f32)" : "embedding_backward(bf16)";
  const core::TensorView &dy = c.in(0), &ids = c.in(1), &out = c.out(0);
  // With the accumulator (input 2, out's memory; f32 like dy, see the op)
  // the sums are added to it.
  const bool into = c.inputs.size() == 3;
  if (out.shape().rank() != 2 || dy.numel() != ids.numel() * out.shape()[1])
    throw core::ShapeError("embedding_backward: expects dy (ids..., C) and a (V, C) gradient");
  const int64_t n = ids.numel(), V = out.shape()[0], C = out.shape()[1];
  if (V * C == 0) return;
  const cudaStream_t st = stream_of(c);
  if (n == 0) {  // no ids: the gradient is zero (all-zero bits in every float dtype)
    if (into) return;
    check_cuda(cudaMemsetAsync(out.data, 0, size_t(V * C) * sizeof(T), st), what);
    return;
  }
  if (n > INT_MAX || V >= INT_MAX)
    throw core::ShapeError(std::string(what) + ": more ids or embeddings than one launch handles");

  // Scratch: sort keys and positions (in and out), row starts, CUB's own.
  const int end_bit = 32 - __builtin_clz(uint32_t(V));  // keys are in [0, V]
  size_t sort_bytes = 0;
  check_cuda(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, static_cast<const uint32_t*>(nullptr),
                                             static_cast<uint32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                             static_cast<int32_t*>(nullptr), int(n), 0, end_bit, st),
             what);
  const core::ExecContext& ctx = context_of(c);
  char* ws = static_cast<char*>(ctx.blas_workspace);
  const size_t list = round_up(size_t(n) * 4);
  const size_t need = 4 * list + round_up(size_t(V + 1) * 4) + sort_bytes;
  if (!ws || need > ctx.blas_workspace_bytes)
    throw core::BackendError(std::string(what) + ": " + std::to_string(n) + " ids and " + std::to_string(V) +
                             " embeddings need " + std::to_string(need) + " bytes of scratch, the backend has " +
                             std::to_string(ctx.blas_workspace_bytes));
  auto* keys_in = reinterpret_cast<uint32_t*>(ws);
  auto* keys_out = reinterpret_cast<uint32_t*>(ws + list);
  auto* pos_in = reinterpret_cast<int32_t*>(ws + 2 * list);
  auto* pos_out = reinterpret_cast<int32_t*>(ws + 3 * list);
  auto* start = reinterpret_cast<int32_t*>(ws + 4 * list);
  void* sort_tmp = ws + 4 * list + round_up(size_t(V + 1) * 4);

  embedding_keys_kernel<<<grid_for(n), 256, 0, st>>>(ids.as<const int32_t>(), keys_in, pos_in, n, V);
  check_launch(what);
  check_cuda(cub::DeviceRadixSort::SortPairs(sort_tmp, sort_bytes, keys_in, keys_out, pos_in, pos_out, int(n), 0,
                                             end_bit, st),
             what);
  embedding_starts_kernel<<<grid_for(V + 1), 256, 0, st>>>(keys_out, start, int(n), V);
  check_launch(what);

  constexpr int P = 16 / int(sizeof(T));
  const bool vec = C % P == 0 && aligned(dy.data, 16) && aligned(out.data, 16);
  if (vec)
    embedding_backward_rows_kernel<T, P><<<unsigned(V), kThreads, 0, st>>>(dy.as<const T>(), pos_out, start,
                                                                           out.as<T>(), C, into);
  else
    embedding_backward_rows_kernel<T, 1><<<unsigned(V), kThreads, 0, st>>>(dy.as<const T>(), pos_out, start,
                                                                           out.as<T>(), C, into);
  check_launch(what);
}

}  // namespace

void register_embedding_kernels(core::KernelRegistry& r) {
  r.add(OpKind::embedding, DType::f32, embedding_fn);
  r.add(OpKind::embedding, DType::bf16, embedding_fn);
  r.add(OpKind::embedding, DType::f16, embedding_fn);
  r.add(OpKind::embedding_backward, DType::f32, embedding_backward_fn<DType::f32>);
  r.add(OpKind::embedding_backward, DType::bf16, embedding_backward_fn<DType::bf16>);
}

}  // namespace brisk::cuda
