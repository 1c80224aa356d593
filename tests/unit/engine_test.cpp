// The engine end to end: graph -> autograd -> planner -> executor on the CPU
// backend. A 2-layer MLP and a GPT block train (their loss falls), their
// gradients match finite differences, gradient accumulation over micro-batches
// equals one large batch, and the planner's figures match what is used. The
// memory plans of these graphs, and of a real GPT at each recompute level, are
// checked against buffer lifetimes simulated from the graph alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>

#include "brisk/core/error.h"
#include "brisk/core/executor.h"
#include "brisk/core/graph_cache.h"
#include "brisk/core/recompute.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/models/gpt.h"
#include "brisk/ops/ops.h"
#include "test_models.h"

using namespace brisk;
using namespace brisk::testing_models;
using core::Tensor;

namespace {

cpu::CpuBackend& cpu_backend() {
  static cpu::CpuBackend b(2);
  return b;
}

// Random class data whose label is a function of the input (learnable).
void make_mlp_batch(int64_t n, int64_t in, int64_t classes, uint64_t seed, Tensor& x, Tensor& y) {
  x = Tensor::uniform({n, in}, core::DType::f32, seed, -1.f, 1.f);
  y = Tensor::empty({n}, core::DType::i32);
  for (int64_t i = 0; i < n; ++i) {
    const float* r = x.data_as<float>() + i * in;
    int best = 0;
    for (int c = 1; c < classes; ++c)
      if (r[c] > r[best]) best = c;
    y.data_as<int32_t>()[i] = best;
  }
}

void adamw_step(core::ParameterStore& store, core::Backend& backend, int64_t step, float lr) {
  for (auto& [name, e] : store.entries()) {
    if (e.state.empty()) e.state = {Tensor::zeros(e.value.shape(), core::DType::f32), Tensor::zeros(e.value.shape(), core::DType::f32)};
    core::AdamWParams p;
    p.lr = lr;
    p.step = step;
    p.decay_matrices = true;  // the op decays rank >= 2 tensors only
    const core::TensorView in[] = {e.value.as_view(), e.grad.as_view(), e.state[0].as_view(), e.state[1].as_view()};
    const core::TensorView out[] = {e.value.as_view(), e.state[0].as_view(), e.state[1].as_view()};
    core::run_op(backend, core::OpKind::adamw, in, out, p);
  }
}

Tensor block_ids(const BlockConfig& c, uint64_t seed) {
  return Tensor::uniform({c.batch, c.seq}, core::DType::i32, seed, 0.f, float(c.vocab));
}

// Targets: the next token of a fixed cyclic pattern, so a block can learn them.
void block_batch(const BlockConfig& c, uint64_t seed, Tensor& ids, Tensor& targets, Tensor& pos) {
  ids = block_ids(c, seed);
  targets = Tensor::empty({c.batch * c.seq}, core::DType::i32);
  for (int64_t i = 0; i < c.batch * c.seq; ++i)
    targets.data_as<int32_t>()[i] = int32_t((ids.data_as<int32_t>()[i] * 7 + 3) % c.vocab);
  pos = Tensor::empty({c.seq}, core::DType::i32);
  for (int64_t t = 0; t < c.seq; ++t) pos.data_as<int32_t>()[t] = int32_t(t);
}

// ---- an independent check of a memory plan -------------------------------------------
// The executor allocates exactly the arena the planner reports and places
// values where the plan says, so comparing the two proves nothing about the
// plan. This check recomputes, from the graph alone, when each arena buffer
// holds data that is still to be read, following the executor's semantics:
//  - a node reads all its inputs and writes all its outputs while it runs,
//    so a buffer is busy at every node that reads or writes a value stored
//    in it; outputs that alias an input (views, in-place ops: OpDef::alias_of)
//    are stored in that input's buffer, transitively;
//  - the caller writes inputs before the first node and may write them only
//    once for many steps (positions), and reads graph outputs after the last
//    node: an input is busy from before the first node to after the last, an
//    output from its producer to after the last;
//  - a node's workspace is busy at that node only;
//  - parameters, gradients and optimizer state (and their aliases) are bound
//    from outside and must not be in the arena.
// Of the plan it reads only where things were put (offsets, workspace sizes,
// the arena), never its lifetimes (first/last) or alias roots; the one thing
// it shares with the planner is the alignment unit its report counts in.

// Where a planned step keeps its data, as byte offsets into the arena.
struct Placement {
  std::vector<size_t> value_offset;      // per value; SIZE_MAX: not in the arena
  std::vector<size_t> workspace_offset;  // per node; SIZE_MAX: none
  std::vector<size_t> workspace_bytes;   // per node
  size_t arena = 0;
};

Placement placement_of(const core::MemoryPlan& plan) {
  return {plan.offset, plan.workspace_offset, plan.workspace_size, plan.report.arena};
}

// The addresses an executor really gives its kernels. (Its workspace pointers
// are not visible from outside; those come from its plan.)
Placement placement_of(const core::Executor& ex) {
  Placement p = placement_of(ex.plan());
  p.arena = ex.arena_bytes();
  const auto arena = reinterpret_cast<uintptr_t>(ex.arena_data());
  for (size_t v = 0; v < p.value_offset.size(); ++v) {
    const auto d = reinterpret_cast<uintptr_t>(ex.data(core::ValueId(v)));
    p.value_offset[v] = arena != 0 && d >= arena && d < arena + p.arena ? size_t(d - arena) : SIZE_MAX;
  }
  return p;
}

struct Simulated {
  std::vector<std::string> problems;  // empty: the placement is safe
  size_t peak_live = 0;               // most aligned bytes busy at once, workspaces included
  size_t peak_activations = 0;        // the same over value buffers only
  size_t buffers = 0, aliases = 0, workspaces = 0;  // how many were checked
};

Simulated simulate(const core::Graph& g, const Placement& pl) {
  const auto& values = g.values();
  const auto& nodes = g.nodes();
  const size_t nv = values.size();
  const int after_last = int(nodes.size());
  Simulated sim;
  auto describe = [&](size_t v) {
    const core::Value& val = values[v];
    std::string s = val.name.empty() ? "value " + std::to_string(v) : "'" + val.name + "'";
    if (val.producer >= 0)
      s += " (" + std::string(core::op_name(nodes[size_t(val.producer)].op)) + " at node " + std::to_string(val.producer) + ")";
    return s;
  };

  // The buffer each value is stored in, named by the value that owns it.
  std::vector<size_t> owner(nv);
  for (size_t v = 0; v < nv; ++v) owner[v] = v;
  for (const core::Node& n : nodes) {
    const core::OpDef& def = core::op_def(n.op);
    for (size_t o = 0; o < n.outputs.size(); ++o)
      if (const int a = def.alias_of(o, n.inputs.size()); a >= 0) owner[size_t(n.outputs[o])] = owner[size_t(n.inputs[size_t(a)])];
  }

  // When each buffer is busy: [begin, end] in node indices, after_last
  // standing for the caller's side of the step.
  std::vector<int> begin(nv, INT_MAX), end(nv, -1);
  auto touch = [&](size_t v, int t) {
    const size_t o = owner[v];
    begin[o] = std::min(begin[o], t);
    end[o] = std::max(end[o], t);
  };
  for (size_t v = 0; v < nv; ++v) {
    if (values[v].role == core::ValueRole::input) touch(v, 0), touch(v, after_last);
    if (values[v].is_output) touch(v, after_last);
  }
  for (int i = 0; i < after_last; ++i) {
    for (core::ValueId v : nodes[size_t(i)].inputs) touch(size_t(v), i);
    for (core::ValueId v : nodes[size_t(i)].outputs) touch(size_t(v), i);
  }

  struct Item {
    std::string what;
    size_t offset, bytes;
    int begin, end;
    bool workspace;
  };
  std::vector<Item> items;
  auto place = [&](const std::string& what, size_t offset, size_t bytes) {
    if (offset == SIZE_MAX) return sim.problems.push_back(what + " has no place in the arena"), false;
    if (offset % core::kAlignment != 0)
      sim.problems.push_back(what + " at offset " + std::to_string(offset) + " is not " +
                             std::to_string(core::kAlignment) + "-byte aligned");
    if (offset + bytes > pl.arena)
      sim.problems.push_back(what + " ends at byte " + std::to_string(offset + bytes) + ", past the arena's " +
                             std::to_string(pl.arena));
    return true;
  };
  for (size_t v = 0; v < nv; ++v) {
    const size_t off = pl.value_offset[v];
    if (core::role_is_external(values[owner[v]].role)) {
      if (off != SIZE_MAX)
        sim.problems.push_back(describe(v) + " is bound from outside but placed in the arena at " + std::to_string(off));
      continue;
    }
    if (!place(describe(v), off, values[v].meta.bytes())) continue;
    if (owner[v] != v) {
      if (off != pl.value_offset[owner[v]])
        sim.problems.push_back(describe(v) + " is stored in " + describe(owner[v]) + "'s buffer at " +
                               std::to_string(pl.value_offset[owner[v]]) + " but placed at " + std::to_string(off));
      ++sim.aliases;
      continue;
    }
    items.push_back({describe(v), off, values[v].meta.bytes(), begin[v], end[v], false});
    ++sim.buffers;
  }
  for (size_t i = 0; i < nodes.size(); ++i) {
    const core::OpDef& def = core::op_def(nodes[i].op);
    std::vector<core::TensorMeta> in;
    for (core::ValueId v : nodes[i].inputs) in.push_back(g.meta(v));
    const size_t ws = def.workspace_bytes ? def.workspace_bytes(in, nodes[i].params) : 0;
    const std::string what = "the workspace of " + std::string(def.name) + " at node " + std::to_string(i);
    if (pl.workspace_bytes[i] != ws)
      sim.problems.push_back(what + " has " + std::to_string(pl.workspace_bytes[i]) + " bytes, the op asks for " +
                             std::to_string(ws));
    if (ws == 0 || !place(what, pl.workspace_offset[i], ws)) continue;
    items.push_back({what, pl.workspace_offset[i], ws, int(i), int(i), true});
    ++sim.workspaces;
  }

  // (a) Two buffers busy at the same node must not share a byte.
  for (size_t a = 0; a < items.size(); ++a)
    for (size_t b = a + 1; b < items.size(); ++b) {
      const Item &x = items[a], &y = items[b];
      const bool same_time = x.begin <= y.end && y.begin <= x.end;
      const bool same_bytes = x.offset < y.offset + y.bytes && y.offset < x.offset + x.bytes;
      if (same_time && same_bytes)
        sim.problems.push_back(x.what + " [" + std::to_string(x.offset) + ", " + std::to_string(x.offset + x.bytes) +
                               ") busy at nodes " + std::to_string(x.begin) + ".." + std::to_string(x.end) + " and " +
                               y.what + " [" + std::to_string(y.offset) + ", " + std::to_string(y.offset + y.bytes) +
                               ") busy at nodes " + std::to_string(y.begin) + ".." + std::to_string(y.end) +
                               " share bytes at node " + std::to_string(std::max(x.begin, y.begin)));
    }

  // (c) The largest set of buffers busy at once, in the report's unit.
  for (int t = 0; t <= after_last; ++t) {
    size_t live = 0, live_act = 0;
    for (const Item& it : items)
      if (it.begin <= t && t <= it.end) {
        live += core::align_up(it.bytes);
        if (!it.workspace) live_act += core::align_up(it.bytes);
      }
    sim.peak_live = std::max(sim.peak_live, live);
    sim.peak_activations = std::max(sim.peak_activations, live_act);
  }
  return sim;
}

// The plan's placement is safe for `g` and its reported peaks are the
// simulated ones.
void expect_safe_plan(const core::Graph& g, const core::MemoryPlan& plan, const Placement& pl, const std::string& what) {
  SCOPED_TRACE(what);
  const Simulated sim = simulate(g, pl);
  for (size_t k = 0; k < std::min<size_t>(sim.problems.size(), 8); ++k) ADD_FAILURE() << sim.problems[k];
  EXPECT_TRUE(sim.problems.empty()) << sim.problems.size() << " problems in the plan (the first ones above)";
  EXPECT_EQ(plan.report.live_lower_bound, sim.peak_live) << "the planner's peak is not the simulated one";
  EXPECT_EQ(plan.report.activations, sim.peak_activations) << "the planner's activation peak is not the simulated one";
  EXPECT_GE(pl.arena, sim.peak_live);
  EXPECT_GT(sim.buffers, 0u);
  std::printf("planner check, %s: %zu nodes, %zu buffers, %zu aliases, %zu workspaces, peak %.3f MiB, arena %.3f MiB\n",
              what.c_str(), g.nodes().size(), sim.buffers, sim.aliases, sim.workspaces,
              double(sim.peak_live) / 1048576.0, double(pl.arena) / 1048576.0);
}

void expect_safe_plan(const core::Graph& g, const std::string& what) {
  const core::MemoryPlan plan = core::plan_memory(g);
  expect_safe_plan(g, plan, placement_of(plan), what);
}

// x (256 x 256) -> 8 GELUs -> a reshape view, the view an output.
struct GeluChain {
  core::Graph g;
  core::ValueId x, h, r;
  GeluChain() {
    x = g.input("x", {256, 256}, core::DType::f32);
    h = x;
    for (int i = 0; i < 8; ++i) h = ops::gelu(g, h);  // a chain: two intermediates live at a time
    r = ops::reshape(g, h, {65536});
    g.mark_output(r);
  }
};

}  // namespace

TEST(Graph, ShapeErrorsNameTheOpAndShapes) {
  core::Graph g;
  auto x = g.input("x", {4, 8}, core::DType::f32);
  auto w = g.param("w", {3, 7});
  try {
    ops::linear(g, x, w);
    FAIL() << "expected a ShapeError";
  } catch (const core::ShapeError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("linear"), std::string::npos) << msg;
    EXPECT_NE(msg.find("(4, 8)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("(3, 7)"), std::string::npos) << msg;
  }
  auto ids = g.input("ids", {4}, core::DType::f32);
  EXPECT_THROW(ops::cross_entropy(g, x, ids), core::Error);
}

TEST(Planner, ReusesBuffersAndAliasesViews) {
  GeluChain c;
  const core::MemoryPlan plan = core::plan_memory(c.g);
  const size_t one = 256 * 256 * 4;
  // The input stays for the whole step (callers may write it once), plus two.
  EXPECT_EQ(plan.report.arena, 3 * one) << plan.report.str();
  EXPECT_EQ(plan.report.live_lower_bound, 3 * one);
  EXPECT_EQ(plan.offset[size_t(c.r)], plan.offset[size_t(c.h)]) << "a reshape must share its input's buffer";
  expect_safe_plan(c.g, plan, placement_of(plan), "gelu chain");
}

// The check above must be able to fail: placements that break each property
// it guards, made by hand from a good plan, are each reported.
TEST(Planner, IndependentCheckCatchesUnsafePlacements) {
  GeluChain c;
  const core::MemoryPlan plan = core::plan_memory(c.g);
  const Placement good = placement_of(plan);
  ASSERT_TRUE(simulate(c.g, good).problems.empty());
  auto reports = [&](const Placement& bad, const std::string& words) {
    const Simulated sim = simulate(c.g, bad);
    for (const std::string& p : sim.problems)
      if (p.find(words) != std::string::npos) return true;
    return false;
  };
  // GELU 2 reads GELU 1's output while it writes its own: one buffer for both.
  const core::ValueId g1 = c.g.nodes()[1].outputs[0], g2 = c.g.nodes()[2].outputs[0];
  Placement reused_early = good;
  reused_early.value_offset[size_t(g2)] = good.value_offset[size_t(g1)];
  EXPECT_TRUE(reports(reused_early, "share bytes at node 2"));
  // The input is busy for the whole step, even after its last reader.
  Placement input_reused = good;
  input_reused.value_offset[size_t(c.g.nodes()[4].outputs[0])] = good.value_offset[size_t(c.x)];
  EXPECT_TRUE(reports(input_reused, "share bytes"));
  // The view lives in its input's buffer.
  Placement view_moved = good;
  view_moved.value_offset[size_t(c.r)] = good.value_offset[size_t(c.x)];
  EXPECT_TRUE(reports(view_moved, "buffer at"));
  // Every value fits in the arena.
  Placement small = good;
  small.arena -= 1;
  EXPECT_TRUE(reports(small, "past the arena"));

  // A node's workspace is busy while the node reads its inputs.
  models::Gpt m(models::GptConfig{64, 1, 32, 4, 32, "flash"}, cpu_backend());
  const core::Graph g = m.train_graph(2, 32);
  const core::MemoryPlan gplan = core::plan_memory(g);
  Placement ws_on_input = placement_of(gplan);
  ASSERT_TRUE(simulate(g, ws_on_input).problems.empty());
  size_t node = 0;
  while (node < g.nodes().size() && gplan.workspace_size[node] == 0) ++node;
  ASSERT_LT(node, g.nodes().size()) << "no node with a workspace";
  size_t input_offset = SIZE_MAX;
  for (core::ValueId v : g.nodes()[node].inputs)
    if (!gplan.is_external(v)) input_offset = gplan.offset[size_t(v)];
  ASSERT_NE(input_offset, SIZE_MAX);
  ws_on_input.workspace_offset[node] = input_offset;
  const Simulated sim = simulate(g, ws_on_input);
  EXPECT_TRUE(std::any_of(sim.problems.begin(), sim.problems.end(), [&](const std::string& p) {
    return p.find("the workspace of") != std::string::npos && p.find("share bytes") != std::string::npos;
  }));
}

// Every kind of graph the engine runs: the placement is safe and the
// planner's peak is the simulated one, with views, in-place accumulation into
// bound gradients, multi-output nodes, workspaces, recomputed clones and
// mixed-precision casts in them.
TEST(Planner, PlacementsAgreeWithAnIndependentLivenessSimulation) {
  {
    core::Graph g;
    Built b = build_mlp(g, 64, 16, 32, 4);
    core::backward(g, b.loss);
    expect_safe_plan(g, "mlp train");
  }
  BlockConfig bc;
  bc.batch = 2; bc.seq = 16; bc.vocab = 64; bc.embd = 32; bc.heads = 4;
  core::Graph block;
  Built b = build_gpt_block(block, bc);
  core::backward(block, b.loss);
  expect_safe_plan(block, "gpt block train");
  core::RecomputePolicy redo_cheap;  // GELU and LayerNorm outputs redone in the backward
  redo_cheap.selective = [](const core::Graph&, const core::Node& n) -> std::optional<core::RecomputeRecipe> {
    if (n.op == core::OpKind::gelu || n.op == core::OpKind::layernorm) return core::clone_recipe(n);
    return std::nullopt;
  };
  const core::RecomputeResult redone = core::recompute(block, redo_cheap);
  ASSERT_FALSE(redone.recomputed.empty());
  expect_safe_plan(redone.graph, "gpt block train, gelu + layernorm recomputed");

  // The real model, 2 layers, at each recompute level and kernel choice.
  struct Variant {
    const char* what;
    void (*set)(models::GptConfig&);
  };
  const Variant variants[] = {
      {"gpt", [](models::GptConfig&) {}},
      {"gpt recompute=selective", [](models::GptConfig& c) { c.recompute = "selective"; }},
      {"gpt recompute=full", [](models::GptConfig& c) { c.recompute = "full"; }},
      {"gpt flash attention + fused classifier",
       [](models::GptConfig& c) {
         c.attention = "flash";
         c.fused_classifier = true;
       }},
      {"gpt fused bias+gelu, residual+layernorm, recompute=selective",
       [](models::GptConfig& c) {
         c.fuse_bias_gelu = true;
         c.fuse_residual_layernorm = "on";
         c.recompute = "selective";
       }},
      {"gpt bf16", [](models::GptConfig& c) { c.compute = core::DType::bf16; }},
  };
  for (const Variant& v : variants) {
    models::GptConfig cfg{64, 2, 32, 4, 32};
    v.set(cfg);
    models::Gpt m(cfg, cpu_backend());
    expect_safe_plan(m.train_graph(2, 32), v.what);
  }
}

TEST(Engine, MlpTrainsAndLossFalls) {
  core::Graph g;
  const int64_t n = 64, in = 16, hidden = 32, classes = 4;
  Built b = build_mlp(g, n, in, hidden, classes);
  core::backward(g, b.loss);
  core::ParameterStore store;
  store.adopt(g);
  init_params(store, 7);
  // Wider init for the MLP so it learns in a few steps.
  for (auto& [name, e] : store.entries())
    if (e.value.shape().rank() == 2) e.value.copy_from(Tensor::randn(e.value.shape(), core::DType::f32, 3, 0.f, 0.3f));
  core::Executor ex(g, cpu_backend());
  ex.bind(store);
  Tensor x, y;
  make_mlp_batch(n, in, classes, 11, x, y);
  ex.write(b.x, x.data(), x.bytes());
  ex.write(b.targets, y.data(), y.bytes());
  double first = 0, last = 0;
  for (int step = 1; step <= 60; ++step) {
    store.zero_grads();
    ex.run();
    const double loss = ex.read_scalar(b.loss);
    ASSERT_TRUE(std::isfinite(loss));
    if (step == 1) first = loss;
    last = loss;
    adamw_step(store, cpu_backend(), step, 1e-2f);
  }
  EXPECT_NEAR(first, std::log(double(classes)), 0.5);
  EXPECT_LT(last, 0.5 * first) << "first " << first << " last " << last;
}

TEST(Engine, GptBlockGradientsMatchFiniteDifferences) {
  core::Graph g;
  BlockConfig c;
  c.batch = 2; c.seq = 5; c.vocab = 11; c.embd = 8; c.heads = 2;
  Built b = build_gpt_block(g, c);
  core::backward(g, b.loss);
  core::ParameterStore store;
  store.adopt(g);
  init_params(store, 5);
  // Larger weights so every path contributes measurably.
  for (auto& [name, e] : store.entries())
    e.value.copy_from(Tensor::randn(e.value.shape(), core::DType::f32, 100 + e.value.numel(), 0.f, 0.3f));
  for (auto& [name, e] : store.entries())
    if (name.rfind("ln", 0) == 0 && name.find("weight") != std::string::npos)
      for (int64_t i = 0; i < e.value.numel(); ++i) e.value.data_as<float>()[i] += 1.f;
  core::Executor ex(g, cpu_backend());
  ex.bind(store);
  Tensor ids, targets, pos;
  block_batch(c, 3, ids, targets, pos);
  ex.write(b.x, ids.data(), ids.bytes());
  ex.write(b.targets, targets.data(), targets.bytes());
  ex.write(g.at("pos"), pos.data(), pos.bytes());

  auto loss_at = [&]() {
    store.zero_grads();
    ex.run();
    return ex.read_scalar(b.loss);
  };
  loss_at();
  std::map<std::string, Tensor> grads;
  for (auto& [name, e] : store.entries()) grads[name] = e.grad.clone();

  const double eps = 1e-3;
  for (auto& [name, e] : store.entries()) {
    double max_abs = 1e-4, max_diff = 0;
    for (int64_t k = 0; k < std::min<int64_t>(e.value.numel(), 6); ++k) {
      const int64_t i = (k * 7919) % e.value.numel();
      float* p = e.value.data_as<float>() + i;
      const float orig = *p;
      *p = orig + float(eps);
      const double lp = loss_at();
      *p = orig - float(eps);
      const double lm = loss_at();
      *p = orig;
      const double fd = (lp - lm) / (2 * eps);
      const double an = grads[name].data_as<float>()[i];
      max_abs = std::max({max_abs, std::abs(fd), std::abs(an)});
      max_diff = std::max(max_diff, std::abs(fd - an));
    }
    EXPECT_LE(max_diff / max_abs, 3e-2) << name;
  }
}

TEST(Engine, GradientAccumulationEqualsOneLargeBatch) {
  // One batch of 8 vs two micro-batches of 4 (each loss scaled by 1/2),
  // run through the same micro-batch graph without rebuilding it.
  const int64_t in = 8, hidden = 16, classes = 3;
  Tensor x, y;
  make_mlp_batch(8, in, classes, 21, x, y);

  core::Graph full;
  Built bf = build_mlp(full, 8, in, hidden, classes);
  core::backward(full, bf.loss);
  core::ParameterStore store_full;
  store_full.adopt(full);
  init_params(store_full, 9);
  core::Executor ex_full(full, cpu_backend());
  ex_full.bind(store_full);
  ex_full.write(bf.x, x.data(), x.bytes());
  ex_full.write(bf.targets, y.data(), y.bytes());
  ex_full.run();

  core::Graph micro;
  Built bm = build_mlp(micro, 4, in, hidden, classes);
  core::backward(micro, bm.loss, {.loss_scale = 0.5});
  core::ParameterStore store_micro;
  store_micro.adopt(micro);
  init_params(store_micro, 9);
  core::Executor ex_micro(micro, cpu_backend());
  ex_micro.bind(store_micro);
  for (int half = 0; half < 2; ++half) {
    ex_micro.write(bm.x, x.data_as<float>() + half * 4 * in, size_t(4 * in) * 4);
    ex_micro.write(bm.targets, y.data_as<int32_t>() + half * 4, 16);
    ex_micro.run();
  }
  for (auto& [name, e] : store_full.entries()) {
    const Tensor& a = e.grad;
    const Tensor& m = store_micro.at(name).grad;
    double maxabs = 1e-12;
    for (int64_t i = 0; i < a.numel(); ++i) maxabs = std::max(maxabs, std::abs(a.item(i)));
    EXPECT_GT(maxabs, 1e-6) << name << " has no gradient";
    for (int64_t i = 0; i < a.numel(); ++i) ASSERT_NEAR(a.item(i), m.item(i), 1e-5 * maxabs + 1e-7) << name << "[" << i << "]";
  }
}

// A parameter with two uses (a tied embedding and head): each piece of its
// gradient is summed into the accumulated gradient as it arrives, in a chain
// of in-place writes (core::grad_sink): the head's weight-gradient product
// writes into "grad:w" with beta = 1, and the embedding's scatter-add into
// that result. No piece gets a (V, C) buffer of its own, nothing is summed
// with `add`, and the gradient is still the sum over both uses, added to
// what the grad held.
TEST(Engine, TiedParameterAccumulatesEachUseInAChain) {
  const int64_t n = 4, v = 5, c = 3;
  core::Graph g;
  const core::ValueId x = g.input("x", {n, c}, core::DType::f32);
  const core::ValueId ids = g.input("ids", {n}, core::DType::i32);
  const core::ValueId w = g.param("w", {v, c});
  const core::ValueId e = ops::embedding(g, ids, w);  // first use in forward order: completes the gradient
  const core::ValueId h = ops::linear(g, x, w);       // second use: its piece arrives first in backward
  const core::ValueId loss = ops::add(g, ops::sum(g, ops::mul(g, e, e)), ops::sum(g, h));
  g.mark_output(loss);
  core::backward(g, loss);

  std::vector<size_t> writes;  // nodes whose output aliases an input that is w's gradient chain
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const core::Node& nd = g.nodes()[i];
    EXPECT_NE(nd.op, core::OpKind::accumulate) << "both pieces are summed in place";
    EXPECT_FALSE(nd.op == core::OpKind::add && g.shape(nd.outputs[0]) == core::Shape({v, c}))
        << "the two (V, C) pieces must not be summed into a third buffer";
    if (core::op_def(nd.op).alias_of(0, nd.inputs.size()) >= 0 && g.shape(nd.outputs[0]) == core::Shape({v, c}))
      writes.push_back(i);
  }
  ASSERT_EQ(writes.size(), 2u);
  const core::Node& head = g.nodes()[writes[0]];
  const core::Node& emb = g.nodes()[writes[1]];
  EXPECT_EQ(head.op, core::OpKind::matmul);
  EXPECT_EQ(g.value(head.inputs[2]).name, "grad:w");
  EXPECT_EQ(emb.op, core::OpKind::embedding_backward);
  EXPECT_EQ(emb.inputs[2], head.outputs[0]) << "the second reads the first's result";
  EXPECT_EQ(g.grad_of(w), head.inputs[2]);

  core::ParameterStore store;
  store.adopt(g);
  init_params(store, 4);
  core::Executor ex(g, cpu_backend());
  ex.bind(store);
  const Tensor xt = Tensor::uniform({n, c}, core::DType::f32, 3, -1.f, 1.f);
  const int32_t id[n] = {1, 3, 1, 4};
  ex.write(x, xt.data(), xt.bytes());
  ex.write(ids, id, sizeof id);
  store.zero_grads();
  ex.run();
  ex.run();  // accumulates: twice the gradient
  const Tensor& wt = store.at("w").value;
  const Tensor& gw = store.at("w").grad;
  for (int64_t r = 0; r < v; ++r)
    for (int64_t k = 0; k < c; ++k) {
      double want = 0;  // d sum(x w^T) / dw[r, k] = sum_i x[i, k]; d sum(e^2) / dw[r, k] = 2 w[r, k] per hit
      for (int64_t i = 0; i < n; ++i) want += xt.item(i * c + k) + (id[i] == r ? 2.0 * wt.item(r * c + k) : 0.0);
      EXPECT_NEAR(gw.item(r * c + k), 2 * want, 1e-5) << r << "," << k;
    }
}

TEST(Engine, GptBlockTrainsAndPlannerMatchesArenaAtTwoBatchSizes) {
  for (int64_t batch : {2, 6}) {
    SCOPED_TRACE("batch " + std::to_string(batch));
    BlockConfig c;
    c.batch = batch; c.seq = 32; c.vocab = 96; c.embd = 48; c.heads = 4;
    core::Graph g;
    Built b = build_gpt_block(g, c);
    core::backward(g, b.loss);
    core::ParameterStore store;
    store.adopt(g);
    init_params(store, 1);

    // Count what the executor takes from the allocator.
    core::CountingAllocator counting(core::HostAllocator::instance());
    struct CountingCpu : core::Backend {
      core::CountingAllocator& alloc;
      cpu::CpuBackend& cpu;
      CountingCpu(core::CountingAllocator& a, cpu::CpuBackend& c) : alloc(a), cpu(c) { kernels() = c.kernels(); }
      std::string_view name() const override { return "cpu-counting"; }
      core::Device device() const override { return core::Device::cpu(); }
      core::Allocator& allocator() override { return alloc; }
      void copy_to_device(void* d, const void* s, size_t n) override { std::memcpy(d, s, n); }
      void copy_to_host(void* d, const void* s, size_t n) override { std::memcpy(d, s, n); }
      core::ExecContext context() const override { return cpu.context(); }
    } backend(counting, cpu_backend());

    core::Executor ex(g, backend);
    ex.bind(store);
    const core::MemoryReport& rep = ex.plan().report;
    // The executor takes the planned arena and nothing more...
    EXPECT_EQ(counting.peak_bytes(), rep.arena) << rep.str();
    // ...and what that arena holds, at the addresses the kernels get, is safe:
    // checked against lifetimes simulated from the graph, not the plan's.
    expect_safe_plan(g, ex.plan(), placement_of(ex), "gpt block train, batch " + std::to_string(batch));
    EXPECT_EQ(rep.params, store.param_bytes());
    EXPECT_EQ(rep.grads, store.grad_bytes());
    // Packing quality: the arena is within 5% of the largest live set.
    EXPECT_LE(double(rep.arena), 1.05 * double(rep.live_lower_bound)) << rep.str();

    // Which arena bytes do kernels really write? Fill with a pattern, run, scan.
    std::memset(ex.arena_data(), 0xA5, ex.arena_bytes());
    Tensor ids, targets, pos;
    block_batch(c, 5, ids, targets, pos);
    ex.write(b.x, ids.data(), ids.bytes());
    ex.write(b.targets, targets.data(), targets.bytes());
    ex.write(g.at("pos"), pos.data(), pos.bytes());
    ex.run();
    const auto* bytes = static_cast<const unsigned char*>(ex.arena_data());
    size_t touched_end = 0;
    for (size_t i = ex.arena_bytes(); i-- > 0;)
      if (bytes[i] != 0xA5) { touched_end = i + 1; break; }
    EXPECT_GE(double(touched_end), 0.95 * double(rep.arena)) << "planned " << rep.arena << " touched " << touched_end;

    double first = 0, last = 0;
    for (int step = 1; step <= 40; ++step) {
      store.zero_grads();
      ex.run();
      const double loss = ex.read_scalar(b.loss);
      if (step == 1) first = loss;
      last = loss;
      adamw_step(store, backend, step, 3e-3f);
    }
    EXPECT_NEAR(first, std::log(double(c.vocab)), 0.3);
    EXPECT_LT(last, first - 1.0) << "first " << first << " last " << last;
  }
}

// x (n x n) -> gelu -> * x -> gelu: one output, intermediates in the arena.
struct SmallChain {
  core::Graph g;
  core::ValueId x, y;
  explicit SmallChain(int64_t n) {
    x = g.input("x", {n, n}, core::DType::f32);
    y = ops::gelu(g, ops::mul(g, ops::gelu(g, x), x));
    g.mark_output(y);
  }
  std::vector<float> run(core::Executor& ex, uint64_t seed) const {
    const Tensor xt = Tensor::uniform(g.shape(x), core::DType::f32, seed, -2.f, 2.f);
    ex.write(x, xt.data(), xt.bytes());
    ex.run();
    std::vector<float> out(size_t(g.shape(y).numel()));
    ex.read(y, out.data(), out.size() * sizeof(float));
    return out;
  }
};

TEST(Engine, SharedArenaHoldsTheLargestPlanAndMovesExecutorsWhenItGrows) {
  const SmallChain small(48), large(160), smaller(16);
  // Each on an arena of its own: the results to match.
  core::Executor own_small(small.g, cpu_backend()), own_large(large.g, cpu_backend());
  const std::vector<float> want_small = small.run(own_small, 1), want_large = large.run(own_large, 2);

  core::SharedArena arena(cpu_backend().allocator());
  core::Executor a(small.g, cpu_backend(), &arena);
  EXPECT_EQ(arena.bytes(), a.arena_bytes());
  EXPECT_EQ(small.run(a, 1), want_small);
  void* before = a.arena_data();
  core::Executor b(large.g, cpu_backend(), &arena);  // larger: the arena grows and `a` moves with it
  EXPECT_EQ(arena.bytes(), b.arena_bytes());
  EXPECT_GT(b.arena_bytes(), a.arena_bytes());
  EXPECT_EQ(a.arena_data(), b.arena_data());
  EXPECT_NE(a.arena_data(), before);
  EXPECT_EQ(large.run(b, 2), want_large);
  EXPECT_EQ(small.run(a, 1), want_small);  // inputs written again: the same result at the new place
  core::Executor c(smaller.g, cpu_backend(), &arena);  // smaller: no growth
  EXPECT_EQ(arena.bytes(), b.arena_bytes());
  EXPECT_EQ(c.arena_data(), b.arena_data());
  core::Executor own_smaller(smaller.g, cpu_backend());
  EXPECT_EQ(smaller.run(c, 3), smaller.run(own_smaller, 3));
  EXPECT_EQ(large.run(b, 2), want_large);
}

TEST(GraphCache, BuildsOncePerShape) {
  struct Program { int built_for; };
  core::ShapeCache<Program> cache;
  int builds = 0;
  auto get = [&](int64_t t) {
    return cache.get({core::Shape{4, t}}, [&] {
      ++builds;
      return std::make_unique<Program>(Program{int(t)});
    }).built_for;
  };
  EXPECT_EQ(get(16), 16);
  EXPECT_EQ(get(16), 16);
  EXPECT_EQ(get(32), 32);
  EXPECT_EQ(get(16), 16);
  EXPECT_EQ(builds, 2);
  EXPECT_EQ(cache.hits(), 2u);
  EXPECT_EQ(cache.misses(), 2u);
  // Lookups compare shapes with the stored keys in place: prefixes and longer
  // shapes, and several shapes per key, are told apart.
  auto get_shapes = [&](std::initializer_list<core::Shape> shapes, int tag) {
    return cache.get(shapes, [&] {
      ++builds;
      return std::make_unique<Program>(Program{tag});
    }).built_for;
  };
  EXPECT_EQ(get_shapes({core::Shape{4}}, 1), 1);
  EXPECT_EQ(get_shapes({core::Shape{4, 16, 1}}, 2), 2);
  EXPECT_EQ(get_shapes({core::Shape{4, 16}, core::Shape{2}}, 3), 3);
  EXPECT_EQ(get_shapes({core::Shape{4}}, 0), 1);
  EXPECT_EQ(get_shapes({core::Shape{4, 16, 1}}, 0), 2);
  EXPECT_EQ(get_shapes({core::Shape{4, 16}, core::Shape{2}}, 0), 3);
  EXPECT_EQ(get(16), 16);
  EXPECT_EQ(builds, 5);
  EXPECT_EQ(cache.size(), 5u);
}

// Backends made and dropped one after another (an inference engine per
// request, per test) each run oneDNN products correctly: a new backend's
// matrix-product cache can sit at a freed one's address, and a thread's
// oneDNN stream must not be taken for the old one's.
TEST(CpuBackendLifetime, SuccessiveBackendsRunProducts) {
  ops::register_ops();
  const int64_t m = 32, k = 64, n = 48;  // past the few-rows path: oneDNN's matmul on AVX-512 machines
  core::Tensor x = core::Tensor::uniform(core::Shape{m, k}, core::DType::f32, 1, -1, 1);
  core::Tensor w = core::Tensor::uniform(core::Shape{n, k}, core::DType::f32, 2, -1, 1);
  std::vector<float> want(size_t(m * n));
  for (int64_t r = 0; r < m; ++r)
    for (int64_t o = 0; o < n; ++o) {
      double s = 0;
      for (int64_t i = 0; i < k; ++i) s += double(x.data_as<float>()[r * k + i]) * w.data_as<float>()[o * k + i];
      want[size_t(r * n + o)] = float(s);
    }
  for (int round = 0; round < 20; ++round) {
    cpu::CpuBackend be(2);
    core::Tensor y = core::Tensor::empty(core::Shape{m, n}, core::DType::f32);
    const core::TensorView in[] = {x.as_view(), w.as_view()};
    const core::TensorView out[] = {y.as_view()};
    ASSERT_NO_THROW(core::run_op(be, core::OpKind::linear, in, out)) << "round " << round;
    for (int64_t i = 0; i < m * n; ++i) ASSERT_NEAR(y.data_as<float>()[i], want[size_t(i)], 1e-4) << "round " << round;
  }
}
