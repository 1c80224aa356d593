// Tensors that own memory: parameters, gradients, optimizer state, data
// batches. Activations inside a step are not Tensors; they are planned slices
// of the executor's arena (see planner.h). A Tensor is a shared Storage plus
// an offset, a shape, strides and a dtype; copying a Tensor shares the bytes.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "brisk/core/allocator.h"
#include "brisk/core/device.h"
#include "brisk/core/shape.h"

namespace brisk::core {

class Storage {
 public:
  Storage(size_t bytes, Allocator& alloc, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Allocator& alloc_;
  Device device_;
};

// A non-owning, contiguous view handed to kernels.
struct TensorView {
  void* data = nullptr;
  TensorMeta meta;
  int64_t numel() const { return meta.shape.numel(); }
  const Shape& shape() const { return meta.shape; }
  DType dtype() const { return meta.dtype; }
  template <class T> T* as() const { return static_cast<T*>(data); }
};

class Tensor {
 public:
  Tensor() = default;
  // Uninitialized memory from `alloc` (the host allocator by default).
  static Tensor empty(const Shape& shape, DType dtype, Allocator& alloc = HostAllocator::instance(),
                      Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype);
  // Host tensor filled from normal(mean, std) with a counter-based generator:
  // the same seed gives the same values on every machine and thread count.
  static Tensor randn(const Shape& shape, DType dtype, uint64_t seed, float mean = 0.f, float std = 1.f);
  static Tensor uniform(const Shape& shape, DType dtype, uint64_t seed, float lo, float hi);

  bool defined() const { return storage_ != nullptr; }
  void* data() const { return static_cast<char*>(storage_->data()) + offset_; }
  template <class T> T* data_as() const { return static_cast<T*>(data()); }
  const TensorMeta& meta() const { return meta_; }
  const Shape& shape() const { return meta_.shape; }
  const Strides& strides() const { return strides_; }
  DType dtype() const { return meta_.dtype; }
  Device device() const { return storage_->device(); }
  int64_t numel() const { return meta_.shape.numel(); }
  size_t bytes() const { return meta_.bytes(); }
  bool is_contiguous() const;

  // Same bytes, new shape (must have the same element count; contiguous only).
  Tensor view(const Shape& shape) const;
  // Elements [offset, offset + shape.numel()) of this contiguous tensor as a
  // tensor of `shape` sharing its storage (parameters and gradients laid out
  // in one flat buffer for data parallelism).
  Tensor slice(int64_t offset, const Shape& shape) const;
  // Element i (row-major, contiguous) as double; for tests and tools.
  double item(int64_t i = 0) const { return load_as_double(data(), dtype(), size_t(i)); }
  void fill(double value);
  void copy_from(const Tensor& other);  // same meta; host only
  Tensor clone() const;
  TensorView as_view() const { return {data(), meta_}; }

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;
  TensorMeta meta_;
  Strides strides_{};
};

// The index of a host tensor's first NaN or infinite element; -1 when it
// has none (always for integer dtypes). What every reader of stored weights
// checks: one such value poisons every output after it.
int64_t first_non_finite(const Tensor& t);

}  // namespace brisk::core
