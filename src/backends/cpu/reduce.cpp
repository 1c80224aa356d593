// CPU kernels for sum, mean (f32, bf16) and expand (every dtype).
//
// A reduction over one axis is an (outer, n, inner) loop. Two shapes matter:
// inner == 1 (last axis, or everything) sums contiguous rows, vectorized with
// a double accumulator (million-element sums stay accurate to the last f32
// bit); inner > 1 (bias gradients: sum over the rows of a (rows, C) matrix)
// adds whole rows into a tile of f32 sums, 64 rows at a time, gathered in
// double: it vectorizes across the inner dim and reads memory in order.
// expand only moves bytes, so one kernel serves every dtype.
#include <cstring>

#include "brisk/core/op.h"
#include "cpu_util.h"
#include "brisk/ops/layout.h"
#include "kernels.h"

namespace brisk::cpu {
namespace {

using core::KernelCall;
using ops::AxisSplit;
using ops::ReduceParams;
using ops::split_at;



template <class T>
double row_sum(const T* x, int64_t n) {
  double acc = 0.0;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += double(widen(x[i]));
  return acc;
}

// Sum of one long row, split across threads in fixed blocks.
template <class T>
double long_row_sum(const T* x, int64_t n) {
  constexpr int64_t kBlock = 8192;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  double acc = 0.0;
  // Not an if() clause: a false one still builds (and mallocs) a one-thread team.
  if (n <= 4 * kParallelGrain) {
    for (int64_t b = 0; b < blocks; ++b) acc += row_sum(x + b * kBlock, std::min(kBlock, n - b * kBlock));
    return acc;
  }
#pragma omp parallel for reduction(+ : acc) schedule(static)
  for (int64_t b = 0; b < blocks; ++b) acc += row_sum(x + b * kBlock, std::min(kBlock, n - b * kBlock));
  return acc;
}

// The sums over n of x seen as (outer, n, inner), inner > 1: emit(o * inner
// + i, sum) for each column. A tile of kTile columns per (outer, tile) task;
// rows are added in f32 (8 lanes per AVX2 add, no conversions) in blocks of
// kRowBlock, and each block's sums go into double accumulators: the error is
// that of 64-term f32 sums, and the loop runs at the speed of loads
// (all-double accumulation made bias gradients compute-bound).
template <class T, class Emit>
void column_sums(const T* x, const AxisSplit& a, Emit emit) {
  constexpr int64_t kTile = 256, kRowBlock = 64;
  const int64_t tiles = (a.inner + kTile - 1) / kTile;
  parallel_for(a.outer * tiles, std::max<int64_t>(1, kParallelGrain / (a.n * kTile)), [&](int64_t lo, int64_t hi) {
    double acc[kTile];
    float block[kTile];
    for (int64_t task = lo; task < hi; ++task) {
      const int64_t o = task / tiles, i0 = (task % tiles) * kTile;
      const int64_t len = std::min(kTile, a.inner - i0);
      std::fill(acc, acc + len, 0.0);
      for (int64_t k0 = 0; k0 < a.n; k0 += kRowBlock) {
        std::fill(block, block + len, 0.f);
        for (int64_t k = k0; k < std::min(a.n, k0 + kRowBlock); ++k) {
          const T* row = x + (o * a.n + k) * a.inner + i0;
#pragma omp simd
          for (int64_t i = 0; i < len; ++i) block[i] += widen(row[i]);
        }
#pragma omp simd
        for (int64_t i = 0; i < len; ++i) acc[i] += double(block[i]);
      }
      for (int64_t i = 0; i < len; ++i) emit(o * a.inner + i0 + i, acc[i]);
    }
  });
}

template <class T, bool kMean>
void reduce_kernel(const KernelCall& c) {
  const T* x = c.in(0).as<T>();
  const AxisSplit a = split_at(c.in(0).shape(), c.p<ReduceParams>().axis);
  if (c.inputs.size() == 2) {  // sum's f32 accumulator (input 1, the output's memory): column sums added to it
    float* acc = c.out(0).as<float>();
    column_sums(x, a, [acc](int64_t i, double v) { acc[i] = float(double(acc[i]) + v); });
    return;
  }
  T* y = c.out(0).as<T>();
  const double inv = kMean ? 1.0 / double(a.n) : 1.0;

  if (a.inner == 1) {
    if (a.outer == 1) {
      *y = narrow<T>(float(long_row_sum(x, a.n) * inv));
      return;
    }
    parallel_for(a.outer, std::max<int64_t>(1, kParallelGrain / a.n), [&](int64_t lo, int64_t hi) {
      for (int64_t o = lo; o < hi; ++o) y[o] = narrow<T>(float(row_sum(x + o * a.n, a.n) * inv));
    });
    return;
  }
  column_sums(x, a, [y, inv](int64_t i, double v) { y[i] = narrow<T>(float(v * inv)); });
}

// ---- expand: element-sized copies, whatever the dtype ---------------------------
template <class E>
void expand_typed(const KernelCall& c) {
  const auto& ep = c.p<ops::ExpandParams>();
  const E* x = c.in(0).as<E>();
  E* y = c.out(0).as<E>();
  const AxisSplit a = split_at(ep.shape, ep.axis);
  if (a.inner == 1) {
    // Each input element repeats n times in a row.
    parallel_for(a.outer * a.n, kParallelGrain, [&](int64_t lo, int64_t hi) {
      for (int64_t o = lo / a.n; o * a.n < hi; ++o) {
        const int64_t b = std::max(lo, o * a.n), e = std::min(hi, (o + 1) * a.n);
        const E v = x[o];
#pragma omp simd
        for (int64_t j = b; j < e; ++j) y[j] = v;
      }
    });
    return;
  }
  // Each input row of `inner` elements repeats n times.
  parallel_for(a.outer * a.n, std::max<int64_t>(1, kParallelGrain / a.inner), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r)
      std::memcpy(y + r * a.inner, x + (r / a.n) * a.inner, size_t(a.inner) * sizeof(E));
  });
}

void expand_any(const KernelCall& c) {
  switch (core::dtype_size(c.in(0).dtype())) {
    case 1: return expand_typed<uint8_t>(c);
    case 2: return expand_typed<uint16_t>(c);
    case 4: return expand_typed<uint32_t>(c);
    default: return expand_typed<uint64_t>(c);
  }
}

}  // namespace

void register_reduce_kernels(core::KernelRegistry& r) {
  using core::DType;
  using core::OpKind;
  r.add(OpKind::sum, DType::f32, reduce_kernel<float, false>);
  r.add(OpKind::sum, DType::bf16, reduce_kernel<uint16_t, false>);
  r.add(OpKind::mean, DType::f32, reduce_kernel<float, true>);
  r.add(OpKind::mean, DType::bf16, reduce_kernel<uint16_t, true>);
  // f16: fp16 mixed precision reduces its bias gradients (linear's backward) in f16.
  r.add(OpKind::sum, DType::f16, reduce_kernel<core::f16, false>);
  r.add(OpKind::mean, DType::f16, reduce_kernel<core::f16, true>);
  for (int t = 0; t < core::kNumDTypes; ++t) r.add(OpKind::expand, DType(t), expand_any);
}

}  // namespace brisk::cpu
