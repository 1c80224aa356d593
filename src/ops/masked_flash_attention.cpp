// Memory-efficient bidirectional attention over a right-padded batch: the
// same function as masked_attention.cpp's op (qkv (B, T, 3C), lengths (B) i32
// -> y (B, T, C), keys u >= lengths[b] masked for every query, padded query
// rows attending over the valid keys), saving only the per-row log-sum-exp
// lse (B, n_head, T) instead of the (B, n_head, T, T) probabilities, as
// flash_attention.cpp does for the causal op. Kernels walk query tiles x key
// tiles over the valid keys with an online softmax; the backward recomputes
// P = exp(s - lse) tile by tile, with D_t = rowsum(dy_t * y_t) standing in for
// rowsum(P * dP) (FlashAttention-2). qkv, y, dy and dqkv are f32 or bf16 (one
// dtype per call), lse f32; lengths gets no gradient.
//
// The reference kernels are the oracle, not a model of the tiling: one query
// row at a time, in double.
#include <cmath>
#include <limits>

#include "masked_shapes.h"

namespace brisk::ops {
using namespace detail;

namespace {

using Dims = AttentionDims;
constexpr std::string_view kFwd = "masked_flash_attention", kBwd = "masked_flash_attention_backward";

// Inputs: qkv (B, T, 3C) f32 or bf16, lengths (B) i32.
std::vector<TensorMeta> infer_forward(std::span<const TensorMeta> in, const core::OpParams& params) {
  check_attention_inputs(kFwd, in, params, 2);
  check_float(kFwd, in, {0});
  const Dims d = check_qkv(kFwd, in, in[0], std::get<AttentionParams>(params).n_head);
  check_lengths_meta(kFwd, in, 1, d.B);
  return {TensorMeta{Shape{d.B, d.T, d.C}, in[0].dtype}, TensorMeta{Shape{d.B, d.nh, d.T}, DType::f32}};
}

// Inputs: dy (B, T, C), qkv (B, T, 3C), y (B, T, C), lse (B, n_head, T), lengths (B).
std::vector<TensorMeta> infer_backward(std::span<const TensorMeta> in, const core::OpParams& params) {
  check_attention_inputs(kBwd, in, params, 5);
  check_float(kBwd, in, {0, 1, 2});
  const Dims d = check_qkv(kBwd, in, in[1], std::get<AttentionParams>(params).n_head);
  check_shape(in[0].shape == Shape{d.B, d.T, d.C}, kBwd, "dy must be (B, T, C) for qkv (B, T, 3C)", in);
  check_shape(in[2].shape == Shape{d.B, d.T, d.C}, kBwd, "y must be (B, T, C) for qkv (B, T, 3C)", in);
  check_shape(in[0].dtype == in[1].dtype && in[2].dtype == in[1].dtype, kBwd,
              "dy, qkv and y must have the same dtype", in);
  check_shape(in[3].shape == Shape{d.B, d.nh, d.T}, kBwd, "lse must be (B, n_head, T)", in);
  check_dtype(kBwd, in[3], DType::f32, "lse");
  check_lengths_meta(kBwd, in, 4, d.B);
  return {in[1]};
}

// Scores of query t against the valid keys 0..L-1 into s.
void score_row(const TensorView& qkv, const PackedQkv& at, int64_t b, int64_t h, int64_t t, int64_t L, double scale,
               std::vector<double>& s) {
  for (int64_t u = 0; u < L; ++u) {
    double dot = 0;
    for (int64_t i = 0; i < at.d.hd; ++i) dot += ld(qkv, at(b, t, 0, h, i)) * ld(qkv, at(b, u, 1, h, i));
    s[size_t(u)] = dot * scale;
  }
}

void forward_reference(const KernelCall& c) {
  const AttentionParams& p = c.p<AttentionParams>();
  const TensorView &qkv = c.in(0), &y = c.out(0), &lse = c.out(1);
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
        score_row(qkv, at, b, h, t, L, scale, s);
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t u = 0; u < L; ++u) mx = std::max(mx, s[size_t(u)]);
        double sum = 0;
        for (int64_t u = 0; u < L; ++u) sum += (s[size_t(u)] = std::exp(s[size_t(u)] - mx));
        st(lse, (b * d.nh + h) * d.T + t, mx + std::log(sum));
        for (int64_t i = 0; i < d.hd; ++i) {
          double acc = 0;
          for (int64_t u = 0; u < L; ++u) acc += s[size_t(u)] * z(b, h, t, u) * ld(qkv, at(b, u, 2, h, i));
          st(y, (b * d.T + t) * d.C + h * d.hd + i, acc / sum);
        }
      }
  }
}

// P = exp(S - lse) over the valid keys, Z its dropout factors (1 without
// dropout), D_t = dy_t . y_t, then
//   dV += (P Z)^T dY, dP = (dY V^T) Z, dS = P * (dP - D), dQ = scale dS K, dK = scale dS^T Q.
void backward_reference(const KernelCall& c) {
  const AttentionParams& p = c.p<AttentionParams>();
  const TensorView &dy = c.in(0), &qkv = c.in(1), &y = c.in(2), &lse = c.in(3), &dqkv = c.out(0);
  const Dims d = attention_dims(qkv.shape(), p.n_head);
  const int32_t* lengths = c.in(4).as<const int32_t>();
  check_lengths(kBwd, lengths, d.B, d.T);
  const double scale = attention_scale(p, d.hd);
  const PackedQkv at{d};
  const ReferenceProbDropout z(c, d.nh, d.T);
  std::vector<double> grad(size_t(dqkv.numel()), 0.0);
  std::vector<double> s(size_t(d.T));
  for (int64_t b = 0; b < d.B; ++b) {
    const int64_t L = lengths[b];
    for (int64_t h = 0; h < d.nh; ++h)
      for (int64_t t = 0; t < d.T; ++t) {
        const int64_t yrow = (b * d.T + t) * d.C + h * d.hd;
        const double l = ld(lse, (b * d.nh + h) * d.T + t);
        double D = 0;
        for (int64_t i = 0; i < d.hd; ++i) D += ld(dy, yrow + i) * ld(y, yrow + i);
        score_row(qkv, at, b, h, t, L, scale, s);
        for (int64_t u = 0; u < L; ++u) {
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
  }
  for (size_t i = 0; i < grad.size(); ++i) st(dqkv, int64_t(i), grad[i]);
}

// As masked_attention's cases, plus T that spans several key tiles (256) of
// the CPU kernel with a ragged last one: lengths 257 and 300 make the online
// softmax rescale, length 256 ends on a tile edge. The register tiles
// (attention_tiles.h) also get head sizes 32, 24 and 64 with lengths off a
// panel's edge (17, 33, 23).
std::vector<MaskedConfig> configs() {
  return {{7, 12, 3, {7, 1, 4}},       {13, 20, 4, {1, 13, 6, 12}},      {5, 6, 1, {5, 1, 3}},
          {16, 24, 2, {16, 1, 9}},     {33, 18, 3, {33, 1, 17}},         {130, 32, 2, {1, 130, 64, 65}},
          {1, 10, 2, {1}},             {300, 10, 1, {300, 1, 257, 256}}, {70, 96, 3, {70, 17, 33, 1}},
          {40, 48, 2, {40, 23, 9}},    {36, 128, 2, {36, 19}}};
}

// bf16 (flash_gemm.h's kernels: 128-row query tiles, 256-key tiles, the last
// key tile rounded up to 16 keys and masked past the length): lengths on and
// off a 16-key step (1, 16, 17, 31), every row of a query tile padded
// (T 290 with length 100: the second and third query tiles are padding
// only), several key tiles with a ragged last one (300, 257, 513), heads of
// 64 and 128, and T not a multiple of 16 (the rounded width stops at T).
std::vector<MaskedConfig> bf16_configs() {
  return {{7, 12, 3, {7, 1, 4}},           {40, 48, 2, {40, 17, 31, 16}},       {290, 32, 2, {290, 100, 1}},
          {300, 128, 2, {300, 257, 256}},  {530, 64, 1, {513, 530, 77}},        {36, 256, 2, {36, 19}}};
}

std::vector<TestCase> forward_cases() {
  std::vector<TestCase> cases;
  for (const MaskedConfig& k : configs()) {
    const int64_t B = int64_t(k.lengths.size());
    cases.push_back({masked_label(k), {spec({B, k.T, 3 * k.C}), lengths_spec(k.lengths)}, AttentionParams{k.n_head, 0.f}});
  }
  for (const MaskedConfig& k : bf16_configs()) {
    const int64_t B = int64_t(k.lengths.size());
    cases.push_back({masked_label(k, DType::bf16), {spec({B, k.T, 3 * k.C}, DType::bf16), lengths_spec(k.lengths)},
                     AttentionParams{k.n_head, 0.f}});
  }
  cases.push_back({"f32 explicit scale", {spec({3, 9, 3 * 8}), lengths_spec({9, 1, 5})}, AttentionParams{2, 0.8f}});
  // Large scores: the online max must keep exp() in range.
  cases.push_back({"f32 large scores", {spec({3, 270, 3 * 16}, DType::f32, -4.0, 4.0), lengths_spec({270, 1, 200})},
                   AttentionParams{2, 0.f}});
  for (const MaskedDropoutConfig& c : masked_dropout_configs(true)) {
    const int64_t B = int64_t(c.k.lengths.size());
    cases.push_back({masked_dropout_label(c),
                     {spec({B, c.k.T, 3 * c.k.C}, c.t), lengths_spec(c.k.lengths), dropout_key_spec()},
                     masked_dropout_params(c)});
  }
  return cases;
}

// y and lse are drawn at random: the backward is a fixed function of its
// inputs whether or not they came from the forward (the unit test checks the pair).
std::vector<TestCase> backward_cases() {
  std::vector<TestCase> cases;
  auto add = [&](const MaskedConfig& k, DType t, float scale, const std::string& label) {
    const int64_t B = int64_t(k.lengths.size());
    cases.push_back({label,
                     {no_grad(spec({B, k.T, k.C}, t)), no_grad(spec({B, k.T, 3 * k.C}, t)), no_grad(spec({B, k.T, k.C}, t)),
                      no_grad(spec({B, k.n_head, k.T}, DType::f32, 0.0, 2.0)), lengths_spec(k.lengths)},
                     AttentionParams{k.n_head, scale}});
  };
  for (const MaskedConfig& k : configs()) add(k, DType::f32, 0.f, masked_label(k));
  add(MaskedConfig{9, 8, 2, {9, 1, 5}}, DType::f32, 0.8f, "f32 explicit scale");
  for (const MaskedConfig& k : bf16_configs()) add(k, DType::bf16, 0.f, masked_label(k, DType::bf16));
  for (const MaskedDropoutConfig& c : masked_dropout_configs(true)) {
    const MaskedConfig& k = c.k;
    const int64_t B = int64_t(k.lengths.size());
    cases.push_back({masked_dropout_label(c),
                     {no_grad(spec({B, k.T, k.C}, c.t)), no_grad(spec({B, k.T, 3 * k.C}, c.t)),
                      no_grad(spec({B, k.T, k.C}, c.t)), no_grad(spec({B, k.n_head, k.T}, DType::f32, 0.0, 2.0)),
                      lengths_spec(k.lengths), dropout_key_spec()},
                     masked_dropout_params(c)});
  }
  return cases;
}

}  // namespace

// ---- masked_flash_attention -----------------------------------------------------------
core::OpDef masked_flash_attention_def() {
  OpDef d;
  d.kind = OpKind::masked_flash_attention;
  d.name = kFwd;
  d.infer = infer_forward;
  // lse (output 1) is saved for the backward and gets no gradient of its own;
  // lengths (input 1) and the dropout key (input 2, with dropout) are
  // integers and get none either.
  d.backward = [](Graph& g, const core::Node& n, std::span<const ValueId> dy) -> std::vector<ValueId> {
    if (dy[0] == core::kNoValue) return with_key_gradient({core::kNoValue, core::kNoValue}, n);
    return with_key_gradient(
        {g.add_node1(OpKind::masked_flash_attention_backward,
                     with_dropout_key({dy[0], n.inputs[0], n.outputs[0], n.outputs[1], n.inputs[1]}, n), n.params),
         core::kNoValue},
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

// ---- masked_flash_attention_backward ---------------------------------------------------
core::OpDef masked_flash_attention_backward_def() {
  OpDef d;
  d.kind = OpKind::masked_flash_attention_backward;
  d.name = kBwd;
  d.infer = infer_backward;
  d.reference = backward_reference;
  d.test_cases = backward_cases;
  d.workspace_bytes = [](std::span<const TensorMeta> in, const core::OpParams& p) {
    return flash_workspace_bytes(in, p, 1);
  };
  d.kernel_dtype_input = 1;
  return d;
}

// ---- builder -------------------------------------------------------------------------------
ValueId masked_flash_attention(Graph& g, ValueId qkv, ValueId lengths, int n_head, const AttentionDropout& drop) {
  register_ops();
  return g.add_node(OpKind::masked_flash_attention, drop.inputs({qkv, lengths}), drop.params(n_head))[0];
}

}  // namespace brisk::ops
