// A backend owns a device's memory and the kernels registered for it. Kernels
// register themselves for the (op, dtype) pairs they cover; supports() reads
// that registry, so a backend claims exactly what it implements. Thread pools,
// BLAS handles and streams travel in the ExecContext, never in globals.
#pragma once

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "brisk/core/op.h"

namespace brisk::core {

// Per-run resources a kernel may use.
struct ExecContext {
  int num_threads = 1;
  void* stream = nullptr;       // cudaStream_t on the CUDA backend
  void* blas_handle = nullptr;  // the CPU backend's GemmCache; brisk::cuda::LtState (cuBLASLt handle + plan cache) on CUDA
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
  // A copy ordered before every kernel queued after it, without waiting for
  // it: the host buffer must stay untouched until the next synchronize() (or
  // a read back) when it is page-locked; pageable memory is staged before
  // the call returns. Synchronous where the device is the host.
  virtual void copy_to_device_async(void* dst, const void* host_src, size_t bytes) {
    copy_to_device(dst, host_src, bytes);
  }
  // Sets device bytes to zero, ordered with the kernels (gradients each step).
  virtual void zero(void* dst, size_t bytes);
  // What the device is, for start-up lines and reports ("NVIDIA H100 80GB HBM3").
  virtual std::string description() const { return std::string(name()); }
  // The device's memory as its driver reports it now (cudaMemGetInfo):
  // what a run holds there, context included, is total - free. None on the
  // host, where peak RSS says it.
  struct MemoryInfo {
    size_t free = 0, total = 0;
  };
  virtual std::optional<MemoryInfo> device_memory() const { return std::nullopt; }

  // ---- whole-step graphs (CUDA graphs) ----
  // A backend that can record the kernels queued between capture_begin() and
  // capture_end() as one replayable graph says so here. Kernels run during a
  // capture are recorded, not executed; capture_end() returns an opaque
  // handle for graph_launch()/graph_destroy(). The executor uses these to
  // turn a planned step into one launch.
  virtual bool supports_graphs() const { return false; }
  virtual void capture_begin() {}
  virtual void* capture_end() { return nullptr; }
  virtual void graph_launch(void* /*graph*/) {}
  virtual void graph_destroy(void* /*graph*/) {}

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
