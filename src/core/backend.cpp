// Kernel registry lookups and one-off op execution.
#include "brisk/core/backend.h"

#include <cstring>

#include "brisk/core/error.h"
#include "brisk/core/graph.h"

namespace brisk::core {

void Backend::zero(void* dst, size_t bytes) {
  if (bytes) std::memset(dst, 0, bytes);
}

void KernelRegistry::add(OpKind op, DType dtype, KernelFn fn) { table_[size_t(op)][size_t(dtype)] = fn; }

KernelFn Backend::kernel_for(OpKind op, DType dtype) const {
  KernelFn fn = kernels_.find(op, dtype);
  if (!fn)
    throw BackendError("backend '" + std::string(name()) + "' has no kernel for op '" + std::string(op_name(op)) +
                       "' with dtype " + std::string(dtype_name(dtype)));
  return fn;
}

DType kernel_dtype(const Graph& g, const Node& n) {
  const int i = op_def(n.op).kernel_dtype_input;
  if (i >= 0 && size_t(i) < n.inputs.size()) return g.meta(n.inputs[size_t(i)]).dtype;
  return g.meta(n.outputs[0]).dtype;
}

void run_op(Backend& backend, OpKind op, std::span<const TensorView> inputs, std::span<const TensorView> outputs,
            const OpParams& params, void* workspace, size_t workspace_bytes) {
  const int i = op_def(op).kernel_dtype_input;
  const DType dt = (i >= 0 && size_t(i) < inputs.size()) ? inputs[size_t(i)].dtype() : outputs[0].dtype();
  const KernelFn fn = backend.kernel_for(op, dt);
  const ExecContext ctx = backend.context();
  KernelCall call;
  call.params = &params;
  call.inputs = inputs;
  call.outputs = outputs;
  call.workspace = workspace;
  call.workspace_bytes = workspace_bytes;
  call.ctx = &ctx;
  fn(call);
}

}  // namespace brisk::core
