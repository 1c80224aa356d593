// Graph rewriting (see passes.h). Two phases: matching runs over the source
// graph alone (patterns see the original nodes and readers, never a half
// rewritten graph), then one replay builds the result. Leaves (inputs,
// params, externals) are created first, in id order, because a model may
// create an input after the nodes a pattern fuses (GPT's loss_scale comes
// after its cross_entropy) and the replacement may need it.
#include "brisk/core/passes.h"

#include <algorithm>

#include "brisk/core/error.h"

namespace brisk::core {

GraphUses::GraphUses(const Graph& g) : g_(g), readers_(g.num_values()) {
  const auto& nodes = g.nodes();
  for (size_t i = 0; i < nodes.size(); ++i)
    for (ValueId v : nodes[i].inputs) readers_[size_t(v)].push_back(int(i));
}

int GraphUses::sole_reader(ValueId v) const {
  const auto& r = readers(v);
  return r.size() == 1 && !g_.value(v).is_output ? r[0] : -1;
}

ValueId copy_leaf(Graph& dst, const Value& val) {
  ValueId n;
  if (val.role == ValueRole::input) n = dst.input(val.name, val.meta.shape, val.meta.dtype, val.requires_grad);
  else if (val.role == ValueRole::param) n = dst.param(val.name, val.meta.shape, val.meta.dtype);
  else n = dst.external(val.name, val.meta.shape, val.meta.dtype, val.role);
  if (val.is_output) dst.mark_output(n);
  return n;
}

RewriteResult rewrite(const Graph& src, const std::vector<Pattern>& patterns) {
  const auto& nodes = src.nodes();
  const size_t bs = src.backward_start();
  const GraphUses uses(src);

  // --- match: claim nodes; remember which match is emitted where.
  std::vector<int> claimed(nodes.size(), -1);  // index into `matches`
  std::vector<Match> matches;
  std::vector<size_t> match_pattern;
  std::vector<int> emit_at(nodes.size(), -1);
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (claimed[i] >= 0) continue;
    for (size_t p = 0; p < patterns.size(); ++p) {
      std::optional<Match> m = patterns[p].match(src, int(i), uses);
      if (!m || m->nodes.empty()) continue;
      const bool free = std::all_of(m->nodes.begin(), m->nodes.end(),
                                    [&](int n) { return n >= 0 && size_t(n) < nodes.size() && claimed[size_t(n)] < 0; });
      if (!free) continue;
      const int id = int(matches.size());
      for (int n : m->nodes) claimed[size_t(n)] = id;
      const int at = m->emit_at >= 0 ? m->emit_at : *std::max_element(m->nodes.begin(), m->nodes.end());
      if (std::find(m->nodes.begin(), m->nodes.end(), at) == m->nodes.end())
        throw Error("rewrite: pattern " + patterns[p].name + " emits at node " + std::to_string(at) +
                    ", which is not one of its matched nodes");
      emit_at[size_t(at)] = id;
      matches.push_back(std::move(*m));
      match_pattern.push_back(p);
      break;
    }
  }

  RewriteResult r;
  Graph& dst = r.graph;
  r.map.assign(src.num_values(), kNoValue);
  for (const Pattern& p : patterns) r.applied.emplace_back(p.name, 0);

  // --- leaves first.
  for (size_t v = 0; v < src.num_values(); ++v) {
    const Value& val = src.value(ValueId(v));
    if (val.producer >= 0) continue;
    r.map[v] = copy_leaf(dst, val);
  }

  auto carry_over = [&](ValueId s) {  // name and output mark of a source value now mapped
    const Value& val = src.value(s);
    const ValueId d = r.map[size_t(s)];
    if (!val.name.empty() && dst.find(val.name) == kNoValue) dst.set_name(d, val.name);
    if (val.is_output) dst.mark_output(d);
  };
  auto mapped = [&](ValueId s, const std::string& who) {
    const ValueId d = r.map[size_t(s)];
    if (d == kNoValue)
      throw Error("rewrite: " + who + " reads value " + std::to_string(s) + " (" + src.meta(s).str() +
                  "), which a pattern removed without replacing");
    return d;
  };

  // --- replay.
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    if (i == bs) dst.set_backward_start(dst.nodes().size());
    if (claimed[i] < 0) {
      std::vector<ValueId> in;
      for (ValueId v : n.inputs) in.push_back(mapped(v, "node " + std::to_string(i) + " (" + std::string(op_name(n.op)) + ")"));
      const std::vector<ValueId> out = dst.add_node(n.op, std::move(in), n.params);
      for (size_t k = 0; k < out.size(); ++k) {
        r.map[size_t(n.outputs[k])] = out[k];
        carry_over(n.outputs[k]);
      }
      continue;
    }
    if (emit_at[i] < 0) continue;  // a matched node; its match is emitted at its last node
    const Match& m = matches[size_t(emit_at[i])];
    const std::string& pname = patterns[match_pattern[size_t(emit_at[i])]].name;
    for (int mn : m.nodes)
      for (ValueId v : nodes[size_t(mn)].inputs) {
        const int prod = src.value(v).producer;
        if (prod >= 0 && claimed[size_t(prod)] == emit_at[i]) continue;  // made inside the match
        if (prod > int(i))
          throw Error("rewrite: pattern " + pname + " is emitted at node " + std::to_string(i) + " but reads value " +
                      std::to_string(v) + ", made later by node " + std::to_string(prod));
        mapped(v, "pattern " + pname);
      }
    m.emit(dst, r.map);
    for (int mn : m.nodes)
      for (ValueId v : nodes[size_t(mn)].outputs)
        if (r.map[size_t(v)] != kNoValue) carry_over(v);
    for (auto& [name, count] : r.applied)
      if (name == pname) ++count;
  }

  // Removed values must not be graph outputs or gradients (readers are checked on replay).
  for (size_t v = 0; v < src.num_values(); ++v)
    if (src.value(ValueId(v)).is_output && r.map[v] == kNoValue)
      throw Error("rewrite: output value " + std::to_string(v) + " (" + src.meta(ValueId(v)).str() +
                  ") was removed by a pattern without a replacement");
  for (size_t v = 0; v < src.num_values(); ++v) {
    const ValueId gv = src.grad_of(ValueId(v));
    if (gv == kNoValue || r.map[v] == kNoValue) continue;
    if (r.map[size_t(gv)] == kNoValue)
      throw Error("rewrite: gradient value " + std::to_string(gv) + " (" + src.meta(gv).str() +
                  ") was removed by a pattern without a replacement");
    dst.set_grad_of(r.map[v], r.map[size_t(gv)]);
  }
  return r;
}

}  // namespace brisk::core
