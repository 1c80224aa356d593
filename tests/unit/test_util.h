// Small helpers shared by the unit tests.
#pragma once

#include <algorithm>
#include <cmath>

#include "brisk/core/tensor.h"
#include "brisk/cpu/cpu_backend.h"

namespace brisk::testing_util {

// One 2-thread CPU backend shared by a test binary's tests.
inline cpu::CpuBackend& backend() {
  static cpu::CpuBackend b(2);
  return b;
}

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
