// Bidirectional multi-head self-attention over a right-padded batch, the
// encoder's attention: qkv (B, T, 3C) packed as in attention.cpp (head h uses
// columns h*hd .. (h+1)*hd-1 of q, k and v), lengths (B) i32. Sequence b is
// real at positions [0, lengths[b]); keys u >= lengths[b] are masked for every
// query, and there is no causal mask. Query rows at padded positions still
// attend over the valid keys, as with PyTorch's key_padding_mask, so every
// output row is finite and a cross-check against PyTorch needs no special
// case; what a model does with those rows (masked_mean drops them) is its
// business. f32 only.
//
// This is the plain version: it saves the (B, n_head, T, T) probabilities,
// zero at masked keys. masked_attention_backward reads probs only at keys
// u < lengths[b], exactly like the CPU kernel, so whatever the masked entries
// hold never influences a result: the harness can feed it random
// probabilities, and a caller need not zero them. lengths is an integer
// input and gets no gradient.
#include <cmath>
#include <limits>

#include "masked_shapes.h"

namespace brisk::ops {
using namespace detail;

namespace {

using Dims = AttentionDims;
constexpr std::string_view kFwd = "masked_attention", kBwd = "masked_attention_backward";

// Inputs: qkv (B, T, 3C) f32, lengths (B) i32.
std::vector<TensorMeta> infer_forward(std::span<const TensorMeta> in, const core::OpParams& params) {
  check_attention_inputs(kFwd, in, params, 2);
  check_dtype(kFwd, in[0], DType::f32, "qkv");
  const Dims d = check_qkv(kFwd, in, in[0], std::get<AttentionParams>(params).n_head);
  check_lengths_meta(kFwd, in, 1, d.B);
  return {TensorMeta{Shape{d.B, d.T, d.C}, DType::f32}, TensorMeta{Shape{d.B, d.nh, d.T, d.T}, DType::f32}};
}

// Inputs: dy (B, T, C), qkv (B, T, 3C), probs (B, n_head, T, T), lengths (B).
std::vector<TensorMeta> infer_backward(std::span<const TensorMeta> in, const core::OpParams& params) {
  check_attention_inputs(kBwd, in, params, 4);
  check_dtype(kBwd, in[0], DType::f32, "dy");
  check_dtype(kBwd, in[1], DType::f32, "qkv");
  const Dims d = check_qkv(kBwd, in, in[1], std::get<AttentionParams>(params).n_head);
  check_shape(in[0].shape == Shape{d.B, d.T, d.C}, kBwd, "dy must be (B, T, C) for qkv (B, T, 3C)", in);
  check_shape(in[2].shape == Shape{d.B, d.nh, d.T, d.T}, kBwd, "probs must be (B, n_head, T, T)", in);
  check_dtype(kBwd, in[2], DType::f32, "probs");
  check_lengths_meta(kBwd, in, 3, d.B);
  return {in[1]};
}

void forward_reference(const KernelCall& c) {
  const AttentionParams& p = c.p<AttentionParams>();
  const TensorView &qkv = c.in(0), &y = c.out(0), &probs = c.out(1);
  const Dims d = attention_dims(qkv.shape(), p.n_head);
  const int32_t* lengths = c.in(1).as<const int32_t>();
  check_lengths(kFwd, lengths, d.B, d.T);
  const double scale = attention_scale(p, d.hd);
  const PackedQkv at{d};
  const ReferenceProbDropout z(c, d.nh, d.T);
  std::vector<double> s(size_t(d.T));
  for (int64_t b = 0; b < d.B; ++b) {
    const int64_t L = lengths[b];
    for (int64_t h = 0; h < d.nh; ++h)
      for (int64_t t = 0; t < d.T; ++t) {
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t u = 0; u < L; ++u) {
          double dot = 0;
          for (int64_t i = 0; i < d.hd; ++i) dot += ld(qkv, at(b, t, 0, h, i)) * ld(qkv, at(b, u, 1, h, i));
          s[size_t(u)] = dot * scale;
          mx = std::max(mx, s[size_t(u)]);
        }
        double sum = 0;
        for (int64_t u = 0; u < L; ++u) sum += (s[size_t(u)] = std::exp(s[size_t(u)] - mx));
        const int64_t prow = ((b * d.nh + h) * d.T + t) * d.T;
        for (int64_t u = 0; u < d.T; ++u) st(probs, prow + u, u < L ? s[size_t(u)] / sum : 0.0);
        for (int64_t i = 0; i < d.hd; ++i) {
          double acc = 0;
          for (int64_t u = 0; u < L; ++u) acc += s[size_t(u)] / sum * z(b, h, t, u) * ld(qkv, at(b, u, 2, h, i));
          st(y, (b * d.T + t) * d.C + h * d.hd + i, acc);
        }
      }
  }
}

// As attention_backward, with keys limited to u < L (Z: the dropout factors):
//   dP = (dY V^T) Z, dV = (P Z)^T dY, dS = P * (dP - rowsum(P * dP)), dQ = scale dS K, dK = scale dS^T Q.
// Padded keys get exactly zero dK, dV; padded query rows get the dQ of their row.
void backward_reference(const KernelCall& c) {
  const AttentionParams& p = c.p<AttentionParams>();
  const TensorView &dy = c.in(0), &qkv = c.in(1), &probs = c.in(2), &dqkv = c.out(0);
  const Dims d = attention_dims(qkv.shape(), p.n_head);
  const int32_t* lengths = c.in(3).as<const int32_t>();
  check_lengths(kBwd, lengths, d.B, d.T);
  const double scale = attention_scale(p, d.hd);
  const PackedQkv at{d};
  const ReferenceProbDropout z(c, d.nh, d.T);
  std::vector<double> grad(size_t(dqkv.numel()), 0.0);
  std::vector<double> dp(size_t(d.T));
  for (int64_t b = 0; b < d.B; ++b) {
    const int64_t L = lengths[b];
    for (int64_t h = 0; h < d.nh; ++h)
      for (int64_t t = 0; t < d.T; ++t) {
        const int64_t prow = ((b * d.nh + h) * d.T + t) * d.T;
        const int64_t yrow = (b * d.T + t) * d.C + h * d.hd;
        double pdp = 0;
        for (int64_t u = 0; u < L; ++u) {
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
        for (int64_t u = 0; u < L; ++u) {
          const double ds = ld(probs, prow + u) * (dp[size_t(u)] - pdp) * scale;
          for (int64_t i = 0; i < d.hd; ++i) {
            grad[size_t(at(b, t, 0, h, i))] += ds * ld(qkv, at(b, u, 1, h, i));
            grad[size_t(at(b, u, 1, h, i))] += ds * ld(qkv, at(b, t, 0, h, i));
          }
        }
      }
  }
  for (size_t i = 0; i < grad.size(); ++i) st(dqkv, int64_t(i), grad[i]);
}

// Odd T, one head and several, head sizes that are not powers of two; every
// batch mixes length 1, length T and lengths in between. T = 130 spans three
// of the CPU kernel's 64-row query blocks, with lengths on both sides of a
// block edge (64, 65). The CPU's register tiles (attention_tiles.h) work in
// 6 rows x 16 columns over panels of 16 keys: head sizes 32 (the earlier E1 shape's), 24
// (16 + 8 columns), 40, 64 and the small ones (masked columns), and lengths
// one past a panel (17, 33) and short of it, cover their edges.
std::vector<MaskedConfig> configs() {
  return {{7, 12, 3, {7, 1, 4}},         {13, 20, 4, {1, 13, 6, 12}}, {5, 6, 1, {5, 1, 3}},
          {16, 24, 2, {16, 1, 9}},       {33, 18, 3, {33, 1, 17}},    {130, 32, 2, {1, 130, 64, 65}},
          {1, 10, 2, {1}},               {70, 96, 3, {70, 17, 33, 1}}, {40, 48, 2, {40, 23, 9}},
          {21, 120, 3, {21, 5, 12}},     {36, 128, 2, {36, 19}}};
}

std::vector<TestCase> forward_cases() {
  std::vector<TestCase> cases;
  for (const MaskedConfig& k : configs()) {
    const int64_t B = int64_t(k.lengths.size());
    cases.push_back({masked_label(k), {spec({B, k.T, 3 * k.C}), lengths_spec(k.lengths)}, AttentionParams{k.n_head, 0.f}});
  }
  cases.push_back({"f32 explicit scale", {spec({3, 9, 3 * 8}), lengths_spec({9, 1, 5})}, AttentionParams{2, 0.8f}});
  for (const MaskedDropoutConfig& c : masked_dropout_configs(false)) {
    const int64_t B = int64_t(c.k.lengths.size());
    cases.push_back({masked_dropout_label(c),
                     {spec({B, c.k.T, 3 * c.k.C}), lengths_spec(c.k.lengths), dropout_key_spec()},
                     masked_dropout_params(c)});
  }
  return cases;
}

// probs is drawn at random, masked entries included: the kernels must not read them.
std::vector<TestCase> backward_cases() {
  std::vector<TestCase> cases;
  auto add = [&](const MaskedConfig& k, float scale, const std::string& label) {
    const int64_t B = int64_t(k.lengths.size());
    cases.push_back({label,
                     {no_grad(spec({B, k.T, k.C})), no_grad(spec({B, k.T, 3 * k.C})),
                      no_grad(spec({B, k.n_head, k.T, k.T}, DType::f32, 0.0, 1.0)), lengths_spec(k.lengths)},
                     AttentionParams{k.n_head, scale}});
  };
  for (const MaskedConfig& k : configs()) add(k, 0.f, masked_label(k));
  add(MaskedConfig{9, 8, 2, {9, 1, 5}}, 0.8f, "f32 explicit scale");
  for (const MaskedDropoutConfig& c : masked_dropout_configs(false)) {
    const int64_t B = int64_t(c.k.lengths.size());
    cases.push_back({masked_dropout_label(c),
                     {no_grad(spec({B, c.k.T, c.k.C})), no_grad(spec({B, c.k.T, 3 * c.k.C})),
                      no_grad(spec({B, c.k.n_head, c.k.T, c.k.T}, DType::f32, 0.0, 1.0)), lengths_spec(c.k.lengths),
                      dropout_key_spec()},
                     masked_dropout_params(c)});
  }
  return cases;
}

ValueId masked_attention_backward(Graph& g, ValueId dy, const core::Node& n) {
  return g.add_node1(OpKind::masked_attention_backward,
                     with_dropout_key({dy, n.inputs[0], n.outputs[1], n.inputs[1]}, n), n.params);
}

}  // namespace

// ---- masked_attention ---------------------------------------------------------------
core::OpDef masked_attention_def() {
  OpDef d;
  d.kind = OpKind::masked_attention;
  d.name = kFwd;
  d.infer = infer_forward;
  // probs (output 1) is saved for the backward and gets no gradient of its own;
  // lengths (input 1) and the dropout key (input 2, with dropout) are
  // integers and get none either.
  d.backward = [](Graph& g, const core::Node& n, std::span<const ValueId> dy) -> std::vector<ValueId> {
    if (dy[0] == core::kNoValue) return with_key_gradient({core::kNoValue, core::kNoValue}, n);
    return with_key_gradient({masked_attention_backward(g, dy[0], n), core::kNoValue}, n);
  };
  d.reference = forward_reference;
  d.test_cases = forward_cases;
  d.num_saved_outputs = 1;
  return d;
}

// ---- masked_attention_backward --------------------------------------------------------
core::OpDef masked_attention_backward_def() {
  OpDef d;
  d.kind = OpKind::masked_attention_backward;
  d.name = kBwd;
  d.infer = infer_backward;
  d.reference = backward_reference;
  d.test_cases = backward_cases;
  return d;
}

// ---- builder ---------------------------------------------------------------------------
ValueId masked_attention(Graph& g, ValueId qkv, ValueId lengths, int n_head, const AttentionDropout& drop) {
  register_ops();
  return g.add_node(OpKind::masked_attention, drop.inputs({qkv, lengths}), drop.params(n_head))[0];
}

}  // namespace brisk::ops
