// CPU kernels for embedding (a row gather) and embedding_backward (a
// scatter-add of gradient rows into the table's gradient).
//
// Ids are validated on the calling thread before any parallel region: an
// exception must not escape an OpenMP region, and a bad id must never become
// an out-of-bounds read. The scatter-add splits the *columns* across threads
// and walks the ids in order: repeated ids (frequent tokens) never race, and
// every sum is formed in the same order for any thread count, so training is
// reproducible. Low-precision gradients accumulate in f32 scratch (the op's
// workspace) and are narrowed once.
#include <cstring>
#include <string>
#include <vector>

#include "brisk/core/error.h"
#include "brisk/core/op.h"
#include "cpu_util.h"
#include "kernels.h"

namespace brisk::cpu {
namespace {

using core::KernelCall;

void check_ids(const char* op, const int32_t* ids, int64_t n, int64_t v) {
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= v)
      throw core::Error(std::string(op) + ": id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                        " is out of range [0, " + std::to_string(v) + ")");
}

// Works for any element type: rows are copied as bytes.
void embedding_kernel(const KernelCall& c) {
  const int32_t* ids = c.in(0).as<const int32_t>();
  const char* table = c.in(1).as<const char>();
  char* y = c.out(0).as<char>();
  const int64_t n = c.in(0).numel(), v = c.in(1).shape()[0];
  const size_t row = size_t(c.in(1).shape()[1]) * core::dtype_size(c.in(1).dtype());
  check_ids("embedding", ids, n, v);
  parallel_for(n, std::max<int64_t>(1, kParallelGrain * 4 / int64_t(std::max<size_t>(row, 1))),
               [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) std::memcpy(y + size_t(i) * row, table + size_t(ids[i]) * row, row);
  });
}

// acc (V, C) f32 = dy rows summed at ids (added to acc's values when `into`),
// columns split across threads.
template <class T, class Widen>
void scatter_add(const T* dy, const int32_t* ids, int64_t n, int64_t C, float* acc, int64_t v, Widen widen,
                 bool into = false) {
  parallel_for(C, std::max<int64_t>(16, kParallelGrain / std::max<int64_t>(n, 1)), [&](int64_t lo, int64_t hi) {
    if (!into)
      for (int64_t r = 0; r < v; ++r) std::fill(acc + r * C + lo, acc + r * C + hi, 0.f);
    for (int64_t i = 0; i < n; ++i) {
      const T* g = dy + i * C;
      float* a = acc + int64_t(ids[i]) * C;
#pragma omp simd
      for (int64_t j = lo; j < hi; ++j) a[j] += widen(g[j]);
    }
  });
}

void embedding_backward_f32(const KernelCall& c) {
  const int32_t* ids = c.in(1).as<const int32_t>();
  const int64_t n = c.in(1).numel(), v = c.out(0).shape()[0], C = c.out(0).shape()[1];
  check_ids("embedding_backward", ids, n, v);
  // With the accumulator (input 2, the output's memory) the rows add to it.
  scatter_add(c.in(0).as<const float>(), ids, n, C, c.out(0).as<float>(), v, [](float x) { return x; },
              c.inputs.size() == 3);
}

void embedding_backward_bf16(const KernelCall& c) {
  const int32_t* ids = c.in(1).as<const int32_t>();
  const int64_t n = c.in(1).numel(), v = c.out(0).shape()[0], C = c.out(0).shape()[1];
  check_ids("embedding_backward", ids, n, v);
  std::vector<float> owned;
  float* acc = static_cast<float*>(c.workspace);
  if (!acc || c.workspace_bytes < size_t(v * C) * sizeof(float)) {
    owned.resize(size_t(v * C));  // run_op without a workspace
    acc = owned.data();
  }
  scatter_add(c.in(0).as<const uint16_t>(), ids, n, C, acc, v, [](uint16_t h) { return core::bf16_to_f32(h); });
  uint16_t* out = c.out(0).as<uint16_t>();
  parallel_for(v * C, kParallelGrain, [&](int64_t lo, int64_t hi) { f32_to_bf16_row(acc + lo, out + lo, hi - lo); });
}

}  // namespace

void register_embedding_kernels(core::KernelRegistry& r) {
  using core::DType;
  using core::OpKind;
  r.add(OpKind::embedding, DType::f32, embedding_kernel);
  r.add(OpKind::embedding, DType::bf16, embedding_kernel);
  r.add(OpKind::embedding, DType::f16, embedding_kernel);
  r.add(OpKind::embedding_backward, DType::f32, embedding_backward_f32);
  r.add(OpKind::embedding_backward, DType::bf16, embedding_backward_bf16);
}

}  // namespace brisk::cpu
