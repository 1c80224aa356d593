// Memory-efficient ("flash") causal self-attention on packed qkv, the same
// function as attention.cpp's op: qkv (B, T, 3C) -> y (B, T, C), head h using
// columns h*hd .. (h+1)*hd-1 of q, k and v. What differs is what is kept: the
// plain op saves the (B, n_head, T, T) probabilities, this one saves only the
// per-row log-sum-exp lse (B, n_head, T) = m + log(sum exp(s - m)). Kernels
// walk query tiles x key tiles with an online softmax (running max and sum),
// so no T x T matrix ever exists, and the backward recomputes each tile of
// probabilities as exp(s - lse) (FlashAttention-2's scheme, with
// D_i = rowsum(dy_i * y_i) standing in for rowsum(P * dP)). At T = 256 the
// saved probabilities are most of a GPT's activation memory; lse is 1/T of it.
//
// The reference kernels are the oracle, not a model of the tiling: they go one
// query row at a time, keeping that row's scores (O(T) memory), in double.
#include <algorithm>
#include <cmath>
#include <limits>

#include "attention_shapes.h"

namespace brisk::ops {
using namespace detail;

namespace {

using Dims = AttentionDims;

std::vector<TensorMeta> infer_forward(std::span<const TensorMeta> in, const core::OpParams& params) {
  check_attention_inputs("flash_attention", in, params, 1);
  check_float("flash_attention", in, {0});
  const Dims d = check_qkv("flash_attention", in, in[0], std::get<AttentionParams>(params).n_head);
  return {TensorMeta{Shape{d.B, d.T, d.C}, in[0].dtype}, TensorMeta{Shape{d.B, d.nh, d.T}, DType::f32}};
}

// Inputs: dy (B, T, C), qkv (B, T, 3C), y (B, T, C), lse (B, n_head, T) f32
// (and the dropout key).
std::vector<TensorMeta> infer_backward(std::span<const TensorMeta> in, const core::OpParams& params) {
  constexpr std::string_view op = "flash_attention_backward";
  check_attention_inputs(op, in, params, 4);
  check_float(op, in, {0, 1, 2});
  const Dims d = check_qkv(op, in, in[1], std::get<AttentionParams>(params).n_head);
  check_shape(in[0].shape == Shape{d.B, d.T, d.C}, op, "dy must be (B, T, C) for qkv (B, T, 3C)", in);
  check_shape(in[2].shape == Shape{d.B, d.T, d.C}, op, "y must be (B, T, C) for qkv (B, T, 3C)", in);
  check_shape(in[0].dtype == in[1].dtype && in[2].dtype == in[1].dtype, op,
              "dy, qkv and y must have the same dtype", in);
  check_shape(in[3].shape == Shape{d.B, d.nh, d.T}, op, "lse must be (B, n_head, T)", in);
  check_dtype(op, in[3], DType::f32, "lse");
  return {in[1]};
}

struct QkvIndex {
  Dims d;
  int64_t operator()(int64_t b, int64_t t, int part, int64_t h, int64_t i) const {
    return (b * d.T + t) * 3 * d.C + part * d.C + h * d.hd + i;
  }
};

// Scores of query t against keys 0..t (one causal row) into s.
void score_row(const TensorView& qkv, const QkvIndex& at, int64_t b, int64_t h, int64_t t, double scale,
               std::vector<double>& s) {
  for (int64_t u = 0; u <= t; ++u) {
    double dot = 0;
    for (int64_t i = 0; i < at.d.hd; ++i) dot += ld(qkv, at(b, t, 0, h, i)) * ld(qkv, at(b, u, 1, h, i));
    s[size_t(u)] = dot * scale;
  }
}

void forward_reference(const KernelCall& c) {
  const AttentionParams& p = c.p<AttentionParams>();
  const TensorView &qkv = c.in(0), &y = c.out(0), &lse = c.out(1);
  const Dims d = attention_dims(qkv.shape(), p.n_head);
  const double scale = attention_scale(p, d.hd);
  const QkvIndex at{d};
  const ReferenceProbDropout z(c, d.nh, d.T);
  std::vector<double> s(size_t(d.T));
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.nh; ++h)
      for (int64_t t = 0; t < d.T; ++t) {
        score_row(qkv, at, b, h, t, scale, s);
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t u = 0; u <= t; ++u) mx = std::max(mx, s[size_t(u)]);
        double sum = 0;
        for (int64_t u = 0; u <= t; ++u) sum += (s[size_t(u)] = std::exp(s[size_t(u)] - mx));
        st(lse, (b * d.nh + h) * d.T + t, mx + std::log(sum));
        for (int64_t i = 0; i < d.hd; ++i) {
          double acc = 0;
          for (int64_t u = 0; u <= t; ++u) acc += s[size_t(u)] * z(b, h, t, u) * ld(qkv, at(b, u, 2, h, i));
          st(y, (b * d.T + t) * d.C + h * d.hd + i, acc / sum);
        }
      }
}

// P = exp(S - lse) (recomputed), Z its dropout factors (1 without dropout),
// D_t = dy_t . y_t, and then
//   dV += (P Z)^T dY, dP = (dY V^T) Z, dS = P * (dP - D), dQ = scale dS K, dK = scale dS^T Q
// (products with Z elementwise). With the lse and y of the forward, D_t
// equals rowsum(P * dP) of the plain backward.
void backward_reference(const KernelCall& c) {
  const AttentionParams& p = c.p<AttentionParams>();
  const TensorView &dy = c.in(0), &qkv = c.in(1), &y = c.in(2), &lse = c.in(3), &dqkv = c.out(0);
  const Dims d = attention_dims(qkv.shape(), p.n_head);
  const double scale = attention_scale(p, d.hd);
  const QkvIndex at{d};
  const ReferenceProbDropout z(c, d.nh, d.T);
  std::vector<double> grad(size_t(dqkv.numel()), 0.0);
  std::vector<double> s(size_t(d.T));
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.nh; ++h)
      for (int64_t t = 0; t < d.T; ++t) {
        const int64_t yrow = (b * d.T + t) * d.C + h * d.hd;
        const double l = ld(lse, (b * d.nh + h) * d.T + t);
        double D = 0;
        for (int64_t i = 0; i < d.hd; ++i) D += ld(dy, yrow + i) * ld(y, yrow + i);
        score_row(qkv, at, b, h, t, scale, s);
        for (int64_t u = 0; u <= t; ++u) {
          const double pu = std::exp(s[size_t(u)] - l), zu = z(b, h, t, u);
          double dp = 0;
          for (int64_t i = 0; i < d.hd; ++i) {
            const double g = ld(dy, yrow + i);
            dp += g * ld(qkv, at(b, u, 2, h, i));
            grad[size_t(at(b, u, 2, h, i))] += pu * zu * g;
          }
          const double ds = pu * (dp * zu - D) * scale;
          for (int64_t i = 0; i < d.hd; ++i) {
            grad[size_t(at(b, t, 0, h, i))] += ds * ld(qkv, at(b, u, 1, h, i));
            grad[size_t(at(b, u, 1, h, i))] += ds * ld(qkv, at(b, t, 0, h, i));
          }
        }
      }
  for (size_t i = 0; i < grad.size(); ++i) st(dqkv, int64_t(i), grad[i]);
}

// (B, T, C, n_head): odd T, head sizes that are not powers of two, one head,
// and T that spans several query tiles (128 rows through gemm.h, 64 on the
// register tiles) and key tiles (256) of the CPU kernels, with ragged last
// tiles (130, 300: the online softmax's rescaling).
// The register tiles (attention_tiles.h: 6 rows x 16 columns, panels of 16
// keys) also get head sizes 32, 24 and 64 and lengths off a panel's edge
// (17, 83, 70); the online softmax's rescaling on them is the T 300 case.
using Config = AttentionConfig;
constexpr Config kConfigs[] = {{2, 7, 12, 3},  {1, 13, 20, 4},  {2, 5, 6, 1},    {3, 16, 24, 2},
                               {1, 33, 18, 3}, {1, 130, 32, 2}, {1, 300, 10, 1}, {2, 17, 64, 2},
                               {1, 83, 48, 2}, {1, 70, 128, 2}};
// bf16 with head_dim 64 takes the CUDA tensor-core kernels: 64-row tiles
// below T 512 (T 200: a ragged last tile), 128-row query tiles in the forward
// and 128-key tiles in the backward from 512 on (T 600 and 530: ragged tiles
// of both, over two batches and two heads).
constexpr Config kBf16Configs[] = {{2, 7, 12, 3},    {1, 70, 12, 2},   {1, 290, 16, 2},
                                   {1, 200, 128, 2}, {1, 600, 128, 2}, {2, 530, 64, 1}};

// Probability dropout (AttentionParams::dropout): several query and key
// tiles with ragged last ones (T 130, 300), the register tiles' panel edges
// (T 83, head 24), one head, and bf16 on both of its paths.
constexpr AttentionDropoutConfig kDropoutConfigs[] = {
    {{2, 7, 12, 3}, DType::f32, 0.2f}, {{1, 130, 32, 2}, DType::f32, 0.5f}, {{1, 300, 10, 1}, DType::f32, 0.1f},
    {{1, 83, 48, 2}, DType::f32, 0.3f}, {{2, 70, 12, 2}, DType::bf16, 0.2f}, {{1, 290, 16, 2}, DType::bf16, 0.4f},
    {{1, 200, 128, 2}, DType::bf16, 0.1f}};

std::vector<TestCase> forward_cases() {
  std::vector<TestCase> cases;
  for (const Config& k : kConfigs)
    cases.push_back({attention_label(k, DType::f32), {spec({k.B, k.T, 3 * k.C})}, AttentionParams{k.n_head, 0.f}});
  cases.push_back({"f32 explicit scale", {spec({2, 9, 3 * 8})}, AttentionParams{2, 0.8f}});
  // Large scores: the online max must keep exp() in range.
  cases.push_back({"f32 large scores", {spec({1, 270, 3 * 16}, DType::f32, -4.0, 4.0)}, AttentionParams{2, 0.f}});
  for (const Config& k : kBf16Configs)
    cases.push_back(
        {attention_label(k, DType::bf16), {spec({k.B, k.T, 3 * k.C}, DType::bf16)}, AttentionParams{k.n_head, 0.f}});
  // Last, so that the cases above keep their seeds (inputs are drawn per case in order).
  for (const AttentionDropoutConfig& c : kDropoutConfigs)
    cases.push_back(
        {attention_label(c), {spec({c.k.B, c.k.T, 3 * c.k.C}, c.t), dropout_key_spec()}, dropout_params(c, 11)});
  return cases;
}

// lse is drawn at random: the backward is a fixed function of its inputs
// whether or not they came from the forward (the unit test checks the pair).
std::vector<TestCase> backward_cases() {
  std::vector<TestCase> cases;
  auto add = [&](const Config& k, DType t, float scale) {
    cases.push_back({attention_label(k, t),
                     {no_grad(spec({k.B, k.T, k.C}, t)), no_grad(spec({k.B, k.T, 3 * k.C}, t)),
                      no_grad(spec({k.B, k.T, k.C}, t)), no_grad(spec({k.B, k.n_head, k.T}, DType::f32, 0.0, 2.0))},
                     AttentionParams{k.n_head, scale}});
  };
  for (const Config& k : kConfigs) add(k, DType::f32, 0.f);
  add(Config{2, 9, 8, 2}, DType::f32, 0.8f);
  for (const Config& k : kBf16Configs) add(k, DType::bf16, 0.f);
  for (const AttentionDropoutConfig& c : kDropoutConfigs) {
    const Config& k = c.k;
    cases.push_back({attention_label(c),
                     {no_grad(spec({k.B, k.T, k.C}, c.t)), no_grad(spec({k.B, k.T, 3 * k.C}, c.t)),
                      no_grad(spec({k.B, k.T, k.C}, c.t)), no_grad(spec({k.B, k.n_head, k.T}, DType::f32, 0.0, 2.0)),
                      dropout_key_spec()},
                     dropout_params(c, 11)});
  }
  return cases;
}

}  // namespace

// ---- flash_attention --------------------------------------------------------------
core::OpDef flash_attention_def() {
  OpDef d;
  d.kind = OpKind::flash_attention;
  d.name = "flash_attention";
  d.infer = infer_forward;
  // lse (output 1) is saved for the backward and gets no gradient of its own.
  // The dropout key (the last input, with dropout) gets none either.
  d.backward = [](Graph& g, const core::Node& n, std::span<const ValueId> dy) -> std::vector<ValueId> {
    return with_key_gradient(
        {g.add_node1(OpKind::flash_attention_backward,
                     with_dropout_key({dy[0], n.inputs[0], n.outputs[0], n.outputs[1]}, n), n.params)},
        n);
  };
  d.reference = forward_reference;
  d.test_cases = forward_cases;
  d.workspace_bytes = [](std::span<const TensorMeta> in, const core::OpParams& p) {
    return flash_workspace_bytes(in, p, 0);
  };
  d.num_saved_outputs = 1;
  return d;
}

// ---- flash_attention_backward -------------------------------------------------------
core::OpDef flash_attention_backward_def() {
  OpDef d;
  d.kind = OpKind::flash_attention_backward;
  d.name = "flash_attention_backward";
  d.infer = infer_backward;
  d.reference = backward_reference;
  d.test_cases = backward_cases;
  d.workspace_bytes = [](std::span<const TensorMeta> in, const core::OpParams& p) {
    return flash_workspace_bytes(in, p, 1);
  };
  d.kernel_dtype_input = 1;
  return d;
}

// ---- builder ------------------------------------------------------------------------
ValueId flash_attention(Graph& g, ValueId qkv, int n_head, const AttentionDropout& drop) {
  register_ops();
  return g.add_node(OpKind::flash_attention, drop.inputs({qkv}), drop.params(n_head))[0];
}

}  // namespace brisk::ops
