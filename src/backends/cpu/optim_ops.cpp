// CPU kernels for the optimizer ops. Both are bound by memory bandwidth, so
// each makes exactly one pass over its data: grad_norm reads every gradient
// once (double accumulators, split over threads), adamw reads p, g, m, v and
// writes p, m, v in the same fused loop.
//
// adamw mirrors PyTorch's single-tensor AdamW: the scalar coefficients are
// computed in double (PyTorch does them as Python floats) and rounded to f32
// once, and the elementwise arithmetic is f32 in the same order as PyTorch's
// mul_/add_/addcmul_/sqrt/div/add_/addcdiv_ chain.
#include <cmath>

#include "brisk/core/op.h"
#include "cpu_util.h"
#include "kernels.h"

namespace brisk::cpu {
namespace {

using core::DType;
using core::KernelCall;
using core::TensorView;

// ---- grad_norm -----------------------------------------------------------------------
// Sum of squares of one tensor of any float dtype, over all threads.
double sum_squares(const TensorView& t) {
  const int64_t n = t.numel();
  const bool threads = n > kParallelGrain;
  double s = 0.0;
  switch (t.dtype()) {
    case DType::f32: {
      const float* x = t.as<float>();
#pragma omp parallel for simd schedule(static) reduction(+ : s) if (threads)
      for (int64_t i = 0; i < n; ++i) s += double(x[i]) * double(x[i]);
      break;
    }
    case DType::bf16: {
      const uint16_t* x = t.as<uint16_t>();
#pragma omp parallel for simd schedule(static) reduction(+ : s) if (threads)
      for (int64_t i = 0; i < n; ++i) {
        const double v = core::bf16_to_f32(x[i]);
        s += v * v;
      }
      break;
    }
    default: {  // f16: rare enough for the scalar conversion
      for (int64_t i = 0; i < n; ++i) {
        const double v = core::load_as_double(t.data, t.dtype(), size_t(i));
        s += v * v;
      }
      break;
    }
  }
  return s;
}

void grad_norm_kernel(const KernelCall& c) {
  double s = 0.0;
  for (const TensorView& t : c.inputs) s += sum_squares(t);
  *c.out(0).as<float>() = float(std::sqrt(s));
}

// ---- adamw ---------------------------------------------------------------------------

// G: storage type of the gradient (float or bf16 bits). Reads the inputs and
// writes the outputs, which are the same memory when the op runs in place.
template <class G>
void adamw_kernel(const KernelCall& c) {
  const ops::AdamWParams& a = c.p<ops::AdamWParams>();
  const float* p_in = c.in(0).as<float>();
  const G* g_in = c.in(1).as<G>();
  const float* m_in = c.in(2).as<float>();
  const float* v_in = c.in(3).as<float>();
  float* p_out = c.out(0).as<float>();
  float* m_out = c.out(1).as<float>();
  float* v_out = c.out(2).as<float>();

  const float grad_scale = a.grad_scale;
  const float decay = a.decay ? float(1.0 - double(a.lr) * double(a.weight_decay)) : 1.f;
  const float beta1 = a.beta1, one_m_beta1 = float(1.0 - double(a.beta1));
  const float beta2 = a.beta2, one_m_beta2 = float(1.0 - double(a.beta2));
  const double bc1 = 1.0 - std::pow(double(a.beta1), double(a.step));
  const double bc2 = 1.0 - std::pow(double(a.beta2), double(a.step));
  const float neg_step_size = float(-(double(a.lr) / bc1));
  const float bc2_sqrt = float(std::sqrt(bc2));
  const float eps = a.eps;

  parallel_for(c.in(0).numel(), kParallelGrain, [&](int64_t lo, int64_t hi) {
    // Each iteration reads then writes only index i, so exact aliasing of
    // inputs and outputs is safe under simd.
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) {
      const float g = widen(g_in[i]) * grad_scale;
      float p = p_in[i] * decay;  // decay is exactly 1 when off: p unchanged
      const float m = m_in[i] * beta1 + g * one_m_beta1;
      const float v = v_in[i] * beta2 + one_m_beta2 * g * g;
      const float denom = std::sqrt(v) / bc2_sqrt + eps;
      p = p + neg_step_size * m / denom;
      p_out[i] = p;
      m_out[i] = m;
      v_out[i] = v;
    }
  });
}

}  // namespace

void register_optim_kernels(core::KernelRegistry& r) {
  for (DType t : {DType::f32, DType::bf16, DType::f16}) r.add(core::OpKind::grad_norm, t, grad_norm_kernel);
  r.add(core::OpKind::adamw, DType::f32, adamw_kernel<float>);
  r.add(core::OpKind::adamw, DType::bf16, adamw_kernel<uint16_t>);
}

}  // namespace brisk::cpu
