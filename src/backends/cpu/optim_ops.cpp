// CPU kernels for the optimizer ops. Both are bound by memory bandwidth, so
// each makes exactly one pass over its data: grad_norm reads every gradient
// once (double accumulators, split over threads), adamw reads p, g, m, v and
// writes p, m, v of every parameter in one fused, multi-threaded loop.
//
// adamw mirrors PyTorch's single-tensor AdamW: the scalar coefficients are
// computed in double (PyTorch does them as Python floats) and rounded to f32
// once, and the elementwise arithmetic is f32 in the same order as PyTorch's
// mul_/add_/addcmul_/sqrt/div/add_/addcdiv_ chain.
#include <algorithm>
#include <cmath>

#include "brisk/core/error.h"
#include "brisk/core/op.h"
#include "cpu_util.h"
#include "kernels.h"

namespace brisk::cpu {
namespace {

using core::DType;
using core::KernelCall;
using core::TensorView;

// ---- grad_norm -----------------------------------------------------------------------
// Sum of squares of n elements, widened by `load`. Small tensors take a
// plain loop: an OpenMP region whose if() clause is false still builds (and
// mallocs) a one-thread team, which would allocate in every step.
template <class T, class Load>
double sum_squares_of(const T* x, int64_t n, Load load) {
  double s = 0.0;
  if (n <= kParallelGrain) {
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; ++i) {
      const double v = load(x[i]);
      s += v * v;
    }
    return s;
  }
#pragma omp parallel for simd schedule(static) reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) {
    const double v = load(x[i]);
    s += v * v;
  }
  return s;
}

// Sum of squares of one tensor of any float dtype, over all threads.
double sum_squares(const TensorView& t) {
  const int64_t n = t.numel();
  switch (t.dtype()) {
    case DType::f32:
      return sum_squares_of(t.as<float>(), n, [](float v) { return double(v); });
    case DType::bf16:
      return sum_squares_of(t.as<uint16_t>(), n, [](uint16_t v) { return double(core::bf16_to_f32(v)); });
    default: {  // f16: rare enough for the scalar conversion
      double s = 0.0;
      for (int64_t i = 0; i < n; ++i) {
        const double v = core::load_as_double(t.data, t.dtype(), size_t(i));
        s += v * v;
      }
      return s;
    }
  }
}

void grad_norm_kernel(const KernelCall& c) {
  double s = 0.0;
  for (const TensorView& t : c.inputs) s += sum_squares(t);
  *c.out(0).as<float>() = float(std::sqrt(s));
}

// ---- adamw ----------------------------------------------------------------------------

// The step's scalar coefficients, shared by every tensor.
struct AdamWCoefficients {
  float grad_scale, decay, beta1, one_m_beta1, beta2, one_m_beta2, neg_step_size, bc2_sqrt, eps;
  explicit AdamWCoefficients(const core::AdamWParams& a)
      : grad_scale(a.grad_scale),
        decay(float(1.0 - double(a.lr) * double(a.weight_decay))),
        beta1(a.beta1),
        one_m_beta1(float(1.0 - double(a.beta1))),
        beta2(a.beta2),
        one_m_beta2(float(1.0 - double(a.beta2))),
        neg_step_size(float(-(double(a.lr) / (1.0 - std::pow(double(a.beta1), double(a.step)))))),
        bc2_sqrt(float(std::sqrt(1.0 - std::pow(double(a.beta2), double(a.step))))),
        eps(a.eps) {}
};

// Elements [lo, hi) of one parameter. G: storage type of the gradient (float
// or bf16 bits). p, m, v are updated in place: each iteration reads then
// writes only index i, so the loop vectorises without aliasing hazards.
template <class G>
void adamw_range(const AdamWCoefficients& k, bool decay, float* p, const G* g, float* m, float* v, int64_t lo,
                 int64_t hi) {
  const float decay_factor = decay ? k.decay : 1.f;  // exactly 1 when off: p unchanged
#pragma omp simd
  for (int64_t i = lo; i < hi; ++i) {
    const float gi = widen(g[i]) * k.grad_scale;
    float pi = p[i] * decay_factor;
    const float mi = m[i] * k.beta1 + gi * k.one_m_beta1;
    const float vi = v[i] * k.beta2 + k.one_m_beta2 * gi * gi;
    const float denom = std::sqrt(vi) / k.bc2_sqrt + k.eps;
    pi = pi + k.neg_step_size * mi / denom;
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
  }
}

// Every parameter in one parallel region: the threads split the
// concatenation of all tensors evenly by element count, so a step costs one
// fork/join instead of one per parameter (a GPT has ~12 per layer, most of
// them small vectors), and no thread idles on a tiny bias while another
// finishes a large matrix. Outputs alias the inputs (p, m, v in place).
void adamw_kernel(const KernelCall& c) {
  const core::AdamWParams& a = c.p<core::AdamWParams>();
  const AdamWCoefficients k(a);
  const size_t groups = c.inputs.size() / 4;
  int64_t total = 0;
  for (size_t t = 0; t < groups; ++t) {
    total += c.in(4 * t).numel();
    const DType gt = c.in(4 * t + 1).dtype();
    if (gt != DType::f32 && gt != DType::bf16)  // checked before the threads start: no throwing inside them
      throw core::BackendError("adamw (cpu): gradient dtype " + std::string(core::dtype_name(gt)) +
                               " has no kernel (f32, bf16)");
  }
  auto run = [&](int64_t lo, int64_t hi) {
    int64_t base = 0;  // global index of tensor t's first element
    for (size_t t = 0; t < groups && base < hi; ++t) {
      const int64_t n = c.in(4 * t).numel();
      const int64_t from = std::max(lo, base) - base, to = std::min(hi, base + n) - base;
      base += n;
      if (from >= to) continue;
      const TensorView& p = c.in(4 * t);
      const bool decay = a.decay_matrices && p.meta.shape.rank() >= 2;
      float* pp = c.out(3 * t).as<float>();
      float* m = c.out(3 * t + 1).as<float>();
      float* v = c.out(3 * t + 2).as<float>();
      const TensorView& g = c.in(4 * t + 1);
      if (pp != p.as<float>() || m != c.in(4 * t + 2).as<float>() || v != c.in(4 * t + 3).as<float>()) {
        // Out of place (the op harness): copy the inputs over, then update.
        std::copy(p.as<float>() + from, p.as<float>() + to, pp + from);
        std::copy(c.in(4 * t + 2).as<float>() + from, c.in(4 * t + 2).as<float>() + to, m + from);
        std::copy(c.in(4 * t + 3).as<float>() + from, c.in(4 * t + 3).as<float>() + to, v + from);
      }
      if (g.dtype() == DType::f32) adamw_range(k, decay, pp, g.as<float>(), m, v, from, to);
      else adamw_range(k, decay, pp, g.as<uint16_t>(), m, v, from, to);
    }
  };
  parallel_for(total, kParallelGrain, run);
}

}  // namespace

void register_optim_kernels(core::KernelRegistry& r) {
  for (DType t : {DType::f32, DType::bf16, DType::f16}) r.add(core::OpKind::grad_norm, t, grad_norm_kernel);
  r.add(core::OpKind::adamw, DType::f32, adamw_kernel);
}

}  // namespace brisk::cpu
