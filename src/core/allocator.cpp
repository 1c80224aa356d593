// Host allocation: aligned_alloc with 64-byte alignment, sizes rounded up as
// aligned_alloc requires.
#include "brisk/core/allocator.h"

#include <cstdlib>
#include <new>

namespace brisk::core {

void* HostAllocator::allocate(size_t bytes) {
  void* p = std::aligned_alloc(kAlignment, align_up(bytes == 0 ? 1 : bytes));
  if (!p) throw std::bad_alloc();
  return p;
}

void HostAllocator::deallocate(void* ptr, size_t) { std::free(ptr); }

HostAllocator& HostAllocator::instance() {
  static HostAllocator a;
  return a;
}

void* CountingAllocator::allocate(size_t bytes) {
  void* p = inner_.allocate(bytes);
  const size_t live = live_.fetch_add(bytes) + bytes;
  size_t peak = peak_.load();
  while (live > peak && !peak_.compare_exchange_weak(peak, live)) {
  }
  allocs_.fetch_add(1);
  return p;
}

void CountingAllocator::deallocate(void* ptr, size_t bytes) {
  inner_.deallocate(ptr, bytes);
  live_.fetch_sub(bytes);
}

}  // namespace brisk::core
