// Greedy decoding for the sequence autoencoder (seq_autoencoder.h), two ways:
//
// - decode_recompute(): the decoder graph (Kind::decode) run again at every
//   step over everything decoded so far. Simple, works on any backend, and
//   it *is* the training graph, so it is the reference.
// - decode_cached(): one new position per step with a key/value cache, the
//   decoder's ops run one by one through core::run_op on host buffers, the
//   way the inference engine runs a GPT (src/infer/engine.cpp), attention
//   through `kv_attention` (each sequence is one cache block of max(lengths)
//   positions). A step costs one token per row instead of the whole prefix:
//   the recomputing decode of a 42-protein test split took two minutes on two
//   busy cores, this one takes a second or two.
//
// decode() takes the cached path on a host backend and recomputes elsewhere;
// tests/models/seq_autoencoder_test.cpp checks that the two agree. Keep the
// op sequence below in step with decoder() in seq_autoencoder.cpp.
#include <algorithm>
#include <string>

#include "brisk/core/error.h"
#include "brisk/core/op.h"
#include "brisk/models/seq_autoencoder.h"

namespace brisk::models {

using core::DType;
using core::OpKind;
using core::Shape;
using core::TensorView;

namespace {

constexpr int64_t kDecodeWidthMultiple = 32;

TensorView view(const void* p, Shape s, DType t = DType::f32) {
  return TensorView{const_cast<void*>(p), core::TensorMeta{std::move(s), t}};
}

void check_lengths(const int32_t* lengths, int64_t B, int64_t max_len) {
  for (int64_t b = 0; b < B; ++b)
    if (lengths[b] < 1 || lengths[b] > max_len)
      throw core::ShapeError("decode length " + std::to_string(lengths[b]) + " at position " + std::to_string(b) +
                             " is out of range [1, " + std::to_string(max_len + 1) + ")");
}

// The argmax residue of a logits row: token 0 is padding, never a residue.
int32_t argmax_residue(const float* row, int64_t V) { return int32_t(std::max_element(row + 1, row + V) - row); }

}  // namespace

std::vector<int32_t> SeqAutoencoder::decode(const float* latents, const int32_t* lengths, int64_t B) {
  return backend_.device().is_host() ? decode_cached(latents, lengths, B) : decode_recompute(latents, lengths, B);
}

std::vector<int32_t> SeqAutoencoder::decode(const float* latents, int64_t B, int64_t length) {
  return decode(latents, std::vector<int32_t>(size_t(B), int32_t(std::clamp<int64_t>(length, 0, INT32_MAX))).data(),
                B);
}

std::vector<int32_t> SeqAutoencoder::decode_recompute(const float* latents, const int32_t* lengths, int64_t B) {
  if (B <= 0) return {};
  check_lengths(lengths, B, config_.max_len);
  const int64_t L = *std::max_element(lengths, lengths + B), V = config_.vocab_size;
  std::vector<int32_t> out(size_t(B * L), 0), dec;
  for (int64_t t = 0; t < L; ++t) {
    // Causal: the logits at t depend only on inputs 0..t, so any width > t
    // gives the same numbers; the smallest rounded one is the cheapest.
    const int64_t W = std::min(config_.max_len, (t + kDecodeWidthMultiple) / kDecodeWidthMultiple * kDecodeWidthMultiple);
    SeqAutoencoderProgram& p = ready(Kind::decode, B, W);
    dec.assign(size_t(B * W), 0);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = 1; s <= t; ++s) dec[size_t(b * W + s)] = out[size_t(b * L + s - 1)];
    p.executor->write(p.latent_in, latents, size_t(B * config_.latent) * sizeof(float));
    p.executor->write(p.dec_ids, dec.data(), dec.size() * 4);
    p.executor->run();
    const float* z = host(Kind::decode, p, p.logits, size_t(B * W * V));
    for (int64_t b = 0; b < B; ++b)
      if (t < lengths[b]) out[size_t(b * L + t)] = argmax_residue(z + (b * W + t) * V, V);
  }
  return out;
}

std::vector<int32_t> SeqAutoencoder::decode_cached(const float* latents, const int32_t* lengths, int64_t B) {
  if (!backend_.device().is_host())
    throw core::Error("SeqAutoencoder::decode_cached runs on host parameters; use decode() on this backend");
  if (B <= 0) return {};
  check_lengths(lengths, B, config_.max_len);
  const int64_t L = *std::max_element(lengths, lengths + B), V = config_.vocab_size, C = config_.n_embd;
  const int64_t Z = config_.latent;
  auto param = [&](const std::string& name) -> const core::Tensor& { return params_.entries().at(name).value; };
  std::vector<unsigned char> workspace;
  auto run = [&](OpKind op, std::initializer_list<TensorView> in, std::initializer_list<TensorView> out,
                 const core::OpParams& params = {}) {
    const core::OpDef& def = core::op_def(op);
    size_t ws = 0;
    if (def.workspace_bytes) {  // kv_attention's scores, a linear's packing: sized per call
      std::vector<core::TensorMeta> metas;
      for (const TensorView& v : in) metas.push_back(v.meta);
      ws = def.workspace_bytes(metas, params);
      if (ws > workspace.size()) workspace.resize(ws);
    }
    core::run_op(backend_, op, std::span<const TensorView>(in.begin(), in.size()),
                 std::span<const TensorView>(out.begin(), out.size()), params, workspace.data(), ws);
  };
  auto linear = [&](const std::string& p, const float* x, int64_t in, float* y, int64_t out) {
    run(OpKind::linear, {view(x, {B, in}), param(p + ".weight").as_view(), param(p + ".bias").as_view()},
        {view(y, {B, out})});
  };
  auto layernorm = [&](const std::string& p, const float* x, float* y, float* stats) {
    run(OpKind::layernorm, {view(x, {B, C}), param(p + ".weight").as_view(), param(p + ".bias").as_view()},
        {view(y, {B, C}), view(stats, {B}), view(stats + B, {B})}, core::LayerNormParams{1e-5f});
  };

  std::vector<float> zc(size_t(B * C)), x(zc.size()), a(zc.size()), att(zc.size()), t(zc.size());
  std::vector<float> qkv(size_t(B * 3 * C)), h(size_t(B * 4 * C)), h2(h.size()), stats(size_t(2 * B));
  std::vector<float> logits(size_t(B * V));
  // One cache block of L positions per row; block_table[b] = b, rows[b] = (b, step).
  std::vector<core::Tensor> kc, vc;
  for (int64_t l = 0; l < config_.n_layer; ++l) {
    kc.push_back(core::Tensor::zeros({B, L, C}, DType::f32));
    vc.push_back(core::Tensor::zeros({B, L, C}, DType::f32));
  }
  std::vector<int32_t> table(static_cast<size_t>(B)), rows(static_cast<size_t>(2 * B)), prev(static_cast<size_t>(B), 0);
  std::vector<int32_t> out(static_cast<size_t>(B * L), 0);
  for (int64_t b = 0; b < B; ++b) table[size_t(b)] = int32_t(b), rows[size_t(2 * b)] = int32_t(b);

  linear("from_latent", latents, Z, zc.data(), C);  // the latent's contribution, the same at every step
  const float* wte = param("dec.wte.weight").data_as<float>();
  const float* wpe = param("dec.wpe.weight").data_as<float>();
  for (int64_t step = 0; step < L; ++step) {
    // --- input: previous residue (the start token 0 at step 0) + position + latent, in the graph's order
    for (int64_t b = 0; b < B; ++b) {
      const float* e = wte + int64_t(prev[size_t(b)]) * C;
      const float* p = wpe + step * C;
      for (int64_t c = 0; c < C; ++c) x[size_t(b * C + c)] = (e[c] + p[c]) + zc[size_t(b * C + c)];
      rows[size_t(2 * b + 1)] = int32_t(step);
    }
    // --- the causal blocks (transformer_block with BlockAttention::causal), one position per row
    const TensorView xv = view(x.data(), {B, C});
    for (int64_t l = 0; l < config_.n_layer; ++l) {
      const std::string p = "dec.h." + std::to_string(l) + ".";
      layernorm(p + "ln_1", x.data(), a.data(), stats.data());
      linear(p + "attn.c_attn", a.data(), C, qkv.data(), 3 * C);
      run(OpKind::kv_attention,
          {view(qkv.data(), {B, 3 * C}), kc[size_t(l)].as_view(), vc[size_t(l)].as_view(),
           view(rows.data(), {B, 2}, DType::i32), view(table.data(), {B, 1}, DType::i32)},
          {view(att.data(), {B, C}), kc[size_t(l)].as_view(), vc[size_t(l)].as_view()},
          core::AttentionParams{int(config_.n_head), 0.f});
      linear(p + "attn.c_proj", att.data(), C, t.data(), C);
      run(OpKind::add, {xv, view(t.data(), {B, C})}, {xv});
      layernorm(p + "ln_2", x.data(), a.data(), stats.data());
      linear(p + "mlp.c_fc", a.data(), C, h.data(), 4 * C);
      run(OpKind::gelu, {view(h.data(), {B, 4 * C})}, {view(h2.data(), {B, 4 * C})});
      linear(p + "mlp.c_proj", h2.data(), 4 * C, t.data(), C);
      run(OpKind::add, {xv, view(t.data(), {B, C})}, {xv});
    }
    // --- final LayerNorm, residue logits, argmax
    layernorm("dec.ln_f", x.data(), a.data(), stats.data());
    linear("dec.head", a.data(), C, logits.data(), V);
    for (int64_t b = 0; b < B; ++b) {
      prev[size_t(b)] = argmax_residue(logits.data() + b * V, V);
      if (step < lengths[b]) out[size_t(b * L + step)] = prev[size_t(b)];
    }
  }
  return out;
}

}  // namespace brisk::models
