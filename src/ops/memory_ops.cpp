// Memory ops: cast between dtypes (cast_many: several tensors in one node),
// fill with a constant, copy, and the
// in-place accumulate that sums gradients. Mixed precision is built from
// casts, so cast's kernel is picked by its *input* dtype (one kernel per
// source type handles every destination); fill has no input, so its kernel
// is picked by the output dtype. accumulate writes into its first input: the
// planner sees the alias and never gives the output memory of its own.
#include <cstring>

#include "brisk/core/passes.h"
#include "op_util.h"

namespace brisk::ops {
using namespace detail;

namespace {

InputSpec int_spec(Shape s, double lo, double hi) {
  return InputSpec{TensorMeta{s, DType::i32}, lo, hi, false, {}};
}

}  // namespace

// ---- cast ----------------------------------------------------------------------------
core::OpDef cast_def() {
  OpDef d;
  d.kind = OpKind::cast;
  d.name = "cast";
  d.infer = [](std::span<const TensorMeta> in, const core::OpParams& p) {
    check_count("cast", in, 1);
    return std::vector<TensorMeta>{TensorMeta{in[0].shape, std::get<CastParams>(p).to}};
  };
  // Only float-to-float casts carry a gradient; integers are not differentiable.
  // The gradient arrives in the output's dtype, or already in the input's
  // when the reader summed it into the parameter's f32 gradient in place
  // (core::grad_sink): then it passes through.
  d.backward = [](Graph& g, const core::Node& n, std::span<const ValueId> dy) -> std::vector<ValueId> {
    const DType from = g.meta(n.inputs[0]).dtype, to = std::get<CastParams>(n.params).to;
    if (!core::dtype_is_float(from) || !core::dtype_is_float(to)) return {core::kNoValue};
    return {g.meta(dy[0]).dtype == from ? dy[0] : cast(g, dy[0], from)};
  };
  // store_from_double does the rounding: nearest-even into 16-bit floats,
  // toward zero into integers (as a C cast does).
  d.reference = [](const KernelCall& c) {
    for (int64_t i = 0; i < c.in(0).numel(); ++i) st(c.out(0), i, ld(c.in(0), i));
  };
  d.kernel_dtype_input = 0;
  d.test_cases = [] {
    std::vector<TestCase> cases;
    const DType floats[] = {DType::f32, DType::bf16, DType::f16};
    for (DType from : floats)
      for (DType to : floats) {
        // A narrowing cast is a staircase at the scale of the finite-difference
        // step (bf16 steps are 2^-7 near 2): only f32 -> f32 is grad-checked.
        InputSpec x = spec({7, 13}, from, -4.0, 4.0);
        if (to != DType::f32) x.differentiable = false;
        cases.push_back(
            {std::string(core::dtype_name(from)) + " to " + std::string(core::dtype_name(to)), {x}, CastParams{to}});
      }
    cases.push_back(
        {"f32 to bf16 long", {no_grad(spec({2, 1031}, DType::f32, -100.0, 100.0))}, CastParams{DType::bf16}});
    cases.push_back({"bf16 to f32 long", {spec({2, 1031}, DType::bf16, -100.0, 100.0)}, CastParams{DType::f32}});
    cases.push_back({"f32 to f16 long", {no_grad(spec({3, 333}, DType::f32, -100.0, 100.0))}, CastParams{DType::f16}});
    cases.push_back({"f16 to f32 long", {spec({3, 333}, DType::f16, -100.0, 100.0)}, CastParams{DType::f32}});
    cases.push_back({"i32 to f32", {int_spec({5, 9}, -1000, 1000)}, CastParams{DType::f32}});
    cases.push_back({"i32 to bf16", {int_spec({33}, -100, 100)}, CastParams{DType::bf16}});
    cases.push_back({"f32 to i32", {no_grad(spec({5, 9}, DType::f32, -100.0, 100.0))}, CastParams{DType::i32}});
    cases.push_back({"i32 to i64", {int_spec({17}, -1000, 1000)}, CastParams{DType::i64}});
    return cases;
  };
  return d;
}

// ---- cast_many: one node for many float casts ---------------------------------------------
// Output i is input i cast to `to`. Made by weight_cast_fusion() on a finished
// train graph, so it has no backward rule.
core::OpDef cast_many_def() {
  OpDef d;
  d.kind = OpKind::cast_many;
  d.name = "cast_many";
  d.infer = [](std::span<const TensorMeta> in, const core::OpParams& p) {
    const DType to = std::get<CastParams>(p).to;
    if (in.empty()) throw core::ShapeError("cast_many: needs at least one input");
    if (!core::dtype_is_float(to))
      throw core::DTypeError("cast_many: casts to a float dtype, not " + std::string(core::dtype_name(to)));
    std::vector<TensorMeta> out;
    for (size_t i = 0; i < in.size(); ++i) {
      if (!core::dtype_is_float(in[i].dtype))
        throw core::DTypeError("cast_many: input " + std::to_string(i) + " is " + in[i].str() +
                               "; it casts float tensors only");
      out.push_back(TensorMeta{in[i].shape, to});
    }
    return out;
  };
  d.reference = [](const KernelCall& c) {
    for (size_t t = 0; t < c.inputs.size(); ++t)
      for (int64_t i = 0; i < c.in(int(t)).numel(); ++i) st(c.out(int(t)), i, ld(c.in(int(t)), i));
  };
  d.kernel_dtype_input = 0;
  d.test_cases = [] {
    std::vector<TestCase> cases;
    // Odd sizes (a multi-tensor kernel's tails), one long enough for several
    // blocks of a GPU chunk, and an input whose dtype differs from the first.
    for (DType to : {DType::bf16, DType::f16, DType::f32}) {
      const std::string name = "f32 to " + std::string(core::dtype_name(to));
      cases.push_back({name,
                       {no_grad(spec({37}, DType::f32, -4.0, 4.0)), no_grad(spec({8, 100}, DType::f32, -4.0, 4.0)),
                        no_grad(spec({3, 5, 7}, DType::f32, -100.0, 100.0)),
                        no_grad(spec({2, 20001}, DType::f32, -4.0, 4.0))},
                       CastParams{to}});
    }
    cases.push_back({"one tensor", {no_grad(spec({3, 333}, DType::f32, -4.0, 4.0))}, CastParams{DType::bf16}});
    cases.push_back({"bf16 and f16 to f32",
                     {no_grad(spec({5, 9}, DType::bf16, -4.0, 4.0)), no_grad(spec({41}, DType::f16, -4.0, 4.0))},
                     CastParams{DType::f32}});
    return cases;
  };
  return d;
}

// ---- fill: no inputs -------------------------------------------------------------------
core::OpDef fill_def() {
  OpDef d;
  d.kind = OpKind::fill;
  d.name = "fill";
  d.infer = [](std::span<const TensorMeta> in, const core::OpParams& p) {
    check_count("fill", in, 0);
    const auto& fp = std::get<FillParams>(p);
    for (int i = 0; i < fp.shape.rank(); ++i)
      check_shape(fp.shape[i] >= 0, "fill", "shape " + fp.shape.str() + " must have non-negative dims", in);
    return std::vector<TensorMeta>{TensorMeta{fp.shape, fp.dtype}};
  };
  d.reference = [](const KernelCall& c) {
    const double v = c.p<FillParams>().value;
    for (int64_t i = 0; i < c.out(0).numel(); ++i) st(c.out(0), i, v);
  };
  d.kernel_dtype_input = -1;
  d.test_cases = [] {
    return std::vector<TestCase>{
        {"f32 zeros", {}, FillParams{Shape{7, 13}, DType::f32, 0.0}},
        {"f32 value", {}, FillParams{Shape{3, 5, 33}, DType::f32, -1.25}},
        {"f32 large", {}, FillParams{Shape{40000}, DType::f32, 0.5}},
        {"bf16", {}, FillParams{Shape{5, 17}, DType::bf16, 3.0}},
        {"f16", {}, FillParams{Shape{9}, DType::f16, -0.5}},
        {"i32", {}, FillParams{Shape{4, 4}, DType::i32, 7.0}},
        {"i64", {}, FillParams{Shape{11}, DType::i64, -3.0}},
        {"scalar", {}, FillParams{Shape{}, DType::f32, 2.0}},
    };
  };
  return d;
}

// ---- copy ----------------------------------------------------------------------------------
core::OpDef copy_def() {
  OpDef d;
  d.kind = OpKind::copy;
  d.name = "copy";
  d.infer = [](std::span<const TensorMeta> in, const core::OpParams&) {
    check_count("copy", in, 1);
    return std::vector<TensorMeta>{in[0]};
  };
  d.backward = [](Graph& g, const core::Node& n, std::span<const ValueId> dy) -> std::vector<ValueId> {
    return {dy[0]};
  };
  // Bytes, not doubles: exact for every dtype, i64 included.
  d.reference = [](const KernelCall& c) {
    if (c.out(0).data != c.in(0).data) std::memcpy(c.out(0).data, c.in(0).data, c.in(0).meta.bytes());
  };
  d.test_cases = [] {
    std::vector<TestCase> cases;
    for (DType t : {DType::f32, DType::bf16}) {
      cases.push_back({"odd rows", {spec({7, 13}, t)}, NoParams{}});
      cases.push_back({"rank 3", {spec({2, 5, 33}, t)}, NoParams{}});
    }
    cases.push_back({"f16", {spec({17}, DType::f16)}, NoParams{}});
    cases.push_back({"i32", {int_spec({3, 11}, -1000, 1000)}, NoParams{}});
    return cases;
  };
  return d;
}

// ---- accumulate: dst += src in place ---------------------------------------------------------
core::OpDef accumulate_def() {
  OpDef d;
  d.kind = OpKind::accumulate;
  d.name = "accumulate";
  d.infer = [](std::span<const TensorMeta> in, const core::OpParams&) {
    check_count("accumulate", in, 2);
    check_float("accumulate", in, {0, 1});
    check_shape(in[0] == in[1], "accumulate", "dst and src must have the same shape and dtype", in);
    return std::vector<TensorMeta>{in[0]};
  };
  // Element i is read before it is written, so this is right whether or not
  // the output is dst's memory.
  d.reference = [](const KernelCall& c) {
    for (int64_t i = 0; i < c.in(0).numel(); ++i) st(c.out(0), i, ld(c.in(0), i) + ld(c.in(1), i));
  };
  d.output_aliases = {0};
  d.test_cases = [] {
    std::vector<TestCase> cases;
    for (DType t : {DType::f32, DType::bf16}) {
      cases.push_back({"odd rows", {no_grad(spec({7, 13}, t)), no_grad(spec({7, 13}, t))}, NoParams{}});
      cases.push_back({"rank 3", {no_grad(spec({2, 5, 33}, t)), no_grad(spec({2, 5, 33}, t))}, NoParams{}});
      cases.push_back({"long", {no_grad(spec({40001}, t)), no_grad(spec({40001}, t))}, NoParams{}});
    }
    return cases;
  };
  return d;
}

// ---- the pass: the forward's weight casts  =>  one cast_many -----------------------------------
core::Pattern weight_cast_fusion() {
  core::Pattern p;
  p.name = "weight_cast_fusion";
  p.match = [](const Graph& g, int i, const core::GraphUses&) -> std::optional<core::Match> {
    // The 16-bit dtype node k casts an f32 parameter to, if it is such a cast.
    auto weight_cast_to = [&g](size_t k) -> std::optional<DType> {
      const core::Node& n = g.nodes()[k];
      if (n.op != OpKind::cast) return std::nullopt;
      const core::Value& x = g.value(n.inputs[0]);
      const DType t = std::get<CastParams>(n.params).to;
      if (x.role != core::ValueRole::param || x.meta.dtype != DType::f32 || (t != DType::bf16 && t != DType::f16))
        return std::nullopt;
      return t;
    };
    // Fires at the first such cast and claims all of them: a later one never
    // starts a match of its own (rewrite() skips claimed nodes).
    const size_t forward_end = g.backward_start();
    if (size_t(i) >= forward_end) return std::nullopt;
    const std::optional<DType> to = weight_cast_to(size_t(i));
    if (!to) return std::nullopt;
    core::Match m;
    std::vector<ValueId> xs, ys;
    for (size_t k = size_t(i); k < forward_end; ++k)
      if (weight_cast_to(k) == to) {
        m.nodes.push_back(int(k));
        xs.push_back(g.nodes()[k].inputs[0]);
        ys.push_back(g.nodes()[k].outputs[0]);
      }
    if (m.nodes.size() < 2) return std::nullopt;
    m.emit_at = i;  // parameters exist from the start: every copy is made before its first reader
    m.emit = [xs, ys, to = *to](Graph& dst, std::vector<ValueId>& map) {
      std::vector<ValueId> in;
      for (ValueId x : xs) in.push_back(map[size_t(x)]);
      const std::vector<ValueId> out = cast_many(dst, in, to);
      for (size_t k = 0; k < ys.size(); ++k) map[size_t(ys[k])] = out[k];
    };
    return m;
  };
  return p;
}

// ---- builders -----------------------------------------------------------------------------------
ValueId cast(Graph& g, ValueId x, core::DType to) {
  register_ops();
  return g.add_node1(OpKind::cast, {x}, CastParams{to});
}
std::vector<ValueId> cast_many(Graph& g, const std::vector<ValueId>& xs, core::DType to) {
  register_ops();
  return g.add_node(OpKind::cast_many, std::vector<ValueId>(xs), CastParams{to});
}
ValueId fill(Graph& g, const core::Shape& shape, core::DType dtype, double value) {
  register_ops();
  return g.add_node1(OpKind::fill, {}, FillParams{shape, dtype, value});
}
ValueId copy(Graph& g, ValueId x) {
  register_ops();
  return g.add_node1(OpKind::copy, {x});
}
ValueId accumulate(Graph& g, ValueId dst, ValueId src) {
  register_ops();
  return g.add_node1(OpKind::accumulate, {dst, src});
}

}  // namespace brisk::ops
