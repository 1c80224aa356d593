// Small helpers shared by the unit tests.
#pragma once

#include <algorithm>
#include <cmath>

#include "brisk/core/tensor.h"

namespace brisk::testing_util {

// max |ref - got| / max |ref|: an error relative to the tensor's scale.
inline double normalized_error(const core::Tensor& ref, const core::Tensor& got) {
  double diff = 0.0, scale = 1e-6;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    diff = std::max(diff, std::abs(ref.item(i) - got.item(i)));
    scale = std::max(scale, std::abs(ref.item(i)));
  }
  return diff / scale;
}

}  // namespace brisk::testing_util
