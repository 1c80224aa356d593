// matmul and linear on CUDA through cuBLASLt, f32 and bf16.
//
// cuBLASLt is column-major; our tensors are row-major. A row-major (M, N)
// matrix is the same bytes as a column-major (N, M) one, so C = op(A) op(B)
// is computed as C^T = op(B)^T op(A)^T: the operands swap places and every
// transpose flag keeps its meaning. Batches fold into rows when B is shared
// and A is not transposed (one large GEMM instead of many small ones), use
// cuBLASLt's strided batches when every batch has its own B, and fall back
// to one GEMM per batch for a transposed A against a shared B (rare: only
// weight gradients of batched inputs, which the models flatten first).
//
// Precision: compute type CUBLAS_COMPUTE_32F everywhere, so f32 products are
// true fp32 (no TF32) and bf16 products accumulate in fp32, as the reference.
//
// linear adds its bias in cuBLASLt's epilogue (CUBLASLT_EPILOGUE_BIAS); if the
// bias pointer is not 16-byte aligned, or no algorithm supports the epilogue
// for the shape, the bias is added by the elementwise add kernel instead.
//
// Descriptors and the algorithm are built per call. That costs a few
// microseconds of host time; caching them per shape is the next step once the
// executor runs real models here.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "brisk/core/op.h"
#include "cuda_backend.h"
#include "elementwise_kernels.h"

namespace brisk::cuda {
namespace {

using core::DType;
using core::KernelCall;
using core::OpKind;

// Row-major C[b] (M, N) = op(A[b]) @ op(B[b]) (+ bias (N)) for b < batch.
struct Gemm {
  DType dtype = DType::f32;
  bool trans_a = false, trans_b = false;
  int64_t M = 0, N = 0, K = 0;
  const void* A = nullptr;
  const void* B = nullptr;
  void* C = nullptr;
  int64_t batch = 1, stride_a = 0, stride_b = 0, stride_c = 0;  // in elements
  const void* bias = nullptr;
};

std::string gemm_str(const Gemm& g) {
  return std::string(core::dtype_name(g.dtype)) + " M=" + std::to_string(g.M) + " N=" + std::to_string(g.N) +
         " K=" + std::to_string(g.K) + " batch=" + std::to_string(g.batch) + (g.trans_a ? " trans_a" : "") +
         (g.trans_b ? " trans_b" : "") + (g.bias ? " +bias" : "");
}

// RAII for the cuBLASLt descriptors.
struct MatmulDesc {
  cublasLtMatmulDesc_t d = nullptr;
  ~MatmulDesc() { if (d) cublasLtMatmulDescDestroy(d); }
};
struct Layout {
  cublasLtMatrixLayout_t d = nullptr;
  ~Layout() { if (d) cublasLtMatrixLayoutDestroy(d); }
};
struct Preference {
  cublasLtMatmulPreference_t d = nullptr;
  ~Preference() { if (d) cublasLtMatmulPreferenceDestroy(d); }
};

// Column-major layout of a stored (rows, cols) matrix with leading dimension ld.
void make_layout(Layout& l, cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                 int64_t stride) {
  check_cublas(cublasLtMatrixLayoutCreate(&l.d, type, uint64_t(rows), uint64_t(cols), ld),
               "cublasLtMatrixLayoutCreate");
  if (batch > 1) {
    const int32_t count = int32_t(batch);
    check_cublas(cublasLtMatrixLayoutSetAttribute(l.d, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)),
                 "set BATCH_COUNT");
    check_cublas(cublasLtMatrixLayoutSetAttribute(l.d, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                  sizeof(stride)),
                 "set STRIDED_BATCH_OFFSET");
  }
}

// The largest power of two (up to 256) dividing the address and, for strided
// batches, every batch's start: what cuBLASLt may assume about the buffer.
uint32_t alignment_of(const void* p, int64_t stride_bytes) {
  uint64_t bits = uint64_t(reinterpret_cast<uintptr_t>(p)) | 256u;
  if (stride_bytes) bits |= uint64_t(stride_bytes);
  return uint32_t(bits & (~bits + 1));
}

// One cuBLASLt call. Returns false (and does nothing) when the bias epilogue
// was asked for but no algorithm supports it for this shape.
bool lt_matmul(const Gemm& g, const core::ExecContext& ctx) {
  const cudaDataType_t type = g.dtype == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F;
  const int64_t es = int64_t(core::dtype_size(g.dtype));
  auto lt = static_cast<cublasLtHandle_t>(ctx.blas_handle);
  auto stream = static_cast<cudaStream_t>(ctx.stream);

  MatmulDesc op;
  check_cublas(cublasLtMatmulDescCreate(&op.d, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  // Column-major view: D' (N, M) = op(B)^T (N, K) @ op(A)^T (K, M), with B as cuBLASLt's "A".
  const cublasOperation_t ta = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  check_cublas(cublasLtMatmulDescSetAttribute(op.d, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "set TRANSA");
  check_cublas(cublasLtMatmulDescSetAttribute(op.d, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "set TRANSB");
  if (g.bias) {
    // The bias runs along D's column-major rows, i.e. our N: one value per output column.
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    check_cublas(cublasLtMatmulDescSetAttribute(op.d, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)),
                 "set EPILOGUE");
    check_cublas(cublasLtMatmulDescSetAttribute(op.d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof(g.bias)),
                 "set BIAS_POINTER");
  }

  Layout la, lb, lc;
  if (g.trans_b) make_layout(la, type, g.K, g.N, g.K, g.batch, g.stride_b);  // B stored (N, K) row-major
  else make_layout(la, type, g.N, g.K, g.N, g.batch, g.stride_b);            // B stored (K, N) row-major
  if (g.trans_a) make_layout(lb, type, g.M, g.K, g.M, g.batch, g.stride_a);  // A stored (K, M) row-major
  else make_layout(lb, type, g.K, g.M, g.K, g.batch, g.stride_a);            // A stored (M, K) row-major
  make_layout(lc, type, g.N, g.M, g.N, g.batch, g.stride_c);

  Preference pref;
  check_cublas(cublasLtMatmulPreferenceCreate(&pref.d), "cublasLtMatmulPreferenceCreate");
  const uint64_t ws = ctx.blas_workspace ? uint64_t(ctx.blas_workspace_bytes) : 0;
  check_cublas(cublasLtMatmulPreferenceSetAttribute(pref.d, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                    sizeof(ws)),
               "set MAX_WORKSPACE_BYTES");
  const bool batched = g.batch > 1;
  const uint32_t align_a = alignment_of(g.B, batched ? g.stride_b * es : 0);  // cuBLASLt's A is our B
  const uint32_t align_b = alignment_of(g.A, batched ? g.stride_a * es : 0);
  const uint32_t align_c = alignment_of(g.C, batched ? g.stride_c * es : 0);
  check_cublas(cublasLtMatmulPreferenceSetAttribute(pref.d, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                                    sizeof(align_a)),
               "set MIN_ALIGNMENT_A");
  check_cublas(cublasLtMatmulPreferenceSetAttribute(pref.d, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                                                    sizeof(align_b)),
               "set MIN_ALIGNMENT_B");
  check_cublas(cublasLtMatmulPreferenceSetAttribute(pref.d, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c,
                                                    sizeof(align_c)),
               "set MIN_ALIGNMENT_C");
  check_cublas(cublasLtMatmulPreferenceSetAttribute(pref.d, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c,
                                                    sizeof(align_c)),
               "set MIN_ALIGNMENT_D");

  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t hs =
      cublasLtMatmulAlgoGetHeuristic(lt, op.d, la.d, lb.d, lc.d, lc.d, pref.d, 1, &result, &found);
  if (hs != CUBLAS_STATUS_SUCCESS || found == 0) {
    if (g.bias) return false;
    throw core::BackendError("cuda: matmul: cuBLASLt has no algorithm for " + gemm_str(g) + " (" +
                             cublasLtGetStatusName(hs) + ")");
  }
  const float alpha = 1.f, beta = 0.f;
  check_cublas(cublasLtMatmul(lt, op.d, &alpha, g.B, la.d, g.A, lb.d, &beta, g.C, lc.d, g.C, lc.d, &result.algo,
                              ctx.blas_workspace, size_t(ws), stream),
               "cublasLtMatmul");
  return true;
}

void add_bias(const Gemm& g, cudaStream_t s) {
  const int64_t n = g.batch * g.M * g.N;
  if (g.dtype == DType::bf16)
    launch_add_bf16(static_cast<const uint16_t*>(g.C), static_cast<const uint16_t*>(g.bias),
                    static_cast<uint16_t*>(g.C), n, g.N, s);
  else
    launch_add_f32(static_cast<const float*>(g.C), static_cast<const float*>(g.bias), static_cast<float*>(g.C), n,
                   g.N, s);
  check_cuda(cudaGetLastError(), "bias add launch");
}

void run_gemm(const Gemm& g, const core::ExecContext& ctx) {
  auto stream = static_cast<cudaStream_t>(ctx.stream);
  const size_t es = core::dtype_size(g.dtype);
  if (g.M == 0 || g.N == 0 || g.batch == 0) return;
  if (g.K == 0) {  // an empty sum: zeros (plus the bias)
    check_cuda(cudaMemsetAsync(g.C, 0, size_t(g.batch * g.M * g.N) * es, stream), "cudaMemsetAsync");
    if (g.bias) add_bias(g, stream);
    return;
  }
  if (g.batch > 1 && (g.stride_a == 0 || g.stride_b == 0)) {
    // A shared operand: one GEMM per batch (see the file comment).
    for (int64_t b = 0; b < g.batch; ++b) {
      Gemm one = g;
      one.batch = 1;
      one.A = static_cast<const char*>(g.A) + size_t(b * g.stride_a) * es;
      one.B = static_cast<const char*>(g.B) + size_t(b * g.stride_b) * es;
      one.C = static_cast<char*>(g.C) + size_t(b * g.stride_c) * es;
      run_gemm(one, ctx);
    }
    return;
  }
  const bool epilogue_ok = g.bias && alignment_of(g.bias, 0) >= 16;
  Gemm plain = g;
  if (!epilogue_ok) plain.bias = nullptr;
  if (!lt_matmul(plain, ctx)) {  // no algorithm with the bias epilogue
    plain.bias = nullptr;
    lt_matmul(plain, ctx);
  }
  if (g.bias && !plain.bias) add_bias(g, stream);
}

void check_dims(const core::TensorView& t, int min_rank, const char* op, const char* what) {
  if (t.shape().rank() < min_rank)
    throw core::ShapeError(std::string("cuda: ") + op + ": " + what + " must have rank >= " +
                           std::to_string(min_rank) + ", got " + t.shape().str());
}

// matmul: A (..., M, K) or (..., K, M); B (K, N)/(N, K) shared, or with A's batch dims.
template <DType kType>
void matmul_kernel(const KernelCall& c) {
  const auto& p = c.p<ops::MatmulParams>();
  const core::TensorView &a = c.in(0), &b = c.in(1), &y = c.out(0);
  check_dims(a, 2, "matmul", "A");
  check_dims(b, 2, "matmul", "B");
  const core::Shape &sa = a.shape(), &sb = b.shape();
  const int ra = sa.rank(), rb = sb.rank();
  Gemm g;
  g.dtype = kType;
  g.trans_a = p.trans_a;
  g.trans_b = p.trans_b;
  g.M = p.trans_a ? sa[ra - 1] : sa[ra - 2];
  g.K = p.trans_a ? sa[ra - 2] : sa[ra - 1];
  g.N = p.trans_b ? sb[rb - 2] : sb[rb - 1];
  g.A = a.data;
  g.B = b.data;
  g.C = y.data;
  const int64_t mat = sa[ra - 1] * sa[ra - 2];
  const int64_t batch = mat ? a.numel() / mat : 0;
  if (rb == 2) {
    if (!p.trans_a) {
      g.M *= batch;  // rows of all batches are one tall matrix
    } else {
      g.batch = batch;
      g.stride_a = g.M * g.K;
      g.stride_b = 0;
      g.stride_c = g.M * g.N;
    }
  } else {
    if (rb != ra)
      throw core::ShapeError("cuda: matmul: batched B must have A's rank, got " + sa.str() + " and " + sb.str());
    if (b.numel() != batch * g.K * g.N)
      throw core::ShapeError("cuda: matmul: batched B must have A's batch dims, got " + sa.str() + " and " +
                             sb.str());
    g.batch = batch;
    g.stride_a = g.M * g.K;
    g.stride_b = g.K * g.N;
    g.stride_c = g.M * g.N;
  }
  run_gemm(g, context_of(c));
}

// linear: x (..., in) @ w^T with w (out, in), plus bias (out) when given.
template <DType kType>
void linear_kernel(const KernelCall& c) {
  const core::TensorView &x = c.in(0), &w = c.in(1), &y = c.out(0);
  check_dims(x, 1, "linear", "x");
  check_dims(w, 2, "linear", "w");
  Gemm g;
  g.dtype = kType;
  g.trans_b = true;
  g.K = x.shape().last();
  g.M = g.K ? x.numel() / g.K : y.numel() / std::max<int64_t>(1, w.shape()[0]);
  g.N = w.shape()[0];
  g.A = x.data;
  g.B = w.data;
  g.C = y.data;
  if (c.inputs.size() > 2 && c.in(2).data) g.bias = c.in(2).data;
  run_gemm(g, context_of(c));
}

}  // namespace

void register_matmul_kernels(core::KernelRegistry& r) {
  r.add(OpKind::matmul, DType::f32, matmul_kernel<DType::f32>);
  r.add(OpKind::matmul, DType::bf16, matmul_kernel<DType::bf16>);
  r.add(OpKind::linear, DType::f32, linear_kernel<DType::f32>);
  r.add(OpKind::linear, DType::bf16, linear_kernel<DType::bf16>);
}

}  // namespace brisk::cuda
