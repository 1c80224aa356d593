// The pre-LN transformer block every model builds, and the checks of an
// encoder-bodied model's shape (transformer_block.h).
#include "brisk/models/transformer_block.h"

#include "brisk/core/error.h"
#include "brisk/models/block_recompute.h"
#include "brisk/ops/ops.h"

namespace brisk::models {

using core::ConfigError;
using core::Graph;
using core::Shape;
using core::ValueId;

uint64_t dropout_key(uint64_t seed, int64_t step, int64_t micro, int rank) {
  auto mix = [](uint64_t z) {  // splitmix64's finalizer
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  return mix(mix(mix(seed ^ 0x64726f706f7574ull) ^ uint64_t(step)) ^ (uint64_t(micro) << 32 | uint64_t(uint32_t(rank))));
}

void Dropout::validate(float p, const char* name) {
  if (!(p >= 0.f && p < 1.f)) throw ConfigError(std::string(name) + " must be in [0, 1), got " + std::to_string(p));
}

Dropout Dropout::for_program(Graph& g, bool train, float p, float attention_p, float classifier_p) {
  if (!train || !(p > 0.f || attention_p > 0.f || classifier_p > 0.f)) return {};
  return {p, attention_p, classifier_p, g.input("dropout_key", {2}, core::DType::i32)};
}

ValueId Dropout::apply(Graph& g, ValueId x, uint32_t site, const Lowp& lp) const {
  if (!*this || !(p > 0.f)) return x;
  return lp.run(x, core::OpKind::dropout, core::OpKind::dropout,
                [&](ValueId v) { return ops::dropout(g, v, key, p, site); });
}

ValueId Dropout::classifier_input(Graph& g, ValueId pooled) const {
  if (!*this || !(classifier_p > 0.f)) return pooled;
  return ops::dropout(g, pooled, key, classifier_p, kClassifierInput);
}

ops::AttentionDropout Dropout::attention(int64_t layer) const {
  if (!*this || !(attention_p > 0.f)) return {};
  return {attention_p, key, probs_site(layer)};
}

void write_dropout_key(core::Executor& executor, ValueId input, uint64_t key) {
  if (input == core::kNoValue) return;
  const int32_t words[2] = {int32_t(uint32_t(key)), int32_t(uint32_t(key >> 32))};
  executor.write(input, words, sizeof words);
}

// x: (B, T, C)
ValueId transformer_block(Graph& g, ValueId x, ValueId lengths, const std::string& p, int64_t C, int n_head,
                          bool flash, BlockAttention attention, const Lowp& lp, const Dropout& drop, int64_t layer) {
  using core::OpKind;
  auto param = [&](const std::string& name, Shape s) { return g.param(p + name, s); };
  auto weight = [&](const std::string& name, Shape s) { return lp.narrow(param(name, s)); };  // compute dtype
  // --- attention: x + proj(attn(ln_1(x)))
  // The LayerNorms write their output in the compute dtype (narrow_to): no
  // f32 copy and no cast before the Linear that reads it.
  auto ln1 = ops::layernorm(g, x, param("ln_1.weight", {C}), param("ln_1.bias", {C}), 1e-5f, lp.dt);
  ValueId qkv =
      ops::linear(g, ln1.y, weight("attn.c_attn.weight", {3 * C, C}), weight("attn.c_attn.bias", {3 * C}));
  ValueId att;
  const ops::AttentionDropout probs = drop.attention(layer);
  if (attention == BlockAttention::causal)
    att = flash ? lp.run(qkv, OpKind::flash_attention, OpKind::flash_attention_backward,
                         [&](ValueId v) { return ops::flash_attention(g, v, n_head, probs); })
                : lp.run(qkv, OpKind::attention, OpKind::attention_backward,
                         [&](ValueId v) { return ops::attention(g, v, n_head, probs); });  // (B, T, C)
  else
    att = flash ? lp.run(qkv, OpKind::masked_flash_attention, OpKind::masked_flash_attention_backward,
                         [&](ValueId v) { return ops::masked_flash_attention(g, v, lengths, n_head, probs); })
                : lp.run(qkv, OpKind::masked_attention, OpKind::masked_attention_backward,
                         [&](ValueId v) { return ops::masked_attention(g, v, lengths, n_head, probs); });  // (B, T, C)
  att = ops::linear(g, att, weight("attn.c_proj.weight", {C, C}), weight("attn.c_proj.bias", {C}));
  att = drop.apply(g, att, Dropout::attention_site(layer), lp);
  x = ops::add(g, x, att);  // the f32 residual plus the compute-dtype branch, no cast
  // --- MLP: x + proj(gelu(fc(ln_2(x))))
  auto ln2 = ops::layernorm(g, x, param("ln_2.weight", {C}), param("ln_2.bias", {C}), 1e-5f, lp.dt);
  ValueId h =
      ops::linear(g, ln2.y, weight("mlp.c_fc.weight", {4 * C, C}), weight("mlp.c_fc.bias", {4 * C}));
  h = lp.run(h, OpKind::gelu, OpKind::gelu_backward, [&](ValueId v) { return ops::gelu(g, v); });  // (B, T, 4C)
  h = ops::linear(g, h, weight("mlp.c_proj.weight", {C, 4 * C}), weight("mlp.c_proj.bias", {C}));
  h = drop.apply(g, h, Dropout::mlp_site(layer), lp);
  return ops::add(g, x, h);
}

void validate_encoder_body(int64_t vocab_size, int64_t n_layer, int64_t n_embd, int64_t n_head, int64_t max_len,
                           const std::string& attention, core::DType compute, const std::string& recompute) {
  auto in_range = [](int64_t v, int64_t limit, const char* key) {
    if (v <= 0 || v > limit)
      throw ConfigError(std::string("model.") + key + " must be in [1, " + std::to_string(limit) + "], got " +
                        std::to_string(v));
  };
  constexpr int64_t kMaxDim = int64_t(1) << 20;  // far above any real encoder; keeps sizes clear of overflow
  in_range(vocab_size, int64_t(1) << 31, "vocab_size");
  in_range(n_layer, 1024, "n_layer");
  in_range(n_embd, kMaxDim, "n_embd");
  in_range(n_head, kMaxDim, "n_head");
  in_range(max_len, kMaxDim, "max_len");
  if (n_embd % n_head != 0)
    throw ConfigError("model.n_embd (" + std::to_string(n_embd) + ") must be divisible by model.n_head (" +
                      std::to_string(n_head) + ")");
  if (double(vocab_size + max_len) * double(n_embd) > double(int64_t(1) << 40))
    throw ConfigError("model: the embedding tables (vocab " + std::to_string(vocab_size) + " + max_len " +
                      std::to_string(max_len) + ") x n_embd " + std::to_string(n_embd) + " are too large");
  if (attention != "flash" && attention != "plain")
    throw ConfigError("model.attention: unknown value '" + attention + "' (allowed: flash, plain)");
  if (compute != core::DType::f32 && compute != core::DType::bf16)
    throw ConfigError("model compute dtype: unknown value '" + std::string(core::dtype_name(compute)) +
                      "' (allowed: f32, bf16; set through train.precision)");
  validate_recompute(recompute);
}

}  // namespace brisk::models
