// The engine end to end: graph -> autograd -> planner -> executor on the CPU
// backend. A 2-layer MLP and a GPT block train (their loss falls), their
// gradients match finite differences, gradient accumulation over micro-batches
// equals one large batch, and the planner's figures match what is used.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "brisk/core/error.h"
#include "brisk/core/executor.h"
#include "brisk/core/graph_cache.h"
#include "brisk/cpu/cpu_backend.h"
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
    ops::AdamWParams p;
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
  core::Graph g;
  auto x = g.input("x", {256, 256}, core::DType::f32);
  core::ValueId h = x;
  for (int i = 0; i < 8; ++i) h = ops::gelu(g, h);  // a chain: two intermediates live at a time
  auto r = ops::reshape(g, h, {65536});
  g.mark_output(r);
  const core::MemoryPlan plan = core::plan_memory(g);
  const size_t one = 256 * 256 * 4;
  // The input stays for the whole step (callers may write it once), plus two.
  EXPECT_EQ(plan.report.arena, 3 * one) << plan.report.str();
  EXPECT_EQ(plan.report.live_lower_bound, 3 * one);
  EXPECT_EQ(plan.offset[size_t(r)], plan.offset[size_t(h)]) << "a reshape must share its input's buffer";
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
    EXPECT_EQ(counting.peak_bytes(), rep.arena) << rep.str();
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

TEST(GraphCache, BuildsOncePerShape) {
  struct Program { int built_for; };
  core::ShapeCache<Program> cache;
  int builds = 0;
  auto get = [&](int64_t t) {
    return cache.get(core::ShapeCache<Program>::key_of({core::Shape{4, t}}), [&] {
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
}
