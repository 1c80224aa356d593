// CPU kernels for gelu and gelu_backward (f32, bf16).
//
// GELU's tanh form is rewritten through the identity 1 + tanh(u) = 2 sigmoid(2u):
//   gelu(x) = x / (1 + exp(-2u)),        u = sqrt(2/pi) (x + 0.044715 x^3)
// which is the same function, but better conditioned: 1 + tanh(u) cancels
// badly for negative x, while 1 + exp(-2u) never does. The only
// transcendental left is exp, computed by an inline Cephes-style polynomial
// (about 2 ulp) that the compiler vectorizes; libm's tanh would keep the
// loop scalar and cost several times more. The derivative uses the same e:
//   d gelu/dx = s (1 + 2 x e s sqrt(2/pi) (1 + 3 * 0.044715 x^2)),  s = 1/(1+e)
// (from 1 - tanh^2 = 4 s (1 - s) and 1 - s = e s), again with no cancellation.
// bf16 rows are widened into a stack tile, computed in f32 and narrowed back.
#include <algorithm>
#include <cmath>

#include "brisk/core/op.h"
#include "cpu_util.h"
#include "kernels.h"
#include "vec_math.h"


namespace brisk::cpu {
namespace {

using core::KernelCall;

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

inline float gelu_one(float x) {
  const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
  return x / (1.0f + fast_exp_clamped(-2.0f * u));
}

inline float gelu_grad_one(float x, float dy) {
  const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
  const float e = fast_exp_clamped(-2.0f * u);
  const float s = 1.0f / (1.0f + e);
  return dy * s * (1.0f + 2.0f * x * e * s * kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x));
}

void gelu_rows(const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = gelu_one(x[i]);
}

void gelu_grad_rows(const float* x, const float* dy, float* dx, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dx[i] = gelu_grad_one(x[i], dy[i]);
}

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

