// Shape arithmetic and printing.
#include "brisk/core/shape.h"

#include "brisk/core/error.h"

namespace brisk::core {

Shape::Shape(std::initializer_list<int64_t> dims) {
  for (int64_t d : dims) push_back(d);
}

void Shape::push_back(int64_t d) {
  if (rank_ >= kMaxRank) throw ShapeError("shape " + str() + ": more than " + std::to_string(kMaxRank) + " dims");
  dims_[rank_++] = d;
}

int Shape::normalize_axis(int axis) const {
  const int a = axis < 0 ? axis + rank_ : axis;
  if (a < 0 || a >= rank_)
    throw ShapeError("axis " + std::to_string(axis) + " is out of range for shape " + str());
  return a;
}

int64_t Shape::dim(int i) const { return dims_[normalize_axis(i)]; }

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank_; ++i) n *= dims_[i];
  return n;
}

int64_t Shape::rows() const { return rank_ ? numel() / dims_[rank_ - 1] : 1; }

bool Shape::operator==(const Shape& o) const {
  if (rank_ != o.rank_) return false;
  for (int i = 0; i < rank_; ++i)
    if (dims_[i] != o.dims_[i]) return false;
  return true;
}

std::string Shape::str() const {
  std::string s = "(";
  for (int i = 0; i < rank_; ++i) s += (i ? ", " : "") + std::to_string(dims_[i]);
  return s + ")";
}

Strides contiguous_strides(const Shape& s) {
  Strides st{};
  int64_t acc = 1;
  for (int i = s.rank() - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}

std::string TensorMeta::str() const { return std::string(dtype_name(dtype)) + shape.str(); }

}  // namespace brisk::core
