// LayerNorm on CUDA: layernorm, add_layernorm (s = a + r, then the LayerNorm
// of s as stored, i.e. rounded to its dtype) and layernorm_backward, in f32
// and bf16, computing what src/ops/layernorm.cpp and add_layernorm.cpp define.
// Under an f32 x, layernorm's y and layernorm_backward's dy may be bf16 or
// f16 (mixed precision's narrowed LayerNorm output), and so may
// add_layernorm's r (the low-precision branch) and y.
//
// Rows of a transformer are short (C = 768 for GPT-2), so one warp owns a
// row and keeps it in registers as 16-byte packs: the row is read from memory
// once, the statistics use the exact two-pass formula (mean, then variance
// about it) on registers, and warp shuffles do the reductions with no shared
// memory or block barrier. Rows that do not fit that path (C not a multiple
// of the pack, misaligned buffers, very wide rows) take a block-per-row
// kernel that re-reads the row from cache.
//
// layernorm_backward may also add a gradient to dx (a sixth input, dres: the
// residual stream's, summed in while the row is in registers) and write dx a
// second time narrowed to bf16/f16 (a fourth output: the gradient of a
// low-precision residual branch). Both follow the unfused graph's rounding:
// dx rounded to its dtype, then __fadd_rn (never contracted into an FMA)
// adds dres, then the sum is narrowed. The narrowed dtype is known only at
// run time; its branch is the same for the whole grid.
//
// layernorm_backward overwrites dweight and dbias with sums over all rows.
// Float atomics would make them depend on scheduling, so each block folds
// the rows of its warps in a fixed order (every lane always owns the same
// columns, so a warp accumulates its rows in its own shared memory), writes
// one partial row to the backend's scratch, and a second kernel adds the
// partials in block order. The block count depends only on the shape and
// the GPU (one wave of blocks): the same inputs give the same bits on every
// run on one kind of GPU.
#include <atomic>
#include <climits>
#include <cstdint>
#include <string>

#include "cuda_util.cuh"

namespace brisk::cuda {
namespace {

using core::DType;
using core::KernelCall;
using core::OpKind;

constexpr int kWarps = 8;  // warps (rows) per block of the warp-per-row kernels
constexpr int kThreads = kWarps * 32;
constexpr int kBlockThreads = 256;  // block-per-row fallback
constexpr int kMaxBackwardBlocks = 256;  // partial rows of dweight/dbias in the fallback (about one wave on an H100)

// 16 bytes of T: what one vectorised load moves.
template <class T>
struct alignas(16) Pack {
  static constexpr int n = 16 / int(sizeof(T));
  T e[n];
};

// The same N elements in another storage type Y: y of a LayerNorm whose f32
// row is written narrowed (LayerNormParams::narrow_to), or its gradient dy.
// For Y = T it is Pack<T>'s 16 bytes; 8 for an f32 pack's bf16/f16 copy.
template <class Y, int N>
struct alignas(sizeof(Y) * N) Lanes {
  Y e[N];
};


// Packs per lane for the register path (rounded up to an instantiated
// count), or 0 when the row needs the fallback. The backward holds two f32
// accumulators per element, so it allows at most 32 elements per lane (C up
// to 1024) to stay clear of register spills.
template <class T>
int packs_per_lane(int64_t C, bool backward) {
  constexpr int P = Pack<T>::n;
  if (C <= 0 || C % P != 0 || C > INT_MAX) return 0;
  const int64_t per = (C / P + 31) / 32;
  if (backward && per * P > 32) return 0;
  for (int o : {1, 2, 3, 4, 6, 8})
    if (per <= o) return o;
  return 0;
}


// ---- forward -----------------------------------------------------------------------

// One warp per row, the row in registers. kAdd: x is a, `res` is r (row
// index modulo res_rows; R: T, or bf16/f16 under an f32 T), s = narrow(a + r)
// is stored and normalised.
template <class T, class Y, class R, int NV, bool kAdd>
__global__ void __launch_bounds__(kThreads)
    layernorm_warp_kernel(const T* __restrict__ x, const R* __restrict__ res, int64_t res_rows,
                          const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ s, Y* __restrict__ y,
                          float* __restrict__ mean_out, float* __restrict__ rstd_out, int64_t rows, int C,
                          float eps) {
  constexpr int P = Pack<T>::n;
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= rows) return;  // whole warps leave together: the shuffles below see full warps
  const int nvec = C / P;
  const float inv_c = 1.f / float(C);
  const Pack<T>* xr = reinterpret_cast<const Pack<T>*>(x + row * C);

  float v[NV][P];
  float sum = 0.f;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int j = lane + 32 * k;
    if (j < nvec) {
      Pack<T> px = xr[j];
      if constexpr (kAdd) {
        const Lanes<R, P> pr = reinterpret_cast<const Lanes<R, P>*>(res + (row % res_rows) * C)[j];
#pragma unroll
        for (int e = 0; e < P; ++e) px.e[e] = narrow<T>(widen(px.e[e]) + widen(pr.e[e]));
        reinterpret_cast<Pack<T>*>(s + row * C)[j] = px;
      }
#pragma unroll
      for (int e = 0; e < P; ++e) {
        v[k][e] = widen(px.e[e]);
        sum += v[k][e];
      }
    } else {
#pragma unroll
      for (int e = 0; e < P; ++e) v[k][e] = 0.f;
    }
  }
  const float mean = warp_sum(sum) * inv_c;
  float var = 0.f;
#pragma unroll
  for (int k = 0; k < NV; ++k)
    if (lane + 32 * k < nvec) {
#pragma unroll
      for (int e = 0; e < P; ++e) {
        const float d = v[k][e] - mean;
        var += d * d;
      }
    }
  const float rstd = 1.f / sqrtf(warp_sum(var) * inv_c + eps);
  Lanes<Y, P>* yr = reinterpret_cast<Lanes<Y, P>*>(y + row * C);
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int j = lane + 32 * k;
    if (j < nvec) {
      const Pack<T> pw = reinterpret_cast<const Pack<T>*>(w)[j];
      const Pack<T> pb = reinterpret_cast<const Pack<T>*>(b)[j];
      Lanes<Y, P> out;
#pragma unroll
      for (int e = 0; e < P; ++e) out.e[e] = narrow<Y>((v[k][e] - mean) * rstd * widen(pw.e[e]) + widen(pb.e[e]));
      yr[j] = out;
    }
  }
  if (lane == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}

// One block per row, any C and alignment: three passes over the row (the
// later two from cache). With kAdd each thread re-reads only the elements of
// s it wrote itself, so no barrier is needed between writing and reading s.
template <class T, class Y, class R, bool kAdd>
__global__ void __launch_bounds__(kBlockThreads)
    layernorm_block_kernel(const T* __restrict__ x, const R* __restrict__ res, int64_t res_rows,
                           const T* __restrict__ w, const T* __restrict__ b, T* s, Y* __restrict__ y,
                           float* __restrict__ mean_out, float* __restrict__ rstd_out, int64_t C, float eps) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const float inv_c = C ? 1.f / float(C) : 0.f;
  const T* xr = x + row * C;
  const T* src = xr;
  float sum = 0.f;
  if constexpr (kAdd) {
    const R* rr = res + (row % res_rows) * C;
    T* sr = s + row * C;
    for (int64_t i = threadIdx.x; i < C; i += blockDim.x) {
      const T sv = narrow<T>(widen(xr[i]) + widen(rr[i]));
      sr[i] = sv;
      sum += widen(sv);
    }
    src = sr;
  } else {
    for (int64_t i = threadIdx.x; i < C; i += blockDim.x) sum += widen(xr[i]);
  }
  const float mean = block_sum(sum, scratch) * inv_c;
  float var = 0.f;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) {
    const float d = widen(src[i]) - mean;
    var += d * d;
  }
  const float rstd = 1.f / sqrtf(block_sum(var, scratch) * inv_c + eps);
  Y* yr = y + row * C;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x)
    yr[i] = narrow<Y>((widen(src[i]) - mean) * rstd * widen(w[i]) + widen(b[i]));
  if (threadIdx.x == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}

template <class T, class Y, class R, bool kAdd>
void launch_forward(const T* x, const R* res, int64_t res_rows, const T* w, const T* b, T* s, Y* y, float* mean,
                    float* rstd, int64_t rows, int64_t C, float eps, cudaStream_t st, const char* what) {
  if (rows <= 0) return;
  if (rows > INT_MAX) throw core::ShapeError(std::string(what) + ": too many rows for one launch");
  bool aligned = aligned16(x) && aligned16(w) && aligned16(b) && aligned16(y);
  if constexpr (kAdd) aligned = aligned && aligned16(res) && aligned16(s);
  const int nv = aligned ? packs_per_lane<T>(C, false) : 0;
  const unsigned blocks = unsigned((rows + kWarps - 1) / kWarps);
  const int c32 = int(nv ? C : 0);
#define BRISK_LN_FWD(NV)                                                                                  \
  case NV:                                                                                                \
    layernorm_warp_kernel<T, Y, R, NV, kAdd><<<blocks, kThreads, 0, st>>>(x, res, res_rows, w, b, s, y, mean, rstd, \
                                                                    rows, c32, eps);                      \
    break;
  switch (nv) {
    BRISK_LN_FWD(1)
    BRISK_LN_FWD(2)
    BRISK_LN_FWD(3)
    BRISK_LN_FWD(4)
    BRISK_LN_FWD(6)
    BRISK_LN_FWD(8)
    default:
      layernorm_block_kernel<T, Y, R, kAdd><<<unsigned(rows), kBlockThreads, 0, st>>>(x, res, res_rows, w, b, s, y,
                                                                                   mean, rstd, C, eps);
  }
#undef BRISK_LN_FWD
  check_launch(what);
}

// Weight and bias are inputs w_in and w_in + 1.
void check_affine_shape(const char* op, const KernelCall& c, int64_t C, int w_in) {
  if (c.in(w_in).numel() != C || c.in(w_in + 1).numel() != C)
    throw core::ShapeError(std::string(op) + ": weight and bias must be (C) with C = the input's last dim");
}

// Y: y's storage, x's or (under an f32 x) a narrower one (LayerNormParams::narrow_to).
template <DType D, DType DY = D>
void layernorm_kernel(const KernelCall& c) {
  using T = device_t<D>;
  using Y = device_t<DY>;
  const core::TensorView& x = c.in(0);
  const int64_t C = x.shape().last(), rows = x.shape().rows();
  check_affine_shape("layernorm", c, C, 1);
  launch_forward<T, Y, T, false>(x.as<const T>(), nullptr, 1, c.in(1).as<const T>(), c.in(2).as<const T>(), nullptr,
                              c.out(0).as<Y>(), c.out(1).as<float>(), c.out(2).as<float>(), rows, C,
                              c.p<core::LayerNormParams>().eps, stream_of(c),
                              D == DType::f32 ? "layernorm(f32)" : "layernorm(bf16)");
}

void layernorm_f32(const KernelCall& c) {
  switch (c.out(0).dtype()) {
    case DType::bf16: return layernorm_kernel<DType::f32, DType::bf16>(c);
    case DType::f16: return layernorm_kernel<DType::f32, DType::f16>(c);
    default: return layernorm_kernel<DType::f32>(c);
  }
}

// DR, DY: r's and y's dtypes, D's or (under an f32 a) bf16/f16.
template <DType D, DType DR = D, DType DY = D>
void add_layernorm_kernel(const KernelCall& c) {
  using T = device_t<D>;
  using R = device_t<DR>;
  using Y = device_t<DY>;
  const core::TensorView& a = c.in(0);
  const int64_t C = a.shape().last(), rows = a.shape().rows();
  check_affine_shape("add_layernorm", c, C, 2);
  const int64_t r_rows = C > 0 ? c.in(1).numel() / C : 1;
  if (C > 0 && (r_rows < 1 || c.in(1).numel() % C != 0))
    throw core::ShapeError("add_layernorm: r must have a's shape or its trailing dims");
  launch_forward<T, Y, R, true>(a.as<const T>(), c.in(1).as<const R>(), r_rows, c.in(2).as<const T>(),
                          c.in(3).as<const T>(), c.out(0).as<T>(), c.out(1).as<Y>(), c.out(2).as<float>(),
                          c.out(3).as<float>(), rows, C, c.p<core::LayerNormParams>().eps, stream_of(c),
                          D == DType::f32 ? "add_layernorm(f32)" : "add_layernorm(bf16)");
}

// f32 a: r and y each f32, bf16 or f16 (mixed precision).
template <DType DR>
void add_layernorm_f32_r(const KernelCall& c) {
  switch (c.out(1).dtype()) {
    case DType::bf16: return add_layernorm_kernel<DType::f32, DR, DType::bf16>(c);
    case DType::f16: return add_layernorm_kernel<DType::f32, DR, DType::f16>(c);
    default: return add_layernorm_kernel<DType::f32, DR, DType::f32>(c);
  }
}

void add_layernorm_f32(const KernelCall& c) {
  switch (c.in(1).dtype()) {
    case DType::bf16: return add_layernorm_f32_r<DType::bf16>(c);
    case DType::f16: return add_layernorm_f32_r<DType::f16>(c);
    default: return add_layernorm_f32_r<DType::f32>(c);
  }
}

// ---- backward ----------------------------------------------------------------------
// dx = rstd * (g*w - mean(g*w) - xhat * mean(g*w*xhat)), xhat = (x - mean) * rstd;
// dweight = sum over rows of g * xhat, dbias = sum over rows of g.

// Where dx's narrowed copy goes (none when kind is 0).
struct NarrowedDx {
  void* data = nullptr;
  int kind = 0;  // 0 none, 1 bf16, 2 f16
};

// Element i of a row's dx: dres added (when given) as a separate rounded add.
template <class T>
__device__ __forceinline__ T add_residual(T dx, const T* __restrict__ dres, int64_t i) {
  return dres ? narrow<T>(__fadd_rn(widen(dres[i]), widen(dx))) : dx;
}

// N values of dx (as stored) at element i, written narrowed.
template <class T, int N>
__device__ __forceinline__ void store_narrowed(const NarrowedDx& nd, int64_t i, const T (&v)[N]) {
  if (nd.kind == 1) {
    Lanes<bf16_t, N> o;
#pragma unroll
    for (int e = 0; e < N; ++e) o.e[e] = narrow<bf16_t>(widen(v[e]));
    *reinterpret_cast<Lanes<bf16_t, N>*>(static_cast<bf16_t*>(nd.data) + i) = o;
  } else if (nd.kind == 2) {
    Lanes<f16_t, N> o;
#pragma unroll
    for (int e = 0; e < N; ++e) o.e[e] = narrow<f16_t>(widen(v[e]));
    *reinterpret_cast<Lanes<f16_t, N>*>(static_cast<f16_t*>(nd.data) + i) = o;
  }
}

// One warp per row (rows strided over a grid of one wave), dy and x held as
// packs; dres is read while dx is written. Each warp sums its rows'
// dweight/dbias terms in shared memory of its own (element e of lane l's
// pack k at word (k * P + e) * 32 + l: no bank conflicts), which leaves the
// registers to the row data: three blocks fit on an SM at G1's C = 768
// (80 registers), where sums in registers (128) allowed two. The block then
// adds its warps' sums in warp order and writes part[block] = (dw[C], db[C]).
template <class T, int NV>
constexpr int backward_slots() {
  return NV * Pack<T>::n * 32;  // one warp's dweight (or dbias) words
}
template <class T, int NV>
constexpr size_t backward_smem() {
  return size_t(kWarps) * 2 * backward_slots<T, NV>() * sizeof(float);
}

template <class T, class G, int NV>
__global__ void __launch_bounds__(kThreads, NV > 6 ? 2 : 3)  // NV 8 spills at 3
    layernorm_backward_warp_kernel(const G* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ w,
                                   const float* __restrict__ mean, const float* __restrict__ rstd,
                                   const T* __restrict__ dres, T* __restrict__ dx, NarrowedDx nd,
                                   float* __restrict__ part, int64_t rows, int C) {
  extern __shared__ float sacc[];  // backward_smem<T, NV>()
  constexpr int P = Pack<T>::n;
  constexpr int kSlots = backward_slots<T, NV>();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nvec = C / P;
  const float inv_c = 1.f / float(C);
  const Pack<T>* wp = reinterpret_cast<const Pack<T>*>(w);
  float* my_dw = sacc + warp * 2 * kSlots;
  float* my_db = my_dw + kSlots;
  for (int i = lane; i < 2 * kSlots; i += 32) my_dw[i] = 0.f;
  __syncwarp();  // each warp touches only its own sums until the barrier below

  const int64_t stride = int64_t(gridDim.x) * kWarps;
  for (int64_t row = int64_t(blockIdx.x) * kWarps + warp; row < rows; row += stride) {
    const float mu = mean[row], rs = rstd[row];
    const Lanes<G, P>* gr = reinterpret_cast<const Lanes<G, P>*>(dy + row * C);
    const Pack<T>* xr = reinterpret_cast<const Pack<T>*>(x + row * C);
    const Pack<T>* rr = dres ? reinterpret_cast<const Pack<T>*>(dres + row * C) : nullptr;
    Lanes<G, P> g[NV];
    Pack<T> xv[NV];
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int j = lane + 32 * k;
      if (j < nvec) {
        g[k] = gr[j];
        xv[k] = xr[j];
      }
    }
    float s1 = 0.f, s2 = 0.f;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int j = lane + 32 * k;
      if (j < nvec) {
        const Pack<T> pw = wp[j];
#pragma unroll
        for (int e = 0; e < P; ++e) {
          const float gg = widen(g[k].e[e]), xh = (widen(xv[k].e[e]) - mu) * rs;
          const float gw = gg * widen(pw.e[e]);
          s1 += gw;
          s2 += gw * xh;
          const int a = (k * P + e) * 32 + lane;
          my_dw[a] += gg * xh;
          my_db[a] += gg;
        }
      }
    }
    s1 = warp_sum(s1) * inv_c;
    s2 = warp_sum(s2) * inv_c;
    Pack<T>* dr = reinterpret_cast<Pack<T>*>(dx + row * C);
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int j = lane + 32 * k;
      if (j < nvec) {
        const Pack<T> pw = wp[j];
        Pack<T> out;
#pragma unroll
        for (int e = 0; e < P; ++e) {
          const float xh = (widen(xv[k].e[e]) - mu) * rs;
          out.e[e] = narrow<T>(rs * (widen(g[k].e[e]) * widen(pw.e[e]) - s1 - xh * s2));
        }
        if (rr) {
          const Pack<T> pr = rr[j];
#pragma unroll
          for (int e = 0; e < P; ++e) out.e[e] = narrow<T>(__fadd_rn(widen(pr.e[e]), widen(out.e[e])));
        }
        dr[j] = out;
        store_narrowed(nd, row * C + int64_t(j) * P, out.e);
      }
    }
  }

  __syncthreads();
  float* pb = part + int64_t(blockIdx.x) * 2 * C;
  for (int i = threadIdx.x; i < nvec * P; i += blockDim.x) {
    const int j = i / P, e = i - j * P, k = j / 32;
    const int a = (k * P + e) * 32 + (j - 32 * k);
    float sw = 0.f, sb = 0.f;
#pragma unroll
    for (int wi = 0; wi < kWarps; ++wi) {
      sw += sacc[wi * 2 * kSlots + a];
      sb += sacc[wi * 2 * kSlots + kSlots + a];
    }
    pb[i] = sw;
    pb[C + i] = sb;
  }
}

// dx of one row per block, any C and alignment.
template <class T, class G>
__global__ void __launch_bounds__(kBlockThreads)
    layernorm_backward_block_kernel(const G* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ w,
                                    const float* __restrict__ mean, const float* __restrict__ rstd,
                                    const T* __restrict__ dres, T* __restrict__ dx, NarrowedDx nd, int64_t C) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const float inv_c = 1.f / float(C);
  const G* gr = dy + row * C;
  const T* xr = x + row * C;
  const float mu = mean[row], rs = rstd[row];
  float s1 = 0.f, s2 = 0.f;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) {
    const float gw = widen(gr[i]) * widen(w[i]);
    s1 += gw;
    s2 += gw * ((widen(xr[i]) - mu) * rs);
  }
  s1 = block_sum(s1, scratch) * inv_c;
  s2 = block_sum(s2, scratch) * inv_c;
  T* dr = dx + row * C;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) {
    const float xh = (widen(xr[i]) - mu) * rs;
    const T v[1] = {add_residual(narrow<T>(rs * (widen(gr[i]) * widen(w[i]) - s1 - xh * s2)), dres, row * C + i)};
    dr[i] = v[0];
    store_narrowed(nd, row * C + i, v);
  }
}

// dweight/dbias partials for the fallback: thread = column, blockIdx.y = a
// run of rows walked in order; part[blockIdx.y] = (dw[C], db[C]).
template <class T, class G>
__global__ void __launch_bounds__(kBlockThreads)
    layernorm_backward_columns_kernel(const G* __restrict__ dy, const T* __restrict__ x,
                                      const float* __restrict__ mean, const float* __restrict__ rstd,
                                      float* __restrict__ part, int64_t rows, int64_t C, int64_t rows_per_part) {
  const int64_t col = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= C) return;
  const int64_t r0 = int64_t(blockIdx.y) * rows_per_part;
  const int64_t r1 = r0 + rows_per_part < rows ? r0 + rows_per_part : rows;
  float aw = 0.f, ab = 0.f;
  for (int64_t r = r0; r < r1; ++r) {
    const float g = widen(dy[r * C + col]);
    aw += g * ((widen(x[r * C + col]) - mean[r]) * rstd[r]);
    ab += g;
  }
  float* pb = part + int64_t(blockIdx.y) * 2 * C;
  pb[col] = aw;
  pb[C + col] = ab;
}

// dw[c], db[c] = sums of the partials in partial order. A block covers 32
// columns with 32 slices of partials (coalesced reads, a few partials per
// thread: the G1 shape has 24 such blocks for some 400 partials), combined
// in slice order.
constexpr int kFinalSlices = 32;
template <class T>
__global__ void __launch_bounds__(32 * kFinalSlices)
    layernorm_backward_finalize_kernel(const float* __restrict__ part, int nparts, int64_t C, T* __restrict__ dw,
                                       T* __restrict__ db) {
  __shared__ float sw[kFinalSlices][32], sb[kFinalSlices][32];
  const int cx = threadIdx.x & 31, sl = threadIdx.x >> 5;
  const int64_t col = int64_t(blockIdx.x) * 32 + cx;
  float aw = 0.f, ab = 0.f;
  if (col < C)
    for (int p = sl; p < nparts; p += kFinalSlices) {
      aw += part[int64_t(p) * 2 * C + col];
      ab += part[int64_t(p) * 2 * C + C + col];
    }
  sw[sl][cx] = aw;
  sb[sl][cx] = ab;
  __syncthreads();
  if (sl == 0 && col < C) {
    float tw = 0.f, tb = 0.f;
#pragma unroll
    for (int k = 0; k < kFinalSlices; ++k) {
      tw += sw[k][cx];
      tb += sb[k][cx];
    }
    dw[col] = narrow<T>(tw);
    db[col] = narrow<T>(tb);
  }
}

// Blocks of the backward warp kernel <T, G, NV> (kThreads threads, its
// shared memory) resident on the whole GPU at once: its grid is one full
// wave, so no SM idles in a second, partial one. Worked out (and the shared
// memory opted into) once per kernel and device, not at every launch.
template <class T, class G, int NV>
int64_t backward_wave() {
  constexpr int kDevices = 64;
  static std::atomic<int64_t> wave[kDevices] = {};
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  if (device < kDevices && wave[device].load(std::memory_order_relaxed) > 0) return wave[device];
  const auto kernel = layernorm_backward_warp_kernel<T, G, NV>;
  constexpr size_t smem = backward_smem<T, NV>();
  int sms = 0, per_sm = 0;
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  if (smem > 48 * 1024)
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
               "cudaFuncSetAttribute");
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem),
             "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  const int64_t blocks = int64_t(std::max(sms, 1)) * std::max(per_sm, 1);
  if (device < kDevices) wave[device] = blocks;  // racing first calls store the same value
  return blocks;
}

// G: dy's storage, x's or (the gradient of a narrowed y) a narrower one.
template <DType D, DType DG = D>
void layernorm_backward_kernel(const KernelCall& c) {
  using T = device_t<D>;
  using G = device_t<DG>;
  const char* what = D == DType::f32 ? "layernorm_backward(f32)" : "layernorm_backward(bf16)";
  const G* dy = c.in(0).as<const G>();
  const T* x = c.in(1).as<const T>();
  const T* w = c.in(2).as<const T>();
  const float* mean = c.in(3).as<const float>();
  const float* rstd = c.in(4).as<const float>();
  T* dx = c.out(0).as<T>();
  T* dw = c.out(1).as<T>();
  T* db = c.out(2).as<T>();
  const T* dres = c.inputs.size() == 6 ? c.in(5).as<const T>() : nullptr;
  NarrowedDx nd;
  if (c.outputs.size() == 4) {
    nd.data = c.out(3).data;
    nd.kind = c.out(3).dtype() == DType::bf16 ? 1 : c.out(3).dtype() == DType::f16 ? 2 : 0;
    if (nd.kind == 0) throw core::DTypeError(std::string(what) + ": dx can be narrowed only to bf16 or f16");
  }
  const int64_t C = c.in(1).shape().last(), rows = c.in(1).shape().rows();
  if (c.in(0).numel() != c.in(1).numel() || c.in(2).numel() != C || c.in(3).numel() != rows ||
      c.in(4).numel() != rows || (dres && c.in(5).numel() != c.in(1).numel()))
    throw core::ShapeError(
        "layernorm_backward: expects dy, x (and dres) of one shape, weight (C), mean and rstd (rows)");
  if (C <= 0) return;
  if (rows > INT_MAX) throw core::ShapeError("layernorm_backward: too many rows for one launch");
  const core::ExecContext& ctx = context_of(c);
  const cudaStream_t st = stream_of(c);
  float* part = static_cast<float*>(ctx.blas_workspace);
  const int64_t part_rows_fit = int64_t(ctx.blas_workspace_bytes / (2 * size_t(C) * sizeof(float)));

  int nparts = 0;
  if (rows > 0) {
    if (!part || part_rows_fit < 1)
      throw core::BackendError(std::string(what) + ": C = " + std::to_string(C) +
                               " is too wide for the backend's scratch");
    const bool aligned = aligned16(dy) && aligned16(x) && aligned16(w) && aligned16(dx) &&
                         (!dres || aligned16(dres)) && (!nd.data || aligned16(nd.data));
    const int nv = aligned ? packs_per_lane<T>(C, true) : 0;
    if (nv) {
      const int64_t want = std::min<int64_t>((rows + kWarps - 1) / kWarps, part_rows_fit);
      const int c32 = int(C);
#define BRISK_LN_BWD(NV)                                                                                  \
  case NV:                                                                                                \
    if constexpr (NV * Pack<T>::n <= 32) {                                                                \
      nparts = int(std::min<int64_t>(want, backward_wave<T, G, NV>()));                                   \
      layernorm_backward_warp_kernel<T, G, NV><<<unsigned(nparts), kThreads, backward_smem<T, NV>(), st>>>( \
          dy, x, w, mean, rstd, dres, dx, nd, part, rows, c32);                                           \
    }                                                                                                     \
    break;
      switch (nv) {
        BRISK_LN_BWD(1)
        BRISK_LN_BWD(2)
        BRISK_LN_BWD(3)
        BRISK_LN_BWD(4)
        BRISK_LN_BWD(6)
        BRISK_LN_BWD(8)
        default: break;
      }
#undef BRISK_LN_BWD
      check_launch(what);
    } else {
      layernorm_backward_block_kernel<T, G><<<unsigned(rows), kBlockThreads, 0, st>>>(dy, x, w, mean, rstd, dres, dx,
                                                                                     nd, C);
      check_launch(what);
      const int64_t want = std::min<int64_t>({rows, kMaxBackwardBlocks, part_rows_fit});
      const int64_t rows_per_part = (rows + want - 1) / want;
      nparts = int((rows + rows_per_part - 1) / rows_per_part);
      const dim3 grid(unsigned((C + kBlockThreads - 1) / kBlockThreads), unsigned(nparts));
      layernorm_backward_columns_kernel<T, G><<<grid, kBlockThreads, 0, st>>>(dy, x, mean, rstd, part, rows, C,
                                                                              rows_per_part);
      check_launch(what);
    }
  }
  // No rows: nparts = 0 and the sums come out zero, as the reference's.
  layernorm_backward_finalize_kernel<T><<<unsigned((C + 31) / 32), 32 * kFinalSlices, 0, st>>>(part, nparts, C, dw, db);
  check_launch(what);
}

void layernorm_backward_f32(const KernelCall& c) {
  switch (c.in(0).dtype()) {
    case DType::bf16: return layernorm_backward_kernel<DType::f32, DType::bf16>(c);
    case DType::f16: return layernorm_backward_kernel<DType::f32, DType::f16>(c);
    default: return layernorm_backward_kernel<DType::f32>(c);
  }
}

}  // namespace

void register_layernorm_kernels(core::KernelRegistry& r) {
  r.add(OpKind::layernorm, DType::f32, layernorm_f32);
  r.add(OpKind::layernorm, DType::bf16, layernorm_kernel<DType::bf16>);
  r.add(OpKind::layernorm_backward, DType::f32, layernorm_backward_f32);
  r.add(OpKind::layernorm_backward, DType::bf16, layernorm_backward_kernel<DType::bf16>);
  r.add(OpKind::add_layernorm, DType::f32, add_layernorm_f32);
  r.add(OpKind::add_layernorm, DType::bf16, add_layernorm_kernel<DType::bf16>);
}

}  // namespace brisk::cuda
