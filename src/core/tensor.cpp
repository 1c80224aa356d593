// Owning tensors and their storage. Random fills use a counter-based
// generator (splitmix64 of seed and element index) so the values depend only
// on the seed and the position, never on thread count or call order.
#include "brisk/core/tensor.h"

#include <cmath>
#include <cstring>

#include "brisk/core/error.h"

namespace brisk::core {

Storage::Storage(size_t bytes, Allocator& alloc, Device device)
    : data_(alloc.allocate(bytes)), bytes_(bytes), alloc_(alloc), device_(device) {}

Storage::~Storage() { alloc_.deallocate(data_, bytes_); }

Tensor Tensor::empty(const Shape& shape, DType dtype, Allocator& alloc, Device device) {
  Tensor t;
  t.meta_ = {shape, dtype};
  t.strides_ = contiguous_strides(shape);
  t.storage_ = std::make_shared<Storage>(t.meta_.bytes(), alloc, device);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  std::memset(t.data(), 0, t.bytes());
  return t;
}

namespace {
uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
// Uniform in (0, 1): never 0, so log() in Box-Muller is finite.
double unit_uniform(uint64_t seed, uint64_t i) {
  return (double(splitmix64(seed * 0x2545f4914f6cdd1dull + i) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}
}  // namespace

Tensor Tensor::randn(const Shape& shape, DType dtype, uint64_t seed, float mean, float std) {
  Tensor t = empty(shape, dtype);
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) {
    const double u1 = unit_uniform(seed, 2 * uint64_t(i)), u2 = unit_uniform(seed, 2 * uint64_t(i) + 1);
    const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    store_from_double(t.data(), dtype, size_t(i), mean + std * z);
  }
  return t;
}

Tensor Tensor::uniform(const Shape& shape, DType dtype, uint64_t seed, float lo, float hi) {
  Tensor t = empty(shape, dtype);
  const int64_t n = t.numel();
  const bool integer = !dtype_is_float(dtype);
  for (int64_t i = 0; i < n; ++i) {
    double v = lo + (double(hi) - lo) * unit_uniform(seed, uint64_t(i));
    if (integer) v = std::floor(v);
    store_from_double(t.data(), dtype, size_t(i), v);
  }
  return t;
}

bool Tensor::is_contiguous() const {
  const Strides c = contiguous_strides(meta_.shape);
  for (int i = 0; i < meta_.shape.rank(); ++i)
    if (meta_.shape[i] != 1 && c[i] != strides_[i]) return false;
  return true;
}

Tensor Tensor::view(const Shape& shape) const {
  if (shape.numel() != numel())
    throw ShapeError("view: cannot view " + meta_.str() + " as " + shape.str() + " (element counts differ)");
  if (!is_contiguous()) throw ShapeError("view: tensor " + meta_.str() + " is not contiguous");
  Tensor t = *this;
  t.meta_.shape = shape;
  t.strides_ = contiguous_strides(shape);
  return t;
}

Tensor Tensor::slice(int64_t offset, const Shape& shape) const {
  if (!is_contiguous()) throw ShapeError("slice: tensor " + meta_.str() + " is not contiguous");
  if (offset < 0 || offset + shape.numel() > numel())
    throw ShapeError("slice: elements [" + std::to_string(offset) + ", " + std::to_string(offset + shape.numel()) +
                     ") are outside " + meta_.str());
  Tensor t = *this;
  t.offset_ = offset_ + size_t(offset) * dtype_size(meta_.dtype);
  t.meta_.shape = shape;
  t.strides_ = contiguous_strides(shape);
  return t;
}

void Tensor::fill(double value) {
  const int64_t n = numel();
  if (dtype() == DType::f32) {
    float* p = data_as<float>();
    for (int64_t i = 0; i < n; ++i) p[i] = float(value);
    return;
  }
  for (int64_t i = 0; i < n; ++i) store_from_double(data(), dtype(), size_t(i), value);
}

void Tensor::copy_from(const Tensor& other) {
  if (!(other.meta() == meta_))
    throw ShapeError("copy_from: " + other.meta().str() + " does not match " + meta_.str());
  std::memcpy(data(), other.data(), bytes());
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape(), dtype());
  t.copy_from(*this);
  return t;
}

int64_t first_non_finite(const Tensor& t) {
  if (!dtype_is_float(t.dtype())) return -1;
  const bool f32 = t.dtype() == DType::f32;
  for (int64_t i = 0; i < t.numel(); ++i)
    if (!std::isfinite(f32 ? double(t.data_as<float>()[i]) : t.item(i))) return i;
  return -1;
}

}  // namespace brisk::core
