// Small helpers shared by the unit tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "brisk/core/error.h"
#include "brisk/core/graph.h"
#include "brisk/core/tensor.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/cpu/cpu_features.h"

namespace brisk::testing_util {

// One 2-thread CPU backend shared by a test binary's tests.
inline cpu::CpuBackend& backend() {
  static cpu::CpuBackend b(2);
  return b;
}

// The nodes of a graph that run op `k`.
inline int count_ops(const core::Graph& g, core::OpKind k) {
  return int(std::count_if(g.nodes().begin(), g.nodes().end(), [&](const core::Node& n) { return n.op == k; }));
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

// BRISK_BF16 (cpu_features.h) set to `value` (null: unset) for one scope,
// then back to the machine's own path.
struct ScopedBf16Path {
  explicit ScopedBf16Path(const char* value) {
    if (value) setenv("BRISK_BF16", value, 1);
    else unsetenv("BRISK_BF16");
    cpu::reload_cpu_features();
  }
  ~ScopedBf16Path() {
    unsetenv("BRISK_BF16");
    cpu::reload_cpu_features();
  }
  ScopedBf16Path(const ScopedBf16Path&) = delete;
  ScopedBf16Path& operator=(const ScopedBf16Path&) = delete;
};

// The message of the core::Error that f() throws, or "no error".
template <class F>
std::string message_of(F f) {
  try {
    f();
  } catch (const core::Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace brisk::testing_util
