// linear_gelu(x, W[, b]) -> (y, h): h = x W^T + b, y = gelu_tanh(h). The MLP's
// first Linear and its GELU as one op, put into graphs by bias_gelu_fusion()
// below. The point is the CPU kernel: each thread applies GELU to its own
// block of rows right after its gemm, while they are in its caches, instead
// of a second parallel pass reading the (rows, 4C) pre-activation back.
//
// h is kept as a second ("saved") output because the backward needs the
// pre-activation: dh = gelu_backward(h, dy), then exactly linear's gradients.
// The backward rule calls the linear op's own rule on dh, so the gradient
// graph is the one the unfused pair would build and runs through the same
// kernels; only the forward changes.
//
// Also here: matmul_gelu_backward, the MLP's fused backward step, and the
// backward pass that puts it in (below).
#include <algorithm>

#include "brisk/core/passes.h"
#include "op_util.h"

namespace brisk::ops {
using namespace detail;

namespace {

constexpr std::string_view kOp = "linear_gelu";

std::vector<TensorMeta> infer_linear_gelu(std::span<const TensorMeta> in, const core::OpParams&) {
  if (in.size() != 2) check_count(kOp, in, 3);
  check_float(kOp, in, {0, 1});
  const Shape &x = in[0].shape, &w = in[1].shape;
  check_shape(x.rank() >= 1, kOp, "x must have rank >= 1", in);
  check_shape(w.rank() == 2, kOp, "w must be (out, in)", in);
  check_shape(x.last() == w[1], kOp, "x's last dim must equal w's in-features (w is (out, in))", in);
  check_shape(in[0].dtype == in[1].dtype, kOp, "x and w must have the same dtype", in);
  if (in.size() == 3) {
    check_shape(in[2].shape == Shape{w[0]}, kOp, "bias must be (out)", in);
    check_shape(in[2].dtype == in[0].dtype, kOp, "bias must have x's dtype", in);
  }
  Shape out;
  for (int i = 0; i < x.rank() - 1; ++i) out.push_back(x[i]);
  out.push_back(w[0]);
  const TensorMeta y{out, in[0].dtype};
  return {y, y};
}

// GELU is applied to h as stored (rounded to its dtype), as the unfused
// linear -> gelu pair does.
void linear_gelu_reference(const KernelCall& c) {
  const TensorView &x = c.in(0), &w = c.in(1), &y = c.out(0), &h = c.out(1);
  const bool has_bias = c.inputs.size() == 3;
  const int64_t in = w.shape()[1], out = w.shape()[0];
  const int64_t rows = y.numel() / std::max<int64_t>(out, 1);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double acc = has_bias ? ld(c.in(2), o) : 0.0;
      for (int64_t i = 0; i < in; ++i) acc += ld(x, r * in + i) * ld(w, o * in + i);
      st(h, r * out + o, acc);
      st(y, r * out + o, gelu_tanh(ld(h, r * out + o)));
    }
}

std::vector<ValueId> linear_gelu_backward(Graph& g, const core::Node& n, std::span<const ValueId> dy) {
  const ValueId h = n.outputs[1];
  ValueId dh = dy[0] == core::kNoValue ? core::kNoValue : g.add_node1(OpKind::gelu_backward, {h, dy[0]});
  if (dy[1] != core::kNoValue) dh = dh == core::kNoValue ? dy[1] : add(g, dh, dy[1]);
  if (dh == core::kNoValue) return std::vector<ValueId>(n.inputs.size(), core::kNoValue);
  // linear's own rule on the node linear(x, W[, b]) -> h.
  core::Node lin;
  lin.op = OpKind::linear;
  lin.params = NoParams{};
  lin.inputs = n.inputs;
  lin.outputs = {h};
  const ValueId grads[] = {dh};
  return core::op_def(OpKind::linear).backward(g, lin, std::span<const ValueId>(grads));
}

std::vector<TestCase> linear_gelu_cases() {
  std::vector<TestCase> cases;
  // x spread so that h covers GELU's curved region and both tails.
  for (DType t : {DType::f32, DType::bf16}) {
    const std::string tag = t == DType::f32 ? "" : " bf16";
    cases.push_back({"2d bias 7x13->33" + tag, {spec({7, 13}, t, -2, 2), spec({33, 13}, t), spec({33}, t)}, NoParams{}});
    cases.push_back({"3d bias" + tag, {spec({2, 5, 16}, t, -2, 2), spec({24, 16}, t), spec({24}, t)}, NoParams{}});
    cases.push_back({"3d no bias" + tag, {spec({3, 4, 9}, t, -2, 2), spec({11, 9}, t)}, NoParams{}});
  }
  cases.push_back({"1d x", {spec({13}, DType::f32, -2, 2), spec({7, 13}), spec({7})}, NoParams{}});
  cases.push_back({"one row", {spec({1, 33}, DType::f32, -2, 2), spec({17, 33}), spec({17})}, NoParams{}});
  // Enough work for the CPU kernel to split the rows across threads.
  cases.push_back({"threaded 70x40->100", {spec({70, 40}, DType::f32, -2, 2), spec({100, 40}), spec({100})}, NoParams{}});
  // W2's MLP width with an odd row count (ragged thread blocks). Too big for
  // finite differences (the inputs are marked no_grad), so forward only.
  cases.push_back({"wide 333x8->1536",
                   {no_grad(spec({333, 8}, DType::f32, -2, 2)), no_grad(spec({1536, 8})), no_grad(spec({1536}))},
                   NoParams{}});
  return cases;
}

}  // namespace

core::OpDef linear_gelu_def() {
  OpDef d;
  d.kind = OpKind::linear_gelu;
  d.name = kOp;
  d.infer = infer_linear_gelu;
  d.backward = linear_gelu_backward;
  d.reference = linear_gelu_reference;
  d.test_cases = linear_gelu_cases;
  d.num_saved_outputs = 1;  // h: read by the backward, not a result
  // The CPU bf16 path runs the linear kernel and then the gelu kernel, so it
  // needs linear's low-precision scratch (B widened plus a chunk of rows).
  d.workspace_bytes = [](std::span<const TensorMeta> in, const core::OpParams& p) -> size_t {
    if (in[0].dtype == DType::f32) return 0;
    return core::op_def(OpKind::linear).workspace_bytes(in, p);
  };
  return d;
}

std::vector<ValueId> linear_gelu(Graph& g, ValueId x, ValueId w, ValueId bias) {
  register_ops();
  if (bias == core::kNoValue) return g.add_node(OpKind::linear_gelu, {x, w});
  return g.add_node(OpKind::linear_gelu, {x, w, bias});
}

// ---- matmul_gelu_backward(dy, W, h) -> dh ---------------------------------------
// dh = (dy W) * gelu'(h): the gradient reaching the pre-activation h of a GELU
// whose output y = gelu(h) feeds a Linear (y W^T + b), given that Linear's
// output gradient dy (..., out), with W (out, in) and h (..., in) of as many
// rows. The MLP's backward as the unfused graph runs it is matmul(dy, W),
// then gelu_backward(h, that) reading the (rows, in) product back; put in by
// gelu_backward_fusion() below. The product is rounded to its dtype before
// it meets gelu'(h), as in that pair, so on the CPU (which composes the two
// kernels) fused and unfused graphs agree bit for bit. The point is CUDA:
// cuBLASLt's DGELU epilogue applies gelu'(h) to the product on its way out
// of the GEMM (src/backends/cuda/activation.cu), so the product is never
// written and read back.

namespace {

constexpr std::string_view kBackwardOp = "matmul_gelu_backward";

std::vector<TensorMeta> infer_matmul_gelu_backward(std::span<const TensorMeta> in, const core::OpParams&) {
  check_count(kBackwardOp, in, 3);
  check_float(kBackwardOp, in, {0, 1, 2});
  const Shape &dy = in[0].shape, &w = in[1].shape, &h = in[2].shape;
  check_shape(w.rank() == 2, kBackwardOp, "w must be (out, in)", in);
  check_shape(dy.rank() >= 1 && h.rank() >= 1, kBackwardOp, "dy and h must have rank >= 1", in);
  check_shape(dy.last() == w[0], kBackwardOp, "dy's last dim must equal w's out-features (w is (out, in))", in);
  check_shape(h.last() == w[1], kBackwardOp, "h's last dim must equal w's in-features (w is (out, in))", in);
  check_shape(dy.numel() / std::max<int64_t>(w[0], 1) == h.numel() / std::max<int64_t>(w[1], 1), kBackwardOp,
              "dy and h must have as many rows", in);
  check_shape(in[0].dtype == in[1].dtype && in[1].dtype == in[2].dtype, kBackwardOp,
              "dy, w and h must have the same dtype", in);
  return {in[2]};
}

void matmul_gelu_backward_reference(const KernelCall& c) {
  const TensorView &dy = c.in(0), &w = c.in(1), &h = c.in(2), &dh = c.out(0);
  const int64_t out = w.shape()[0], in = w.shape()[1];
  const int64_t rows = dh.numel() / std::max<int64_t>(in, 1);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < in; ++i) {
      double acc = 0.0;
      for (int64_t o = 0; o < out; ++o) acc += ld(dy, r * out + o) * ld(w, o * in + i);
      st(dh, r * in + i, acc);  // the product as stored, then through GELU
      st(dh, r * in + i, gelu_tanh_derivative(ld(h, r * in + i)) * ld(dh, r * in + i));
    }
}

std::vector<TestCase> matmul_gelu_backward_cases() {
  std::vector<TestCase> cases;
  // h spread over GELU's curved region and both tails. No backward rule (it
  // is one), so no finite differences: every input is no_grad.
  for (DType t : {DType::f32, DType::bf16}) {
    const std::string tag = t == DType::f32 ? "" : " bf16";
    auto c = [&](std::string label, Shape dy, Shape w, Shape h) {
      cases.push_back({label + tag,
                       {no_grad(spec(dy, t)), no_grad(spec(w, t)), no_grad(spec(h, t, -4, 4))},
                       NoParams{}});
    };
    c("2d 7x13 -> 9", {7, 13}, {13, 9}, {7, 9});
    c("3d h under a 2d dy", {10, 16}, {16, 24}, {2, 5, 24});
    c("one row", {1, 33}, {33, 17}, {1, 17});
    // in a multiple of 8 (what cuBLASLt's DGELU epilogue needs) and not.
    c("64x32 -> 128", {64, 32}, {32, 128}, {64, 128});
    c("48x40 -> 100", {48, 40}, {40, 100}, {48, 100});
    // Enough work for the CPU's products to split across threads.
    c("threaded 300x64 -> 256", {300, 64}, {64, 256}, {300, 256});
  }
  return cases;
}

}  // namespace

core::OpDef matmul_gelu_backward_def() {
  OpDef d;
  d.kind = OpKind::matmul_gelu_backward;
  d.name = kBackwardOp;
  d.infer = infer_matmul_gelu_backward;
  d.reference = matmul_gelu_backward_reference;
  d.test_cases = matmul_gelu_backward_cases;
  // Kernels that compose matmul's (the CPU's) need its low-precision scratch.
  d.workspace_bytes = [](std::span<const TensorMeta> in, const core::OpParams&) -> size_t {
    const int64_t out = in[1].shape[0];
    const TensorMeta flat[] = {{Shape{in[0].shape.numel() / std::max<int64_t>(out, 1), out}, in[0].dtype}, in[1]};
    return core::op_def(OpKind::matmul).workspace_bytes(std::span<const TensorMeta>(flat), MatmulParams{});
  };
  return d;
}

ValueId matmul_gelu_backward(Graph& g, ValueId dy, ValueId w, ValueId h) {
  register_ops();
  return g.add_node1(OpKind::matmul_gelu_backward, {dy, w, h});
}

// ---- the pass: linear -> gelu  =>  linear_gelu -----------------------------------

core::Pattern bias_gelu_fusion() {
  core::Pattern p;
  p.name = "bias_gelu_fusion";
  p.match = [](const Graph& g, int i, const core::GraphUses& uses) -> std::optional<core::Match> {
    const core::Node& lin = g.nodes()[size_t(i)];
    if (lin.op != OpKind::linear) return std::nullopt;
    const ValueId h = lin.outputs[0];
    // CPU kernels exist for f32 and bf16 (gelu has no f16 kernel either).
    const DType t = g.meta(h).dtype;
    if (t != DType::f32 && t != DType::bf16) return std::nullopt;
    // GELU must be the only reader of the pre-activation (which the fused op
    // still produces, but as saved output for its backward, not for others).
    const int j = uses.sole_reader(h);
    if (j < 0) return std::nullopt;
    const core::Node& act = g.nodes()[size_t(j)];
    if (act.op != OpKind::gelu) return std::nullopt;
    core::Match m;
    m.nodes = {i, j};
    m.emit = [inputs = lin.inputs, h, y = act.outputs[0]](Graph& dst, std::vector<ValueId>& map) {
      std::vector<ValueId> in;
      for (ValueId v : inputs) in.push_back(map[size_t(v)]);
      const std::vector<ValueId> out = dst.add_node(OpKind::linear_gelu, std::move(in), NoParams{});
      map[size_t(y)] = out[0];
      map[size_t(h)] = out[1];
    };
    return m;
  };
  return p;
}

// ---- the backward pass: matmul [-> reshape] -> gelu_backward  =>  matmul_gelu_backward

core::Pattern gelu_backward_fusion() {
  core::Pattern p;
  p.name = "gelu_backward_fusion";
  p.match = [](const Graph& g, int i, const core::GraphUses& uses) -> std::optional<core::Match> {
    const core::Node& gb = g.nodes()[size_t(i)];
    if (gb.op != OpKind::gelu_backward) return std::nullopt;
    const ValueId h = gb.inputs[0];
    const DType t = g.meta(h).dtype;
    if (t != DType::f32 && t != DType::bf16) return std::nullopt;  // the gelu_backward kernels' dtypes
    core::Match m;
    m.nodes = {i};
    // dy's producer, through the reshape a Linear's rule puts after its
    // (rows, in) product when x had more dims; each read by the next only.
    ValueId d = gb.inputs[1];
    if (d == h || uses.sole_reader(d) != i) return std::nullopt;
    int prod = g.value(d).producer;
    if (prod >= 0 && g.nodes()[size_t(prod)].op == OpKind::reshape) {
      m.nodes.push_back(prod);
      d = g.nodes()[size_t(prod)].inputs[0];
      if (uses.sole_reader(d) != prod) return std::nullopt;
      prod = g.value(d).producer;
    }
    if (prod < 0) return std::nullopt;
    const core::Node& mm = g.nodes()[size_t(prod)];
    if (mm.op != OpKind::matmul || mm.inputs.size() != 2) return std::nullopt;  // not summed into an accumulator
    const auto& mp = std::get<MatmulParams>(mm.params);
    if (mp.trans_a || mp.trans_b) return std::nullopt;
    const ValueId dy = mm.inputs[0], w = mm.inputs[1];
    if (g.shape(w).rank() != 2 || g.shape(dy).rank() != 2 || g.meta(dy).dtype != t || g.meta(w).dtype != t)
      return std::nullopt;
    m.nodes.push_back(prod);
    m.emit = [dy, w, h, dh = gb.outputs[0]](Graph& dst, std::vector<ValueId>& map) {
      map[size_t(dh)] = matmul_gelu_backward(dst, map[size_t(dy)], map[size_t(w)], map[size_t(h)]);
    };
    return m;
  };
  return p;
}

}  // namespace brisk::ops
