// linear_param_grad on the CPU: matmul's kernel (dw += dy^T x, beta = 1)
// then sum's (db += the column sums of dy), over the op's own views. The same
// kernels as the two nodes the fusion replaces, so the same bits; the op
// exists for CUDA's BGRADB epilogue, and every CPU run exercises the fused
// graph a GPU runs.
#include "brisk/core/op.h"
#include "kernels.h"

namespace brisk::cpu {
namespace {

using core::KernelCall;

// The matmul and sum kernels of this backend, looked up once.
const core::KernelRegistry& composed_kernels() {
  static const core::KernelRegistry r = [] {
    core::KernelRegistry k;
    register_matmul_kernels(k);
    register_reduce_kernels(k);
    return k;
  }();
  return r;
}

void linear_param_grad_composed(const KernelCall& c) {
  const core::DType t = c.in(0).dtype();
  const core::OpParams mm_params = core::MatmulParams{true, false};
  const core::TensorView mm_in[] = {c.in(0), c.in(1), c.in(2)};
  KernelCall mc = c;
  mc.params = &mm_params;
  mc.inputs = mm_in;
  mc.outputs = c.outputs.subspan(0, 1);
  composed_kernels().find(core::OpKind::matmul, t)(mc);

  const core::OpParams sum_params = core::ReduceParams{0, false};
  const core::TensorView sum_in[] = {c.in(0), c.in(3)};
  KernelCall sc = c;
  sc.params = &sum_params;
  sc.inputs = sum_in;
  sc.outputs = c.outputs.subspan(1, 1);
  sc.workspace = nullptr;  // sum takes no scratch
  sc.workspace_bytes = 0;
  composed_kernels().find(core::OpKind::sum, t)(sc);
}

}  // namespace

void register_linear_param_grad_kernels(core::KernelRegistry& r) {
  for (core::DType t : {core::DType::f32, core::DType::bf16, core::DType::f16})
    if (composed_kernels().supports(core::OpKind::matmul, t) && composed_kernels().supports(core::OpKind::sum, t))
      r.add(core::OpKind::linear_param_grad, t, linear_param_grad_composed);
}

}  // namespace brisk::cpu
