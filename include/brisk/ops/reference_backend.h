// A host backend whose kernels are the ops' scalar reference kernels. It runs
// any graph, slowly and obviously correctly: the oracle for every other
// backend, and the engine of the finite-difference gradient checks.
#pragma once

#include "brisk/core/backend.h"

namespace brisk::ops {

class ReferenceBackend final : public core::Backend {
 public:
  ReferenceBackend();
  std::string_view name() const override { return "reference"; }
  core::Device device() const override { return core::Device::cpu(); }
  core::Allocator& allocator() override { return core::HostAllocator::instance(); }
  void copy_to_device(void* dst, const void* src, size_t bytes) override;
  void copy_to_host(void* dst, const void* src, size_t bytes) override;
};

}  // namespace brisk::ops
