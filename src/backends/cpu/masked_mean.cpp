// CPU kernels for masked_mean (the mean of each sequence's real positions of
// a right-padded batch) and its backward, f32.
//
// The forward's work items are (sequence, block of columns): an encoder's
// batch is often a few long sequences, and splitting only over sequences
// would leave threads idle. Each item walks its sequence's real rows in order
// into the output row, so the sum's order (and result) does not depend on the
// thread count. The backward writes every element of dx, padding included
// (exact zeros), rows split across threads.
#include <algorithm>

#include "brisk/core/op.h"
#include "brisk/ops/layout.h"
#include "cpu_util.h"
#include "kernels.h"

namespace brisk::cpu {
namespace {

using core::KernelCall;

// Columns per forward work item: a few cache lines of each row.
constexpr int64_t kCols = 256;

void masked_mean_f32(const KernelCall& c) {
  const core::Shape& s = c.in(0).shape();
  const int64_t B = s[0], T = s[1], C = s[2];
  const int32_t* lengths = c.in(1).as<const int32_t>();
  ops::check_lengths("masked_mean", lengths, B, T);  // before the parallel region: it throws
  const float* x = c.in(0).as<float>();
  float* y = c.out(0).as<float>();
  const int64_t blocks = (C + kCols - 1) / kCols;
  const int64_t per_item = std::max<int64_t>(1, T * std::min(C, kCols));
  parallel_for(B * blocks, std::max<int64_t>(1, kParallelGrain / per_item), [&](int64_t lo, int64_t hi) {
    for (int64_t item = lo; item < hi; ++item) {
      const int64_t b = item / blocks, c0 = item % blocks * kCols, n = std::min(kCols, C - c0);
      float* yr = y + b * C + c0;
      std::fill(yr, yr + n, 0.f);
      for (int64_t t = 0; t < lengths[b]; ++t) {
        const float* xr = x + (b * T + t) * C + c0;
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) yr[j] += xr[j];
      }
      const float len = float(lengths[b]);
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) yr[j] /= len;
    }
  });
}

void masked_mean_backward_f32(const KernelCall& c) {
  const core::Shape& s = c.out(0).shape();
  const int64_t B = s[0], T = s[1], C = s[2];
  const int32_t* lengths = c.in(1).as<const int32_t>();
  ops::check_lengths("masked_mean_backward", lengths, B, T);
  const float* dy = c.in(0).as<float>();
  float* dx = c.out(0).as<float>();
  parallel_for(B * T, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(C, 1)), [&](int64_t lo, int64_t hi) {
    for (int64_t row = lo; row < hi; ++row) {
      const int64_t b = row / T, t = row % T;
      float* dst = dx + row * C;
      if (t >= lengths[b]) {
        std::fill(dst, dst + C, 0.f);
        continue;
      }
      const float* g = dy + b * C;
      const float len = float(lengths[b]);
#pragma omp simd
      for (int64_t j = 0; j < C; ++j) dst[j] = g[j] / len;
    }
  });
}

}  // namespace

void register_masked_mean_kernels(core::KernelRegistry& r) {
  r.add(core::OpKind::masked_mean, core::DType::f32, masked_mean_f32);
  r.add(core::OpKind::masked_mean_backward, core::DType::f32, masked_mean_backward_f32);
}

}  // namespace brisk::cpu
