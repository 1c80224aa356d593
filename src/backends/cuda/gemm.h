// The CUDA kernels' one entry point to a matrix product, through cuBLASLt:
//   C[b] (M, N) = alpha * op(A[b]) op(B[b]) [+ bias] + beta * C[b]   (row-major)
// optionally with a GELU epilogue that writes the pre-activation to `aux`,
// or GELU's gradient epilogue that reads it from there, or a bias gradient
// summed from A on its way through.
//
// cuBLASLt descriptors, layouts and the heuristic's algorithm are built once
// per shape and kept in a GemmCache inside the backend's LtState, which the
// backend hands to kernels as ExecContext::blas_handle. A steady-state call
// only sets the per-call pointers (bias, aux) and launches. Everything a plan
// creation does is host-side (no stream work), so a first call may happen
// while the stream is being captured into a CUDA graph.
//
// Precision: CUBLAS_COMPUTE_32F (true fp32 products; bf16/f16 operands on the
// tensor cores with fp32 accumulation). BRISK_CUDA_TF32=1 in the environment
// when the backend is created switches f32 products to TF32 tensor cores.
//
// Algorithm: the heuristic's first, unless BRISK_CUDA_GEMM_TUNE=1 at the
// backend's creation: then each plan's first call outside a graph capture
// times up to 8 of the heuristic's candidates and keeps the fastest (gemm.cu).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <mutex>

#include "brisk/core/backend.h"
#include "brisk/core/dtype.h"

namespace brisk::cuda {

enum class Epilogue : uint8_t {
  none,
  bias,           // D = AB + bias
  gelu_aux,       // aux = AB,        D = gelu_tanh(aux)
  gelu_aux_bias,  // aux = AB + bias, D = gelu_tanh(aux)
  dgelu,          // D = AB * gelu_tanh'(aux): aux is read (the GELU's input), not written
  // D = AB, and `bias` (M values of D's type, which must be f32: c_f32 or
  // an f32 product) is *written* with the sums of op(A) over K: row i of
  // op(A) summed, i.e. with A = dy^T (trans_a, dy stored (K, M)) the column
  // sums of dy, a bias gradient. cuBLASLt's BGRADB (our A is its B).
  bias_grad,
};

struct GemmArgs {
  core::DType dtype = core::DType::f32;  // A, B, C (and bias, aux)
  // C in f32 whatever `dtype` is (bf16/f16 products summed into an f32
  // gradient with beta = 1). No bias or aux with it, except bias_grad's.
  bool c_f32 = false;
  bool trans_a = false, trans_b = false;
  int64_t M = 0, N = 0, K = 0;
  const void* A = nullptr;
  const void* B = nullptr;
  void* C = nullptr;
  // Strided batches (element strides); a zero stride shares that operand.
  int64_t batch = 1, stride_a = 0, stride_b = 0, stride_c = 0;
  float alpha = 1.f, beta = 0.f;
  Epilogue epilogue = Epilogue::none;
  const void* bias = nullptr;  // (N): one value per output column; bias_grad: (M) f32, written
  const void* aux = nullptr;   // (M, N), leading dimension N (gelu epilogues only; written by gelu_aux*)
};

class GemmCache;

// What the backend owns for cuBLASLt: the handle, the plan cache and the
// precision switch. Thread-safe: the mutex covers the cache and the per-call
// descriptor updates up to the (asynchronous) cublasLtMatmul launch.
struct LtState {
  explicit LtState(cublasLtHandle_t h);
  ~LtState();
  LtState(const LtState&) = delete;
  LtState& operator=(const LtState&) = delete;

  cublasLtHandle_t handle = nullptr;  // not owned
  bool tf32 = false;                  // BRISK_CUDA_TF32=1 at creation
  bool tune = false;                  // BRISK_CUDA_GEMM_TUNE=1 at creation: time the heuristic's candidates
  std::mutex mu;
  std::unique_ptr<GemmCache> cache;
  int64_t plans_created = 0;  // tests: no new plans in the steady state
};

// The backend's LtState carried by the context; throws if there is none.
LtState& lt_state_of(const core::ExecContext& ctx);

// One cuBLASLt call with the context's BLAS workspace. Returns false (and
// launches nothing) when no algorithm supports the shape with this epilogue;
// the caller then falls back. Needs M, N, K > 0.
bool lt_matmul(const GemmArgs& g, const core::ExecContext& ctx);

// The whole product: empty shapes, K = 0 (C = beta * C [+ bias]), shared
// operands in batches, and a bias epilogue cuBLASLt refuses (added by a small
// kernel instead). The GELU epilogues are not accepted here: their fallback
// is the caller's (see linear_gelu.cu).
void run_gemm(const GemmArgs& g, const core::ExecContext& ctx);

// Largest power of two (up to 256) dividing the address and, for batches,
// every batch's start: what cuBLASLt may assume about a buffer.
uint32_t alignment_of(const void* p, int64_t stride_bytes = 0);

}  // namespace brisk::cuda
