// classifier_train on CUDA (f32, bf16): the LM head, the mean cross-entropy
// loss and their backward in one op, chunk by chunk over the rows, so the
// (N, V) logits never exist (semantics: src/ops/fused_classifier.cpp).
//
// Per chunk of R rows, with the (R, V) logits in the op's workspace:
//   logits  = x_c W^T                  cuBLASLt (gemm.h)
//   row pass: one block per row        loss term lse - logit[target] into a
//                                      per-row slot; the logits overwritten
//                                      in place by (softmax - onehot) * seed/count
//   dx_c    = dlogits W                cuBLASLt
//   dW     += dlogits^T x_c            cuBLASLt, beta = 0 on the first chunk
//                                      (1 throughout when given dw_into,
//                                      which may be f32 under bf16 x, W)
// The row pass reads a row twice (an online max/sum in base 2 with the
// hardware's ex2, then the gradient) and writes it once; it is memory-bound.
// The chunk height comes from the workspace the op declares
// (CrossEntropyParams::chunk_floats): on a GPU the GPT asks for 1 GiB, two
// chunks of 8192 bf16 rows at G1's shape, since the dx product of a short
// chunk has too few output tiles to fill the chip (docs/gpu.md).
//
// Nothing is read on the host: the number of kept targets (the mean's
// divisor) is counted on the device by a first small kernel, and the seed
// (loss scale) is read by the row kernels from its device scalar. The loss
// is deterministic: per-row terms in scratch, summed in a fixed order by one
// block at the end.
//
// bf16: the logits chunk is bf16 (cuBLASLt's bf16 products take and give
// bf16 operands; the loss then sees bf16-rounded logits, as the unfused
// linear + cross_entropy pair would), with fp32 arithmetic in the row pass.
// dW accumulates in bf16 across chunks; with 2-byte logits a chunk holds
// twice the rows the op's (f32-sized) workspace was declared for, so there
// are half as many roundings.
//
// Targets outside [0, V) that are not ignore_index cannot be reported from
// the device: such a row gets a zero gradient and a NaN loss term, so the
// loss comes out NaN (a loss scaler or the caller's check then sees it).
//
// Workspace layout: [logits: chunk * V elements][pad to 4][row losses: N f32]
// [kept count: i32]. Without a workspace (core::run_op with none) the
// backend's BLAS workspace holds it, minus kLtReserve left to cuBLASLt.
#include <string>

#include "cuda_util.cuh"
#include "gemm.h"

namespace brisk::cuda {
namespace {

using core::DType;
using core::KernelCall;

constexpr size_t kLtReserve = size_t(4) << 20;

// The number of kept (in-range, not ignored) targets.
__global__ void count_kernel(const int32_t* __restrict__ t, int64_t n, int64_t v, int32_t ignore,
                             int32_t* __restrict__ count) {
  __shared__ int32_t warp_counts[32];
  int32_t c = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const int32_t tr = t[i];
    c += tr != ignore && tr >= 0 && tr < v;
  }
  for (int o = 16; o > 0; o >>= 1) c += __shfl_xor_sync(0xffffffffu, c, o);
  if ((threadIdx.x & 31) == 0) warp_counts[threadIdx.x >> 5] = c;
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t total = 0;
    for (int w = 0; w < int(blockDim.x >> 5); ++w) total += warp_counts[w];
    *count = total;
  }
}

// 2^x by the hardware's approximation (relative error about 2^-22): the
// row pass works in base 2, z = logit * log2(e), so each element costs one
// multiply and one ex2 per pass instead of a full-range expf.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

// Online max and sum of 2^(z - max) over a thread's elements, a group at a
// time: one rescale per group at most.
template <int kN>
__device__ __forceinline__ void take(const float (&z)[kN], float& m, float& s) {
  float gm = z[0];
#pragma unroll
  for (int j = 1; j < kN; ++j) gm = fmaxf(gm, z[j]);
  if (gm > m) {
    s *= fast_exp2(m - gm);  // m = -inf at first: s = 0 * 0
    m = gm;
  }
#pragma unroll
  for (int j = 0; j < kN; ++j) s += fast_exp2(z[j] - m);
}

// One block per row of the chunk: the row's loss term, then its logits
// become dlogits in place.
template <class T>
__global__ void row_kernel(T* __restrict__ logits, const int32_t* __restrict__ t, int64_t v, int32_t ignore,
                           const float* __restrict__ seed, const int32_t* __restrict__ count,
                           float* __restrict__ row_loss, bool vec) {
  constexpr int kVec = 16 / sizeof(T);
  __shared__ float scratch[32];
  T* l = logits + int64_t(blockIdx.x) * v;
  const int32_t tr = t[blockIdx.x];
  const bool kept = tr != ignore && tr >= 0 && tr < v;
  if (!kept) {
    // Ignored (or invalid: NaN, see the file comment): no loss, no gradient.
    for (int64_t j = threadIdx.x; j < v; j += blockDim.x) l[j] = narrow<T>(0.f);
    if (threadIdx.x == 0) row_loss[blockIdx.x] = tr == ignore ? 0.f : __int_as_float(0x7fc00000);
    return;
  }
  // Every read of the row happens before the block reductions' barriers,
  // every write after them: the target's logit is still the logit here.
  const float target_logit = widen(l[tr]);

  float m = -INFINITY, s = 0.f;
  const int64_t nv = vec ? v / kVec : 0;
  for (int64_t i = threadIdx.x; i < nv; i += blockDim.x) {
    uint4 raw = reinterpret_cast<const uint4*>(l)[i];
    const T* e = reinterpret_cast<const T*>(&raw);
    float z[kVec];
#pragma unroll
    for (int j = 0; j < kVec; ++j) z[j] = widen(e[j]) * kLog2e;
    take(z, m, s);
  }
  for (int64_t j = nv * kVec + threadIdx.x; j < v; j += blockDim.x) {
    const float z[1] = {widen(l[j]) * kLog2e};
    take(z, m, s);
  }
  const float row_max = block_max(m, scratch);  // in base-2 units
  const float sum = block_sum(m == -INFINITY ? 0.f : s * fast_exp2(m - row_max), scratch);

  const int32_t kept_count = *count;
  const float scale = kept_count > 0 ? *seed / float(kept_count) : 0.f;
  if (threadIdx.x == 0) row_loss[blockIdx.x] = (row_max + log2f(sum)) * kLn2 - target_logit;
  const float f = scale / sum;
  for (int64_t i = threadIdx.x; i < nv; i += blockDim.x) {
    uint4 raw = reinterpret_cast<const uint4*>(l)[i];
    T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float p = fast_exp2(widen(e[j]) * kLog2e - row_max) * f;
      e[j] = narrow<T>(i * kVec + j == tr ? p - scale : p);
    }
    reinterpret_cast<uint4*>(l)[i] = raw;
  }
  for (int64_t j = nv * kVec + threadIdx.x; j < v; j += blockDim.x) {
    const float p = fast_exp2(widen(l[j]) * kLog2e - row_max) * f;
    l[j] = narrow<T>(j == tr ? p - scale : p);
  }
}

// loss = sum of the row terms / kept count, in double, in a fixed order
// (thread i takes rows i, i + blockDim, ...; then a fixed tree).
__global__ void loss_kernel(const float* __restrict__ row_loss, int64_t n, const int32_t* __restrict__ count,
                            float* __restrict__ loss) {
  __shared__ double partial[1024];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += double(row_loss[i]);
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half >>= 1) {
    if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const double total = partial[0];
    const int32_t kept = *count;
    *loss = kept > 0 ? float(total / double(kept)) : (isnan(total) ? float(total) : 0.f);
  }
}

template <DType kType>
void classifier_kernel(const KernelCall& c) {
  using T = device_t<kType>;
  const core::TensorView &x = c.in(0), &w = c.in(1), &t = c.in(2), &seed = c.in(3);
  const core::TensorView &loss = c.out(0), &dx = c.out(1), &dw = c.out(2);
  // With dw_into (input 4, the same memory as dw) the gradient adds to it;
  // a bf16 head's dw_into may be f32 (the parameter's gradient).
  const bool into = c.inputs.size() == 5;
  const bool dw_f32 = dw.dtype() == DType::f32;
  if (x.shape().rank() != 2 || w.shape().rank() != 2 || x.shape()[1] != w.shape()[1] ||
      t.numel() != x.shape()[0] || seed.numel() != 1)
    throw core::ShapeError("cuda: classifier_train: want x (N, C), w (V, C), targets (N), seed (); got " +
                           x.shape().str() + ", " + w.shape().str() + ", " + t.shape().str() + ", " +
                           seed.shape().str());
  const int64_t n = x.shape()[0], k = x.shape()[1], v = w.shape()[0];
  const int32_t ignore = c.p<core::CrossEntropyParams>().ignore_index;
  const int64_t es = int64_t(sizeof(T));
  const core::ExecContext& ctx = context_of(c);
  const cudaStream_t stream = stream_of(c);
  auto* loss_p = static_cast<float*>(loss.data);

  if (n == 0) {  // mean over nothing: 0; no rows, no gradient
    check_cuda(cudaMemsetAsync(loss_p, 0, sizeof(float), stream), "cudaMemsetAsync(classifier_train loss)");
    if (v * k > 0 && !into) check_cuda(cudaMemsetAsync(dw.data, 0, size_t(v * k * es), stream), "cudaMemsetAsync(dw)");
    return;
  }

  // Scratch: the op's workspace, else the BLAS workspace (see the file comment).
  const int64_t tail = n * int64_t(sizeof(float)) + int64_t(sizeof(int32_t));
  auto rows_fitting = [&](int64_t bytes) -> int64_t {
    const int64_t room = bytes - tail - 3;  // 3: the pad before the row losses
    if (room < 0) return 0;
    return v > 0 ? std::min<int64_t>(n, room / (v * es)) : n;
  };
  core::ExecContext gemm_ctx = ctx;
  auto* base = static_cast<unsigned char*>(c.workspace);
  int64_t chunk = base ? rows_fitting(int64_t(c.workspace_bytes)) : 0;
  if (chunk < 1) {
    if (!ctx.blas_workspace || ctx.blas_workspace_bytes <= kLtReserve)
      throw core::BackendError("cuda: classifier_train: no workspace given and no BLAS workspace to borrow");
    const size_t own = ctx.blas_workspace_bytes - kLtReserve;
    base = static_cast<unsigned char*>(ctx.blas_workspace);
    gemm_ctx.blas_workspace = base + own;
    gemm_ctx.blas_workspace_bytes = kLtReserve;
    chunk = rows_fitting(int64_t(own));
    if (chunk < 1)
      throw core::BackendError("cuda: classifier_train: V = " + std::to_string(v) +
                               " is too large for the BLAS workspace; pass the op's declared workspace");
  }
  // Equal chunks, so the last one is not a sliver of a product.
  const int64_t chunks = (n + chunk - 1) / chunk;
  chunk = (n + chunks - 1) / chunks;
  T* logits = reinterpret_cast<T*>(base);
  const int64_t tail_at = (chunk * v * es + 3) / 4 * 4;
  auto* row_loss = reinterpret_cast<float*>(base + tail_at);
  auto* count = reinterpret_cast<int32_t*>(base + tail_at + n * int64_t(sizeof(float)));

  const auto* targets = static_cast<const int32_t*>(t.data);
  count_kernel<<<1, 1024, 0, stream>>>(targets, n, v, ignore, count);
  check_launch("classifier_train(count)");

  const bool vec = v % (16 / es) == 0 && alignment_of(logits) >= 16;
  const int64_t per_thread = vec ? 16 / es : 4;
  const int threads = int(std::clamp<int64_t>((v / per_thread + 31) / 32 * 32, 64, 1024));
  const auto* x_b = static_cast<const unsigned char*>(x.data);
  auto* dx_b = static_cast<unsigned char*>(dx.data);
  for (int64_t r0 = 0; r0 < n; r0 += chunk) {
    const int64_t rows = std::min(chunk, n - r0);
    const void* x_c = x_b + r0 * k * es;

    GemmArgs lg;  // logits (rows, V) = x_c (rows, C) @ W^T
    lg.dtype = kType;
    lg.trans_b = true;
    lg.M = rows;
    lg.N = v;
    lg.K = k;
    lg.A = x_c;
    lg.B = w.data;
    lg.C = logits;
    run_gemm(lg, gemm_ctx);

    row_kernel<T><<<unsigned(rows), threads, 0, stream>>>(logits, targets + r0, v, ignore,
                                                          static_cast<const float*>(seed.data), count,
                                                          row_loss + r0, vec);
    check_launch("classifier_train(rows)");

    GemmArgs gx;  // dx_c (rows, C) = dlogits (rows, V) @ W (V, C)
    gx.dtype = kType;
    gx.M = rows;
    gx.N = k;
    gx.K = v;
    gx.A = logits;
    gx.B = w.data;
    gx.C = dx_b + r0 * k * es;
    run_gemm(gx, gemm_ctx);

    GemmArgs gw;  // dW (V, C) (+)= dlogits^T (V, rows) @ x_c (rows, C)
    gw.dtype = kType;
    gw.trans_a = true;
    gw.M = v;
    gw.N = k;
    gw.K = rows;
    gw.A = logits;
    gw.B = x_c;
    gw.C = dw.data;
    gw.c_f32 = dw_f32 && kType != DType::f32;
    gw.beta = r0 == 0 && !into ? 0.f : 1.f;
    run_gemm(gw, gemm_ctx);
  }

  loss_kernel<<<1, 1024, 0, stream>>>(row_loss, n, count, loss_p);
  check_launch("classifier_train(loss)");
}

}  // namespace

void register_fused_classifier_kernels(core::KernelRegistry& r) {
  r.add(core::OpKind::classifier_train, DType::f32, classifier_kernel<DType::f32>);
  r.add(core::OpKind::classifier_train, DType::bf16, classifier_kernel<DType::bf16>);
}

}  // namespace brisk::cuda
