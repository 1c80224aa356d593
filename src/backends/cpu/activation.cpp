// CPU kernels for gelu and gelu_backward (f32, bf16). The arithmetic (a
// divide-free, vectorized tanh-GELU and its derivative) lives in gelu_math.h,
// shared with linear_gelu's epilogue; this file splits the elements across
// threads. bf16 rows are widened into a stack tile, computed in f32 and
// narrowed back.
#include <algorithm>
#include <cmath>

#include "brisk/core/op.h"
#include "cpu_util.h"
#include "gelu_math.h"
#include "kernels.h"
#include "vec_math.h"


namespace brisk::cpu {
namespace {

using core::KernelCall;

void gelu_f32(const KernelCall& c) {
  const float* x = c.in(0).as<float>();
  float* y = c.out(0).as<float>();
  parallel_for(c.in(0).numel(), kParallelGrain / 4, [&](int64_t lo, int64_t hi) { gelu_rows(x + lo, y + lo, hi - lo); });
}

void gelu_backward_f32(const KernelCall& c) {
  const float* x = c.in(0).as<float>();
  const float* dy = c.in(1).as<float>();
  float* dx = c.out(0).as<float>();
  parallel_for(c.in(0).numel(), kParallelGrain / 4,
               [&](int64_t lo, int64_t hi) { gelu_grad_rows(x + lo, dy + lo, dx + lo, hi - lo); });
}

// bf16: a tile this size of each operand fits in L1 next to its output.
constexpr int64_t kTile = 512;

void gelu_bf16(const KernelCall& c) {
  const uint16_t* x = c.in(0).as<uint16_t>();
  uint16_t* y = c.out(0).as<uint16_t>();
  parallel_for(c.in(0).numel(), kParallelGrain / 4, [&](int64_t lo, int64_t hi) {
    float xf[kTile], yf[kTile];
    for (int64_t b = lo; b < hi; b += kTile) {
      const int64_t len = std::min(kTile, hi - b);
      bf16_to_f32_row(x + b, xf, len);
      gelu_rows(xf, yf, len);
      f32_to_bf16_row(yf, y + b, len);
    }
  });
}

void gelu_backward_bf16(const KernelCall& c) {
  const uint16_t* x = c.in(0).as<uint16_t>();
  const uint16_t* dy = c.in(1).as<uint16_t>();
  uint16_t* dx = c.out(0).as<uint16_t>();
  parallel_for(c.in(0).numel(), kParallelGrain / 4, [&](int64_t lo, int64_t hi) {
    float xf[kTile], df[kTile], of[kTile];
    for (int64_t b = lo; b < hi; b += kTile) {
      const int64_t len = std::min(kTile, hi - b);
      bf16_to_f32_row(x + b, xf, len);
      bf16_to_f32_row(dy + b, df, len);
      gelu_grad_rows(xf, df, of, len);
      f32_to_bf16_row(of, dx + b, len);
    }
  });
}

}  // namespace

void register_activation_kernels(core::KernelRegistry& r) {
  r.add(core::OpKind::gelu, core::DType::f32, gelu_f32);
  r.add(core::OpKind::gelu, core::DType::bf16, gelu_bf16);
  r.add(core::OpKind::gelu_backward, core::DType::f32, gelu_backward_f32);
  r.add(core::OpKind::gelu_backward, core::DType::bf16, gelu_backward_bf16);
}

}  // namespace brisk::cpu

