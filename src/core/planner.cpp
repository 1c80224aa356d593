// Liveness, alias resolution and greedy-by-size offset assignment (planner.h).
#include "brisk/core/planner.h"

#include <algorithm>
#include <cstdio>

#include "brisk/core/allocator.h"
#include "brisk/core/error.h"

namespace brisk::core {

namespace {

struct Interval {
  size_t bytes;
  int first, last;
  size_t* offset_out;
};

// Places buffers largest first, each at the lowest offset that does not
// collide with an already placed buffer whose lifetime overlaps its own.
size_t assign_offsets(std::vector<Interval>& items) {
  std::stable_sort(items.begin(), items.end(), [](const Interval& a, const Interval& b) {
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.first < b.first;
  });
  std::vector<const Interval*> placed;
  std::vector<std::pair<size_t, size_t>> busy;  // (offset, end) of overlapping placed buffers
  size_t arena = 0;
  for (Interval& it : items) {
    busy.clear();
    for (const Interval* p : placed)
      if (p->first <= it.last && it.first <= p->last) busy.emplace_back(*p->offset_out, *p->offset_out + p->bytes);
    std::sort(busy.begin(), busy.end());
    size_t offset = 0;
    for (const auto& [b, e] : busy) {
      if (offset + it.bytes <= b) break;
      offset = std::max(offset, e);
    }
    *it.offset_out = offset;
    arena = std::max(arena, offset + it.bytes);
    placed.push_back(&it);
  }
  return arena;
}

}  // namespace

MemoryPlan plan_memory(const Graph& g) {
  const auto& values = g.values();
  const auto& nodes = g.nodes();
  const size_t nv = values.size();
  const int end = int(nodes.size());  // "after the last node": graph outputs live until here

  MemoryPlan plan;
  plan.root.resize(nv);
  plan.offset.assign(nv, SIZE_MAX);
  plan.workspace_offset.assign(nodes.size(), SIZE_MAX);
  plan.workspace_size.assign(nodes.size(), 0);
  for (size_t v = 0; v < nv; ++v) plan.root[v] = ValueId(v);

  // Aliases: an output that reuses an input's memory takes that input's root.
  for (const Node& n : nodes) {
    const OpDef& def = op_def(n.op);
    for (size_t o = 0; o < n.outputs.size(); ++o) {
      const int a = def.alias_of(o, n.inputs.size());
      if (a < 0) continue;
      const ValueId src = n.inputs.at(size_t(a));
      if (g.meta(src).bytes() != g.meta(n.outputs[o]).bytes())
        throw Error("planner: op '" + std::string(def.name) + "' aliases buffers of different sizes");
      plan.root[size_t(n.outputs[o])] = plan.root[size_t(src)];
    }
  }

  // Lifetimes of root buffers, in node indices.
  std::vector<int> first(nv, 0), last(nv, -1);
  for (size_t v = 0; v < nv; ++v) {
    if (plan.root[v] != ValueId(v)) continue;
    first[v] = values[v].producer >= 0 ? values[v].producer : 0;
    last[v] = first[v];
  }
  for (int i = 0; i < end; ++i) {
    const Node& n = nodes[size_t(i)];
    for (ValueId v : n.inputs) last[size_t(plan.root[size_t(v)])] = std::max(last[size_t(plan.root[size_t(v)])], i);
    for (ValueId v : n.outputs) last[size_t(plan.root[size_t(v)])] = std::max(last[size_t(plan.root[size_t(v)])], i);
  }
  // Outputs are read after the step; inputs are written once and may be
  // reused by the next step (positions, a fixed batch): both live throughout.
  for (size_t v = 0; v < nv; ++v)
    if (values[v].is_output || values[v].role == ValueRole::input) last[size_t(plan.root[v])] = end;

  // Externals are not planned; count them for the report.
  std::vector<Interval> items;
  std::vector<size_t> root_offset(nv, SIZE_MAX);
  MemoryReport& r = plan.report;
  for (size_t v = 0; v < nv; ++v) {
    if (plan.root[v] != ValueId(v)) continue;
    const Value& val = values[v];
    const size_t bytes = val.meta.bytes();
    switch (val.role) {
      case ValueRole::param: r.params += bytes; continue;
      case ValueRole::grad: r.grads += bytes; continue;
      case ValueRole::state: r.optimizer_state += bytes; continue;
      default: break;
    }
    items.push_back({align_up(bytes), first[v], last[v], &root_offset[v]});
  }
  const size_t activation_items = items.size();
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    const OpDef& def = op_def(n.op);
    if (!def.workspace_bytes) continue;
    std::vector<TensorMeta> in;
    for (ValueId v : n.inputs) in.push_back(g.meta(v));
    const size_t ws = def.workspace_bytes(in, n.params);
    if (ws == 0) continue;
    plan.workspace_size[i] = ws;
    items.push_back({align_up(ws), int(i), int(i), &plan.workspace_offset[i]});
    r.workspace = std::max(r.workspace, ws);
  }

  // Lower bound and activation peak: the most bytes live at any one time.
  for (int t = 0; t <= end; ++t) {
    size_t live = 0, live_act = 0;
    for (size_t k = 0; k < items.size(); ++k) {
      const Interval& it = items[k];
      if (it.first <= t && t <= it.last) {
        live += it.bytes;
        if (k < activation_items) live_act += it.bytes;
      }
    }
    r.live_lower_bound = std::max(r.live_lower_bound, live);
    r.activations = std::max(r.activations, live_act);
  }

  r.arena = assign_offsets(items);
  for (const Interval& it : items) plan.buffers.push_back({*it.offset_out, it.bytes, it.first, it.last});

  for (size_t v = 0; v < nv; ++v) plan.offset[v] = root_offset[size_t(plan.root[v])];
  return plan;
}

std::string MemoryReport::str() const {
  auto mib = [](size_t b) { return double(b) / (1024.0 * 1024.0); };
  char buf[640];
  std::snprintf(buf, sizeof buf,
                "memory plan (MiB)\n"
                "  parameters        %10.2f\n"
                "  gradients         %10.2f\n"
                "  optimizer state   %10.2f\n"
                "  arena             %10.2f  (activations peak %.2f, workspace peak %.2f, lower bound %.2f)\n"
                "  total             %10.2f\n",
                mib(params), mib(grads), mib(optimizer_state), mib(arena), mib(activations), mib(workspace),
                mib(live_lower_bound), mib(total()));
  return buf;
}

}  // namespace brisk::core
