// train.recompute for every model built from transformer_block (the GPT, the
// encoder classifier, the sequence autoencoder): which activations a train
// graph's backward recomputes instead of keeping them from the forward
// (core::recompute says how). One policy for all of them:
// - "none": everything the backward reads is kept.
// - "selective": GELU and LayerNorm outputs (and the casts that only narrow
//   them) are redone in the backward from what it keeps anyway (the
//   pre-activation, the LayerNorm input): elementwise work, no products.
//   Fused ops redo only their cheap part: linear_gelu's GELU from its saved
//   pre-activation, add_layernorm's LayerNorm from its saved sum.
// - "full": each block is a segment, from after the node making its input
//   through the node making its output; the backward replays a block's
//   forward from its saved input right before differentiating it. Only the
//   residual stream between blocks stays; nodes outside the blocks are
//   treated as in selective. The models name their block boundaries
//   `<stack>0` .. `<stack><n_layer>` (e.g. "resid.0"), which is where the
//   segments are cut.
// Same function, same gradients (the clones compute bit for bit what the
// originals did, except where a fused kernel's cheap part is redone by the
// plain op); not part of the weights.
#pragma once

#include <initializer_list>
#include <string>
#include <vector>

#include "brisk/core/graph.h"
#include "brisk/core/recompute.h"

namespace brisk::models {

// Throws ConfigError naming train.recompute unless level is none, selective or full.
void validate_recompute(const std::string& level);

// The train graph `g` (with its backward) rewritten for `level` ("none"
// replays it unchanged). `stacks` are the prefixes of the block-boundary
// names, each stack's boundaries `<prefix>0` .. `<prefix><n_layer>`; under
// full, a stack missing one throws Error (its blocks would otherwise merge
// into larger segments, or fall back to selective, without a word). The
// caller maps its value ids with remap_values.
core::RecomputeResult recompute_blocks(const core::Graph& g, const std::string& level,
                                       const std::vector<std::string>& stacks, int64_t n_layer);

// Each of a program's value ids (kNoValue left as is) mapped into r.graph.
void remap_values(const core::RecomputeResult& r, std::initializer_list<core::ValueId*> ids);

}  // namespace brisk::models
