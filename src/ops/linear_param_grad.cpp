// linear_param_grad(dy, x, dw_into, db_into) -> (dw, db): a Linear's weight
// and bias gradients as one op,
//   dw = dw_into + dy^T x        (out, in)
//   db = db_into + sum_rows dy   (out)
// over dy (rows, out) and x (rows, in), both accumulators f32 and written in
// place. The unfused train graph runs these as two nodes reading dy: the
// weight-gradient matmul (beta = 1 into the parameter's gradient) and the
// column sums of dy (sum with an accumulator). bias_grad_fusion() below puts
// this op in their place. It was written for CUDA: cuBLASLt's BGRADB
// epilogue sums dy's columns while the product streams dy through the tensor
// cores, so the (rows, out) gradient is not read a second time
// (src/backends/cuda/linear_grad.cu). On an H200 that made the products
// slower by about what the separate pass cost, so a GPU run leaves the
// fusion off by default (GptConfig::fuse_bias_backward). The CPU composes
// matmul's and sum's kernels (the same bits as the two nodes).
#include <algorithm>

#include "brisk/core/passes.h"
#include "op_util.h"

namespace brisk::ops {
using namespace detail;

namespace {

constexpr std::string_view kOp = "linear_param_grad";

std::vector<TensorMeta> infer_linear_param_grad(std::span<const TensorMeta> in, const core::OpParams&) {
  check_count(kOp, in, 4);
  check_float(kOp, in, {0, 1});
  const Shape &dy = in[0].shape, &x = in[1].shape;
  check_shape(dy.rank() == 2 && x.rank() == 2, kOp, "dy must be (rows, out) and x (rows, in)", in);
  check_shape(dy[0] == x[0], kOp, "dy and x must have as many rows", in);
  check_shape(in[0].dtype == in[1].dtype, kOp, "dy and x must have the same dtype", in);
  check_shape(dy[1] >= 2, kOp, "the bias gradient needs out >= 2 (as sum's accumulator does)", in);
  check_shape(in[2] == TensorMeta{Shape{dy[1], x[1]}, DType::f32}, kOp, "dw_into must be f32 (out, in)", in);
  check_shape(in[3] == TensorMeta{Shape{dy[1]}, DType::f32}, kOp, "db_into must be f32 (out)", in);
  return {in[2], in[3]};
}

void linear_param_grad_reference(const KernelCall& c) {
  const TensorView &dy = c.in(0), &x = c.in(1);
  const int64_t rows = dy.shape()[0], out = dy.shape()[1], in = x.shape()[1];
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t i = 0; i < in; ++i) {
      double acc = ld(c.in(2), o * in + i);
      for (int64_t r = 0; r < rows; ++r) acc += ld(dy, r * out + o) * ld(x, r * in + i);
      st(c.out(0), o * in + i, acc);
    }
    double acc = ld(c.in(3), o);
    for (int64_t r = 0; r < rows; ++r) acc += ld(dy, r * out + o);
    st(c.out(1), o, acc);
  }
}

std::vector<TestCase> linear_param_grad_cases() {
  std::vector<TestCase> cases;
  // Random accumulators: a kernel that overwrites them instead of adding fails.
  // No backward rule (it is one), so every input is no_grad.
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    const std::string tag = t == DType::f32 ? "" : t == DType::bf16 ? " bf16" : " f16";
    auto c = [&](std::string label, int64_t rows, int64_t out, int64_t in) {
      cases.push_back({label + tag,
                       {no_grad(spec({rows, out}, t)), no_grad(spec({rows, in}, t)), no_grad(spec({out, in})),
                        no_grad(spec({out}))},
                       NoParams{}});
    };
    c("7 rows, 9 <- 13", 7, 9, 13);
    c("one row", 1, 17, 33);
    // out and in multiples of 8 (what cuBLASLt's epilogue wants) and not.
    c("64 rows, 32 <- 48", 64, 32, 48);
    c("40 rows, 100 <- 24", 40, 100, 24);
    if (t != DType::f16) c("threaded 300 rows, 256 <- 64", 300, 256, 64);
  }
  return cases;
}

}  // namespace

core::OpDef linear_param_grad_def() {
  OpDef d;
  d.kind = OpKind::linear_param_grad;
  d.name = kOp;
  d.infer = infer_linear_param_grad;
  d.reference = linear_param_grad_reference;
  d.test_cases = linear_param_grad_cases;
  d.output_aliases = {2, 3};  // over the accumulators
  // The CPU's composed matmul needs its low-precision scratch; CUDA keeps the
  // epilogue's bias gradient (out floats) here before adding it to db.
  d.workspace_bytes = [](std::span<const TensorMeta> in, const core::OpParams&) -> size_t {
    const int64_t rows = in[0].shape[0], out = in[0].shape[1], n_in = in[1].shape[1];
    const TensorMeta mm[] = {{Shape{rows, out}, in[0].dtype}, {Shape{rows, n_in}, in[1].dtype}};
    const size_t product = core::op_def(OpKind::matmul).workspace_bytes(std::span<const TensorMeta>(mm),
                                                                        MatmulParams{true, false});
    return std::max(product, size_t(out) * sizeof(float));
  };
  return d;
}

std::vector<ValueId> linear_param_grad(Graph& g, ValueId dy, ValueId x, ValueId dw_into, ValueId db_into) {
  register_ops();
  return g.add_node(OpKind::linear_param_grad, {dy, x, dw_into, db_into}, NoParams{});
}

// ---- the backward pass: matmul(dy^T x, into) + sum(dy, into)  =>  linear_param_grad

core::Pattern bias_grad_fusion() {
  core::Pattern p;
  p.name = "bias_grad_fusion";
  p.match = [](const Graph& g, int i, const core::GraphUses& uses) -> std::optional<core::Match> {
    // The bias gradient: column sums of dy (rows, out) added to an f32 accumulator.
    const core::Node& sm = g.nodes()[size_t(i)];
    if (sm.op != OpKind::sum || sm.inputs.size() != 2) return std::nullopt;
    const ValueId dy = sm.inputs[0];
    const DType t = g.meta(dy).dtype;
    if (g.shape(dy).rank() != 2 || !core::dtype_is_float(t)) return std::nullopt;
    // The weight gradient over the same dy: dy^T x summed into an accumulator.
    for (int j : uses.readers(dy)) {
      const core::Node& mm = g.nodes()[size_t(j)];
      if (j == i || mm.op != OpKind::matmul || mm.inputs.size() != 3 || mm.inputs[0] != dy) continue;
      const auto& mp = std::get<MatmulParams>(mm.params);
      const ValueId x = mm.inputs[1];
      if (!mp.trans_a || mp.trans_b || g.shape(x).rank() != 2 || g.meta(x).dtype != t) continue;
      // The replacement stands where the later of the two stood: nothing
      // between may read what the earlier one made.
      const int first = std::min(i, j), last = std::max(i, j);
      const ValueId early_out = g.nodes()[size_t(first)].outputs[0];
      const std::vector<int>& readers = uses.readers(early_out);
      if (std::any_of(readers.begin(), readers.end(), [last](int r) { return r < last; })) continue;
      core::Match m;
      m.nodes = {i, j};
      m.emit = [dy, x, dw_into = mm.inputs[2], db_into = sm.inputs[1], dw = mm.outputs[0], db = sm.outputs[0]](
                   Graph& dst, std::vector<ValueId>& map) {
        const std::vector<ValueId> out =
            linear_param_grad(dst, map[size_t(dy)], map[size_t(x)], map[size_t(dw_into)], map[size_t(db_into)]);
        map[size_t(dw)] = out[0];
        map[size_t(db)] = out[1];
      };
      return m;
    }
    return std::nullopt;
  };
  return p;
}

}  // namespace brisk::ops
