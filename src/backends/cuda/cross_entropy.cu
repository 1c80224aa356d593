// cross_entropy and cross_entropy_backward on CUDA, f32, bf16 and f16 logits
// (N, V), i32 targets, as src/ops/cross_entropy.cpp defines them: the loss is
// the mean of lse - x[target] over the targets that are not ignore_index, and
// the per-row logsumexp (lse) is a saved f32 output; the backward is
// dloss / count * (softmax - onehot), zero on ignored rows.
//
// A language model's vocabulary is wide (V = 50304), so one block owns a row
// and reads it once with 16-byte loads, keeping an online (max, sum) pair in
// fp32: when the running max grows the sum is rescaled, so no separate max
// pass is needed. The fast exponential (__expf) is accurate to a few ulp here
// because its argument (x - max) is small, and the op is otherwise all
// exponentials.
//
// The mean needs the number of kept targets, which only the device knows
// (the host may not read device data inside a captured step). The forward
// ends with one single-block kernel that walks the rows in a fixed order,
// summing lse - x[target] in double (as the CPU kernel does), counting kept
// targets and writing loss = total / count. The backward first runs a
// single-block count kernel that writes dloss / count to the backend's
// scratch, which every row then reads.
//
// Out-of-range targets (neither in [0, V) nor ignore_index) are a user error
// that the reference reports by throwing; a device kernel cannot throw, so
// the loss becomes NaN and the gradient rows of those targets are NaN: the
// step's loss shows the failure instead of training on garbage.
#include <climits>
#include <cstdint>
#include <string>

#include "cuda_util.cuh"

namespace brisk::cuda {
namespace {

using core::DType;
using core::KernelCall;
using core::OpKind;

constexpr int kReduceThreads = 1024;  // the single-block loss and count kernels

template <class T>
struct alignas(16) Pack {
  static constexpr int n = 16 / int(sizeof(T));
  T e[n];
};


// Threads for a row of `units` loads: about four loads per thread, 64 to 512.
int row_threads(int64_t units) {
  const int64_t t = ((units + 3) / 4 + 31) / 32 * 32;
  return int(std::min<int64_t>(512, std::max<int64_t>(64, t)));
}

template <DType D>
const char* op_name(bool backward) {
  if (D == DType::f32) return backward ? "cross_entropy_backward(f32)" : "cross_entropy(f32)";
  if (D == DType::bf16) return backward ? "cross_entropy_backward(bf16)" : "cross_entropy(bf16)";
  return backward ? "cross_entropy_backward(f16)" : "cross_entropy(f16)";
}

// (max, sum of exp(x - max)) of two parts merged; the equality tests keep
// (-inf, 0) parts from producing exp(-inf - -inf) = NaN.
__device__ __forceinline__ void merge_max_sum(float& m, float& s, float mo, float so) {
  const float mn = fmaxf(m, mo);
  s = (m == mn ? s : s * __expf(m - mn)) + (mo == mn ? so : so * __expf(mo - mn));
  m = mn;
}

// ---- forward -----------------------------------------------------------------------

// lse[row] = max + log(sum exp(x - max)), one block per row.
template <class T, bool kVec>
__global__ void __launch_bounds__(512) cross_entropy_lse_kernel(const T* __restrict__ x, float* __restrict__ lse,
                                                                 int64_t V) {
  __shared__ float sm[32], ss[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * V;
  float m = -INFINITY, s = 0.f;
  if constexpr (kVec) {
    constexpr int P = Pack<T>::n;
    const Pack<T>* xp = reinterpret_cast<const Pack<T>*>(xr);
    const int64_t nvec = V / P;
#pragma unroll 4
    for (int64_t j = threadIdx.x; j < nvec; j += blockDim.x) {
      const Pack<T> px = xp[j];
      float v[P];
      float lm = -INFINITY;
#pragma unroll
      for (int e = 0; e < P; ++e) {
        v[e] = widen(px.e[e]);
        lm = fmaxf(lm, v[e]);
      }
      if (lm > m) {
        s *= __expf(m - lm);
        m = lm;
      }
      if (m > -INFINITY) {  // else every value so far is -inf and adds nothing
#pragma unroll
        for (int e = 0; e < P; ++e) s += __expf(v[e] - m);
      }
    }
  } else {
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
      const float v = widen(xr[j]);
      if (v > m) {
        s = s * __expf(m - v) + 1.f;
        m = v;
      } else if (m > -INFINITY) {
        s += __expf(v - m);
      }
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float mo = __shfl_xor_sync(0xffffffffu, m, o), so = __shfl_xor_sync(0xffffffffu, s, o);
    merge_max_sum(m, s, mo, so);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  if (lane == 0) {
    sm[warp] = m;
    ss[warp] = s;
  }
  __syncthreads();
  if (warp == 0) {
    m = lane < nwarps ? sm[lane] : -INFINITY;
    s = lane < nwarps ? ss[lane] : 0.f;
    for (int o = 16; o > 0; o >>= 1) {
      const float mo = __shfl_xor_sync(0xffffffffu, m, o), so = __shfl_xor_sync(0xffffffffu, s, o);
      merge_max_sum(m, s, mo, so);
    }
    if (lane == 0) lse[row] = m + logf(s);
  }
}

// loss = mean over kept rows of lse - x[target]; one block, rows in a fixed
// order per thread and a fixed tree across threads.
template <class T>
__global__ void __launch_bounds__(kReduceThreads)
    cross_entropy_loss_kernel(const T* __restrict__ x, const int32_t* __restrict__ t, const float* __restrict__ lse,
                              float* __restrict__ loss, int64_t N, int64_t V, int ignore) {
  __shared__ double s_total[kReduceThreads];
  __shared__ long long s_count[kReduceThreads];
  __shared__ int s_bad[kReduceThreads];
  double total = 0.0;
  long long count = 0;
  int bad = 0;
  for (int64_t r = threadIdx.x; r < N; r += blockDim.x) {
    const int tr = t[r];
    if (tr == ignore) continue;
    ++count;
    if (tr < 0 || int64_t(tr) >= V) {
      bad = 1;
      continue;
    }
    total += double(lse[r]) - double(widen(x[r * V + tr]));
  }
  s_total[threadIdx.x] = total;
  s_count[threadIdx.x] = count;
  s_bad[threadIdx.x] = bad;
  __syncthreads();
  for (int h = kReduceThreads / 2; h > 0; h >>= 1) {
    if (int(threadIdx.x) < h) {
      s_total[threadIdx.x] += s_total[threadIdx.x + h];
      s_count[threadIdx.x] += s_count[threadIdx.x + h];
      s_bad[threadIdx.x] |= s_bad[threadIdx.x + h];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const long long n = s_count[0];
    loss[0] = s_bad[0] ? __int_as_float(0x7fc00000) : n ? float(s_total[0] / double(n)) : 0.f;
  }
}

template <DType D>
void cross_entropy_kernel(const KernelCall& c) {
  using T = device_t<D>;
  const char* what = op_name<D>(false);
  const T* x = c.in(0).as<const T>();
  const int32_t* t = c.in(1).as<const int32_t>();
  float* loss = c.out(0).as<float>();
  float* lse = c.out(1).as<float>();
  if (c.in(0).shape().rank() != 2 || c.in(1).numel() != c.in(0).shape()[0])
    throw core::ShapeError("cross_entropy: expects logits (N, V) and targets (N)");
  const int64_t N = c.in(0).shape()[0], V = c.in(0).shape()[1];
  if (N > INT_MAX) throw core::ShapeError("cross_entropy: too many rows for one launch");
  const int ignore = c.p<core::CrossEntropyParams>().ignore_index;
  if (c.p<core::CrossEntropyParams>().label_smoothing != 0.f)
    throw core::Error("cross_entropy: label_smoothing has no CUDA kernel yet (the CPU backend has one)");
  if (c.inputs.size() > 2)
    throw core::Error("cross_entropy: class weights have no CUDA kernel yet (the CPU backend has one)");
  const cudaStream_t st = stream_of(c);
  if (N > 0) {
    constexpr int P = Pack<T>::n;
    const bool vec = V % P == 0 && aligned16(x);
    if (vec) cross_entropy_lse_kernel<T, true><<<unsigned(N), row_threads(V / P), 0, st>>>(x, lse, V);
    else cross_entropy_lse_kernel<T, false><<<unsigned(N), row_threads(V), 0, st>>>(x, lse, V);
    check_launch(what);
  }
  cross_entropy_loss_kernel<T><<<1, kReduceThreads, 0, st>>>(x, t, lse, loss, N, V, ignore);
  check_launch(what);
}

// ---- backward ----------------------------------------------------------------------

// *scale = dloss / (number of kept targets), 0 when none is kept (as the CPU kernel).
__global__ void __launch_bounds__(kReduceThreads)
    cross_entropy_scale_kernel(const int32_t* __restrict__ t, const float* __restrict__ dloss,
                               float* __restrict__ scale, int64_t N, int ignore) {
  __shared__ long long s_count[kReduceThreads];
  long long count = 0;
  for (int64_t r = threadIdx.x; r < N; r += blockDim.x) count += t[r] != ignore;
  s_count[threadIdx.x] = count;
  __syncthreads();
  for (int h = kReduceThreads / 2; h > 0; h >>= 1) {
    if (int(threadIdx.x) < h) s_count[threadIdx.x] += s_count[threadIdx.x + h];
    __syncthreads();
  }
  if (threadIdx.x == 0) scale[0] = s_count[0] ? dloss[0] / float(s_count[0]) : 0.f;
}

// dx[row] = scale * (exp(x - lse) - onehot(target)); zero for ignored rows,
// NaN for out-of-range targets. One block per row.
template <class T, bool kVec>
__global__ void __launch_bounds__(512)
    cross_entropy_backward_kernel(const T* __restrict__ x, const int32_t* __restrict__ t,
                                  const float* __restrict__ lse, const float* __restrict__ scale_ptr,
                                  T* __restrict__ dx, int64_t V, int ignore) {
  const int64_t row = blockIdx.x;
  const T* xr = x + row * V;
  T* dr = dx + row * V;
  const int tr = t[row];
  const bool skip = tr == ignore;
  const bool bad = !skip && (tr < 0 || int64_t(tr) >= V);
  const float scale = skip ? 0.f : bad ? __int_as_float(0x7fc00000) : scale_ptr[0];
  const float l = lse[row];
  if constexpr (kVec) {
    constexpr int P = Pack<T>::n;
    const Pack<T>* xp = reinterpret_cast<const Pack<T>*>(xr);
    Pack<T>* dp = reinterpret_cast<Pack<T>*>(dr);
    const int64_t nvec = V / P;
    if (skip) {
      Pack<T> z;
#pragma unroll
      for (int e = 0; e < P; ++e) z.e[e] = narrow<T>(0.f);
      for (int64_t j = threadIdx.x; j < nvec; j += blockDim.x) dp[j] = z;
      return;
    }
#pragma unroll 4
    for (int64_t j = threadIdx.x; j < nvec; j += blockDim.x) {
      const Pack<T> px = xp[j];
      Pack<T> out;
#pragma unroll
      for (int e = 0; e < P; ++e) {
        const float hot = j * P + e == tr ? 1.f : 0.f;
        out.e[e] = narrow<T>(scale * (__expf(widen(px.e[e]) - l) - hot));
      }
      dp[j] = out;
    }
  } else {
    if (skip) {
      for (int64_t j = threadIdx.x; j < V; j += blockDim.x) dr[j] = narrow<T>(0.f);
      return;
    }
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
      const float hot = j == tr ? 1.f : 0.f;
      dr[j] = narrow<T>(scale * (__expf(widen(xr[j]) - l) - hot));
    }
  }
}

template <DType D>
void cross_entropy_backward_kernel_fn(const KernelCall& c) {
  using T = device_t<D>;
  const char* what = op_name<D>(true);
  const T* x = c.in(0).as<const T>();
  const int32_t* t = c.in(1).as<const int32_t>();
  const float* lse = c.in(2).as<const float>();
  const float* dloss = c.in(3).as<const float>();
  T* dx = c.out(0).as<T>();
  if (c.in(0).shape().rank() != 2 || c.in(1).numel() != c.in(0).shape()[0] ||
      c.in(2).numel() != c.in(0).shape()[0] || c.in(3).numel() != 1)
    throw core::ShapeError("cross_entropy_backward: expects logits (N, V), targets (N), lse (N), scalar dloss");
  const int64_t N = c.in(0).shape()[0], V = c.in(0).shape()[1];
  if (N <= 0 || V <= 0) return;
  if (N > INT_MAX) throw core::ShapeError("cross_entropy_backward: too many rows for one launch");
  const core::ExecContext& ctx = context_of(c);
  if (!ctx.blas_workspace || ctx.blas_workspace_bytes < sizeof(float))
    throw core::BackendError(std::string(what) + ": the backend has no scratch memory");
  float* scale = static_cast<float*>(ctx.blas_workspace);
  const int ignore = c.p<core::CrossEntropyParams>().ignore_index;
  if (c.p<core::CrossEntropyParams>().label_smoothing != 0.f)
    throw core::Error("cross_entropy: label_smoothing has no CUDA kernel yet (the CPU backend has one)");
  if (c.inputs.size() > 4)
    throw core::Error("cross_entropy: class weights have no CUDA kernel yet (the CPU backend has one)");
  const cudaStream_t st = stream_of(c);
  cross_entropy_scale_kernel<<<1, kReduceThreads, 0, st>>>(t, dloss, scale, N, ignore);
  check_launch(what);
  constexpr int P = Pack<T>::n;
  const bool vec = V % P == 0 && aligned16(x) && aligned16(dx);
  if (vec)
    cross_entropy_backward_kernel<T, true><<<unsigned(N), row_threads(V / P), 0, st>>>(x, t, lse, scale, dx, V,
                                                                                      ignore);
  else
    cross_entropy_backward_kernel<T, false><<<unsigned(N), row_threads(V), 0, st>>>(x, t, lse, scale, dx, V,
                                                                                   ignore);
  check_launch(what);
}

}  // namespace

void register_cross_entropy_kernels(core::KernelRegistry& r) {
  r.add(OpKind::cross_entropy, DType::f32, cross_entropy_kernel<DType::f32>);
  r.add(OpKind::cross_entropy, DType::bf16, cross_entropy_kernel<DType::bf16>);
  r.add(OpKind::cross_entropy, DType::f16, cross_entropy_kernel<DType::f16>);
  r.add(OpKind::cross_entropy_backward, DType::f32, cross_entropy_backward_kernel_fn<DType::f32>);
  r.add(OpKind::cross_entropy_backward, DType::bf16, cross_entropy_backward_kernel_fn<DType::bf16>);
  r.add(OpKind::cross_entropy_backward, DType::f16, cross_entropy_backward_kernel_fn<DType::f16>);
}

}  // namespace brisk::cuda
