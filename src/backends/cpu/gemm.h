// The one entry point of the CPU kernels to a matrix product:
//   C (m, n) = alpha * op(A) op(B) [+ bias] + beta * C
// row-major, transposes as flags, A/B in f32 or bf16, C in f32 or bf16.
//
// oneDNN's matmul primitive runs it wherever cpu_features() chose oneDNN
// (bf16-native always; fp32 on AVX-512 machines), with fp32 accumulation; the
// bias is a fused epilogue and beta = 1 a sum post-op, so gradient
// accumulation and the bias broadcast cost no extra pass over C. Primitives
// are created once per (shape, layout, dtypes, epilogue) and kept in a
// GemmCache that the CPU backend owns and hands to kernels through
// ExecContext::blas_handle: a training step creates none in the steady state.
//
// fp32 on the OpenBLAS path is cblas_sgemm split over our own OpenMP team
// (see gemm.cpp). bf16 without the native path is the caller's business
// (matmul.cpp widens to fp32 first): gemm() refuses bf16 operands there.
#pragma once

#include <cstdint>
#include <memory>

#include "brisk/core/backend.h"
#include "brisk/core/dtype.h"

namespace brisk::cpu {

struct Gemm {
  bool ta = false, tb = false;
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  int64_t lda = 0;
  const void* b = nullptr;
  int64_t ldb = 0;
  void* c = nullptr;
  int64_t ldc = 0;
  core::DType ab_type = core::DType::f32;  // A and B
  core::DType c_type = core::DType::f32;
  float alpha = 1.f;
  float beta = 0.f;  // 0 or 1
  const void* bias = nullptr;  // n values, dtype bias_type; added to every row
  core::DType bias_type = core::DType::f32;
};

class GemmCache;

// Primitive cache plus per-thread streams. Thread-safe: kernels that run one
// product per thread inside a parallel region share it.
std::unique_ptr<GemmCache, void (*)(GemmCache*)> make_gemm_cache();

// The cache the kernel call carries (ExecContext::blas_handle), or a process-
// wide one for calls without a CPU backend context.
GemmCache& gemm_cache_of(const core::ExecContext* ctx);

// Runs the product. Called outside a parallel region it uses the whole
// OpenMP team; inside one it runs on the calling thread.
void gemm(GemmCache& cache, const Gemm& g);

// The f32 case spelled out: C (m, n) = op(A) op(B) + beta C, C's rows ldc apart.
void sgemm(GemmCache& cache, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// Whether gemm() takes bf16 operands on this machine (bf16-native).
bool gemm_bf16_native();

// Number of primitives created so far (tests: none in the steady state).
int64_t gemm_primitives_created(const GemmCache& cache);

}  // namespace brisk::cpu
