// Small models built straight from ops, shared by the engine tests: a 2-layer
// MLP classifier and one GPT-2 block with an LM head. (The full GPT lives in
// src/models/; these stay tiny and dependency-free on purpose.)
#pragma once

#include <cmath>
#include <string>

#include "brisk/core/autograd.h"
#include "brisk/core/graph.h"
#include "brisk/core/param_store.h"
#include "brisk/ops/ops.h"

namespace brisk::testing_models {

using core::DType;
using core::Graph;
using core::Shape;
using core::ValueId;

struct Built {
  ValueId x, targets, loss;
};

// x (N, in) -> linear -> gelu -> linear -> cross-entropy against targets (N).
inline Built build_mlp(Graph& g, int64_t n, int64_t in, int64_t hidden, int64_t classes) {
  Built b;
  b.x = g.input("x", {n, in}, DType::f32);
  b.targets = g.input("targets", {n}, DType::i32);
  ValueId w1 = g.param("fc1.weight", {hidden, in}), b1 = g.param("fc1.bias", {hidden});
  ValueId w2 = g.param("fc2.weight", {classes, hidden}), b2 = g.param("fc2.bias", {classes});
  ValueId h = ops::gelu(g, ops::linear(g, b.x, w1, b1));  // (N, hidden)
  ValueId logits = ops::linear(g, h, w2, b2);               // (N, classes)
  b.loss = ops::cross_entropy(g, logits, b.targets);
  g.mark_output(b.loss);
  return b;
}

struct BlockConfig {
  int64_t batch = 2, seq = 16, vocab = 64, embd = 32, heads = 4;
};

// ids (B, T) -> embeddings -> one pre-LN transformer block -> LN -> tied head -> loss.
inline Built build_gpt_block(Graph& g, const BlockConfig& c) {
  const int64_t B = c.batch, T = c.seq, C = c.embd, V = c.vocab;
  Built b;
  b.x = g.input("ids", {B, T}, DType::i32);
  b.targets = g.input("targets", {B * T}, DType::i32);
  ValueId wte = g.param("wte", {V, C}), wpe = g.param("wpe", {T, C});
  ValueId pos = g.input("pos", {T}, DType::i32);
  // --- embeddings                                                        (B, T, C)
  ValueId x = ops::add(g, ops::embedding(g, b.x, wte), ops::embedding(g, pos, wpe));
  // --- attention
  auto ln1 = ops::layernorm(g, x, g.param("ln1.weight", {C}), g.param("ln1.bias", {C}));
  ValueId qkv = ops::linear(g, ln1.y, g.param("attn.weight", {3 * C, C}), g.param("attn.bias", {3 * C}));
  ValueId att = ops::attention(g, qkv, int(c.heads));                               // (B, T, C)
  x = ops::add(g, x, ops::linear(g, att, g.param("proj.weight", {C, C}), g.param("proj.bias", {C})));
  // --- MLP
  auto ln2 = ops::layernorm(g, x, g.param("ln2.weight", {C}), g.param("ln2.bias", {C}));
  ValueId h = ops::gelu(g, ops::linear(g, ln2.y, g.param("fc.weight", {4 * C, C}), g.param("fc.bias", {4 * C})));
  x = ops::add(g, x, ops::linear(g, h, g.param("fcproj.weight", {C, 4 * C}), g.param("fcproj.bias", {C})));
  // --- head, tied to the token embedding
  auto lnf = ops::layernorm(g, x, g.param("lnf.weight", {C}), g.param("lnf.bias", {C}));
  ValueId logits = ops::linear(g, ops::reshape(g, lnf.y, {B * T, C}), wte);         // (B*T, V)
  b.loss = ops::cross_entropy(g, logits, b.targets);
  g.mark_output(b.loss);
  return b;
}

// GPT-2 style init: weights normal(0, 0.02), LayerNorm weights 1, biases 0.
inline void init_params(core::ParameterStore& store, uint64_t seed) {
  for (auto& [name, e] : store.entries()) {
    const bool is_bias = name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    const bool is_ln = name.rfind("ln", 0) == 0;
    if (is_ln && !is_bias) e.value.fill(1.0);
    else if (is_bias) e.value.fill(0.0);
    else e.value.copy_from(core::Tensor::randn(e.value.shape(), e.value.dtype(), seed++, 0.f, 0.02f));
  }
}

}  // namespace brisk::testing_models
