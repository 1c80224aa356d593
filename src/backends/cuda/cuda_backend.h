// The CUDA backend (private to libbrisk_cuda.so; the engine reaches it only
// through core::load_cuda_backend and the core::Backend interface, so no
// header of the engine mentions a CUDA type).
//
// One stream and one cuBLASLt handle per backend, passed to kernels through
// ExecContext: kernels never create or look up resources themselves, so the
// same kernel sequence can be captured as a CUDA graph. Memory comes from a
// small caching allocator because cudaMalloc/cudaFree synchronise the device.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "brisk/core/backend.h"
#include "brisk/core/error.h"

namespace brisk::cuda {

struct LtState;  // gemm.h: the cuBLASLt handle, plan cache and precision mode

// Throws core::BackendError naming the call and the CUDA error.
void check_cuda(cudaError_t err, const char* what);
void check_cublas(cublasStatus_t status, const char* what);

// Device memory, cached by size. Freed blocks are kept for reuse (sizes are
// rounded up so that near-equal requests share blocks); everything goes back
// to the driver when the allocator dies or when a cudaMalloc fails.
class CudaAllocator final : public core::Allocator {
 public:
  explicit CudaAllocator(int device) : device_(device) {}
  ~CudaAllocator() override;
  void* allocate(size_t bytes) override;
  void deallocate(void* ptr, size_t bytes) override;
  void release_cached();
  size_t cached_bytes() const;

 private:
  static size_t round_size(size_t bytes);
  int device_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> free_;  // rounded size -> block
  size_t cached_ = 0;
};

// Page-locked host memory (cudaHostAlloc): loader buffers the GPU can copy
// from asynchronously.
class PinnedHostAllocator final : public core::Allocator {
 public:
  void* allocate(size_t bytes) override;
  void deallocate(void* ptr, size_t bytes) override;
};

class CudaBackend final : public core::Backend {
 public:
  // Throws core::BackendError if the device cannot be set up.
  explicit CudaBackend(int device);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string_view name() const override { return "cuda"; }
  core::Device device() const override { return core::Device::cuda(device_); }
  core::Allocator& allocator() override { return allocator_; }
  void copy_to_device(void* dst, const void* host_src, size_t bytes) override;
  void copy_to_host(void* host_dst, const void* src, size_t bytes) override;
  void synchronize() override;
  core::ExecContext context() const override;
  core::Allocator& staging_allocator() override { return pinned_; }
  void copy_to_device_async(void* dst, const void* host_src, size_t bytes) override;
  void zero(void* dst, size_t bytes) override;
  std::string description() const override { return description_; }
  std::optional<MemoryInfo> device_memory() const override;
  bool supports_graphs() const override { return true; }
  void capture_begin() override;
  void* capture_end() override;
  void graph_launch(void* graph) override;
  void graph_destroy(void* graph) override;

 private:
  void release();
  int device_;
  CudaAllocator allocator_;
  PinnedHostAllocator pinned_;
  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  std::unique_ptr<LtState> lt_state_;  // ExecContext::blas_handle points here
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::string description_;
};

// Registration entry points of the kernel files, as on the CPU backend.
void register_elementwise_kernels(core::KernelRegistry& r);
void register_matmul_kernels(core::KernelRegistry& r);
void register_activation_kernels(core::KernelRegistry& r);  // gelu, gelu_backward, matmul_gelu_backward
void register_memory_ops_kernels(core::KernelRegistry& r);  // cast, fill, copy, accumulate
void register_shape_ops_kernels(core::KernelRegistry& r);  // reshape, permute, split, concat
void register_reduce_kernels(core::KernelRegistry& r);  // sum, mean, expand
// sum's kernel for x's dtype (f32, bf16, f16), for ops that compose it.
void sum_kernel(const core::KernelCall& c);
void register_linear_param_grad_kernels(core::KernelRegistry& r);  // linear_param_grad
void register_layernorm_kernels(core::KernelRegistry& r);  // layernorm, layernorm_backward, add_layernorm
void register_softmax_kernels(core::KernelRegistry& r);  // softmax, softmax_backward
void register_cross_entropy_kernels(core::KernelRegistry& r);  // cross_entropy, cross_entropy_backward
void register_embedding_kernels(core::KernelRegistry& r);  // embedding, embedding_backward
void register_optim_kernels(core::KernelRegistry& r);  // grad_norm, adamw
void register_attention_kernels(core::KernelRegistry& r);  // attention, attention_backward
void register_flash_attention_kernels(core::KernelRegistry& r);  // flash_attention, flash_attention_backward
void register_linear_gelu_kernels(core::KernelRegistry& r);  // linear_gelu
void register_fused_classifier_kernels(core::KernelRegistry& r);  // classifier_train

// The execution context of a kernel call; throws if the caller passed none
// (a CUDA kernel cannot guess its stream or BLAS handle).
const core::ExecContext& context_of(const core::KernelCall& c);
inline cudaStream_t stream_of(const core::KernelCall& c) { return static_cast<cudaStream_t>(context_of(c).stream); }

}  // namespace brisk::cuda
