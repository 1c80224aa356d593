// The pre-LN transformer block of every model: the GPT's (causal), the
// encoder classifier's (bidirectional, masked at the padding) and the
// sequence autoencoder's (its encoder masked at the padding, its decoder
// causal). One definition (transformer_block.cpp) keeps the blocks -- and
// their parameter names under `prefix` -- identical. Also the checks of an
// encoder-bodied model's config.
#pragma once

#include <cstdint>
#include <string>

#include "brisk/core/executor.h"
#include "brisk/core/graph.h"
#include "brisk/models/lowp.h"
#include "brisk/ops/ops.h"

namespace brisk::models {

enum class BlockAttention {
  padding_masked,  // bidirectional; keys at positions >= lengths[b] are masked
  causal,          // each position sees itself and earlier ones (GPT's attention; lengths unused)
};

// Parameters of one block at width C (LayerNorms, qkv, projection, MLP).
inline int64_t transformer_block_params(int64_t C) {
  return 2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (4 * C * C + 4 * C) + (4 * C * C + C);
}

// A train program's dropout (the GPT's and the encoder classifier's):
// model.dropout's p on the embeddings' sum and each block's attention and MLP
// branches, model.attention_dropout's on each block's attention
// probabilities, the encoder classifier's model.classifier_dropout on its
// pooled features, and the program's (2) i32 key input they share. Off (all
// 0, the default, and every program but a train one) it adds nothing. The sites
// (docs/architecture.md, "Dropout") tell the masks apart under one key.
struct Dropout {
  float p = 0.f;             // model.dropout
  float attention_p = 0.f;   // model.attention_dropout
  float classifier_p = 0.f;  // the encoder classifier's model.classifier_dropout
  core::ValueId key = core::kNoValue;
  explicit operator bool() const { return key != core::kNoValue; }

  // Throws ConfigError naming `name` unless p is in [0, 1).
  static void validate(float p, const char* name = "model.dropout");
  // The dropout of a program: on (with its "dropout_key" input added) for a
  // train program with any of the probabilities > 0, off otherwise.
  static Dropout for_program(core::Graph& g, bool train, float p, float attention_p, float classifier_p = 0.f);
  static constexpr uint32_t kEmbeddings = 0;
  // The encoder classifier's pooled features, clear of the block sites below
  // and of the attention probabilities' (the high bit).
  static constexpr uint32_t kClassifierInput = 0x40000000u;
  static uint32_t attention_site(int64_t layer) { return uint32_t(1 + 2 * layer); }
  static uint32_t mlp_site(int64_t layer) { return uint32_t(2 + 2 * layer); }
  // The attention probabilities' sites, clear of the others' (the high bit).
  static uint32_t probs_site(int64_t layer) { return 0x80000000u | uint32_t(layer); }
  // x dropped by p at `site` in lp's compute dtype (f32 between casts where
  // the backend has no kernel in it: f16); x itself when p is 0.
  core::ValueId apply(core::Graph& g, core::ValueId x, uint32_t site, const Lowp& lp) const;
  // Block `layer`'s attention-probability dropout (off when attention_p is 0).
  ops::AttentionDropout attention(int64_t layer) const;
  // The classifier's f32 input dropped by classifier_p (itself when 0).
  core::ValueId classifier_input(core::Graph& g, core::ValueId pooled) const;
};

// The dropout key of one micro-step of a run (the GPT's and the encoder
// classifier's model.dropout): a hash of the run's seed, the optimizer step,
// the micro-step within it and the data-parallel rank, so every micro-step
// and every rank drops its own elements and a resumed run drops the ones
// the uninterrupted run would have.
uint64_t dropout_key(uint64_t seed, int64_t step, int64_t micro, int rank);
// Writes `key` into a train program's (2) i32 key input, if it has one.
void write_dropout_key(core::Executor& executor, core::ValueId input, uint64_t key);

// x (B, T, C) -> (B, T, C): x + proj(attn(ln_1(x))), then + proj(gelu(fc(ln_2(x)))).
// Parameters are `prefix` + "ln_1.weight", "attn.c_attn.weight", ... (the GPT's
// names). `lengths` (B) i32 is read only by padding_masked attention; `flash`
// picks the tiled kernel that keeps only each row's log-sum-exp. `lp` is the
// compute dtype (mixed precision, gpt.cpp says why): the weights are cast at
// their use, the LayerNorms write the compute dtype, the products, attention
// and GELU run in it (an op in f32 between casts where the backend has no
// kernel in it), and x, the residual stream, stays f32.
// `dropout` drops the two branches at block `layer`'s sites.
core::ValueId transformer_block(core::Graph& g, core::ValueId x, core::ValueId lengths, const std::string& prefix,
                                int64_t C, int n_head, bool flash, BlockAttention attention, const Lowp& lp,
                                const Dropout& dropout = {}, int64_t layer = 0);

// The checks every encoder-bodied model's config shares (the classifier, the
// sequence autoencoder): sizes in range and clear of overflow, n_embd
// divisible by n_head, a known attention kind, a compute dtype of f32 or
// bf16, a known recompute level. Throws ConfigError naming the key.
void validate_encoder_body(int64_t vocab_size, int64_t n_layer, int64_t n_embd, int64_t n_head, int64_t max_len,
                           const std::string& attention, core::DType compute, const std::string& recompute);

// The encoder-bodied models compile one program per (batch, width), so
// whoever runs them (the trainers, brisk classify, brisk serve, the E1
// bench) pads a batch of `cols` columns to a multiple of kSeqMultiple,
// capped at max_len: a handful of widths, not one per length.
inline constexpr int64_t kSeqMultiple = 32;
inline int64_t round_width(int64_t cols, int64_t max_len) {
  const int64_t w = (cols + kSeqMultiple - 1) / kSeqMultiple * kSeqMultiple;
  return w < max_len ? w : max_len;
}

}  // namespace brisk::models
