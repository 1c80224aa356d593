// reshape, permute, split and concat on CUDA, for every dtype.
//
// These ops only move bytes, so kernels work on unsigned "units" of 1 to 16
// bytes: the widest power of two that divides every row length, pitch and
// base address involved, so the common cases move 128 bits per thread.
//
// reshape is a view: the output is the input's memory and nothing happens,
// unless a caller gave it memory of its own (the op harness), which gets a
// copy. split and concat are strided 2-D copies, one launch per piece: the
// joined tensor is `outer` rows in which the pieces sit side by side.
//
// permute first simplifies the permutation as the CPU kernel does (size-1
// axes dropped, output axes that are adjacent and in order in the input
// merged). Then:
//  - when the input's innermost axis stays innermost ((B, T, H, D) ->
//    (B, H, T, D)), every output row is a contiguous input run: a gather of
//    units, each thread unravelling its output index with multiply-shift
//    division by the (run-time constant) axis sizes;
//  - otherwise the innermost axis moves: a 32 x 32 shared-memory tile
//    transpose between the input's innermost axis and the output's, batched
//    over the remaining axes, so both reads and writes are coalesced.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "brisk/ops/layout.h"
#include "cuda_util.cuh"

namespace brisk::cuda {
namespace {

using core::DType;
using core::KernelCall;
using ops::PermPlan;
using ops::plan_permute;
using core::OpKind;
using core::kMaxRank;

constexpr int kThreads = 256;

char* bytes_of(const core::TensorView& t) { return static_cast<char*>(t.data); }

// Unsigned type of a unit of W bytes.
template <int W> struct UnitOf;
template <> struct UnitOf<1> { using type = uint8_t; };
template <> struct UnitOf<2> { using type = uint16_t; };
template <> struct UnitOf<4> { using type = uint32_t; };
template <> struct UnitOf<8> { using type = uint2; };
template <> struct UnitOf<16> { using type = uint4; };

// The widest unit (16 bytes at most) dividing every value in `vals`.
int unit_bytes(std::initializer_list<uint64_t> vals) {
  uint64_t bits = 16;
  for (uint64_t v : vals) bits |= v;
  return int(bits & (~bits + 1));  // lowest set bit
}

// ---- strided 2-D copy: split, concat ---------------------------------------------------
template <class U>
__global__ void copy2d_kernel(U* dst, int64_t dpitch, const U* src, int64_t spitch, int64_t width, int64_t rows) {
  const int64_t rstep = int64_t(gridDim.y) * blockDim.y, cstep = int64_t(gridDim.x) * blockDim.x;
  for (int64_t r = int64_t(blockIdx.y) * blockDim.y + threadIdx.y; r < rows; r += rstep)
    for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < width; c += cstep)
      dst[r * dpitch + c] = src[r * spitch + c];
}

template <int W>
void launch_copy2d(char* dst, int64_t dpitch, const char* src, int64_t spitch, int64_t width, int64_t rows,
                   cudaStream_t s) {
  using U = typename UnitOf<W>::type;
  const int64_t w = width / W;
  const int bx = int(std::min<int64_t>(kThreads, (w + 31) / 32 * 32));
  const int by = kThreads / bx;
  const dim3 block{unsigned(bx), unsigned(by), 1u};
  const dim3 grid{unsigned(std::min<int64_t>((w + bx - 1) / bx, 65535)),
                  unsigned(std::min<int64_t>((rows + by - 1) / by, 65535)), 1u};
  copy2d_kernel<U><<<grid, block, 0, s>>>(reinterpret_cast<U*>(dst), dpitch / W, reinterpret_cast<const U*>(src),
                                          spitch / W, w, rows);
}

// rows x width bytes from src (row pitch spitch) to dst (row pitch dpitch).
void copy2d(char* dst, int64_t dpitch, const char* src, int64_t spitch, int64_t width, int64_t rows,
            cudaStream_t s, const char* what) {
  if (width <= 0 || rows <= 0) return;
  if (rows == 1 || (dpitch == width && spitch == width)) {
    check_cuda(cudaMemcpyAsync(dst, src, size_t(width * rows), cudaMemcpyDeviceToDevice, s), what);
    return;
  }
  switch (unit_bytes({uint64_t(width), uint64_t(dpitch), uint64_t(spitch), reinterpret_cast<uintptr_t>(dst),
                      reinterpret_cast<uintptr_t>(src)})) {
    case 16: launch_copy2d<16>(dst, dpitch, src, spitch, width, rows, s); break;
    case 8: launch_copy2d<8>(dst, dpitch, src, spitch, width, rows, s); break;
    case 4: launch_copy2d<4>(dst, dpitch, src, spitch, width, rows, s); break;
    case 2: launch_copy2d<2>(dst, dpitch, src, spitch, width, rows, s); break;
    default: launch_copy2d<1>(dst, dpitch, src, spitch, width, rows, s); break;
  }
  check_launch(what);
}

// kSplit copies the joined tensor into the pieces; otherwise the pieces into it.
template <bool kSplit>
void split_concat(const core::TensorView& joined, std::span<const core::TensorView> pieces, int axis_param,
                  cudaStream_t s) {
  const char* op = kSplit ? "split" : "concat";
  const core::Shape& js = joined.shape();
  const int axis = js.normalize_axis(axis_param);
  const int64_t es = int64_t(core::dtype_size(joined.dtype()));
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < axis; ++i) outer *= js[i];
  for (int i = axis + 1; i < js.rank(); ++i) inner *= js[i];
  int64_t along = 0;
  for (const core::TensorView& p : pieces) {
    bool ok = p.dtype() == joined.dtype() && p.shape().rank() == js.rank();
    for (int i = 0; ok && i < js.rank(); ++i) ok = i == axis || p.shape()[i] == js[i];
    if (!ok)
      throw core::ShapeError(std::string(op) + ": piece " + p.meta.str() + " does not fit " + joined.meta.str() +
                             " along axis " + std::to_string(axis));
    along += p.shape()[axis];
  }
  if (along != js[axis])
    throw core::ShapeError(std::string(op) + ": pieces add up to " + std::to_string(along) + " along axis " +
                           std::to_string(axis) + ", not " + std::to_string(js[axis]));
  const int64_t joined_row = js[axis] * inner * es;
  int64_t offset = 0;
  for (const core::TensorView& p : pieces) {
    const int64_t width = p.shape()[axis] * inner * es;
    if constexpr (kSplit)
      copy2d(bytes_of(p), width, bytes_of(joined) + offset, joined_row, width, outer, s, "split");
    else
      copy2d(bytes_of(joined) + offset, joined_row, bytes_of(p), width, width, outer, s, "concat");
    offset += width;
  }
}

void split_op(const KernelCall& c) {
  split_concat<true>(c.in(0), c.outputs, c.p<ops::SplitParams>().axis, stream_of(c));
}
void concat_op(const KernelCall& c) {
  split_concat<false>(c.out(0), c.inputs, c.p<ops::ConcatParams>().axis, stream_of(c));
}

void reshape_op(const KernelCall& c) {
  if (c.out(0).meta.bytes() != c.in(0).meta.bytes())
    throw core::ShapeError("reshape: output " + c.out(0).meta.str() + " does not hold input " + c.in(0).meta.str());
  if (c.out(0).data == c.in(0).data || c.in(0).meta.bytes() == 0) return;
  check_cuda(cudaMemcpyAsync(c.out(0).data, c.in(0).data, c.in(0).meta.bytes(), cudaMemcpyDeviceToDevice,
                             stream_of(c)),
             "reshape: cudaMemcpyAsync");
}

// ---- permute -----------------------------------------------------------------------------

// n / d for n < 2^31 by a multiply and a shift (Granlund & Montgomery):
// mul = ceil(2^(31 + l) / d) with l = ceil(log2 d) fits 32 bits and is exact
// for every 31-bit n.
struct FastDiv {
  uint32_t d = 1, mul = 0, shr = 0;
  FastDiv() = default;
  explicit FastDiv(uint32_t divisor) : d(divisor) {
    if (d <= 1) return;
    int l = 0;
    while ((uint64_t(1) << l) < d) ++l;
    mul = uint32_t(((uint64_t(1) << (31 + l)) + d - 1) / d);
    shr = uint32_t(l - 1);
  }
  __device__ __forceinline__ uint32_t div(uint32_t n) const { return d == 1 ? n : __umulhi(n, mul) >> shr; }
};

// Axes innermost first: output index t unravels over size[], the source is
// the dot product of the digits with stride[] (all in units).
struct GatherArgs {
  int rank = 0;
  int64_t size[kMaxRank] = {};
  int64_t stride[kMaxRank] = {};
  FastDiv fdiv[kMaxRank];
};

// Narrow indices when every unit index fits 31 bits (all real tensors).
template <class U, bool kNarrow>
__global__ void permute_gather_kernel(const U* __restrict__ x, U* __restrict__ y, int64_t total, GatherArgs a) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += step) {
    int64_t src = 0;
    if constexpr (kNarrow) {
      uint32_t rem = uint32_t(t), off = 0;
#pragma unroll
      for (int i = 0; i < kMaxRank; ++i) {
        if (i < a.rank) {
          const uint32_t q = a.fdiv[i].div(rem);
          off += (rem - q * a.fdiv[i].d) * uint32_t(a.stride[i]);
          rem = q;
        }
      }
      src = off;
    } else {
      int64_t rem = t;
      for (int i = 0; i < a.rank; ++i) {
        const int64_t q = rem / a.size[i];
        src += (rem - q * a.size[i]) * a.stride[i];
        rem = q;
      }
    }
    y[t] = x[src];
  }
}

template <int W>
void launch_gather(const KernelCall& c, const PermPlan& p, int es) {
  using U = typename UnitOf<W>::type;
  const int per = W / es;  // elements per unit along the innermost axis
  GatherArgs a;
  a.rank = p.rank;
  for (int i = 0; i < p.rank; ++i) {
    const int o = p.rank - 1 - i;  // output axis, innermost first
    a.size[i] = i == 0 ? p.size[o] / per : p.size[o];
    a.stride[i] = i == 0 ? 1 : p.stride[o] / per;
  }
  const int64_t total = c.out(0).numel() / per;
  const bool narrow_idx = total < (int64_t(1) << 31);
  if (narrow_idx)
    for (int i = 0; i < a.rank; ++i) a.fdiv[i] = FastDiv(uint32_t(a.size[i]));
  const U* x = c.in(0).as<const U>();
  U* y = c.out(0).as<U>();
  const unsigned grid = grid_for(total, kThreads);
  if (narrow_idx) permute_gather_kernel<U, true><<<grid, kThreads, 0, stream_of(c)>>>(x, y, total, a);
  else permute_gather_kernel<U, false><<<grid, kThreads, 0, stream_of(c)>>>(x, y, total, a);
}

constexpr int kTile = 32, kTileRows = 8;

// Output axis k is the input's innermost (stride 1); output axis L (the last)
// has input stride in_stride_l. Batch axes are listed innermost first.
struct TransposeArgs {
  int64_t sk = 1, sl = 1, in_stride_l = 1, out_stride_k = 1;
  int64_t tiles_l = 1, tiles = 1, work = 0;
  int nb = 0;
  int64_t bsize[kMaxRank] = {}, bin[kMaxRank] = {}, bout[kMaxRank] = {};
};

template <class E>
__global__ void permute_transpose_kernel(const E* __restrict__ x, E* __restrict__ y, TransposeArgs a) {
  __shared__ E tile[kTile][kTile + 1];  // [l][k]; the pad spreads columns over banks
  const int tx = threadIdx.x, ty = threadIdx.y;
  for (int64_t w = blockIdx.x; w < a.work; w += gridDim.x) {
    const int64_t b = w / a.tiles, t = w - b * a.tiles;
    const int64_t l0 = (t % a.tiles_l) * kTile, k0 = (t / a.tiles_l) * kTile;
    int64_t in_base = 0, out_base = 0, rem = b;
    for (int i = 0; i < a.nb; ++i) {
      const int64_t q = rem / a.bsize[i], r = rem - q * a.bsize[i];
      in_base += r * a.bin[i];
      out_base += r * a.bout[i];
      rem = q;
    }
    const int64_t k = k0 + tx;  // reads run along the input's contiguous axis
    for (int j = ty; j < kTile; j += kTileRows) {
      const int64_t l = l0 + j;
      if (k < a.sk && l < a.sl) tile[j][tx] = x[in_base + k + l * a.in_stride_l];
    }
    __syncthreads();
    const int64_t l = l0 + tx;  // writes run along the output's contiguous axis
    for (int j = ty; j < kTile; j += kTileRows) {
      const int64_t kk = k0 + j;
      if (kk < a.sk && l < a.sl) y[out_base + kk * a.out_stride_k + l] = tile[tx][j];
    }
    __syncthreads();  // the tile is rewritten by the next work item
  }
}

template <class E>
void launch_transpose(const KernelCall& c, const PermPlan& p) {
  const int r = p.rank, L = r - 1;
  int k = -1;
  for (int i = 0; i < r; ++i)
    if (p.stride[i] == 1) k = i;
  int64_t ostride[kMaxRank];
  ostride[r - 1] = 1;
  for (int i = r - 2; i >= 0; --i) ostride[i] = ostride[i + 1] * p.size[i + 1];
  TransposeArgs a;
  a.sk = p.size[k];
  a.sl = p.size[L];
  a.in_stride_l = p.stride[L];
  a.out_stride_k = ostride[k];
  a.tiles_l = (a.sl + kTile - 1) / kTile;
  a.tiles = a.tiles_l * ((a.sk + kTile - 1) / kTile);
  int64_t batches = 1;
  for (int i = r - 1; i >= 0; --i) {
    if (i == k || i == L) continue;
    a.bsize[a.nb] = p.size[i];
    a.bin[a.nb] = p.stride[i];
    a.bout[a.nb] = ostride[i];
    ++a.nb;
    batches *= p.size[i];
  }
  a.work = batches * a.tiles;
  const unsigned grid = unsigned(std::min<int64_t>(a.work, int64_t(1) << 20));
  permute_transpose_kernel<E><<<grid, dim3(kTile, kTileRows), 0, stream_of(c)>>>(c.in(0).as<const E>(),
                                                                                 c.out(0).as<E>(), a);
}

void permute_op(const KernelCall& c) {
  const core::Shape& xs = c.in(0).shape();
  const core::Shape& dims = c.p<ops::PermuteParams>().dims;
  if (dims.rank() != xs.rank() || c.out(0).numel() != c.in(0).numel() || c.out(0).dtype() != c.in(0).dtype())
    throw core::ShapeError("permute: dims " + dims.str() + " do not permute input " + c.in(0).meta.str() +
                           " into output " + c.out(0).meta.str());
  const int64_t n = c.in(0).numel();
  if (n == 0) return;
  const PermPlan p = plan_permute(xs, dims);
  const int es = int(core::dtype_size(c.in(0).dtype()));
  if (p.rank <= 1) {  // the permutation moves nothing: a plain copy
    check_cuda(cudaMemcpyAsync(c.out(0).data, c.in(0).data, c.in(0).meta.bytes(), cudaMemcpyDeviceToDevice,
                               stream_of(c)),
               "permute: cudaMemcpyAsync");
    return;
  }
  if (p.stride[p.rank - 1] == 1) {
    // Rows stay contiguous: widen the unit while it divides the row, every
    // outer stride and both base addresses.
    uint64_t bits = 16 | uint64_t(p.size[p.rank - 1] * es) | reinterpret_cast<uintptr_t>(c.in(0).data) |
                    reinterpret_cast<uintptr_t>(c.out(0).data);
    for (int i = 0; i < p.rank - 1; ++i) bits |= uint64_t(p.stride[i] * es);
    switch (std::max<int>(int(bits & (~bits + 1)), es)) {
      case 16: launch_gather<16>(c, p, es); break;
      case 8: launch_gather<8>(c, p, es); break;
      case 4: launch_gather<4>(c, p, es); break;
      case 2: launch_gather<2>(c, p, es); break;
      default: launch_gather<1>(c, p, es); break;
    }
  } else {
    switch (es) {
      case 1: launch_transpose<uint8_t>(c, p); break;
      case 2: launch_transpose<uint16_t>(c, p); break;
      case 4: launch_transpose<uint32_t>(c, p); break;
      default: launch_transpose<uint64_t>(c, p); break;
    }
  }
  check_launch("permute");
}

}  // namespace

void register_shape_ops_kernels(core::KernelRegistry& r) {
  for (int t = 0; t < core::kNumDTypes; ++t) {
    const auto dt = DType(t);
    r.add(OpKind::reshape, dt, reshape_op);
    r.add(OpKind::permute, dt, permute_op);
    r.add(OpKind::split, dt, split_op);
    r.add(OpKind::concat, dt, concat_op);
  }
}

}  // namespace brisk::cuda
