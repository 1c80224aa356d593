// Activation recomputation ("checkpointing"): trade compute for memory by
// running parts of the forward pass again during the backward pass instead of
// keeping their outputs alive from one to the other.
//
// The graph is append-only and the executor runs nodes in order, so the
// planner frees a value after its last reader. recompute() replays a graph
// that already has its backward pass into a new one in which, for the chosen
// forward nodes, a clone of the node is emitted right before the first
// backward node that reads one of its outputs, and every backward reader is
// redirected to the clone's outputs. The originals then die after their last
// forward reader and the arena shrinks; only the clone's outputs live through
// the backward, and only from the point they are needed. Working on the
// finished graph (not inside autograd or the model) keeps backward rules,
// fusion passes and models unaware of it, and the planner's figure for each
// level is exact before anything runs.
//
// Core knows ops only through the op table, so the caller says what to
// recompute (the model knows which nodes are GELUs or form a block):
//  - selective: single nodes whose outputs are cheap to redo (GELU,
//    LayerNorm), each with a recipe: by default the node itself run again
//    from its saved inputs; a fused node can name a cheaper way to redo part
//    of its outputs (linear_gelu's GELU output from its saved pre-activation,
//    not the gemm).
//  - segments: node ranges (transformer blocks). A value produced inside a
//    segment and read by no forward node outside it is recomputed; what the
//    segment hands on (its output, the next segment's input) stays saved. A
//    clone reads the clones of recomputed inputs, so the first backward use
//    replays the segment's forward chain from its saved inputs.
// A view of a recomputed value is recomputed with it (reshape is free).
//
// Assumed of the forward nodes, true of every op today: they are pure (no
// in-place writes; an aliased output is a view) and deterministic (no random
// ops), so a clone computes bit for bit what the original did.
#pragma once

#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "brisk/core/graph.h"

namespace brisk::core {

// How to redo some outputs of one forward node.
struct RecomputeRecipe {
  std::vector<int> outputs;    // which outputs of the node it reproduces
  std::vector<ValueId> reads;  // source values it reads (inputs, or outputs it does not reproduce)
  // Appends the nodes to `dst`; `reads` are already mapped into dst. Returns
  // one value per entry of `outputs`, with the same shape and dtype.
  std::function<std::vector<ValueId>(Graph& dst, const std::vector<ValueId>& reads)> emit;
};

// The default recipe: the node itself, all outputs, from its inputs.
RecomputeRecipe clone_recipe(const Node& n);

struct RecomputePolicy {
  // Forward nodes (outside the segments) to recompute one by one: a recipe,
  // or nullopt to keep the node's outputs saved. May be empty.
  std::function<std::optional<RecomputeRecipe>(const Graph& g, const Node& n)> selective;
  // Forward node ranges [begin, end) recomputed as a whole; must not overlap.
  std::vector<std::pair<size_t, size_t>> segments;
  bool empty() const { return !selective && segments.empty(); }
};

struct RecomputeResult {
  Graph graph;
  // Source value -> value in `graph` (originals; clones are not in the map).
  std::vector<ValueId> map;
  // Source forward nodes whose recipe ran in the backward pass, in order.
  std::vector<int> recomputed;
};

// Throws Error if `g` has no backward pass, a segment is out of range or
// overlaps another, or a recipe emits values of the wrong shape or dtype.
// With an empty policy the graph is replayed unchanged, value ids and all.
RecomputeResult recompute(const Graph& g, const RecomputePolicy& policy);

}  // namespace brisk::core
