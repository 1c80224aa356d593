// Activation recomputation (recompute.h). Two phases, like rewrite(): first
// decide over the source graph alone which forward values are recomputed
// ("flagged") and by which recipe, then one replay builds the result, running
// recipes on demand while the backward nodes are emitted.
//
// Decisions are made per buffer, not per value: a view shares its input's
// memory, so recomputing a value while one of its views stays saved would
// keep the original buffer alive and add a copy. A buffer is recomputed only
// if none of its views is a graph output and (in a segment) none is read by a
// forward node outside the segment; its views are then recomputed with it.
//
// The replay walks nodes in order and creates each leaf (input, param,
// external) just before the first node whose outputs were created after it,
// so with an empty policy the new graph has the same value ids as the old.
#include "brisk/core/recompute.h"

#include <algorithm>
#include <string>

#include "brisk/core/error.h"
#include "brisk/core/passes.h"

namespace brisk::core {

RecomputeRecipe clone_recipe(const Node& n) {
  RecomputeRecipe r;
  for (size_t o = 0; o < n.outputs.size(); ++o) r.outputs.push_back(int(o));
  r.reads = n.inputs;
  r.emit = [op = n.op, params = n.params](Graph& dst, const std::vector<ValueId>& in) {
    return dst.add_node(op, in, params);
  };
  return r;
}

namespace {

struct Plan {
  std::vector<bool> flagged;                           // per source value
  std::vector<std::optional<RecomputeRecipe>> recipe;  // per forward node; views get theirs on demand
};

Plan plan_recompute(const Graph& g, const RecomputePolicy& policy) {
  const auto& nodes = g.nodes();
  const size_t bs = g.backward_start(), nv = g.num_values();
  Plan plan;
  plan.recipe.resize(bs);

  // Segment of each forward node; selected nodes get one of their own.
  constexpr int kNone = -1;
  std::vector<int> seg(bs, kNone);
  std::vector<bool> in_segment(bs, false);
  for (size_t s = 0; s < policy.segments.size(); ++s) {
    const auto [b, e] = policy.segments[s];
    if (b > e || e > bs)
      throw Error("recompute: segment " + std::to_string(s) + " [" + std::to_string(b) + ", " + std::to_string(e) +
                  ") is not a range of forward nodes (the forward pass has " + std::to_string(bs) + ")");
    for (size_t i = b; i < e; ++i) {
      if (in_segment[i])
        throw Error("recompute: segment " + std::to_string(s) + " overlaps an earlier one at node " +
                    std::to_string(i));
      seg[i] = int(s);
      in_segment[i] = true;
      plan.recipe[i] = clone_recipe(nodes[i]);
    }
  }
  if (policy.selective)
    for (size_t i = 0; i < bs; ++i) {
      if (in_segment[i]) continue;
      plan.recipe[i] = policy.selective(g, nodes[i]);
      if (plan.recipe[i]) seg[i] = int(policy.segments.size() + i);
    }

  // Buffers of forward values: a view takes its input's root (as the planner does).
  std::vector<ValueId> root(nv);
  for (size_t v = 0; v < nv; ++v) root[v] = ValueId(v);
  for (size_t i = 0; i < bs; ++i) {
    const Node& n = nodes[i];
    const OpDef& def = op_def(n.op);
    for (size_t o = 0; o < n.outputs.size(); ++o)
      if (const int a = def.alias_of(o, n.inputs.size()); a >= 0) root[size_t(n.outputs[o])] = root[size_t(n.inputs.at(size_t(a)))];
  }
  std::vector<std::vector<int>> readers(nv);  // forward readers of each value
  for (size_t i = 0; i < bs; ++i)
    for (ValueId u : nodes[i].inputs) readers[size_t(u)].push_back(int(i));

  // A buffer is a candidate if its producer's recipe reproduces it ...
  std::vector<bool> candidate(nv, false), keep(nv, false);
  for (size_t i = 0; i < bs; ++i) {
    if (!plan.recipe[i]) continue;
    for (int o : plan.recipe[i]->outputs) {
      const ValueId v = nodes[i].outputs.at(size_t(o));
      if (root[size_t(v)] == v) candidate[size_t(v)] = true;
    }
  }
  // ... and stays saved if any view of it must.
  for (size_t v = 0; v < nv; ++v) {
    const size_t r = size_t(root[v]);
    if (!candidate[r]) continue;
    if (g.value(ValueId(v)).is_output) keep[r] = true;
    const size_t home = size_t(g.value(ValueId(r)).producer);
    if (!in_segment[home]) continue;
    for (int j : readers[v])
      if (seg[size_t(j)] != seg[home]) keep[r] = true;
  }
  // A segment node with one output saved keeps all of them: redoing it for
  // the rest (a fused add_layernorm's mean and rstd next to the residual it
  // hands on) would replay everything it reads to make a few bytes.
  for (size_t i = 0; i < bs; ++i) {
    if (!in_segment[i]) continue;
    const auto& outs = nodes[i].outputs;
    if (std::any_of(outs.begin(), outs.end(), [&](ValueId v) { return keep[size_t(root[size_t(v)])]; }))
      for (ValueId v : outs) keep[size_t(root[size_t(v)])] = true;
  }
  plan.flagged.assign(nv, false);
  for (size_t v = 0; v < nv; ++v) {
    const int p = g.value(ValueId(v)).producer;
    const size_t r = size_t(root[v]);
    plan.flagged[v] = p >= 0 && size_t(p) < bs && candidate[r] && !keep[r];
  }
  return plan;
}

}  // namespace

RecomputeResult recompute(const Graph& src, const RecomputePolicy& policy) {
  const auto& nodes = src.nodes();
  const size_t bs = src.backward_start(), nv = src.num_values();
  if (bs >= nodes.size()) throw Error("recompute: the graph has no backward pass; call backward() first");
  Plan plan = plan_recompute(src, policy);

  RecomputeResult r;
  Graph& dst = r.graph;
  r.map.assign(nv, kNoValue);
  std::vector<ValueId> copy(nv, kNoValue);  // source value -> its recomputed copy
  std::vector<bool> done(bs, false);

  size_t next_leaf = 0;
  auto leaves_before = [&](size_t end) {
    for (; next_leaf < end && next_leaf < nv; ++next_leaf) {
      const Value& val = src.value(ValueId(next_leaf));
      if (val.producer >= 0) continue;
      r.map[next_leaf] = copy_leaf(dst, val);
    }
  };
  auto mapped = [&](ValueId s) {
    const ValueId d = r.map[size_t(s)];
    if (d == kNoValue) throw Error("recompute: value " + std::to_string(s) + " is read before it exists");
    return d;
  };

  // Runs node i's recipe (once). It reads the copies of recomputed values
  // (running their recipes first) and the originals of saved ones.
  std::function<ValueId(ValueId)> read;
  auto run_recipe = [&](int i) {
    if (done[size_t(i)]) return;
    done[size_t(i)] = true;
    const Node& n = nodes[size_t(i)];
    std::optional<RecomputeRecipe>& rec = plan.recipe[size_t(i)];
    if (!rec) rec = clone_recipe(n);  // a view of a recomputed buffer
    std::vector<ValueId> in;
    for (ValueId u : rec->reads) in.push_back(read(u));
    const std::vector<ValueId> out = rec->emit(dst, in);
    if (out.size() != rec->outputs.size())
      throw Error("recompute: the recipe for node " + std::to_string(i) + " (" + std::string(op_name(n.op)) +
                  ") gave " + std::to_string(out.size()) + " values for " + std::to_string(rec->outputs.size()) +
                  " outputs");
    for (size_t k = 0; k < out.size(); ++k) {
      const ValueId s = n.outputs.at(size_t(rec->outputs[k]));
      if (!(dst.meta(out[k]) == src.meta(s)))
        throw Error("recompute: the recipe for node " + std::to_string(i) + " (" + std::string(op_name(n.op)) +
                    ") gave " + dst.meta(out[k]).str() + " for output " + std::to_string(rec->outputs[k]) + " of " +
                    src.meta(s).str());
      copy[size_t(s)] = out[k];
    }
    r.recomputed.push_back(i);
  };
  read = [&](ValueId u) {
    if (!plan.flagged[size_t(u)]) return mapped(u);
    run_recipe(src.value(u).producer);
    if (copy[size_t(u)] == kNoValue)
      throw Error("recompute: the recipe for node " + std::to_string(src.value(u).producer) +
                  " does not reproduce value " + std::to_string(u));
    return copy[size_t(u)];
  };

  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    if (!n.outputs.empty()) leaves_before(size_t(*std::min_element(n.outputs.begin(), n.outputs.end())));
    if (i == bs) dst.set_backward_start(dst.nodes().size());
    std::vector<ValueId> in;
    for (ValueId u : n.inputs) in.push_back(i >= bs ? read(u) : mapped(u));
    const std::vector<ValueId> out = dst.add_node(n.op, std::move(in), n.params);
    for (size_t k = 0; k < out.size(); ++k) {
      const ValueId s = n.outputs[k], d = out[k];
      r.map[size_t(s)] = d;
      const Value& val = src.value(s);
      if (!val.name.empty() && dst.find(val.name) == kNoValue) dst.set_name(d, val.name);
      if (val.is_output) dst.mark_output(d);
    }
  }
  leaves_before(nv);

  for (size_t v = 0; v < nv; ++v) {
    const ValueId gv = src.grad_of(ValueId(v));
    if (gv != kNoValue) dst.set_grad_of(r.map[v], mapped(gv));
  }
  return r;
}

}  // namespace brisk::core
