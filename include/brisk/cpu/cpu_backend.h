// The CPU backend: OpenMP-parallel, vectorised kernels and matrix products
// through OpenBLAS. num_threads 0 means one per core.
#pragma once

#include <memory>

#include "brisk/core/backend.h"

namespace brisk::cpu {

class GemmCache;  // gemm.h: the matrix-product primitives, created once per shape

class CpuBackend final : public core::Backend {
 public:
  explicit CpuBackend(int num_threads = 0);
  std::string_view name() const override { return "cpu"; }
  core::Device device() const override { return core::Device::cpu(); }
  core::Allocator& allocator() override { return core::HostAllocator::instance(); }
  void copy_to_device(void* dst, const void* src, size_t bytes) override;
  void copy_to_host(void* dst, const void* src, size_t bytes) override;
  // blas_handle: this backend's GemmCache.
  core::ExecContext context() const override { return {num_threads_, nullptr, gemm_cache_.get()}; }
  int num_threads() const { return num_threads_; }
  GemmCache& gemm_cache() { return *gemm_cache_; }

 private:
  int num_threads_;
  std::unique_ptr<GemmCache, void (*)(GemmCache*)> gemm_cache_;
};

// The number of threads our kernels use. The BLAS is kept single-threaded and
// driven from our threads, so the two never oversubscribe the cores.
void set_num_threads(int n);

}  // namespace brisk::cpu
