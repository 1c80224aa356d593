// linear_param_grad (dy, x, dw_into, db_into) -> (dw, db) on CUDA:
//   dw += dy^T x (rows deep), db += the column sums of dy.
// One cuBLASLt product with beta = 1 into dw and the BGRADB epilogue, which
// sums dy's columns while the product streams dy through the tensor cores,
// writing them to the op's workspace; a small kernel then adds them to db
// (the epilogue writes a bias gradient, brisk adds it to the parameter's,
// which gradient accumulation needs). Unfused, the column sums were a
// separate pass reading all of dy (rows, out) again. Where cuBLASLt refuses
// the epilogue (alignment, a type it lacks), the product and sum's kernel
// run one after the other: the two kernels of the unfused graph.
// Measured on an H200 (G1, docs/gpu.md): correct, but the epilogue's
// reduction slows each product by about what the separate column sums cost,
// and the step was 1% slower; the GPT leaves the fusion off on a GPU.
#include <cstdint>

#include "cuda_backend.h"
#include "cuda_util.cuh"
#include "gemm.h"

namespace brisk::cuda {
namespace {

using core::DType;
using core::KernelCall;
using core::OpKind;

__global__ void add_into_kernel(float* __restrict__ y, const float* __restrict__ x, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] += x[i];
}

template <DType D>
void linear_param_grad_op(const KernelCall& c) {
  const core::TensorView &dy = c.in(0), &x = c.in(1);
  const int64_t rows = dy.shape()[0], out = dy.shape()[1], in = x.shape()[1];
  if (rows == 0 || out == 0) return;  // nothing added: the accumulators are the outputs
  float* db = c.out(1).as<float>();
  const core::ExecContext& ctx = context_of(c);
  GemmArgs g;
  g.dtype = D;
  g.c_f32 = D != DType::f32;
  g.trans_a = true;  // (out, rows) x (rows, in)
  g.M = out;
  g.N = in;
  g.K = rows;
  g.A = dy.data;
  g.B = x.data;
  g.C = c.out(0).data;
  g.beta = 1.f;
  if (in > 0 && c.workspace && c.workspace_bytes >= size_t(out) * sizeof(float)) {
    GemmArgs fused = g;
    fused.epilogue = Epilogue::bias_grad;
    fused.bias = c.workspace;
    if (lt_matmul(fused, ctx)) {
      constexpr int kThreads = 256;
      add_into_kernel<<<unsigned((out + kThreads - 1) / kThreads), kThreads, 0, stream_of(c)>>>(
          db, static_cast<const float*>(c.workspace), out);
      check_launch("linear_param_grad(bias gradient)");
      return;
    }
  }
  run_gemm(g, ctx);
  const core::OpParams sum_params = core::ReduceParams{0, false};
  const core::TensorView sum_in[] = {dy, c.in(3)};
  KernelCall sc = c;
  sc.params = &sum_params;
  sc.inputs = sum_in;
  sc.outputs = c.outputs.subspan(1, 1);
  sum_kernel(sc);
}

}  // namespace

void register_linear_param_grad_kernels(core::KernelRegistry& r) {
  r.add(OpKind::linear_param_grad, DType::f32, linear_param_grad_op<DType::f32>);
  r.add(OpKind::linear_param_grad, DType::bf16, linear_param_grad_op<DType::bf16>);
  r.add(OpKind::linear_param_grad, DType::f16, linear_param_grad_op<DType::f16>);
}

}  // namespace brisk::cuda
