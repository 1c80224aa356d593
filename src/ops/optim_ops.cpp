// Ops of the optimizer step: grad_norm (the global L2 norm used for gradient
// clipping) and adamw (one fused, in-place update of every parameter and its
// two moments: inputs in groups (p, g, m, v), one group per parameter).
// Neither is differentiable. adamw's outputs alias each group's p, m and v,
// so a step allocates nothing and the kernel runs straight on the
// ParameterStore's tensors. Weight decay applies to tensors of rank >= 2
// (matrices, embeddings) when decay_matrices is set, never to biases or
// LayerNorm gains: the op decides per tensor, so one call covers them all.
//
// adamw follows torch.optim.AdamW (PyTorch 1.13, foreach=False) formula by
// formula, in the same order, so that a brisk run and a PyTorch run from the
// same state agree to rounding:
//   g = g * grad_scale
//   p = p * (1 - lr * weight_decay)            (only where decay)
//   m = beta1 m + (1 - beta1) g ;  v = beta2 v + (1 - beta2) g g
//   denom = sqrt(v) / sqrt(1 - beta2^step) + eps
//   p = p - (lr / (1 - beta1^step)) m / denom
#include <cmath>

#include "op_util.h"

namespace brisk::ops {
using namespace detail;

namespace {

// ---- grad_norm ------------------------------------------------------------------------
std::vector<TensorMeta> infer_grad_norm(std::span<const TensorMeta> in, const core::OpParams&) {
  check_shape(!in.empty(), "grad_norm", "expects at least one input", in);
  for (size_t i = 0; i < in.size(); ++i) check_float("grad_norm", in, {int(i)});
  return {TensorMeta{Shape{}, DType::f32}};
}

void grad_norm_reference(const KernelCall& c) {
  double sum = 0;
  for (const TensorView& t : c.inputs)
    for (int64_t i = 0; i < t.numel(); ++i) {
      const double x = ld(t, i);
      sum += x * x;
    }
  st(c.out(0), 0, std::sqrt(sum));
}

std::vector<TestCase> grad_norm_cases() {
  auto g = [](Shape s, DType t = DType::f32) { return no_grad(spec(s, t)); };
  return {
      {"one tensor", {g({7, 13})}, NoParams{}},
      {"one element", {g({1})}, NoParams{}},
      {"several tensors", {g({33}), g({5, 7}), g({3, 4, 9}), g({1})}, NoParams{}},
      {"large", {g({300, 257}), g({1001})}, NoParams{}},
      {"bf16", {g({7, 13}, DType::bf16), g({33}, DType::bf16)}, NoParams{}},
      {"mixed dtypes", {g({65}), g({17, 3}, DType::bf16)}, NoParams{}},
  };
}

// ---- adamw ----------------------------------------------------------------------------
// Inputs come in groups (p, g, m, v), one group per parameter, so a whole
// optimizer step is one op call and one pass over memory.
std::vector<TensorMeta> infer_adamw(std::span<const TensorMeta> in, const core::OpParams& params) {
  constexpr std::string_view op = "adamw";
  check_shape(!in.empty() && in.size() % 4 == 0, op,
              "expects groups of 4 inputs (p, g, m, v), one group per parameter", in);
  std::vector<TensorMeta> out;
  for (size_t i = 0; i < in.size(); i += 4) {
    const std::span<const TensorMeta> grp = in.subspan(i, 4);
    check_shape(grp[1].shape == grp[0].shape && grp[2].shape == grp[0].shape && grp[3].shape == grp[0].shape, op,
                "p, g, m and v of parameter " + std::to_string(i / 4) + " must have the same shape", in);
    check_dtype(op, grp[0], DType::f32, "p (master weights)");
    check_float(op, grp, {1});
    check_dtype(op, grp[2], DType::f32, "m");
    check_dtype(op, grp[3], DType::f32, "v");
    out.insert(out.end(), {grp[0], grp[2], grp[3]});
  }
  if (std::get<AdamWParams>(params).step < 1)
    throw core::ConfigError("adamw: step must be >= 1 (it is 1-based, for bias correction), got " +
                            std::to_string(std::get<AdamWParams>(params).step));
  return out;
}

void adamw_reference(const KernelCall& c) {
  const AdamWParams& a = c.p<AdamWParams>();
  const double bc1 = 1.0 - std::pow(double(a.beta1), double(a.step));
  const double bc2 = 1.0 - std::pow(double(a.beta2), double(a.step));
  for (size_t t = 0; t < c.inputs.size() / 4; ++t) {
    const TensorView &p = c.in(4 * t), &g = c.in(4 * t + 1), &m = c.in(4 * t + 2), &v = c.in(4 * t + 3);
    const bool decay = a.decay_matrices && p.meta.shape.rank() >= 2;
    for (int64_t i = 0; i < p.numel(); ++i) {
      const double gi = ld(g, i) * a.grad_scale;
      double pi = ld(p, i);
      if (decay) pi *= 1.0 - double(a.lr) * a.weight_decay;
      const double mi = a.beta1 * ld(m, i) + (1.0 - a.beta1) * gi;
      const double vi = a.beta2 * ld(v, i) + (1.0 - a.beta2) * gi * gi;
      const double denom = std::sqrt(vi) / std::sqrt(bc2) + a.eps;
      pi -= (a.lr / bc1) * mi / denom;
      st(c.out(3 * t), i, pi);
      st(c.out(3 * t + 1), i, mi);
      st(c.out(3 * t + 2), i, vi);
    }
  }
}

std::vector<TestCase> adamw_cases() {
  auto group = [](Shape s, DType gt) {
    return std::vector<InputSpec>{no_grad(spec(s)), no_grad(spec(s, gt)), no_grad(spec(s, DType::f32, -0.1, 0.1)),
                                  no_grad(spec(s, DType::f32, 0.01, 1.0))};
  };
  auto groups = [&](std::initializer_list<std::pair<Shape, DType>> ps) {
    std::vector<InputSpec> in;
    for (const auto& [s, t] : ps) {
      auto g = group(s, t);
      in.insert(in.end(), g.begin(), g.end());
    }
    return in;
  };
  auto params = [](int64_t step, bool decay, float grad_scale) {
    AdamWParams a;
    a.lr = 1e-2f;  // large enough that the update is visible next to p
    a.step = step;
    a.decay_matrices = decay;
    a.grad_scale = grad_scale;
    return a;
  };
  constexpr DType f32 = DType::f32, bf16 = DType::bf16;
  return {
      {"step 1 matrix", groups({{{7, 13}, f32}}), params(1, true, 1.f)},
      {"step 10 vector (never decayed)", groups({{{33}, f32}}), params(10, true, 1.f)},
      {"step 1 no decay", groups({{{1}, f32}}), params(1, false, 1.f)},
      {"step 10 no decay scaled", groups({{{3, 5, 7}, f32}}), params(10, false, 0.37f)},
      {"step 10 decay scaled large", groups({{{257, 129}, f32}}), params(10, true, 2.5f)},
      {"bf16 grad step 1", groups({{{7, 13}, bf16}}), params(1, true, 0.5f)},
      {"bf16 grad step 10", groups({{{1001}, bf16}}), params(10, false, 1.f)},
      // A model's worth: matrices and vectors of odd sizes, mixed gradient
      // dtypes, each tensor's decay decided by its rank.
      {"many tensors", groups({{{33, 7}, f32}, {{33}, f32}, {{1}, f32}, {{5, 3, 2}, bf16}, {{4099}, f32}, {{130, 65}, f32}}),
       params(3, true, 0.8f)},
  };
}

}  // namespace

core::OpDef grad_norm_def() {
  OpDef d;
  d.kind = OpKind::grad_norm;
  d.name = "grad_norm";
  d.infer = infer_grad_norm;
  d.reference = grad_norm_reference;
  d.test_cases = grad_norm_cases;
  return d;
}

core::OpDef adamw_def() {
  OpDef d;
  d.kind = OpKind::adamw;
  d.name = "adamw";
  d.infer = infer_adamw;
  d.reference = adamw_reference;
  d.test_cases = adamw_cases;
  d.output_aliases = {0, 2, 3};  // per group of inputs (p, g, m, v): p, m, v updated in place
  d.alias_group_inputs = 4;
  d.kernel_dtype_input = 0;  // p is always f32; the kernel handles each gradient's dtype itself
  return d;
}

ValueId grad_norm(Graph& g, const std::vector<ValueId>& grads) {
  register_ops();
  return g.add_node1(OpKind::grad_norm, grads);
}

}  // namespace brisk::ops
