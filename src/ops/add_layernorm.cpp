// add_layernorm(a, r, w, b) -> (s, y, mean, rstd): s = a + r, then
// layernorm(s) with layernorm's own params, eps and saved statistics. In a
// pre-LN transformer every LayerNorm reads a residual sum that is also carried
// on to the next residual add, so s stays an output. The CPU kernel does the
// add, the statistics and the normalization row by row while the row is in
// L1: one read of a and r instead of the add's read-write pass followed by
// LayerNorm reading s back. residual_layernorm_fusion() below puts it in.
//
// r may be a's shape or its trailing dims, as for add (GPT's token +
// position embedding sum is such a broadcast). Mixed precision, as add and
// layernorm have it: under an f32 a, r may be bf16/f16 (the low-precision
// branch added to the f32 residual) and y may be written narrowed
// (LayerNormParams::narrow_to, for the Linear that reads it); s and the
// statistics stay f32. The backward rule is
// layernorm's own rule on (s, w, b) plus the gradient arriving at s, and the
// add's rule (r's gradient summed over the broadcast dims): the same graph
// the unfused pair would get from autograd.
#include <cmath>

#include "brisk/core/passes.h"
#include "op_util.h"

namespace brisk::ops {
using namespace detail;

namespace {

constexpr std::string_view kOp = "add_layernorm";

bool trailing_match(const Shape& a, const Shape& b) {
  if (b.rank() > a.rank() || b.rank() < 1) return false;
  for (int i = 1; i <= b.rank(); ++i)
    if (a[a.rank() - i] != b[b.rank() - i]) return false;
  return true;
}

std::vector<TensorMeta> infer_add_layernorm(std::span<const TensorMeta> in, const core::OpParams& params) {
  check_count(kOp, in, 4);
  check_float(kOp, in, {0, 1, 2, 3});
  const Shape& a = in[0].shape;
  check_shape(a.rank() >= 1, kOp, "a must have rank >= 1", in);
  check_shape(trailing_match(a, in[1].shape), kOp, "r must have a's shape or its trailing dims", in);
  const Shape c{a.last()};
  check_shape(in[2].shape == c && in[3].shape == c, kOp, "weight and bias must be (C) with C = a's last dim", in);
  auto narrower = [&](DType t) { return in[0].dtype == DType::f32 && (t == DType::bf16 || t == DType::f16); };
  check_shape(in[1].dtype == in[0].dtype || narrower(in[1].dtype), kOp,
              "r must have a's dtype, or bf16/f16 under an f32 a", in);
  for (int i = 2; i < 4; ++i)
    check_shape(in[size_t(i)].dtype == in[0].dtype, kOp, "a, weight and bias must have the same dtype", in);
  const DType narrow_to = std::get<LayerNormParams>(params).narrow_to;
  check_shape(narrow_to == DType::f32 || narrow_to == in[0].dtype || narrower(narrow_to), kOp,
              std::string("y can be narrowed only from f32 to bf16 or f16 (narrow_to ") +
                  std::string(core::dtype_name(narrow_to)) + ")",
              in);
  const TensorMeta stats{Shape{a.rows()}, DType::f32};
  return {in[0], TensorMeta{a, narrow_to == DType::f32 ? in[0].dtype : narrow_to}, stats, stats};
}

void add_layernorm_reference(const KernelCall& c) {
  const TensorView &a = c.in(0), &r = c.in(1), &s = c.out(0);
  const int64_t n = a.numel(), nr = r.numel();
  for (int64_t i = 0; i < n; ++i) st(s, i, ld(a, i) + ld(r, i % nr));
  // LayerNorm of s as stored (rounded to its dtype), as the unfused pair computes it.
  layernorm_rows_reference(s, c.in(2), c.in(3), c.p<LayerNormParams>().eps, c.out(1), c.out(2), c.out(3));
}

std::vector<ValueId> add_layernorm_backward(Graph& g, const core::Node& n, std::span<const ValueId> dy) {
  const ValueId r = n.inputs[1], s = n.outputs[0];
  ValueId ds = dy[0], dw = core::kNoValue, db = core::kNoValue;
  if (dy[1] != core::kNoValue) {
    // layernorm's rule on the node layernorm(s, w, b) -> (y, mean, rstd).
    core::Node ln;
    ln.op = OpKind::layernorm;
    ln.params = n.params;
    ln.inputs = {s, n.inputs[2], n.inputs[3]};
    ln.outputs = {n.outputs[1], n.outputs[2], n.outputs[3]};
    const ValueId grads[] = {dy[1], core::kNoValue, core::kNoValue};
    const std::vector<ValueId> d = core::op_def(OpKind::layernorm).backward(g, ln, std::span<const ValueId>(grads));
    // Same order as autograd's accumulation into s: the later reader's gradient first.
    ds = ds == core::kNoValue ? d[0] : add(g, ds, d[0]);
    dw = d[1];
    db = d[2];
  }
  if (ds == core::kNoValue) return {core::kNoValue, core::kNoValue, dw, db};
  ValueId dr = reduce_to(g, ds, g.shape(r));
  if (g.meta(dr).dtype != g.meta(r).dtype) dr = cast(g, dr, g.meta(r).dtype);  // a narrower r, as add's rule
  return {ds, dr, dw, db};
}

std::vector<TestCase> add_layernorm_cases() {
  std::vector<TestCase> cases;
  auto one = [&](const std::string& label, Shape a, Shape r, DType t, float eps = 1e-5f) {
    const int64_t C = a.last();
    // LayerNorm weight away from zero, a + r spread enough that rstd stays moderate.
    cases.push_back({label, {spec(a, t, -2, 2), spec(r, t), spec({C}, t, 0.5, 1.5), spec({C}, t)},
                     LayerNormParams{eps}});
  };
  for (DType t : {DType::f32, DType::bf16}) {
    const std::string tag = t == DType::f32 ? "" : " bf16";
    one("7x13" + tag, {7, 13}, {7, 13}, t);
    one("2x5x33" + tag, {2, 5, 33}, {2, 5, 33}, t);
    one("broadcast r (5,33)" + tag, {2, 5, 33}, {5, 33}, t);
  }
  one("broadcast r (C)", {3, 7, 13}, {13}, DType::f32);
  one("wide 3x256", {3, 256}, {3, 256}, DType::f32);
  one("1-D, eps 0.1", {9}, {9}, DType::f32, 0.1f);
  // Enough rows for the CPU kernel to split them across threads.
  one("threaded 2x150x96", {2, 150, 96}, {150, 96}, DType::f32);
  // Mixed precision: r bf16/f16 under an f32 a and/or y narrowed. Not
  // differentiated by finite differences (a rounded y hides them, as for
  // layernorm's narrowed cases); the GPT tests compare the fused graph's
  // gradients with the unfused one's. 4x768 takes the GPUs' warp kernel,
  // 5x37 their block kernel.
  auto mixed = [&](const std::string& label, Shape a, Shape r, DType rt, DType y) {
    const int64_t C = a.last();
    cases.push_back({label,
                     {no_grad(spec(a, DType::f32, -2, 2)), no_grad(spec(r, rt)),
                      no_grad(spec({C}, DType::f32, 0.5, 1.5)), no_grad(spec({C}))},
                     LayerNormParams{1e-5f, y}});
  };
  for (DType t : {DType::bf16, DType::f16}) {
    const std::string n(core::dtype_name(t));
    mixed("4x768 r " + n + ", y " + n, {4, 768}, {4, 768}, t, t);
    mixed("5x37 r " + n + ", y " + n, {5, 37}, {5, 37}, t, t);
    mixed("4x768 y " + n, {4, 768}, {4, 768}, DType::f32, t);
    mixed("broadcast r (3,64) " + n + ", y " + n, {2, 3, 64}, {3, 64}, t, t);
  }
  mixed("4x768 r bf16, y f32", {4, 768}, {4, 768}, DType::bf16, DType::f32);
  return cases;
}

}  // namespace

core::OpDef add_layernorm_def() {
  OpDef d;
  d.kind = OpKind::add_layernorm;
  d.name = kOp;
  d.infer = infer_add_layernorm;
  d.backward = add_layernorm_backward;
  d.reference = add_layernorm_reference;
  d.test_cases = add_layernorm_cases;
  d.num_saved_outputs = 2;  // mean, rstd
  return d;
}

AddLayerNormOut add_layernorm(Graph& g, ValueId a, ValueId r, ValueId weight, ValueId bias, float eps) {
  register_ops();
  const auto out = g.add_node(OpKind::add_layernorm, {a, r, weight, bias}, LayerNormParams{eps});
  return {out[0], out[1], out[2], out[3]};
}

// ---- the pass: add -> layernorm  =>  add_layernorm -------------------------------

core::Pattern residual_layernorm_fusion() {
  core::Pattern p;
  p.name = "residual_layernorm_fusion";
  p.match = [](const Graph& g, int i, const core::GraphUses& uses) -> std::optional<core::Match> {
    const core::Node& sum = g.nodes()[size_t(i)];
    if (sum.op != OpKind::add) return std::nullopt;
    const ValueId s = sum.outputs[0];
    const DType t = g.meta(s).dtype;
    if (t != DType::f32 && t != DType::bf16) return std::nullopt;  // the CPU kernels' dtypes, as layernorm's
    // A mixed add (a bf16/f16 branch under the f32 residual) is add_layernorm's mixed form.
    if (g.meta(sum.inputs[0]).dtype != t) return std::nullopt;
    // The first LayerNorm normalizing s. The fused op is emitted where that
    // LayerNorm stood, so s must have no reader before it.
    int j = -1;
    for (int k : uses.readers(s)) {
      const core::Node& n = g.nodes()[size_t(k)];
      if (n.op == OpKind::layernorm && n.inputs[0] == s && n.inputs[1] != s && n.inputs[2] != s) {
        j = k;
        break;
      }
    }
    if (j < 0) return std::nullopt;
    for (int k : uses.readers(s))
      if (k < j) return std::nullopt;
    const core::Node& ln = g.nodes()[size_t(j)];
    if (!(g.meta(ln.inputs[1]).dtype == t && g.meta(ln.inputs[2]).dtype == t)) return std::nullopt;
    core::Match m;
    m.nodes = {i, j};
    m.emit = [a = sum.inputs[0], r = sum.inputs[1], w = ln.inputs[1], b = ln.inputs[2], s, outs = ln.outputs,
              params = ln.params](Graph& dst, std::vector<ValueId>& map) {
      const std::vector<ValueId> out = dst.add_node(
          OpKind::add_layernorm, {map[size_t(a)], map[size_t(r)], map[size_t(w)], map[size_t(b)]}, params);
      map[size_t(s)] = out[0];
      for (size_t k = 0; k < 3; ++k) map[size_t(outs[k])] = out[k + 1];
    };
    return m;
  };
  return p;
}

}  // namespace brisk::ops
