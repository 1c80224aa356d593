// Memory comes from an Allocator, one per device. The host allocator hands out
// 64-byte-aligned blocks (a cache line and a full AVX-512 register), so every
// kernel may use aligned vector loads on any tensor start. The counting
// wrapper is how tests and the planner's report learn what was really taken.
#pragma once

#include <atomic>
#include <cstddef>

namespace brisk::core {

inline constexpr size_t kAlignment = 64;
inline constexpr size_t align_up(size_t n, size_t a = kAlignment) { return (n + a - 1) / a * a; }

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* ptr, size_t bytes) = 0;
};

// 64-byte aligned host memory. Throws std::bad_alloc when the system refuses.
class HostAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes) override;
  void deallocate(void* ptr, size_t bytes) override;
  static HostAllocator& instance();
};

// Forwards to another allocator and keeps counts: live bytes, peak bytes and
// the number of calls. Thread-safe.
class CountingAllocator final : public Allocator {
 public:
  explicit CountingAllocator(Allocator& inner) : inner_(inner) {}
  void* allocate(size_t bytes) override;
  void deallocate(void* ptr, size_t bytes) override;

  size_t live_bytes() const { return live_.load(); }
  size_t peak_bytes() const { return peak_.load(); }
  size_t allocations() const { return allocs_.load(); }

 private:
  Allocator& inner_;
  std::atomic<size_t> live_{0}, peak_{0}, allocs_{0};
};

}  // namespace brisk::core
