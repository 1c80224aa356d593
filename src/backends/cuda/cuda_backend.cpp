// CUDA backend: device set-up, the caching allocator, host<->device copies,
// and the factory that core::load_cuda_backend finds with dlsym.
//
// The factory is the library's only way in. It checks for a device before
// touching anything else and turns every failure into a reason string: an
// exception must not cross the dlopen boundary, and "no GPU" is an expected
// answer on CPU-only machines, not an error.
#include "cuda_backend.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>

#include "brisk/core/backend_loader.h"
#include "gemm.h"

namespace brisk::cuda {

void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw core::BackendError(std::string("cuda: ") + what + " failed: " + cudaGetErrorName(err) + " (" +
                             cudaGetErrorString(err) + ")");
}

void check_cublas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw core::BackendError(std::string("cuda: ") + what + " failed: " + cublasLtGetStatusName(status) + " (" +
                             cublasLtGetStatusString(status) + ")");
}

const core::ExecContext& context_of(const core::KernelCall& c) {
  if (!c.ctx || !c.ctx->stream)
    throw core::BackendError("cuda: kernel called without the CUDA backend's ExecContext (stream, cuBLASLt handle)");
  return *c.ctx;
}

// ---- allocator ----------------------------------------------------------------

void* PinnedHostAllocator::allocate(size_t bytes) {
  void* p = nullptr;
  if (cudaHostAlloc(&p, std::max<size_t>(bytes, 1), cudaHostAllocDefault) != cudaSuccess) {
    (void)cudaGetLastError();
    throw std::bad_alloc();
  }
  return p;
}

void PinnedHostAllocator::deallocate(void* ptr, size_t) {
  if (ptr) (void)cudaFreeHost(ptr);
}

size_t CudaAllocator::round_size(size_t bytes) {
  // 512 B granules for small blocks, 2 MiB for large ones: enough sharing to
  // reuse blocks across near-equal requests without wasting much.
  constexpr size_t kSmall = 512, kLarge = size_t(2) << 20;
  const size_t g = bytes < kLarge ? kSmall : kLarge;
  return (std::max<size_t>(bytes, 1) + g - 1) / g * g;
}

void* CudaAllocator::allocate(size_t bytes) {
  const size_t size = round_size(bytes);
  {
    std::lock_guard lock(mu_);
    // Best fit, but never hand out a block more than twice the request.
    auto it = free_.lower_bound(size);
    if (it != free_.end() && it->first <= 2 * size) {
      void* p = it->second;
      cached_ -= it->first;
      free_.erase(it);
      return p;
    }
  }
  check_cuda(cudaSetDevice(device_), "cudaSetDevice");
  void* p = nullptr;
  if (cudaMalloc(&p, size) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky-free error state before retrying
    release_cached();
    if (cudaMalloc(&p, size) != cudaSuccess) {
      (void)cudaGetLastError();
      throw std::bad_alloc();
    }
  }
  return p;
}

void CudaAllocator::deallocate(void* ptr, size_t bytes) {
  if (!ptr) return;
  // The block may still be in use by queued kernels on the backend's stream;
  // reusing it for later work on the same stream is ordered, so caching is safe.
  std::lock_guard lock(mu_);
  const size_t size = round_size(bytes);
  free_.emplace(size, ptr);
  cached_ += size;
}

void CudaAllocator::release_cached() {
  std::lock_guard lock(mu_);
  if (!free_.empty()) (void)cudaDeviceSynchronize();
  for (auto& [size, p] : free_) (void)cudaFree(p);
  free_.clear();
  cached_ = 0;
}

size_t CudaAllocator::cached_bytes() const {
  std::lock_guard lock(mu_);
  return cached_;
}

CudaAllocator::~CudaAllocator() { release_cached(); }

// ---- backend --------------------------------------------------------------------

CudaBackend::CudaBackend(int device) : device_(device), allocator_(device) {
  try {
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check_cublas(cublasLtCreate(&lt_), "cublasLtCreate");
    lt_state_ = std::make_unique<LtState>(lt_);
    // 32 MiB is NVIDIA's recommendation for cuBLASLt on Hopper.
    workspace_bytes_ = size_t(32) << 20;
    check_cuda(cudaMalloc(&workspace_, workspace_bytes_), "cudaMalloc(cuBLASLt workspace)");
    cudaDeviceProp prop{};
    check_cuda(cudaGetDeviceProperties(&prop, device_), "cudaGetDeviceProperties");
    description_ = std::string(prop.name) + " (sm_" + std::to_string(prop.major) + std::to_string(prop.minor) +
                   ", " + std::to_string(prop.multiProcessorCount) + " SMs, " +
                   std::to_string(prop.totalGlobalMem >> 20) + " MiB)";
  } catch (...) {
    release();  // the destructor does not run for a half-built object
    throw;
  }
  register_elementwise_kernels(kernels());
  register_matmul_kernels(kernels());
  register_activation_kernels(kernels());
  register_memory_ops_kernels(kernels());
  register_shape_ops_kernels(kernels());
  register_reduce_kernels(kernels());
  register_layernorm_kernels(kernels());
  register_softmax_kernels(kernels());
  register_cross_entropy_kernels(kernels());
  register_embedding_kernels(kernels());
  register_optim_kernels(kernels());
  register_attention_kernels(kernels());
  register_flash_attention_kernels(kernels());
  register_linear_gelu_kernels(kernels());
  register_linear_param_grad_kernels(kernels());
  register_fused_classifier_kernels(kernels());
}

void CudaBackend::release() {
  if (stream_) (void)cudaStreamSynchronize(stream_);
  if (workspace_) (void)cudaFree(workspace_);
  lt_state_.reset();  // its cached descriptors first
  if (lt_) (void)cublasLtDestroy(lt_);
  if (stream_) (void)cudaStreamDestroy(stream_);
  workspace_ = nullptr;
  lt_ = nullptr;
  stream_ = nullptr;
}

CudaBackend::~CudaBackend() { release(); }

void CudaBackend::copy_to_device(void* dst, const void* host_src, size_t bytes) {
  if (bytes == 0) return;
  check_cuda(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync(H2D)");
  // Synchronous on purpose: the caller may reuse or free the host buffer at once.
  check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

void CudaBackend::copy_to_host(void* host_dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  check_cuda(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync(D2H)");
  check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

void CudaBackend::copy_to_device_async(void* dst, const void* host_src, size_t bytes) {
  if (bytes == 0) return;
  check_cuda(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync(H2D)");
}

std::optional<core::Backend::MemoryInfo> CudaBackend::device_memory() const {
  check_cuda(cudaSetDevice(device_), "cudaSetDevice");
  MemoryInfo m;
  check_cuda(cudaMemGetInfo(&m.free, &m.total), "cudaMemGetInfo");
  return m;
}

void CudaBackend::zero(void* dst, size_t bytes) {
  if (bytes) check_cuda(cudaMemsetAsync(dst, 0, bytes, stream_), "cudaMemsetAsync");
}

// Graph capture in the thread-local mode: only this thread's calls are
// recorded, and a stray synchronising call elsewhere in the process does not
// invalidate the capture.
void CudaBackend::capture_begin() {
  check_cuda(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
}

void* CudaBackend::capture_end() {
  cudaGraph_t graph = nullptr;
  check_cuda(cudaStreamEndCapture(stream_, &graph), "cudaStreamEndCapture");
  cudaGraphExec_t exec = nullptr;
  const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
  (void)cudaGraphDestroy(graph);
  check_cuda(err, "cudaGraphInstantiate");
  return exec;
}

void CudaBackend::graph_launch(void* graph) {
  check_cuda(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph), stream_), "cudaGraphLaunch");
}

void CudaBackend::graph_destroy(void* graph) {
  if (graph) (void)cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph));
}

void CudaBackend::synchronize() { check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

core::ExecContext CudaBackend::context() const {
  core::ExecContext ctx;
  ctx.num_threads = 1;
  ctx.stream = stream_;
  ctx.blas_handle = lt_state_.get();  // LtState*, see gemm.h
  ctx.blas_workspace = workspace_;
  ctx.blas_workspace_bytes = workspace_bytes_;
  return ctx;
}

}  // namespace brisk::cuda

// ---- the library's exported entry points ------------------------------------------

namespace {
void write_reason(char* buf, size_t size, const std::string& s) {
  if (!buf || size == 0) return;
  std::snprintf(buf, size, "%s", s.c_str());
}
}  // namespace

extern "C" __attribute__((visibility("default"))) size_t brisk_cuda_backend_abi() {
  return brisk::core::backend_abi_tag();
}

extern "C" __attribute__((visibility("default"))) brisk::core::Backend* brisk_create_cuda_backend(
    int device_index, char* why_not, size_t why_not_size) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    write_reason(why_not, why_not_size,
                 std::string("no GPU: cudaGetDeviceCount returned ") + cudaGetErrorName(err) + " (" +
                     cudaGetErrorString(err) + "), " + std::to_string(count) + " device(s)");
    return nullptr;
  }
  if (device_index < 0 || device_index >= count) {
    write_reason(why_not, why_not_size,
                 "no CUDA device " + std::to_string(device_index) + ": " + std::to_string(count) + " present");
    return nullptr;
  }
  try {
    return new brisk::cuda::CudaBackend(device_index);
  } catch (const std::exception& e) {
    write_reason(why_not, why_not_size, std::string("CUDA backend set-up failed: ") + e.what());
  } catch (...) {
    write_reason(why_not, why_not_size, "CUDA backend set-up failed with an unknown exception");
  }
  return nullptr;
}
