// Causal multi-head self-attention on packed qkv, as in GPT-2 / llm.c /
// nanoGPT: qkv (B, T, 3C) holds [q | k | v] along the last dim, head h uses
// columns h*hd .. (h+1)*hd-1 of each part (hd = C / n_head), and the heads'
// outputs are concatenated back along C. This is the plain version that keeps
// the (B, n_head, T, T) softmax probabilities as a saved output, so the
// backward pass needs no recomputation; the memory-efficient tiled version is
// a separate op. The reference kernels touch only the causal lower triangle,
// exactly like the fast kernels, so the masked entries of `probs` (zero by
// contract) never influence a result: that lets the harness feed
// attention_backward arbitrary random probabilities.
//
// With AttentionParams::dropout > 0 (every attention op alike; the key is
// the last input of the op and of its backward) the probabilities are
// dropped before they multiply V: y = (P * Z) V, Z the keep factors of
// brisk/ops/dropout.h's hash at each probability's (B, n_head, T, T) index.
// `probs` stays the undropped P, and the backward remakes Z from the key.
#include <cmath>
#include <limits>

#include "attention_shapes.h"

namespace brisk::ops {
using namespace detail;

namespace {

using Dims = AttentionDims;

std::vector<TensorMeta> infer_attention(std::span<const TensorMeta> in, const core::OpParams& params) {
  check_attention_inputs("attention", in, params, 1);
  check_float("attention", in, {0});
  const Dims d = check_qkv("attention", in, in[0], std::get<AttentionParams>(params).n_head);
  return {TensorMeta{Shape{d.B, d.T, d.C}, in[0].dtype}, TensorMeta{Shape{d.B, d.nh, d.T, d.T}, DType::f32}};
}

std::vector<TensorMeta> infer_attention_backward(std::span<const TensorMeta> in, const core::OpParams& params) {
  constexpr std::string_view op = "attention_backward";
  check_attention_inputs(op, in, params, 3);
  check_float(op, in, {0, 1});
  const Dims d = check_qkv(op, in, in[1], std::get<AttentionParams>(params).n_head);
  check_shape(in[0].shape == Shape{d.B, d.T, d.C}, op, "dy must be (B, T, C) for qkv (B, T, 3C)", in);
  check_shape(in[0].dtype == in[1].dtype, op, "dy and qkv must have the same dtype", in);
  check_shape(in[2].shape == Shape{d.B, d.nh, d.T, d.T}, op, "probs must be (B, n_head, T, T)", in);
  check_dtype(op, in[2], DType::f32, "probs");
  return {in[1]};
}

// Index of element (b, t, part, h, d) of qkv: part 0 = q, 1 = k, 2 = v.
struct QkvIndex {
  Dims d;
  int64_t operator()(int64_t b, int64_t t, int part, int64_t h, int64_t i) const {
    return (b * d.T + t) * 3 * d.C + part * d.C + h * d.hd + i;
  }
};

void attention_reference(const KernelCall& c) {
  const AttentionParams& p = c.p<AttentionParams>();
  const TensorView &qkv = c.in(0), &y = c.out(0), &probs = c.out(1);
  const Dims d = attention_dims(qkv.shape(), p.n_head);
  const double scale = attention_scale(p, d.hd);
  const QkvIndex at{d};
  const ReferenceProbDropout z(c, d.nh, d.T);
  std::vector<double> s(size_t(d.T));
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.nh; ++h)
      for (int64_t t = 0; t < d.T; ++t) {
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t u = 0; u <= t; ++u) {
          double dot = 0;
          for (int64_t i = 0; i < d.hd; ++i) dot += ld(qkv, at(b, t, 0, h, i)) * ld(qkv, at(b, u, 1, h, i));
          s[size_t(u)] = dot * scale;
          mx = std::max(mx, s[size_t(u)]);
        }
        double sum = 0;
        for (int64_t u = 0; u <= t; ++u) sum += (s[size_t(u)] = std::exp(s[size_t(u)] - mx));
        const int64_t prow = ((b * d.nh + h) * d.T + t) * d.T;
        for (int64_t u = 0; u < d.T; ++u) st(probs, prow + u, u <= t ? s[size_t(u)] / sum : 0.0);
        for (int64_t i = 0; i < d.hd; ++i) {
          double acc = 0;
          for (int64_t u = 0; u <= t; ++u) acc += s[size_t(u)] / sum * z(b, h, t, u) * ld(qkv, at(b, u, 2, h, i));
          st(y, (b * d.T + t) * d.C + h * d.hd + i, acc);
        }
      }
}

// With S = scale * Q K^T, P = softmax(S) (causal), Z its dropout factors (1
// without dropout), Y = (P Z) V:
//   dP = (dY V^T) Z, dV = (P Z)^T dY, dS = P * (dP - rowsum(P * dP)), dQ = scale dS K, dK = scale dS^T Q
// (products with Z elementwise).
void attention_backward_reference(const KernelCall& c) {
  const AttentionParams& p = c.p<AttentionParams>();
  const TensorView &dy = c.in(0), &qkv = c.in(1), &probs = c.in(2), &dqkv = c.out(0);
  const Dims d = attention_dims(qkv.shape(), p.n_head);
  const double scale = attention_scale(p, d.hd);
  const QkvIndex at{d};
  const ReferenceProbDropout z(c, d.nh, d.T);
  std::vector<double> grad(size_t(dqkv.numel()), 0.0);
  std::vector<double> dp(size_t(d.T));
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.nh; ++h)
      for (int64_t t = 0; t < d.T; ++t) {
        const int64_t prow = ((b * d.nh + h) * d.T + t) * d.T;
        const int64_t yrow = (b * d.T + t) * d.C + h * d.hd;
        double pdp = 0;
        for (int64_t u = 0; u <= t; ++u) {
          const double pu = ld(probs, prow + u), zu = z(b, h, t, u);
          double dot = 0;
          for (int64_t i = 0; i < d.hd; ++i) {
            const double g = ld(dy, yrow + i);
            dot += g * ld(qkv, at(b, u, 2, h, i));
            grad[size_t(at(b, u, 2, h, i))] += pu * zu * g;
          }
          dp[size_t(u)] = dot * zu;
          pdp += pu * dot * zu;
        }
        for (int64_t u = 0; u <= t; ++u) {
          const double ds = ld(probs, prow + u) * (dp[size_t(u)] - pdp) * scale;
          for (int64_t i = 0; i < d.hd; ++i) {
            grad[size_t(at(b, t, 0, h, i))] += ds * ld(qkv, at(b, u, 1, h, i));
            grad[size_t(at(b, u, 1, h, i))] += ds * ld(qkv, at(b, t, 0, h, i));
          }
        }
      }
  for (size_t i = 0; i < grad.size(); ++i) st(dqkv, int64_t(i), grad[i]);
}

// (B, T, C, n_head) sweeps: odd T, head sizes that are not powers of two, one head.
using Config = AttentionConfig;
// T = 130 spans several of the CPU kernel's 64-row query blocks; the last
// three give its register tiles (attention_tiles.h: 6 rows x 16 columns,
// panels of 16 keys) head sizes 32, 24 (16 + 8 columns) and 64 over block
// edges that are not multiples of 16 or 6.
constexpr Config kConfigs[] = {{2, 7, 12, 3},  {1, 13, 20, 4}, {2, 5, 6, 1},  {3, 16, 24, 2},
                               {1, 33, 18, 3}, {1, 130, 32, 2}, {2, 71, 96, 3}, {1, 83, 48, 2},
                               {1, 67, 128, 2}};
constexpr Config kBf16Configs[] = {{2, 7, 12, 3}, {1, 70, 12, 2}, {1, 130, 32, 2}, {2, 64, 128, 2}};

// Probability dropout (AttentionParams::dropout): several query blocks
// (T 130), the register tiles' panel edges (T 83, head 24), one head, and
// bf16 on both of its paths.
constexpr AttentionDropoutConfig kDropoutConfigs[] = {
    {{2, 7, 12, 3}, DType::f32, 0.2f}, {{1, 130, 32, 2}, DType::f32, 0.5f}, {{2, 5, 6, 1}, DType::f32, 0.1f},
    {{1, 83, 48, 2}, DType::f32, 0.3f}, {{2, 7, 12, 3}, DType::bf16, 0.2f}, {{1, 130, 32, 2}, DType::bf16, 0.4f}};

std::vector<TestCase> attention_cases() {
  std::vector<TestCase> cases;
  for (const Config& k : kConfigs)
    cases.push_back({attention_label(k, DType::f32), {spec({k.B, k.T, 3 * k.C})}, AttentionParams{k.n_head, 0.f}});
  cases.push_back({"f32 explicit scale", {spec({2, 9, 3 * 8})}, AttentionParams{2, 0.8f}});
  for (const Config& k : kBf16Configs)
    cases.push_back(
        {attention_label(k, DType::bf16), {spec({k.B, k.T, 3 * k.C}, DType::bf16)}, AttentionParams{k.n_head, 0.f}});
  // Last, so that the cases above keep their seeds (inputs are drawn per case in order).
  for (const AttentionDropoutConfig& c : kDropoutConfigs)
    cases.push_back(
        {attention_label(c), {spec({c.k.B, c.k.T, 3 * c.k.C}, c.t), dropout_key_spec()}, dropout_params(c, 7)});
  return cases;
}

std::vector<TestCase> attention_backward_cases() {
  std::vector<TestCase> cases;
  auto add = [&](const Config& k, DType t, float scale) {
    cases.push_back({attention_label(k, t),
                     {no_grad(spec({k.B, k.T, k.C}, t)), no_grad(spec({k.B, k.T, 3 * k.C}, t)),
                      no_grad(spec({k.B, k.n_head, k.T, k.T}, DType::f32, 0.0, 1.0))},
                     AttentionParams{k.n_head, scale}});
  };
  for (const Config& k : kConfigs) add(k, DType::f32, 0.f);
  add(Config{2, 9, 8, 2}, DType::f32, 0.8f);
  for (const Config& k : kBf16Configs) add(k, DType::bf16, 0.f);
  for (const AttentionDropoutConfig& c : kDropoutConfigs) {
    const Config& k = c.k;
    cases.push_back({attention_label(c),
                     {no_grad(spec({k.B, k.T, k.C}, c.t)), no_grad(spec({k.B, k.T, 3 * k.C}, c.t)),
                      no_grad(spec({k.B, k.n_head, k.T, k.T}, DType::f32, 0.0, 1.0)), dropout_key_spec()},
                     dropout_params(c, 7)});
  }
  return cases;
}

}  // namespace

// ---- attention --------------------------------------------------------------------
core::OpDef attention_def() {
  OpDef d;
  d.kind = OpKind::attention;
  d.name = "attention";
  d.infer = infer_attention;
  // probs (output 1) is saved for the backward and gets no gradient of its own.
  // The dropout key (the last input, with dropout) gets none either.
  d.backward = [](Graph& g, const core::Node& n, std::span<const ValueId> dy) -> std::vector<ValueId> {
    return with_key_gradient(
        {g.add_node1(OpKind::attention_backward, with_dropout_key({dy[0], n.inputs[0], n.outputs[1]}, n), n.params)},
        n);
  };
  d.reference = attention_reference;
  d.test_cases = attention_cases;
  d.num_saved_outputs = 1;
  return d;
}

// ---- attention_backward ------------------------------------------------------------
core::OpDef attention_backward_def() {
  OpDef d;
  d.kind = OpKind::attention_backward;
  d.name = "attention_backward";
  d.infer = infer_attention_backward;
  d.reference = attention_backward_reference;
  d.test_cases = attention_backward_cases;
  return d;
}

// ---- builder -------------------------------------------------------------------------
ValueId attention(Graph& g, ValueId qkv, int n_head, const AttentionDropout& drop) {
  register_ops();
  return g.add_node(OpKind::attention, drop.inputs({qkv}), drop.params(n_head))[0];
}

}  // namespace brisk::ops
