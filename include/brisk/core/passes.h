// Graph rewriting: the mechanism fusion passes are built on. rewrite() replays
// a graph node by node into a new graph (inputs, params and externals first,
// then the nodes in order; names, params, roles, output marks, the start of
// the backward pass and each gradient's value preserved) and lets patterns
// replace a matched set of nodes with other nodes. A Graph is append-only, so
// a rewrite builds a new one instead of editing in place; it runs once per
// program, before planning, so the copy costs nothing that matters. Forward
// fusions run before backward() (the backward rules then differentiate the
// fused ops); fusions of backward nodes run on the finished graph.
//
// Core knows ops only through the op table, so patterns live in the ops
// layer (ops::classifier_fusion, for one) and core provides the matching
// loop and the bookkeeping: which values each node reads, the map from old
// values to new, and the checks that a pattern removed nothing still in use.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "brisk/core/graph.h"

namespace brisk::core {

// Who reads each value of a graph.
class GraphUses {
 public:
  explicit GraphUses(const Graph& g);
  const std::vector<int>& readers(ValueId v) const { return readers_.at(size_t(v)); }
  // The one node reading v when exactly one node does (once) and v is not a
  // graph output; -1 otherwise.
  int sole_reader(ValueId v) const;

 private:
  const Graph& g_;
  std::vector<std::vector<int>> readers_;
};

struct Match {
  // Source nodes replaced, any order. The replacement is emitted where the
  // last of them stood, so every value they read from outside exists by then.
  std::vector<int> nodes;
  // Adds the replacement to `dst`. `map` takes source values to dst values:
  // read the matched nodes' outside inputs through it, and set it for every
  // matched output that something else still reads (rewrite() checks).
  std::function<void(Graph& dst, std::vector<ValueId>& map)> emit;
  // Emitted where this one of `nodes` stood instead (-1: the last): earlier,
  // when unmatched nodes between read what the replacement makes (they are
  // replayed after it). Every outside value the match reads must then be
  // made before emit_at (rewrite() checks).
  int emit_at = -1;
};

struct Pattern {
  std::string name;
  // Tried at every node not yet claimed by an earlier match, in node order.
  std::function<std::optional<Match>(const Graph& g, int node, const GraphUses& uses)> match;
};

struct RewriteResult {
  Graph graph;
  // Source value -> value in `graph`; kNoValue for values a pattern removed.
  std::vector<ValueId> map;
  std::vector<std::pair<std::string, int>> applied;  // pattern name, times it fired
  int rewrites() const {
    int n = 0;
    for (const auto& [name, k] : applied) n += k;
    return n;
  }
};

// Adds a copy of leaf value `val` (input, param or external: same name,
// shape, dtype, role and output mark) to `dst`: how graph passes that
// replay a graph carry its leaves over.
ValueId copy_leaf(Graph& dst, const Value& val);

// Throws Error if a pattern removes a value that a remaining node (or the
// graph's outputs, or a gradient mapping) still reads.
RewriteResult rewrite(const Graph& src, const std::vector<Pattern>& patterns);

}  // namespace brisk::core
