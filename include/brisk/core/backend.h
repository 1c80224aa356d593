// A backend owns a device's memory and the kernels registered for it. Kernels
// register themselves for the (op, dtype) pairs they cover; supports() reads
// that registry, so a backend claims exactly what it implements. Thread pools,
// BLAS handles and streams travel in the ExecContext, never in globals.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <string_view>

#include "brisk/core/op.h"

namespace brisk::core {

// Per-run resources a kernel may use.
struct ExecContext {
  int num_threads = 1;
  void* stream = nullptr;       // cudaStream_t on the CUDA backend
  void* blas_handle = nullptr;  // cublasLtHandle_t on the CUDA backend
  // Device scratch the BLAS may use (cuBLASLt picks faster algorithms with
  // some); owned by the backend, valid for the backend's lifetime.
  void* blas_workspace = nullptr;
  size_t blas_workspace_bytes = 0;
};

class KernelRegistry {
 public:
  void add(OpKind op, DType dtype, KernelFn fn);
  KernelFn find(OpKind op, DType dtype) const {
    return table_[size_t(op)][size_t(dtype)];
  }
  bool supports(OpKind op, DType dtype) const { return find(op, dtype) != nullptr; }

 private:
  std::array<std::array<KernelFn, kNumDTypes>, kNumOps> table_{};
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  virtual Device device() const = 0;
  virtual Allocator& allocator() = 0;
  virtual void copy_to_device(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void copy_to_host(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void synchronize() {}
  virtual ExecContext context() const { return {}; }
  // Host memory for data on its way to this device: page-locked on a GPU (so
  // copies can be asynchronous), plain aligned memory on the CPU.
  virtual Allocator& staging_allocator() { return HostAllocator::instance(); }

  const KernelRegistry& kernels() const { return kernels_; }
  KernelRegistry& kernels() { return kernels_; }
  bool supports(OpKind op, DType dtype) const { return kernels_.supports(op, dtype); }
  // The kernel for a node: throws BackendError naming op, dtype and backend if missing.
  KernelFn kernel_for(OpKind op, DType dtype) const;

 private:
  KernelRegistry kernels_;
};

// The dtype that selects a node's kernel (see OpDef::kernel_dtype_input).
DType kernel_dtype(const Graph& g, const Node& n);

// Runs one op immediately on host buffers, outside any graph: optimizer steps
// and tools use it. Allocates nothing; `outputs` must already be sized.
void run_op(Backend& backend, OpKind op, std::span<const TensorView> inputs,
            std::span<const TensorView> outputs, const OpParams& params = {},
            void* workspace = nullptr, size_t workspace_bytes = 0);

}  // namespace brisk::core
