// Shapes and strides with a fixed maximum rank, so that describing a tensor
// never touches the heap (the executor builds none at run time anyway, but
// kernels and planners copy shapes freely).
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "brisk/core/dtype.h"

namespace brisk::core {

inline constexpr int kMaxRank = 6;

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  template <class It>
  Shape(It begin, It end) {
    for (; begin != end; ++begin) push_back(int64_t(*begin));
  }

  int rank() const { return rank_; }
  int64_t operator[](int i) const { return dims_[i]; }
  int64_t& operator[](int i) { return dims_[i]; }
  // Python-style index: -1 is the last dimension. Throws ShapeError if out of range.
  int64_t dim(int i) const;
  int normalize_axis(int axis) const;
  int64_t numel() const;
  // Product of all dimensions but the last: the row count of a 2-D view.
  int64_t rows() const;
  int64_t last() const { return rank_ ? dims_[rank_ - 1] : 1; }

  void push_back(int64_t d);
  const int64_t* begin() const { return dims_.data(); }
  const int64_t* end() const { return dims_.data() + rank_; }

  bool operator==(const Shape& o) const;
  bool operator!=(const Shape& o) const { return !(*this == o); }
  std::string str() const;  // "(2, 3, 4)"

 private:
  std::array<int64_t, kMaxRank> dims_{};
  int rank_ = 0;
};

using Strides = std::array<int64_t, kMaxRank>;
Strides contiguous_strides(const Shape& s);

// What the graph knows about a value before it exists.
struct TensorMeta {
  Shape shape;
  DType dtype = DType::f32;
  size_t bytes() const { return size_t(shape.numel()) * dtype_size(dtype); }
  bool operator==(const TensorMeta& o) const { return shape == o.shape && dtype == o.dtype; }
  std::string str() const;  // "f32(2, 3)"
};

}  // namespace brisk::core
