// The CPU backend: OpenMP-parallel, vectorised kernels and matrix products
// through OpenBLAS. num_threads 0 means one per core.
#pragma once

#include "brisk/core/backend.h"

namespace brisk::cpu {

class CpuBackend final : public core::Backend {
 public:
  explicit CpuBackend(int num_threads = 0);
  std::string_view name() const override { return "cpu"; }
  core::Device device() const override { return core::Device::cpu(); }
  core::Allocator& allocator() override { return core::HostAllocator::instance(); }
  void copy_to_device(void* dst, const void* src, size_t bytes) override;
  void copy_to_host(void* dst, const void* src, size_t bytes) override;
  core::ExecContext context() const override { return {num_threads_, nullptr, nullptr}; }
  int num_threads() const { return num_threads_; }

 private:
  int num_threads_;
};

// The number of threads our kernels use. The BLAS is kept single-threaded and
// driven from our threads, so the two never oversubscribe the cores.
void set_num_threads(int n);

}  // namespace brisk::cpu
