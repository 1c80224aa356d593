// LayerNorm over the last dim, as in PyTorch (biased variance, eps inside the
// square root). The forward also returns the per-row mean and 1/std in f32:
// the backward needs them, and saving two floats per row is far cheaper than
// a second statistics pass. They are "saved outputs" (num_saved_outputs = 2):
// nothing downstream differentiates them, so their incoming gradients are
// ignored. The backward is one fused op rather than a composition of
// elementwise ops because it is a per-row reduction twice over; expressing it
// in small ops would cost several extra passes over the activations.
#include <algorithm>
#include <cmath>

#include "brisk/core/passes.h"
#include "op_util.h"

namespace brisk::ops {
using namespace detail;

// The scalar LayerNorm of every row of x (double accumulation): the reference
// for layernorm and for add_layernorm's normalising half.
void detail::layernorm_rows_reference(const TensorView& x, const TensorView& w, const TensorView& b, double eps,
                              const TensorView& y, const TensorView& mean_out, const TensorView& rstd_out) {
  const int64_t C = x.shape().last(), rows = x.shape().rows();
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0.0, var = 0.0;
    for (int64_t i = 0; i < C; ++i) mean += ld(x, r * C + i);
    mean /= double(C);
    for (int64_t i = 0; i < C; ++i) {
      const double d = ld(x, r * C + i) - mean;
      var += d * d;
    }
    var /= double(C);
    const double rstd = 1.0 / std::sqrt(var + eps);
    for (int64_t i = 0; i < C; ++i) st(y, r * C + i, (ld(x, r * C + i) - mean) * rstd * ld(w, i) + ld(b, i));
    st(mean_out, r, mean);
    st(rstd_out, r, rstd);
  }
}

namespace {

std::vector<TensorMeta> infer_layernorm(std::span<const TensorMeta> in, const core::OpParams& params) {
  constexpr std::string_view op = "layernorm";
  check_count(op, in, 3);
  check_float(op, in, {0, 1, 2});
  const Shape& x = in[0].shape;
  check_shape(x.rank() >= 1, op, "x must have rank >= 1", in);
  const Shape c{x.last()};
  check_shape(in[1].shape == c && in[2].shape == c, op, "weight and bias must be (C) with C = x's last dim", in);
  check_shape(in[1].dtype == in[0].dtype && in[2].dtype == in[0].dtype, op,
              "x, weight and bias must have the same dtype", in);
  const DType narrow_to = std::get<LayerNormParams>(params).narrow_to;
  check_shape(narrow_to == DType::f32 || narrow_to == in[0].dtype ||
                  (in[0].dtype == DType::f32 && (narrow_to == DType::bf16 || narrow_to == DType::f16)),
              op, std::string("y can be narrowed only from f32 to bf16 or f16 (narrow_to ") +
                      std::string(core::dtype_name(narrow_to)) + ")",
              in);
  const TensorMeta stats{Shape{x.rows()}, DType::f32};
  return {TensorMeta{x, narrow_to == DType::f32 ? in[0].dtype : narrow_to}, stats, stats};
}

void layernorm_reference(const KernelCall& c) {
  layernorm_rows_reference(c.in(0), c.in(1), c.in(2), c.p<LayerNormParams>().eps, c.out(0), c.out(1), c.out(2));
}

std::vector<ValueId> layernorm_backward_rule(Graph& g, const core::Node& n, std::span<const ValueId> dy) {
  if (dy[0] == core::kNoValue) return {core::kNoValue, core::kNoValue, core::kNoValue};
  register_ops();
  // The forward's narrow_to says y's dtype; the backward's would ask for a narrowed dx.
  const LayerNormParams params{std::get<LayerNormParams>(n.params).eps, DType::f32};
  return g.add_node(OpKind::layernorm_backward, {dy[0], n.inputs[0], n.inputs[1], n.outputs[1], n.outputs[2]},
                    params);
}

std::vector<TestCase> layernorm_cases() {
  std::vector<TestCase> cases;
  for (DType t : {DType::f32, DType::bf16}) {
    const std::string tag = t == DType::f32 ? "" : " bf16";
    // Weight away from zero and x spread wide enough that rstd stays moderate.
    cases.push_back({"7x13" + tag, {spec({7, 13}, t, -2, 2), spec({13}, t, 0.5, 1.5), spec({13}, t)},
                     LayerNormParams{}});
    cases.push_back({"2x5x33" + tag, {spec({2, 5, 33}, t, -2, 2), spec({33}, t, 0.5, 1.5), spec({33}, t)},
                     LayerNormParams{}});
  }
  cases.push_back({"wide 3x256", {spec({3, 256}, DType::f32, -3, 3), spec({256}), spec({256})},
                   LayerNormParams{1e-5f}});
  // f32 x, y narrowed in the kernel (mixed precision): y to its dtype's
  // rounding, the statistics to f32's. Not differentiated by finite
  // differences (a rounded y hides them, as for a narrowing cast); the
  // backward of a narrowed y is layernorm_backward's dy-bf16/f16 cases.
  for (DType y : {DType::bf16, DType::f16}) {
    const std::string tag = " y " + std::string(core::dtype_name(y));
    cases.push_back({"2x5x33" + tag,
                     {no_grad(spec({2, 5, 33}, DType::f32, -2, 2)), no_grad(spec({33}, DType::f32, 0.5, 1.5)),
                      no_grad(spec({33}))},
                     LayerNormParams{1e-5f, y}});
    cases.push_back({"7x13" + tag,
                     {no_grad(spec({7, 13}, DType::f32, -2, 2)), no_grad(spec({13}, DType::f32, 0.5, 1.5)),
                      no_grad(spec({13}))},
                     LayerNormParams{1e-5f, y}});
    // GPT-2 124M's width: rows a multiple of the vector width take the GPUs' warp kernel.
    cases.push_back({"4x768" + tag,
                     {no_grad(spec({4, 768}, DType::f32, -2, 2)), no_grad(spec({768}, DType::f32, 0.5, 1.5)),
                      no_grad(spec({768}))},
                     LayerNormParams{1e-5f, y}});
  }
  cases.push_back({"1-D, eps 0.1", {spec({9}), spec({9}), spec({9})}, LayerNormParams{0.1f}});
  return cases;
}

// ---- layernorm_backward ------------------------------------------------------------
// inputs dy, x, weight, mean, rstd [, dres] -> dx, dweight, dbias [, dx narrowed]
// dres (optional, x's shape and dtype): a gradient dx is added to, the
// residual stream's in a pre-LN transformer (residual_layernorm_backward_fusion
// below gives it): dx = dres + the LayerNorm's own dx, one pass instead of a
// separate add reading both back. narrow_to bf16/f16 (under an f32 x): dx
// also written in that dtype, rounded from its f32 value as a cast after it
// would round it.
std::vector<TensorMeta> infer_layernorm_backward(std::span<const TensorMeta> in, const core::OpParams& params) {
  constexpr std::string_view op = "layernorm_backward";
  check_shape(in.size() == 5 || in.size() == 6, op,
              "expects 5 inputs (dy, x, weight, mean, rstd) or 6 (and the gradient dx is added to)", in);
  check_float(op, in, {0, 1, 2});
  const Shape& x = in[1].shape;
  check_shape(x.rank() >= 1 && in[0].shape == x, op, "dy must have x's shape", in);
  check_shape(in[2].shape == Shape{x.last()}, op, "weight must be (C)", in);
  const Shape rows{x.rows()};
  check_shape(in[3].shape == rows && in[4].shape == rows, op, "mean and rstd must be (rows)", in);
  check_dtype(op, in[3], DType::f32, "mean");
  check_dtype(op, in[4], DType::f32, "rstd");
  // dy narrower than x: the gradient arriving at a narrowed y (see layernorm).
  check_shape((in[0].dtype == in[1].dtype ||
               (in[1].dtype == DType::f32 && (in[0].dtype == DType::bf16 || in[0].dtype == DType::f16))) &&
                  in[2].dtype == in[1].dtype,
              op, "dy must have x's dtype (or bf16/f16 under an f32 x), and weight x's", in);
  if (in.size() == 6) check_shape(in[5] == in[1], op, "the gradient dx is added to must have x's shape and dtype", in);
  const DType narrow_to = std::get<LayerNormParams>(params).narrow_to;
  if (narrow_to == DType::f32) return {in[1], in[2], in[2]};
  check_shape(in[1].dtype == DType::f32 && (narrow_to == DType::bf16 || narrow_to == DType::f16), op,
              std::string("dx can be narrowed only from f32 to bf16 or f16 (narrow_to ") +
                  std::string(core::dtype_name(narrow_to)) + ")",
              in);
  return {in[1], in[2], in[2], TensorMeta{in[1].shape, narrow_to}};
}

void layernorm_backward_reference(const KernelCall& c) {
  const TensorView &dy = c.in(0), &x = c.in(1), &w = c.in(2), &mu = c.in(3), &rs = c.in(4);
  const int64_t C = x.shape().last(), rows = x.shape().rows();
  std::vector<double> dw(size_t(C), 0.0), db(size_t(C), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const double mean = ld(mu, r), rstd = ld(rs, r);
    double s1 = 0.0, s2 = 0.0;  // mean of dy*w, mean of dy*w*xhat
    for (int64_t i = 0; i < C; ++i) {
      const double g = ld(dy, r * C + i), xh = (ld(x, r * C + i) - mean) * rstd;
      s1 += g * ld(w, i);
      s2 += g * ld(w, i) * xh;
      dw[size_t(i)] += g * xh;
      db[size_t(i)] += g;
    }
    s1 /= double(C);
    s2 /= double(C);
    for (int64_t i = 0; i < C; ++i) {
      const int64_t k = r * C + i;
      const double g = ld(dy, k), xh = (ld(x, k) - mean) * rstd;
      st(c.out(0), k, rstd * (g * ld(w, i) - s1 - xh * s2));
      // dres + dx as stored: the unfused graph's add reads the LayerNorm's dx rounded to its dtype.
      if (c.inputs.size() == 6) st(c.out(0), k, ld(c.in(5), k) + ld(c.out(0), k));
      if (c.outputs.size() == 4) st(c.out(3), k, ld(c.out(0), k));  // narrowed from dx as stored
    }
  }
  for (int64_t i = 0; i < C; ++i) {
    st(c.out(1), i, dw[size_t(i)]);
    st(c.out(2), i, db[size_t(i)]);
  }
}

std::vector<TestCase> layernorm_backward_cases() {
  std::vector<TestCase> cases;
  auto one = [&](const std::string& label, Shape x, DType t) {
    const int64_t C = x.last(), rows = x.rows();
    cases.push_back({label,
                     {spec(x, t), spec(x, t, -2, 2), spec({C}, t, 0.5, 1.5), spec({rows}, DType::f32, -0.5, 0.5),
                      spec({rows}, DType::f32, 0.5, 2.0)},
                     LayerNormParams{}});
  };
  one("7x13", {7, 13}, DType::f32);
  one("2x5x33", {2, 5, 33}, DType::f32);
  one("64x256", {64, 256}, DType::f32);
  one("7x13 bf16", {7, 13}, DType::bf16);
  one("3x4x40 bf16", {3, 4, 40}, DType::bf16);
  // The backward of a narrowed y: dy bf16/f16, x and the results f32.
  // 5x37 takes the GPUs' block kernel, 8x768 (GPT-2 124M's width) the warp kernel.
  for (DType t : {DType::bf16, DType::f16})
    for (const Shape& x : {Shape{5, 37}, Shape{8, 768}}) {
      const int64_t C = x.last(), rows = x.rows();
      cases.push_back({std::to_string(rows) + "x" + std::to_string(C) + " dy " + std::string(core::dtype_name(t)),
                       {spec(x, t), spec(x, DType::f32, -2, 2), spec({C}, DType::f32, 0.5, 1.5),
                        spec({rows}, DType::f32, -0.5, 0.5), spec({rows}, DType::f32, 0.5, 2.0)},
                       LayerNormParams{}});
    }
  // With the gradient dx is added to (dres), and with dx narrowed (under an
  // f32 x): 8x768 takes the GPUs' warp kernel, 5x37 and 3x100 the block kernel.
  auto with_dres = [&](const std::string& label, Shape x, DType t, DType dy_t, DType narrow_to, bool dres) {
    const int64_t C = x.last(), rows = x.rows();
    std::vector<core::InputSpec> in = {spec(x, dy_t), spec(x, t, -2, 2), spec({C}, t, 0.5, 1.5),
                                       spec({rows}, DType::f32, -0.5, 0.5), spec({rows}, DType::f32, 0.5, 2.0)};
    if (dres) in.push_back(spec(x, t, -3, 3));
    cases.push_back({label, std::move(in), LayerNormParams{1e-5f, narrow_to}});
  };
  with_dres("7x13 + dres", {7, 13}, DType::f32, DType::f32, DType::f32, true);
  with_dres("2x5x33 + dres", {2, 5, 33}, DType::f32, DType::f32, DType::f32, true);
  with_dres("64x256 + dres", {64, 256}, DType::f32, DType::f32, DType::f32, true);
  with_dres("3x4x40 bf16 + dres", {3, 4, 40}, DType::bf16, DType::bf16, DType::f32, true);
  for (DType t : {DType::bf16, DType::f16}) {
    const std::string n(core::dtype_name(t));
    with_dres("8x768 dy " + n + " + dres, dx " + n, {8, 768}, DType::f32, t, t, true);
    with_dres("5x37 dy " + n + " + dres, dx " + n, {5, 37}, DType::f32, t, t, true);
    with_dres("3x100 dy " + n + ", dx " + n, {3, 100}, DType::f32, t, t, false);
  }
  with_dres("6x64 + dres, dx bf16", {6, 64}, DType::f32, DType::f32, DType::bf16, true);
  // G1's form over many warp-kernel blocks, the last one partly empty: the
  // dweight/dbias sums of every block meet in the finalize kernel.
  with_dres("203x768 dy bf16 + dres, dx bf16", {203, 768}, DType::f32, DType::bf16, DType::bf16, true);
  return cases;
}

}  // namespace

core::OpDef layernorm_def() {
  OpDef d;
  d.kind = OpKind::layernorm;
  d.name = "layernorm";
  d.infer = infer_layernorm;
  d.backward = layernorm_backward_rule;
  d.reference = layernorm_reference;
  d.test_cases = layernorm_cases;
  d.num_saved_outputs = 2;
  return d;
}

core::OpDef layernorm_backward_def() {
  OpDef d;
  d.kind = OpKind::layernorm_backward;
  d.name = "layernorm_backward";
  d.infer = infer_layernorm_backward;
  d.reference = layernorm_backward_reference;
  d.test_cases = layernorm_backward_cases;
  d.kernel_dtype_input = 1;  // x: dy may be narrower
  return d;
}

LayerNormOut layernorm(Graph& g, ValueId x, ValueId weight, ValueId bias, float eps, DType narrow_to) {
  register_ops();
  const auto out = g.add_node(OpKind::layernorm, {x, weight, bias}, LayerNormParams{eps, narrow_to});
  return {out[0], out[1], out[2]};
}

// ---- the backward pass: layernorm_backward -> add [-> cast]  =>  layernorm_backward

core::Pattern residual_layernorm_backward_fusion() {
  core::Pattern p;
  p.name = "residual_layernorm_backward_fusion";
  p.match = [](const Graph& g, int i, const core::GraphUses& uses) -> std::optional<core::Match> {
    const core::Node& lnb = g.nodes()[size_t(i)];
    if (lnb.op != OpKind::layernorm_backward || lnb.inputs.size() != 5 || lnb.outputs.size() != 3)
      return std::nullopt;
    const ValueId dxl = lnb.outputs[0];
    const int j = uses.sole_reader(dxl);  // the add summing dx into the residual gradient
    if (j < 0) return std::nullopt;
    const core::Node& sum = g.nodes()[size_t(j)];
    if (sum.op != OpKind::add || sum.inputs[0] == sum.inputs[1]) return std::nullopt;
    const ValueId dres = sum.inputs[0] == dxl ? sum.inputs[1] : sum.inputs[0];
    if (!(g.meta(dres) == g.meta(dxl))) return std::nullopt;  // no broadcast, no mixed dtypes
    // The fused op is emitted where the add stood, so nothing between the
    // LayerNorm backward and the add may read its weight and bias gradients
    // (autograd accumulates them after the add).
    for (ValueId v : {lnb.outputs[1], lnb.outputs[2]})
      for (int r : uses.readers(v))
        if (r < j) return std::nullopt;
    const ValueId s = sum.outputs[0];
    // A cast narrowing the sum (the gradient of a bf16/f16 residual branch)
    // becomes the fused op's narrowed output.
    int k = -1;
    DType narrow_to = DType::f32;
    if (g.meta(s).dtype == DType::f32)
      for (int r : uses.readers(s)) {
        const core::Node& c = g.nodes()[size_t(r)];
        const DType to = g.meta(c.outputs[0]).dtype;
        if (c.op == OpKind::cast && (to == DType::bf16 || to == DType::f16)) {
          k = r, narrow_to = to;
          break;
        }
      }
    core::Match m;
    m.nodes = {i, j};
    if (k >= 0) m.nodes.push_back(k);
    m.emit_at = j;
    const float eps = std::get<LayerNormParams>(lnb.params).eps;
    m.emit = [in = lnb.inputs, dres, outs = lnb.outputs, s,
              narrowed = k >= 0 ? g.nodes()[size_t(k)].outputs[0] : core::kNoValue,
              params = LayerNormParams{eps, narrow_to}](Graph& dst, std::vector<ValueId>& map) {
      std::vector<ValueId> args;
      for (ValueId v : in) args.push_back(map[size_t(v)]);
      args.push_back(map[size_t(dres)]);
      const std::vector<ValueId> out = dst.add_node(OpKind::layernorm_backward, std::move(args), params);
      map[size_t(s)] = out[0];
      map[size_t(outs[1])] = out[1];
      map[size_t(outs[2])] = out[2];
      if (narrowed != core::kNoValue) map[size_t(narrowed)] = out[3];
    };
    return m;
  };
  return p;
}

}  // namespace brisk::ops
