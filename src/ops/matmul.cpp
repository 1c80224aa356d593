// Matrix products: matmul and linear. They carry almost all of a transformer's
// FLOPs, so their shapes are chosen to map onto one BLAS call wherever
// possible: a shared (rank-2) right operand lets backends fold the batch into
// the rows, and linear keeps PyTorch's (out, in) weight layout so that
// y = x W^T is a single gemm over all rows with no transposed copy.
//
// The backward rules are written with matmul itself (transposes are flags,
// never materialized, except for one rare layout), reshape (a free view) and
// sum, so gradients run through the same fast kernels as the forward pass.
#include "brisk/core/autograd.h"
#include "op_util.h"

namespace brisk::ops {
using namespace detail;

namespace {

struct MatmulDims {
  int64_t batch, m, k, n;
  bool shared_b;
};

MatmulDims matmul_dims(const Shape& a, const Shape& b, const MatmulParams& p) {
  const int ra = a.rank();
  MatmulDims d;
  d.m = p.trans_a ? a[ra - 1] : a[ra - 2];
  d.k = p.trans_a ? a[ra - 2] : a[ra - 1];
  d.n = p.trans_b ? b[b.rank() - 2] : b[b.rank() - 1];
  d.batch = 1;
  for (int i = 0; i < ra - 2; ++i) d.batch *= a[i];
  d.shared_b = b.rank() == 2;
  return d;
}

std::vector<TensorMeta> infer_matmul(std::span<const TensorMeta> in, const core::OpParams& params) {
  constexpr std::string_view op = "matmul";
  check_shape(in.size() == 2 || in.size() == 3, op, "takes A, B and optionally an f32 accumulator C", in);
  check_float(op, in, {0, 1});
  check_shape(in[0].dtype == in[1].dtype, op, "operands must have the same dtype", in);
  const Shape &a = in[0].shape, &b = in[1].shape;
  check_shape(a.rank() >= 2, op, "A must have rank >= 2", in);
  check_shape(b.rank() == 2 || b.rank() == a.rank(), op,
              "B must be rank 2 (shared by every batch) or have A's rank", in);
  if (b.rank() == a.rank())
    for (int i = 0; i < a.rank() - 2; ++i)
      check_shape(a[i] == b[i], op, "batch dims of A and B must match", in);
  const auto& p = std::get<MatmulParams>(params);
  const int64_t k_a = p.trans_a ? a[a.rank() - 2] : a[a.rank() - 1];
  const int64_t k_b = p.trans_b ? b[b.rank() - 1] : b[b.rank() - 2];
  check_shape(k_a == k_b, op,
              std::string("inner dims differ (trans_a=") + (p.trans_a ? "1" : "0") +
                  ", trans_b=" + (p.trans_b ? "1" : "0") + ")",
              in);
  const MatmulDims d = matmul_dims(a, b, p);
  Shape out;
  for (int i = 0; i < a.rank() - 2; ++i) out.push_back(a[i]);
  out.push_back(d.m);
  out.push_back(d.n);
  if (in.size() == 3) {
    check_shape(in[2] == TensorMeta{out, DType::f32}, op, "the accumulator C must be f32 of the product's shape " + out.str(),
                in);
    return {in[2]};
  }
  return {TensorMeta{out, in[0].dtype}};
}

void matmul_reference(const KernelCall& c) {
  const auto& p = c.p<MatmulParams>();
  const TensorView &a = c.in(0), &b = c.in(1), &y = c.out(0);
  const MatmulDims d = matmul_dims(a.shape(), b.shape(), p);
  for (int64_t bt = 0; bt < d.batch; ++bt) {
    const int64_t ao = bt * d.m * d.k, bo = d.shared_b ? 0 : bt * d.k * d.n, yo = bt * d.m * d.n;
    for (int64_t i = 0; i < d.m; ++i)
      for (int64_t j = 0; j < d.n; ++j) {
        double acc = c.inputs.size() == 3 ? ld(c.in(2), yo + i * d.n + j) : 0.0;
        for (int64_t k = 0; k < d.k; ++k) {
          const double av = ld(a, ao + (p.trans_a ? k * d.m + i : i * d.k + k));
          const double bv = ld(b, bo + (p.trans_b ? j * d.k + k : k * d.n + j));
          acc += av * bv;
        }
        st(y, yo + i * d.n + j, acc);
      }
  }
}

// Swaps the last two dims (a materialized permute). Only the rare
// trans_a-with-shared-B gradient needs it.
ValueId swap_last2(Graph& g, ValueId x) {
  const int r = g.shape(x).rank();
  return transpose(g, x, r - 2, r - 1);
}

// C = op(A) op(B); with G = dC: d op(A) = G op(B)^T, d op(B) = op(A)^T G.
// With an accumulator input (C + op(A) op(B)), dC_in = G.
std::vector<ValueId> matmul_backward(Graph& g, const core::Node& node, std::span<const ValueId> dy) {
  const ValueId a = node.inputs[0], b = node.inputs[1], gy = dy[0];
  if (gy == core::kNoValue) return std::vector<ValueId>(node.inputs.size(), core::kNoValue);
  if (node.inputs.size() == 3) {
    if (g.meta(a).dtype != DType::f32)
      throw core::Error("matmul: no gradient through an accumulating product of low-precision operands");
    core::Node plain = node;
    plain.inputs.pop_back();
    std::vector<ValueId> grads = matmul_backward(g, plain, dy);
    grads.push_back(gy);
    return grads;
  }
  const auto& p = std::get<MatmulParams>(node.params);
  const Shape &sa = g.shape(a), &sb = g.shape(b);
  const bool shared = sb.rank() == 2 && sa.rank() > 2;

  // ---- dA
  ValueId da;
  if (!p.trans_a)
    da = matmul(g, gy, b, false, !p.trans_b);  // (..., M, K): works for shared and batched B
  else if (!shared)
    da = matmul(g, b, gy, p.trans_b, true);  // op(B) G^T: (..., K, M)
  else
    da = swap_last2(g, matmul(g, gy, b, false, !p.trans_b));

  // ---- dB
  ValueId db;
  if (!shared) {
    db = p.trans_b ? matmul(g, gy, a, true, p.trans_a)    // G^T op(A): (..., N, K)
                   : matmul(g, a, gy, !p.trans_a, false);  // op(A)^T G: (..., K, N)
  } else if (!p.trans_a) {
    // Fold the batch into the rows: one gemm over all of them.
    const int64_t k = sa[sa.rank() - 1], n = g.shape(gy).last();
    const int64_t rows = sa.numel() / std::max<int64_t>(k, 1);
    const ValueId a2 = reshape(g, a, Shape{rows, k});
    const ValueId g2 = reshape(g, gy, Shape{rows, n});
    db = p.trans_b ? matmul(g, g2, a2, true, false) : matmul(g, a2, g2, true, false);
  } else {
    // A is (..., K, M): per-batch products, then a sum over the batch.
    ValueId per = p.trans_b ? matmul(g, gy, a, true, true) : matmul(g, a, gy, false, false);
    const int64_t inner = sb.numel();
    per = reshape(g, per, Shape{g.shape(per).numel() / std::max<int64_t>(inner, 1), inner});
    db = reshape(g, sum(g, per, 0), sb);
  }
  return {da, db};
}

std::vector<TestCase> matmul_cases() {
  std::vector<TestCase> cases;
  auto ab = [](bool ta, bool tb, Shape batch, int64_t m, int64_t k, int64_t n, bool shared) {
    Shape a = batch, b = shared ? Shape{} : batch;
    a.push_back(ta ? k : m);
    a.push_back(ta ? m : k);
    b.push_back(tb ? n : k);
    b.push_back(tb ? k : n);
    return std::pair{a, b};
  };
  const char* names[] = {"nn", "nt", "tn", "tt"};
  for (int t = 0; t < 4; ++t) {
    const bool ta = t & 2, tb = t & 1;
    const std::string tag = names[t];
    const MatmulParams p{ta, tb};
    auto [a1, b1] = ab(ta, tb, {}, 7, 13, 33, true);
    cases.push_back({tag + " 2d 7x13x33", {spec(a1), spec(b1)}, p});
    auto [a2, b2] = ab(ta, tb, {2, 3}, 5, 9, 17, false);
    cases.push_back({tag + " batched (2,3)", {spec(a2), spec(b2)}, p});
    auto [a3, b3] = ab(ta, tb, {3}, 6, 11, 8, true);
    cases.push_back({tag + " shared B", {spec(a3), spec(b3)}, p});
    auto [a4, b4] = ab(ta, tb, {2}, 16, 32, 24, true);
    cases.push_back({tag + " bf16 shared B", {spec(a4, DType::bf16), spec(b4, DType::bf16)}, p});
    auto [a5, b5] = ab(ta, tb, {2}, 9, 20, 7, false);
    cases.push_back({tag + " bf16 batched", {spec(a5, DType::bf16), spec(b5, DType::bf16)}, p});
  }
  // Summed into a random f32 accumulator (weight gradients, beta = 1), with
  // f32 and bf16 operands, shared and batched B.
  for (DType t : {DType::f32, DType::bf16}) {
    const std::string tag = t == DType::f32 ? "" : " bf16";
    cases.push_back({"into tn 2d 13x9x21" + tag, {spec({9, 13}, t), spec({9, 21}, t), no_grad(spec({13, 21}))},
                     MatmulParams{true, false}});
    cases.push_back({"into nt 2d 40x70x29" + tag, {spec({40, 70}, t), spec({29, 70}, t), no_grad(spec({40, 29}))},
                     MatmulParams{false, true}});
    cases.push_back({"into batched (2,3)" + tag, {spec({2, 3, 5, 9}, t), spec({2, 3, 9, 17}, t), no_grad(spec({2, 3, 5, 17}))},
                     MatmulParams{}});
  }
  cases.push_back({"into shared B (3)", {spec({3, 6, 11}), spec({11, 8}), no_grad(spec({3, 6, 8}))}, MatmulParams{}});
  cases.push_back({"1x1x1", {spec({1, 1}), spec({1, 1})}, MatmulParams{}});
  cases.push_back({"64x64x64", {spec({64, 64}), spec({64, 64})}, MatmulParams{}});
  cases.push_back({"f16", {spec({5, 12}, DType::f16), spec({12, 6}, DType::f16)}, MatmulParams{}});
  return cases;
}

// ---- linear -------------------------------------------------------------------
std::vector<TensorMeta> infer_linear(std::span<const TensorMeta> in, const core::OpParams&) {
  constexpr std::string_view op = "linear";
  if (in.size() != 2) check_count(op, in, 3);
  check_float(op, in, {0, 1});
  const Shape &x = in[0].shape, &w = in[1].shape;
  check_shape(x.rank() >= 1, op, "x must have rank >= 1", in);
  check_shape(w.rank() == 2, op, "w must be (out, in)", in);
  check_shape(x.last() == w[1], op, "x's last dim must equal w's in-features (w is (out, in))", in);
  check_shape(in[0].dtype == in[1].dtype, op, "x and w must have the same dtype", in);
  if (in.size() == 3) {
    check_shape(in[2].shape == Shape{w[0]}, op, "bias must be (out)", in);
    check_shape(in[2].dtype == in[0].dtype, op, "bias must have x's dtype", in);
  }
  Shape out;
  for (int i = 0; i < x.rank() - 1; ++i) out.push_back(x[i]);
  out.push_back(w[0]);
  return {TensorMeta{out, in[0].dtype}};
}

void linear_reference(const KernelCall& c) {
  const TensorView &x = c.in(0), &w = c.in(1), &y = c.out(0);
  const bool has_bias = c.inputs.size() == 3;
  const int64_t in = w.shape()[1], out = w.shape()[0];
  const int64_t rows = in ? x.numel() / in : y.numel() / std::max<int64_t>(out, 1);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double acc = has_bias ? ld(c.in(2), o) : 0.0;
      for (int64_t i = 0; i < in; ++i) acc += ld(x, r * in + i) * ld(w, o * in + i);
      st(y, r * out + o, acc);
    }
}

std::vector<ValueId> linear_backward(Graph& g, const core::Node& node, std::span<const ValueId> dy) {
  const ValueId x = node.inputs[0], w = node.inputs[1], gy = dy[0];
  const bool has_bias = node.inputs.size() == 3;
  if (gy == core::kNoValue) return std::vector<ValueId>(node.inputs.size(), core::kNoValue);
  const int64_t in = g.shape(w)[1], out = g.shape(w)[0];
  const int64_t rows = g.shape(x).numel() / std::max<int64_t>(in, 1);
  // Everything runs on the (rows, features) views: reshapes are free, and each
  // product becomes one gemm over all rows.
  const Shape flat_x{rows, in}, flat_y{rows, out};
  const ValueId x2 = g.shape(x) == flat_x ? x : reshape(g, x, flat_x);
  const ValueId g2 = g.shape(gy) == flat_y ? gy : reshape(g, gy, flat_y);
  ValueId dx = matmul(g, g2, w, false, false);  // dy W: (rows, in)
  if (g.shape(x) != flat_x) dx = reshape(g, dx, g.shape(x));
  // dy^T x: (out, in), summed straight into the parameter's gradient when
  // nothing else adds to it first (core::grad_sink): a beta = 1 product.
  const ValueId dw = matmul(g, g2, x2, true, false, core::grad_sink(g, node, w));
  if (!has_bias) return {dx, dw};
  // The bias gradient (column sums of dy) likewise, where it has >= 2 outputs.
  const ValueId b_sink = out >= 2 ? core::grad_sink(g, node, node.inputs[2]) : core::kNoValue;
  return {dx, dw, b_sink != core::kNoValue ? column_sum_into(g, g2, b_sink) : sum(g, g2, 0)};
}

std::vector<TestCase> linear_cases() {
  std::vector<TestCase> cases;
  for (DType t : {DType::f32, DType::bf16}) {
    const std::string tag = t == DType::f32 ? "" : " bf16";
    cases.push_back({"2d bias" + tag, {spec({7, 13}, t), spec({33, 13}, t), spec({33}, t)}, NoParams{}});
    cases.push_back({"3d bias" + tag, {spec({2, 5, 16}, t), spec({24, 16}, t), spec({24}, t)}, NoParams{}});
    cases.push_back({"3d no bias" + tag, {spec({3, 4, 9}, t), spec({11, 9}, t)}, NoParams{}});
  }
  cases.push_back({"1d x", {spec({13}), spec({7, 13}), spec({7})}, NoParams{}});
  cases.push_back({"wide", {spec({2, 3, 64}), spec({96, 64}), spec({96})}, NoParams{}});
  // Decoding shapes: 16 rows (the CPU's few-row kernel, tails in every
  // direction) and 40 rows (the gemm).
  cases.push_back({"16 rows", {spec({16, 100}), spec({37, 100}), spec({37})}, NoParams{}});
  cases.push_back({"40 rows", {spec({40, 70}), spec({29, 70}), spec({29})}, NoParams{}});
  // fp16 mixed precision's Linear (the CPU kernel widens with F16C, sgemm, narrows).
  cases.push_back({"3d bias f16", {spec({3, 7, 33}, DType::f16), spec({13, 33}, DType::f16), spec({13}, DType::f16)},
                   NoParams{}});
  return cases;
}

// Low-precision products widen their operands to f32 in row chunks (CPU);
// this is the scratch that takes: B once, plus a chunk of A rows and C rows.
size_t lowp_gemm_workspace(DType t, int64_t rows, int64_t k, int64_t n) {
  if (t == DType::f32) return 0;
  const int64_t chunk = std::min<int64_t>(rows, std::max<int64_t>(64, (int64_t(1) << 22) / std::max<int64_t>(k + n, 1)));
  return size_t(k * n + chunk * (k + n)) * sizeof(float);
}

}  // namespace

core::OpDef matmul_def() {
  OpDef d;
  d.kind = OpKind::matmul;
  d.name = "matmul";
  d.infer = infer_matmul;
  d.backward = matmul_backward;
  d.reference = matmul_reference;
  d.test_cases = matmul_cases;
  d.output_aliases = {2};  // C + op(A) op(B) over the accumulator, when given
  d.workspace_bytes = [](std::span<const TensorMeta> in, const core::OpParams& params) -> size_t {
    const MatmulDims md = matmul_dims(in[0].shape, in[1].shape, std::get<MatmulParams>(params));
    const int64_t rows = md.shared_b && !std::get<MatmulParams>(params).trans_a ? md.batch * md.m : md.m;
    return lowp_gemm_workspace(in[0].dtype, rows, md.k, md.n);
  };
  return d;
}

core::OpDef linear_def() {
  OpDef d;
  d.kind = OpKind::linear;
  d.name = "linear";
  d.infer = infer_linear;
  d.backward = linear_backward;
  d.reference = linear_reference;
  d.test_cases = linear_cases;
  d.workspace_bytes = [](std::span<const TensorMeta> in, const core::OpParams&) -> size_t {
    const int64_t n_in = in[1].shape[1], n_out = in[1].shape[0];
    return lowp_gemm_workspace(in[0].dtype, in[0].shape.numel() / std::max<int64_t>(n_in, 1), n_in, n_out);
  };
  return d;
}

ValueId matmul(Graph& g, ValueId a, ValueId b, bool trans_a, bool trans_b, ValueId into) {
  register_ops();
  if (into != core::kNoValue) return g.add_node1(OpKind::matmul, {a, b, into}, MatmulParams{trans_a, trans_b});
  return g.add_node1(OpKind::matmul, {a, b}, MatmulParams{trans_a, trans_b});
}

ValueId linear(Graph& g, ValueId x, ValueId w, ValueId bias) {
  register_ops();
  if (bias == core::kNoValue) return g.add_node1(OpKind::linear, {x, w});
  return g.add_node1(OpKind::linear, {x, w, bias});
}

}  // namespace brisk::ops
