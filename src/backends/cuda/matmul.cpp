// matmul and linear on CUDA (f32, bf16, f16): shape handling only; the
// product itself is gemm.h's cached cuBLASLt path.
//
// Batches fold into rows when B is shared and A is not transposed (one large
// GEMM instead of many small ones), use cuBLASLt's strided batches when every
// batch has its own B, and run one GEMM per batch for a transposed A against
// a shared B (rare: only weight gradients of batched inputs, which the models
// flatten first).
//
// linear adds its bias in cuBLASLt's epilogue (CUBLASLT_EPILOGUE_BIAS);
// run_gemm adds it with a small kernel instead when the epilogue is refused.
#include <algorithm>
#include <cstdint>
#include <string>

#include "brisk/core/op.h"
#include "cuda_backend.h"
#include "gemm.h"

namespace brisk::cuda {
namespace {

using core::DType;
using core::KernelCall;
using core::OpKind;

void check_dims(const core::TensorView& t, int min_rank, const char* op, const char* what) {
  if (t.shape().rank() < min_rank)
    throw core::ShapeError(std::string("cuda: ") + op + ": " + what + " must have rank >= " +
                           std::to_string(min_rank) + ", got " + t.shape().str());
}

// matmul: A (..., M, K) or (..., K, M); B (K, N)/(N, K) shared, or with A's batch dims;
// optionally an f32 accumulator C that the product is added to.
template <DType kType>
void matmul_kernel(const KernelCall& c) {
  const auto& p = c.p<core::MatmulParams>();
  const core::TensorView &a = c.in(0), &b = c.in(1), &y = c.out(0);
  check_dims(a, 2, "matmul", "A");
  check_dims(b, 2, "matmul", "B");
  const core::Shape &sa = a.shape(), &sb = b.shape();
  const int ra = sa.rank(), rb = sb.rank();
  GemmArgs g;
  g.dtype = kType;
  g.trans_a = p.trans_a;
  g.trans_b = p.trans_b;
  g.M = p.trans_a ? sa[ra - 1] : sa[ra - 2];
  g.K = p.trans_a ? sa[ra - 2] : sa[ra - 1];
  g.N = p.trans_b ? sb[rb - 2] : sb[rb - 1];
  g.A = a.data;
  g.B = b.data;
  g.C = y.data;
  if (c.inputs.size() == 3) {  // summed into the f32 accumulator (input 2, y's memory): beta = 1
    g.c_f32 = true;
    g.beta = 1.f;
  }
  int64_t batch = 1;  // from the dims, not numel / (M K): K may be 0
  for (int i = 0; i < ra - 2; ++i) batch *= sa[i];
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
  GemmArgs g;
  g.dtype = kType;
  g.trans_b = true;
  g.K = x.shape().last();
  g.M = g.K ? x.numel() / g.K : y.numel() / std::max<int64_t>(1, w.shape()[0]);
  g.N = w.shape()[0];
  g.A = x.data;
  g.B = w.data;
  g.C = y.data;
  if (c.inputs.size() > 2 && c.in(2).data) {
    g.epilogue = Epilogue::bias;
    g.bias = c.in(2).data;
  }
  run_gemm(g, context_of(c));
}

}  // namespace

void register_matmul_kernels(core::KernelRegistry& r) {
  r.add(OpKind::matmul, DType::f32, matmul_kernel<DType::f32>);
  r.add(OpKind::matmul, DType::bf16, matmul_kernel<DType::bf16>);
  r.add(OpKind::matmul, DType::f16, matmul_kernel<DType::f16>);
  r.add(OpKind::linear, DType::f32, linear_kernel<DType::f32>);
  r.add(OpKind::linear, DType::bf16, linear_kernel<DType::bf16>);
  r.add(OpKind::linear, DType::f16, linear_kernel<DType::f16>);
}

}  // namespace brisk::cuda
