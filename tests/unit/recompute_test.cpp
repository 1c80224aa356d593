// Activation recomputation (core::recompute, train.recompute). What must
// hold: (1) the same function: a GPT's loss and every parameter gradient are
// the same for none, selective and full; (2) what it is for: the planned arena
// strictly shrinks none > selective > full at a shape where the saved
// activations dominate (fp32, bf16, and with linear_gelu / add_layernorm
// fused in, whose cheap part alone is redone), and in full no activation made
// inside a block is read
// by the backward except through a recomputed copy; (3) the pass itself: an
// empty policy replays the graph unchanged, names, grads and outputs carried;
// bad segments, a graph without backward and a bad config value are errors.
// The encoder classifier and the sequence autoencoder (both stacks) take the
// same policy: the same gradients bit for bit, a smaller arena per level.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "brisk/core/autograd.h"
#include "brisk/core/error.h"
#include "brisk/core/planner.h"
#include "brisk/core/recompute.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/models/block_recompute.h"
#include "brisk/models/encoder.h"
#include "brisk/models/gpt.h"
#include "brisk/models/seq_autoencoder.h"
#include "brisk/train/autoencoder_config.h"
#include "brisk/train/classify_config.h"
#include "brisk/train/config.h"
#include "test_models.h"
#include "test_util.h"

using namespace brisk;
using core::Graph;
using core::OpKind;
using core::ValueId;

namespace {

using testing_util::backend;
using testing_util::count_ops;

const char* kLevels[] = {"none", "selective", "full"};

// Batch 4 x seq 64, 2 layers: the (B, H, T, T) probabilities and the (B, T, 4C)
// MLP activations are most of the arena, the logits (V = 64) are small.
models::GptConfig small_gpt(const std::string& level, core::DType compute = core::DType::f32, bool fused = false) {
  models::GptConfig c{64, 2, 32, 4, 64};
  c.recompute = level;
  c.compute = compute;
  c.fuse_bias_gelu = fused;
  c.fuse_residual_layernorm = fused ? "on" : "off";
  return c;
}

struct Trained {
  std::vector<std::unique_ptr<models::Gpt>> models;  // none, selective, full
  std::vector<double> loss;
};

// One micro-step of the same model and batch at every level.
Trained train_levels(int64_t B, int64_t T, bool fused) {
  std::vector<int32_t> x(size_t(B * T)), y(x.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = int32_t((i * 7 + 3) % 64), y[i] = int32_t((i * 13 + 5) % 64);
  Trained t;
  for (const char* level : kLevels) {
    t.models.push_back(std::make_unique<models::Gpt>(small_gpt(level, core::DType::f32, fused), backend()));
    t.models.back()->init_weights(7);
    t.loss.push_back(t.models.back()->train_micro_step(x.data(), y.data(), B, T, 2.0));
  }
  return t;
}

void expect_same_gradients(const Trained& t, double tolerance) {
  for (size_t m = 1; m < t.models.size(); ++m) {
    SCOPED_TRACE(kLevels[m]);
    EXPECT_NEAR(t.loss[m], t.loss[0], tolerance * std::abs(t.loss[0]));
    int checked = 0;
    double worst = 0;
    for (const auto& [name, e] : t.models[0]->params().entries()) {
      SCOPED_TRACE(name);
      const double err = testing_util::normalized_error(e.grad, t.models[m]->params().entries().at(name).grad);
      EXPECT_LE(err, tolerance);
      worst = std::max(worst, err);
      ++checked;
    }
    EXPECT_GT(checked, 20);
    std::printf("%s: loss %.9g vs %.9g, worst gradient error %.3g over %d parameters\n", kLevels[m], t.loss[m],
                t.loss[0], worst, checked);
  }
}

}  // namespace

TEST(Recompute, GptLossAndGradientsMatchAtEveryLevel) {
  const int64_t B = 4, T = 64;
  const Trained t = train_levels(B, T, false);
  const Graph& none = t.models[0]->program(true, B, T).graph;
  const Graph& sel = t.models[1]->program(true, B, T).graph;
  const Graph& full = t.models[2]->program(true, B, T).graph;
  // Selective redoes 5 LayerNorms and 2 GELUs; full also each block's products,
  // but not the MLP's c_proj: its output feeds only the residual add, whose
  // backward reads neither input.
  EXPECT_EQ(count_ops(sel, OpKind::layernorm), count_ops(none, OpKind::layernorm) + 5);
  EXPECT_EQ(count_ops(sel, OpKind::gelu), count_ops(none, OpKind::gelu) + 2);
  EXPECT_EQ(count_ops(sel, OpKind::linear), count_ops(none, OpKind::linear));
  EXPECT_EQ(count_ops(full, OpKind::layernorm), count_ops(none, OpKind::layernorm) + 5);
  EXPECT_EQ(count_ops(full, OpKind::linear), count_ops(none, OpKind::linear) + 2 * 3);
  EXPECT_EQ(count_ops(full, OpKind::attention), count_ops(none, OpKind::attention) + 2);
  expect_same_gradients(t, 1e-6);
  // Eval programs are never rewritten.
  EXPECT_EQ(t.models[2]->program(false, B, T).graph.nodes().size(),
            t.models[0]->program(false, B, T).graph.nodes().size());
}

// With linear_gelu and add_layernorm fused in, selective redoes only their
// cheap part (GELU from the saved pre-activation, LayerNorm from the saved
// sum), never their gemm, and full still replays each product once.
TEST(Recompute, FusedOpsRecomputeTheirCheapPart) {
  const int64_t B = 4, T = 64;
  const Trained t = train_levels(B, T, true);
  const Graph& none = t.models[0]->program(true, B, T).graph;
  const Graph& sel = t.models[1]->program(true, B, T).graph;
  const Graph& full = t.models[2]->program(true, B, T).graph;
  ASSERT_EQ(count_ops(none, OpKind::linear_gelu), 2);
  ASSERT_EQ(count_ops(none, OpKind::add_layernorm), 5);
  EXPECT_EQ(count_ops(sel, OpKind::linear_gelu), 2);
  EXPECT_EQ(count_ops(sel, OpKind::add_layernorm), 5);
  EXPECT_EQ(count_ops(sel, OpKind::linear), count_ops(none, OpKind::linear));
  EXPECT_EQ(count_ops(sel, OpKind::gelu), 2);
  EXPECT_EQ(count_ops(sel, OpKind::layernorm), 5);
  EXPECT_EQ(count_ops(full, OpKind::linear_gelu), 2 + 2);
  EXPECT_EQ(count_ops(full, OpKind::add_layernorm), 5 + 2);  // the one inside each block
  EXPECT_EQ(count_ops(full, OpKind::linear), count_ops(none, OpKind::linear) + 2 * 2);
  // The fused kernels may round the GELU / LayerNorm differently from the
  // plain ones that redo them: close, not necessarily bit for bit.
  expect_same_gradients(t, 1e-5);
  size_t arena[3];
  for (int l = 0; l < 3; ++l) arena[l] = t.models[size_t(l)]->program(true, B, T).executor->plan().report.arena;
  EXPECT_LT(arena[1], arena[0]);
  EXPECT_LT(arena[2], arena[1]);
}

TEST(Recompute, PlannedArenaShrinksLevelByLevel) {
  for (core::DType compute : {core::DType::f32, core::DType::bf16}) {
    SCOPED_TRACE(core::dtype_name(compute));
    size_t arena[3];
    for (int l = 0; l < 3; ++l) {
      models::Gpt m(small_gpt(kLevels[l], compute), backend());
      arena[l] = core::plan_memory(m.train_graph(4, 64)).report.arena;
    }
    std::printf("%s arena: none %.2f MiB, selective %.2f MiB, full %.2f MiB\n", core::dtype_name(compute).data(),
                arena[0] / 1048576.0, arena[1] / 1048576.0, arena[2] / 1048576.0);
    EXPECT_LT(arena[1], arena[0]);
    EXPECT_LT(arena[2], arena[1]);
    EXPECT_LT(double(arena[2]), 0.75 * double(arena[0]));
  }
}

// In full, the backward reads an activation made inside a block only through
// a copy made in the backward: the originals die with the forward pass.
TEST(Recompute, FullKeepsOnlyTheBlockBoundaries) {
  models::Gpt m(small_gpt("full"), backend());
  const Graph g = m.train_graph(2, 16);
  const size_t bs = g.backward_start();
  std::vector<int> cut;
  for (int l = 0; l <= 2; ++l) cut.push_back(g.value(g.at("resid." + std::to_string(l))).producer);
  auto inside_block = [&](int node) {
    for (size_t l = 0; l + 1 < cut.size(); ++l)
      if (node > cut[l] && node < cut[l + 1]) return true;
    return false;
  };
  int reads = 0;
  for (size_t i = bs; i < g.nodes().size(); ++i)
    for (ValueId u : g.nodes()[i].inputs) {
      const int p = g.value(u).producer;
      if (p < 0 || size_t(p) >= bs) continue;
      ++reads;
      EXPECT_FALSE(inside_block(p)) << "backward node " << i << " (" << core::op_name(g.nodes()[i].op)
                                    << ") reads forward node " << p << " (" << core::op_name(g.nodes()[size_t(p)].op)
                                    << ") of a block";
    }
  EXPECT_GT(reads, 0);  // the boundaries, the head and the loss are still read
}

TEST(Recompute, EmptyPolicyReplaysTheGraph) {
  Graph g;
  const testing_models::Built b = testing_models::build_gpt_block(g, {});
  core::backward(g, b.loss);
  const core::RecomputeResult r = core::recompute(g, {});
  EXPECT_TRUE(r.recomputed.empty());
  ASSERT_EQ(r.graph.nodes().size(), g.nodes().size());
  ASSERT_EQ(r.graph.num_values(), g.num_values());
  EXPECT_EQ(r.graph.backward_start(), g.backward_start());
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    EXPECT_EQ(r.graph.nodes()[i].op, g.nodes()[i].op);
    EXPECT_EQ(r.graph.nodes()[i].inputs, g.nodes()[i].inputs);
    EXPECT_EQ(r.graph.nodes()[i].is_backward, g.nodes()[i].is_backward);
  }
  for (size_t v = 0; v < g.num_values(); ++v) {
    EXPECT_EQ(r.map[v], ValueId(v));
    const core::Value &a = g.value(ValueId(v)), &c = r.graph.value(ValueId(v));
    EXPECT_EQ(a.name, c.name);
    EXPECT_EQ(a.role, c.role);
    EXPECT_TRUE(a.meta == c.meta);
    EXPECT_EQ(a.is_output, c.is_output);
    EXPECT_EQ(a.requires_grad, c.requires_grad);
    EXPECT_EQ(g.grad_of(ValueId(v)), r.graph.grad_of(ValueId(v)));
  }
  EXPECT_NE(r.graph.grad_of(r.graph.at("wte")), core::kNoValue);
}

// A selected node whose output is a graph output stays saved; the others are
// redone once, right before the first backward node that reads them.
TEST(Recompute, SelectiveClonesBeforeFirstBackwardUse) {
  Graph g;
  const testing_models::Built b = testing_models::build_mlp(g, 8, 5, 16, 3);
  core::backward(g, b.loss);
  core::RecomputePolicy gelu_only;
  gelu_only.selective = [](const Graph&, const core::Node& n) -> std::optional<core::RecomputeRecipe> {
    if (n.op == OpKind::gelu) return core::clone_recipe(n);
    return std::nullopt;
  };
  const core::RecomputeResult r = core::recompute(g, gelu_only);
  ASSERT_EQ(r.recomputed.size(), 1u);
  const Graph& o = r.graph;
  ASSERT_EQ(count_ops(o, OpKind::gelu), 2);
  size_t clone = 0;
  for (size_t i = o.backward_start(); i < o.nodes().size(); ++i)
    if (o.nodes()[i].op == OpKind::gelu) clone = i;
  ASSERT_GT(clone, o.backward_start());
  const ValueId h = o.nodes()[clone].outputs[0];
  // The clone's output is read only after it; the original only by the forward.
  size_t first_reader = SIZE_MAX;
  for (size_t i = 0; i < o.nodes().size(); ++i)
    for (ValueId u : o.nodes()[i].inputs)
      if (u == h) first_reader = std::min(first_reader, i);
  EXPECT_EQ(first_reader, clone + 1);
  const ValueId orig = r.map[size_t(g.nodes()[1].outputs[0])];  // linear, gelu, ...
  for (size_t i = o.backward_start(); i < o.nodes().size(); ++i)
    for (ValueId u : o.nodes()[i].inputs) EXPECT_NE(u, orig) << "backward node " << i;

  Graph g2;
  const testing_models::Built b2 = testing_models::build_mlp(g2, 8, 5, 16, 3);
  g2.mark_output(g2.nodes()[1].outputs[0]);  // the gelu output is wanted after the step
  core::backward(g2, b2.loss);
  EXPECT_TRUE(core::recompute(g2, gelu_only).recomputed.empty());
}

TEST(Recompute, Errors) {
  Graph g;
  const testing_models::Built b = testing_models::build_gpt_block(g, {});
  EXPECT_THROW(core::recompute(g, {}), core::Error);  // no backward yet
  core::backward(g, b.loss);
  const size_t bs = g.backward_start();
  core::RecomputePolicy overlap;
  overlap.segments = {{1, 5}, {4, 8}};
  EXPECT_THROW(core::recompute(g, overlap), core::Error);
  core::RecomputePolicy past_forward;
  past_forward.segments = {{1, bs + 1}};
  EXPECT_THROW(core::recompute(g, past_forward), core::Error);
  core::RecomputePolicy wrong_shape;  // a recipe that gives back the wrong value
  wrong_shape.selective = [](const Graph&, const core::Node& n) -> std::optional<core::RecomputeRecipe> {
    if (n.op != OpKind::gelu) return std::nullopt;
    core::RecomputeRecipe r = core::clone_recipe(n);
    r.emit = [](Graph& dst, const std::vector<ValueId>& in) { return std::vector<ValueId>{ops::sum(dst, in[0])}; };
    return r;
  };
  EXPECT_THROW(core::recompute(g, wrong_shape), core::Error);
}

TEST(Recompute, UnknownLevelIsAConfigError) {
  EXPECT_THROW(small_gpt("sometimes").validate(), core::ConfigError);
  try {
    train::load_train_config("", {"train.recompute=sometimes"});
    FAIL() << "expected a ConfigError";
  } catch (const core::ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("train.recompute"), std::string::npos) << msg;
    EXPECT_NE(msg.find("none, selective, full"), std::string::npos) << msg;
  }
  const train::TrainConfig c = train::load_train_config("", {"train.recompute=full"});
  EXPECT_EQ(c.model.recompute, "full");
  EXPECT_NE(train::to_toml(c).find("recompute = \"full\""), std::string::npos);
}

// ---- the encoder-bodied models: the same policy (block_recompute.h) -----------------

namespace {

// Right-padded rows of lengths {64, 17, 40, 1} over residue-sized ids.
struct PaddedBatch {
  int64_t B = 4, T = 64;
  std::vector<int32_t> lengths = {64, 17, 40, 1}, labels = {0, 1, 1, 0}, ids;
  PaddedBatch() {
    for (int64_t i = 0; i < B * T; ++i) ids.push_back(int32_t(1 + (i * 7 + 3) % 20));
  }
};

struct LevelStep {
  double loss = 0;
  std::map<std::string, core::Tensor> grads;
  size_t arena = 0;
  int attention = 0, layernorm = 0, linear = 0;
};

template <class Model>
LevelStep level_step(Model& m, const core::Graph& g, size_t arena, double loss) {
  LevelStep s;
  s.loss = loss;
  for (auto& [name, e] : m.params().entries()) s.grads.emplace(name, e.grad.clone());
  s.arena = arena;
  s.attention = count_ops(g, OpKind::masked_flash_attention) + count_ops(g, OpKind::flash_attention);
  s.layernorm = count_ops(g, OpKind::layernorm);
  s.linear = count_ops(g, OpKind::linear);
  return s;
}

// none, selective and full: the same gradients bit for bit (the clones
// compute what the originals did; these graphs have no fused ops), a
// smaller planned arena at each level, and exactly the ops each level adds:
// selective every LayerNorm again (two per block, the final one per stack;
// the backward reads their statistics), no products; full also each block's
// attention and three of its four products (the MLP's c_proj output feeds
// only the residual add, whose backward reads neither input).
void expect_levels(const std::vector<LevelStep>& s, int blocks, int stacks) {
  for (size_t l = 1; l < s.size(); ++l) {
    SCOPED_TRACE(kLevels[l]);
    EXPECT_EQ(s[l].loss, s[0].loss);
    for (const auto& [name, g] : s[0].grads) EXPECT_EQ(testing_util::normalized_error(g, s[l].grads.at(name)), 0.0) << name;
  }
  std::printf("arena: none %.2f MiB, selective %.2f MiB, full %.2f MiB\n", s[0].arena / 1048576.0,
              s[1].arena / 1048576.0, s[2].arena / 1048576.0);
  EXPECT_LT(s[1].arena, s[0].arena);
  EXPECT_LT(s[2].arena, s[1].arena);
  EXPECT_EQ(s[1].layernorm, s[0].layernorm + 2 * blocks + stacks);
  EXPECT_EQ(s[1].linear, s[0].linear);
  EXPECT_EQ(s[1].attention, s[0].attention);
  EXPECT_EQ(s[2].layernorm, s[1].layernorm);
  EXPECT_EQ(s[2].linear, s[0].linear + 3 * blocks);
  EXPECT_EQ(s[2].attention, s[0].attention + blocks);
}

// One train step of the model `configure()` describes at every level, in
// fp32 and bf16 (`step` runs it on the batch and returns its loss and train
// program), checked by expect_levels.
template <class Model, class Configure, class Step>
void expect_every_level(Configure configure, Step step, int blocks, int stacks) {
  for (core::DType compute : {core::DType::f32, core::DType::bf16}) {
    SCOPED_TRACE(core::dtype_name(compute));
    std::vector<LevelStep> steps;
    for (const char* level : kLevels) {
      auto c = configure();
      c.compute = compute;
      c.recompute = level;
      Model m(c, backend());
      m.init_weights(3);
      const auto [loss, program] = step(m);
      steps.push_back(level_step(m, program->graph, program->executor->plan().report.arena, loss));
    }
    expect_levels(steps, blocks, stacks);
  }
}

}  // namespace

TEST(Recompute, EncoderLossAndGradientsMatchAtEveryLevelInLessMemory) {
  const PaddedBatch b;
  expect_every_level<models::Encoder>(
      [] {
        models::EncoderConfig c;
        c.vocab_size = 32, c.n_layer = 2, c.n_embd = 32, c.n_head = 2, c.max_len = 64, c.n_classes = 2;
        return c;
      },
      [&](models::Encoder& m) {
        const double loss = m.train_micro_step(b.ids.data(), b.lengths.data(), b.labels.data(), b.B, b.T);
        return std::pair{loss, &m.program(true, b.B, b.T)};
      },
      2, 1);
}

TEST(Recompute, SeqAutoencoderLossAndGradientsMatchAtEveryLevelInLessMemory) {
  const PaddedBatch b;
  expect_every_level<models::SeqAutoencoder>(
      [] {
        models::SeqAutoencoderConfig c;
        c.n_layer = 2, c.n_embd = 32, c.n_head = 2, c.max_len = 64, c.latent = 8;
        return c;
      },
      [&](models::SeqAutoencoder& m) {
        const double loss = m.train_micro_step(b.ids.data(), b.lengths.data(), b.B, b.T);
        return std::pair{loss, &m.program(models::SeqAutoencoder::Kind::train, b.B, b.T)};
      },
      2 * 2, 2);  // both stacks
}

// full cuts a model's stacks at its named block boundaries; a graph without
// them is an error, not a silent selective.
TEST(Recompute, FullWithoutBlockBoundariesIsAnError) {
  Graph g;
  const testing_models::Built b = testing_models::build_gpt_block(g, {});
  core::backward(g, b.loss);
  EXPECT_NO_THROW(models::recompute_blocks(g, "selective", {"resid."}, 1));
  try {
    models::recompute_blocks(g, "full", {"resid."}, 1);
    FAIL() << "expected an Error";
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no block boundary 'resid.0'"), std::string::npos) << e.what();
  }
}

TEST(Recompute, EpochRunsReadWriteAndCheckTheLevel) {
  const train::AutoencoderConfig a =
      train::parse_autoencoder_config("[model]\nkind = \"autoencoder\"\n[train]\nrecompute = \"full\"\n", "a.toml");
  EXPECT_EQ(a.model.recompute, "full");
  EXPECT_EQ(train::parse_autoencoder_config(train::to_toml(a), "b.toml").model.recompute, "full");
  const train::ClassifyConfig c = train::parse_classify_config(
      "[model]\nkind = \"encoder\"\n[train]\nrecompute = \"selective\"\n", "c.toml");
  EXPECT_EQ(c.model.recompute, "selective");
  EXPECT_EQ(train::parse_classify_config(train::to_toml(c), "d.toml").model.recompute, "selective");
  for (const char* text : {"[model]\nkind = \"autoencoder\"\n[train]\nrecompute = \"sometimes\"\n",
                           "[model]\nkind = \"encoder\"\n[train]\nrecompute = \"sometimes\"\n"}) {
    try {
      if (std::string(text).find("autoencoder") != std::string::npos) train::parse_autoencoder_config(text, "x.toml");
      else train::parse_classify_config(text, "x.toml");
      ADD_FAILURE() << "expected a ConfigError for " << text;
    } catch (const core::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("train.recompute: unknown value 'sometimes'"), std::string::npos) << e.what();
    }
  }
}
