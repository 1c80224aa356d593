// The optimizer ops on CUDA (src/ops/optim_ops.cpp): grad_norm, the global
// L2 norm of any number of f32/bf16/f16 tensors as one f32 scalar, and
// adamw, the fused in-place AdamW update of every parameter (groups of
// p, g, m, v; outputs alias p, m, v).
//
// A GPT-2 has ~150 parameter tensors, most of them small vectors; a launch
// per tensor would cost more than the arithmetic. Both ops are multi-tensor
// kernels: a launch takes a batch of tensors (pointers and sizes in a
// __grid_constant__ parameter struct under the 4 KB parameter limit) and
// its blocks map to (tensor, chunk) pairs through a table of each tensor's
// first block, searched by binary search. A whole model is one to four
// launches. Chunks are 16-byte vectorised where the tensor's buffers allow.
//
// grad_norm is deterministic: every block writes the sum of squares of its
// chunk (fp32, at most 8192 elements) to a slot of the backend's scratch
// fixed by the tensor order and sizes; one final block adds the slots in
// order in double, as the CPU kernel accumulates, and writes the sqrt.
//
// adamw mirrors the CPU kernel (and torch.optim.AdamW): coefficients are
// computed on the host in double and rounded to f32 once, the per-element
// arithmetic is f32 in the same order. Weight decay applies to tensors of
// rank >= 2 when decay_matrices is set. Inputs and outputs may be the same
// buffers (the normal in-place step) or distinct ones (the op harness): each
// element is read, then written, by the same thread.
#include <climits>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda_util.cuh"

namespace brisk::cuda {
namespace {

using core::DType;
using core::KernelCall;
using core::OpKind;

constexpr int kThreads = 256;

template <class T>
struct alignas(16) Pack {
  static constexpr int n = 16 / int(sizeof(T));
  T e[n];
};

// Four gradient elements as one load (16 bytes of f32, 8 of bf16/f16).
template <class T>
struct alignas(4 * sizeof(T)) Quad {
  T e[4];
};

bool aligned(const void* p, size_t bytes) { return (reinterpret_cast<uintptr_t>(p) % bytes) == 0; }

// ---- grad_norm -----------------------------------------------------------------------

constexpr int kNormTensors = 96;
constexpr int kNormChunk = 8192;  // elements per block

struct NormBatch {
  const void* ptr[kNormTensors];
  int64_t n[kNormTensors];
  int32_t block_start[kNormTensors + 1];
  uint8_t dtype[kNormTensors];
  uint8_t vec[kNormTensors];
  int count;
};
static_assert(sizeof(NormBatch) <= 4000, "kernel parameters are limited to 4 KB");

template <class T>
__device__ float chunk_sum_squares(const T* x, int64_t begin, int64_t end, bool vec) {
  float s = 0.f;
  int64_t i0 = begin;
  if (vec) {  // begin is a multiple of kNormChunk, so x + begin keeps x's alignment
    constexpr int P = Pack<T>::n;
    const int64_t npack = (end - begin) / P;
    const Pack<T>* xp = reinterpret_cast<const Pack<T>*>(x + begin);
    for (int64_t j = threadIdx.x; j < npack; j += blockDim.x) {
      const Pack<T> p = xp[j];
#pragma unroll
      for (int e = 0; e < P; ++e) {
        const float v = widen(p.e[e]);
        s += v * v;
      }
    }
    i0 = begin + npack * P;
  }
  for (int64_t i = i0 + threadIdx.x; i < end; i += blockDim.x) {
    const float v = widen(x[i]);
    s += v * v;
  }
  return s;
}

__global__ void __launch_bounds__(kThreads)
    grad_norm_partial_kernel(const __grid_constant__ NormBatch b, float* __restrict__ partials) {
  __shared__ float scratch[32];
  const int t = tensor_of(b.block_start, b.count, int(blockIdx.x));
  const int64_t begin = int64_t(int(blockIdx.x) - b.block_start[t]) * kNormChunk;
  const int64_t end = begin + kNormChunk < b.n[t] ? begin + kNormChunk : b.n[t];
  float s;
  switch (b.dtype[t]) {
    case 0: s = chunk_sum_squares(static_cast<const float*>(b.ptr[t]), begin, end, b.vec[t]); break;
    case 1: s = chunk_sum_squares(static_cast<const bf16_t*>(b.ptr[t]), begin, end, b.vec[t]); break;
    default: s = chunk_sum_squares(static_cast<const f16_t*>(b.ptr[t]), begin, end, b.vec[t]); break;
  }
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

// out = sqrt(sum of the partials), added in a fixed order in double.
__global__ void __launch_bounds__(1024)
    grad_norm_final_kernel(const float* __restrict__ partials, int64_t n, float* __restrict__ out) {
  __shared__ double sd[1024];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += double(partials[i]);
  sd[threadIdx.x] = s;
  __syncthreads();
  for (int h = 512; h > 0; h >>= 1) {
    if (int(threadIdx.x) < h) sd[threadIdx.x] += sd[threadIdx.x + h];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[0] = float(sqrt(sd[0]));
}

void grad_norm_fn(const KernelCall& c) {
  constexpr const char* what = "grad_norm";
  const core::ExecContext& ctx = context_of(c);
  const cudaStream_t st = stream_of(c);
  auto* partials = static_cast<float*>(ctx.blas_workspace);
  const int64_t capacity = int64_t(ctx.blas_workspace_bytes / sizeof(float));

  // Validate everything before the first launch.
  int64_t needed = 0;
  for (const core::TensorView& t : c.inputs) {
    float_code(t.dtype(), what);
    needed += (t.numel() + kNormChunk - 1) / kNormChunk;
  }
  if (needed > 0 && (!partials || needed > capacity))
    throw core::BackendError("grad_norm: " + std::to_string(needed) +
                             " partial sums do not fit in the backend's scratch");

  int64_t total = 0;  // partial slots used by earlier launches
  NormBatch b{};
  auto flush = [&] {
    if (b.count == 0) return;
    const int blocks = b.block_start[b.count];
    grad_norm_partial_kernel<<<unsigned(blocks), kThreads, 0, st>>>(b, partials + total);
    check_launch(what);
    total += blocks;
    b = NormBatch{};
  };
  for (const core::TensorView& t : c.inputs) {
    const int64_t n = t.numel();
    if (n == 0) continue;
    const int64_t blocks = (n + kNormChunk - 1) / kNormChunk;
    if (b.count == kNormTensors || int64_t(b.block_start[b.count]) + blocks > INT_MAX) flush();
    const int k = b.count++;
    b.ptr[k] = t.data;
    b.n[k] = n;
    b.dtype[k] = float_code(t.dtype(), what);
    b.vec[k] = aligned(t.data, 16);
    b.block_start[k + 1] = int32_t(b.block_start[k] + blocks);
  }
  flush();
  grad_norm_final_kernel<<<1, 1024, 0, st>>>(partials, total, c.out(0).as<float>());
  check_launch(what);
}

// ---- adamw ----------------------------------------------------------------------------

constexpr int kAdamTensors = 48;
constexpr int kAdamChunk = 4096;  // elements per block: 16 per thread

struct AdamWTensor {
  const float* p_in;
  const void* g;
  const float* m_in;
  const float* v_in;
  float* p;
  float* m;
  float* v;
  int64_t n;
};

enum : uint8_t { kDecay = 1, kVec = 2 };

struct AdamWBatch {
  AdamWTensor t[kAdamTensors];
  int32_t block_start[kAdamTensors + 1];
  uint8_t gtype[kAdamTensors];
  uint8_t flags[kAdamTensors];
  int count;
};

// The step's scalar coefficients, exactly as the CPU kernel rounds them.
struct AdamWCoefficients {
  float grad_scale, decay, beta1, one_m_beta1, beta2, one_m_beta2, neg_step_size, bc2_sqrt, eps;
};
static_assert(sizeof(AdamWBatch) + sizeof(AdamWCoefficients) <= 4000, "kernel parameters are limited to 4 KB");

AdamWCoefficients coefficients(const core::AdamWParams& a) {
  AdamWCoefficients k;
  k.grad_scale = a.grad_scale;
  k.decay = float(1.0 - double(a.lr) * double(a.weight_decay));
  k.beta1 = a.beta1;
  k.one_m_beta1 = float(1.0 - double(a.beta1));
  k.beta2 = a.beta2;
  k.one_m_beta2 = float(1.0 - double(a.beta2));
  k.neg_step_size = float(-(double(a.lr) / (1.0 - std::pow(double(a.beta1), double(a.step)))));
  k.bc2_sqrt = float(std::sqrt(1.0 - std::pow(double(a.beta2), double(a.step))));
  k.eps = a.eps;
  return k;
}

// One element, in torch.optim.AdamW's order (see the CPU kernel).
__device__ __forceinline__ void adamw_element(const AdamWCoefficients& k, float decay_factor, float g, float& p,
                                              float& m, float& v) {
  const float gi = g * k.grad_scale;
  float pi = p * decay_factor;
  const float mi = m * k.beta1 + gi * k.one_m_beta1;
  const float vi = v * k.beta2 + k.one_m_beta2 * gi * gi;
  const float denom = sqrtf(vi) / k.bc2_sqrt + k.eps;
  pi = pi + k.neg_step_size * mi / denom;
  p = pi;
  m = mi;
  v = vi;
}

// Elements [begin, end) of one tensor. No __restrict__: p/m/v may be p_in/m_in/v_in.
template <class G>
__device__ void adamw_chunk(const AdamWTensor& a, const AdamWCoefficients& k, float decay_factor, bool vec,
                            int64_t begin, int64_t end) {
  const G* g = static_cast<const G*>(a.g);
  int64_t i0 = begin;
  if (vec) {  // begin is a multiple of kAdamChunk: every buffer stays aligned
    const int64_t nq = (end - begin) / 4;
    for (int64_t q = threadIdx.x; q < nq; q += blockDim.x) {
      const int64_t i = begin + 4 * q;
      float4 p = *reinterpret_cast<const float4*>(a.p_in + i);
      float4 m = *reinterpret_cast<const float4*>(a.m_in + i);
      float4 v = *reinterpret_cast<const float4*>(a.v_in + i);
      const Quad<G> gq = *reinterpret_cast<const Quad<G>*>(g + i);
      adamw_element(k, decay_factor, widen(gq.e[0]), p.x, m.x, v.x);
      adamw_element(k, decay_factor, widen(gq.e[1]), p.y, m.y, v.y);
      adamw_element(k, decay_factor, widen(gq.e[2]), p.z, m.z, v.z);
      adamw_element(k, decay_factor, widen(gq.e[3]), p.w, m.w, v.w);
      *reinterpret_cast<float4*>(a.p + i) = p;
      *reinterpret_cast<float4*>(a.m + i) = m;
      *reinterpret_cast<float4*>(a.v + i) = v;
    }
    i0 = begin + 4 * nq;
  }
  for (int64_t i = i0 + threadIdx.x; i < end; i += blockDim.x) {
    float p = a.p_in[i], m = a.m_in[i], v = a.v_in[i];
    adamw_element(k, decay_factor, widen(g[i]), p, m, v);
    a.p[i] = p;
    a.m[i] = m;
    a.v[i] = v;
  }
}

__global__ void __launch_bounds__(kThreads)
    adamw_kernel(const __grid_constant__ AdamWBatch b, const AdamWCoefficients k) {
  const int t = tensor_of(b.block_start, b.count, int(blockIdx.x));
  const AdamWTensor& a = b.t[t];
  const int64_t begin = int64_t(int(blockIdx.x) - b.block_start[t]) * kAdamChunk;
  const int64_t end = begin + kAdamChunk < a.n ? begin + kAdamChunk : a.n;
  const uint8_t flags = b.flags[t];
  const float decay_factor = flags & kDecay ? k.decay : 1.f;  // exactly 1 when off: p unchanged
  const bool vec = flags & kVec;
  switch (b.gtype[t]) {
    case 0: adamw_chunk<float>(a, k, decay_factor, vec, begin, end); break;
    case 1: adamw_chunk<bf16_t>(a, k, decay_factor, vec, begin, end); break;
    default: adamw_chunk<f16_t>(a, k, decay_factor, vec, begin, end); break;
  }
}

void adamw_fn(const KernelCall& c) {
  constexpr const char* what = "adamw";
  const core::AdamWParams& params = c.p<core::AdamWParams>();
  const AdamWCoefficients k = coefficients(params);
  const cudaStream_t st = stream_of(c);
  if (c.inputs.size() % 4 != 0 || c.outputs.size() != c.inputs.size() / 4 * 3)
    throw core::ShapeError("adamw: expects groups of 4 inputs (p, g, m, v) and 3 outputs (p, m, v) per group");

  // Validate every group before the first launch.
  const size_t groups = c.inputs.size() / 4;
  for (size_t gi = 0; gi < groups; ++gi) {
    const core::TensorView &p = c.in(int(4 * gi)), &g = c.in(int(4 * gi + 1)), &m = c.in(int(4 * gi + 2)),
                           &v = c.in(int(4 * gi + 3));
    const int64_t n = p.numel();
    if (g.numel() != n || m.numel() != n || v.numel() != n)
      throw core::ShapeError("adamw: p, g, m and v of parameter " + std::to_string(gi) + " must have one shape");
    if (p.dtype() != DType::f32 || m.dtype() != DType::f32 || v.dtype() != DType::f32)
      throw core::DTypeError("adamw: p, m and v must be f32 (parameter " + std::to_string(gi) + ")");
    float_code(g.dtype(), what);
    if ((n + kAdamChunk - 1) / kAdamChunk > INT_MAX)
      throw core::ShapeError("adamw: parameter " + std::to_string(gi) + " is too large for one launch");
  }

  AdamWBatch b{};
  auto flush = [&] {
    if (b.count == 0) return;
    adamw_kernel<<<unsigned(b.block_start[b.count]), kThreads, 0, st>>>(b, k);
    check_launch(what);
    b = AdamWBatch{};
  };
  for (size_t gi = 0; gi < groups; ++gi) {
    const core::TensorView &p = c.in(int(4 * gi)), &g = c.in(int(4 * gi + 1));
    const int64_t n = p.numel();
    if (n == 0) continue;
    const int64_t blocks = (n + kAdamChunk - 1) / kAdamChunk;
    if (b.count == kAdamTensors || int64_t(b.block_start[b.count]) + blocks > INT_MAX) flush();
    AdamWTensor& t = b.t[b.count];
    t.p_in = p.as<const float>();
    t.g = g.data;
    t.m_in = c.in(int(4 * gi + 2)).as<const float>();
    t.v_in = c.in(int(4 * gi + 3)).as<const float>();
    t.p = c.out(int(3 * gi)).as<float>();
    t.m = c.out(int(3 * gi + 1)).as<float>();
    t.v = c.out(int(3 * gi + 2)).as<float>();
    t.n = n;
    const bool vec = aligned(t.p_in, 16) && aligned(t.m_in, 16) && aligned(t.v_in, 16) && aligned(t.p, 16) &&
                     aligned(t.m, 16) && aligned(t.v, 16) && aligned(t.g, 4 * core::dtype_size(g.dtype()));
    const bool decay = params.decay_matrices && p.shape().rank() >= 2;
    b.gtype[b.count] = float_code(g.dtype(), what);
    b.flags[b.count] = uint8_t((decay ? kDecay : 0) | (vec ? kVec : 0));
    b.block_start[b.count + 1] = int32_t(b.block_start[b.count] + blocks);
    ++b.count;
  }
  flush();
}

}  // namespace

void register_optim_kernels(core::KernelRegistry& r) {
  for (DType t : {DType::f32, DType::bf16, DType::f16}) r.add(OpKind::grad_norm, t, grad_norm_fn);
  r.add(OpKind::adamw, DType::f32, adamw_fn);
}

}  // namespace brisk::cuda
