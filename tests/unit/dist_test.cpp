// The pieces of data parallelism that need no second process: the flat
// gradient layout and its ZeRO-1 shards, the order backward finishes
// gradients in, and the communication thread's clocks and timeout.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <thread>

#include "brisk/core/error.h"
#include "brisk/core/safetensors.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/dist/comm_thread.h"
#include "brisk/dist/data_parallel.h"
#include "brisk/models/gpt.h"
#include "brisk/train/trainer.h"
#include "test_corpus.h"

namespace brisk::dist {
namespace {

std::vector<std::pair<std::string, int64_t>> sizes(std::initializer_list<int64_t> n) {
  std::vector<std::pair<std::string, int64_t>> out;
  int i = 0;
  for (int64_t x : n) out.emplace_back("p" + std::to_string(i++), x);
  return out;
}

TEST(FlatLayout, AlignedOffsetsAndEvenlyCutBuckets) {
  for (int world : {1, 2, 3, 8}) {
    const FlatLayout l = FlatLayout::make(sizes({1000, 7, 1, 4096, 333, 50000, 5}), 2000, world);
    int64_t end = 0;
    for (size_t i = 0; i < l.params.size(); ++i) {
      const auto& p = l.params[i];
      EXPECT_EQ(p.offset % 16, 0) << p.name;
      EXPECT_GE(p.offset, end) << "parameters must not overlap";
      end = p.offset + p.numel;
      const auto& b = l.buckets[size_t(p.bucket)];
      EXPECT_GE(p.offset, b.offset);
      EXPECT_LE(p.offset + p.numel, b.offset + b.numel) << p.name << " leaves its bucket";
    }
    int64_t at = 0;
    for (const auto& b : l.buckets) {
      EXPECT_EQ(b.offset, at) << "buckets are contiguous";
      EXPECT_EQ(b.numel % (16 * world), 0) << "equal 64-byte aligned chunks";
      at += b.numel;
    }
    EXPECT_EQ(at, l.total);
    EXPECT_GT(l.buckets.size(), 2u) << "2000-float buckets over ~56k floats";
  }
}

// Every element of every parameter belongs to exactly one rank's shard.
TEST(FlatLayout, ShardsCoverEveryElementOnce) {
  const auto order = sizes({1000, 7, 1, 4096, 333, 50000, 5, 17});
  for (int world : {1, 2, 3, 4, 8}) {
    const FlatLayout l = FlatLayout::make(order, 3000, world);
    std::map<std::string, std::vector<int>> owner;
    for (const auto& [name, n] : order) owner[name].assign(size_t(n), 0);
    int64_t largest = 0, smallest = INT64_MAX;
    for (int r = 0; r < world; ++r) {
      int64_t mine = 0;
      for (const auto& piece : l.shard_pieces(r, world)) {
        ASSERT_GT(piece.count, 0);
        for (int64_t i = piece.offset; i < piece.offset + piece.count; ++i) ++owner[piece.name][size_t(i)];
        mine += piece.count;
      }
      largest = std::max(largest, mine);
      smallest = std::min(smallest, mine);
    }
    for (const auto& [name, counts] : owner)
      for (size_t i = 0; i < counts.size(); ++i) ASSERT_EQ(counts[i], 1) << name << "[" << i << "], world " << world;
    // Shards are near equal: at most a chunk's padding apart per bucket.
    EXPECT_LE(largest - smallest, int64_t(l.buckets.size()) * 16 * world + 16 * int64_t(order.size())) << world;
  }
}

models::GptConfig small_gpt(int64_t layers) {
  models::GptConfig c;
  c.vocab_size = 64;
  c.n_layer = layers;
  c.n_embd = 32;
  c.n_head = 2;
  c.block_size = 16;
  return c;
}

// Backward finishes the last layer's gradients first and the embeddings'
// last, and each accumulate sits right after its gradient's backward, not
// at the end of the graph: what lets buckets leave during backward.
// With the fused classifier too: its in-place write into the tied weight's
// gradient is a link of that gradient's chain, not its end.
TEST(GradientOrder, LastLayerFirstAndAccumulatesSpreadThroughBackward) {
  for (const bool fused : {false, true}) {
    SCOPED_TRACE(fused ? "fused classifier" : "plain head");
    cpu::CpuBackend backend(1);
    models::GptConfig cfg = small_gpt(3);
    cfg.fused_classifier = fused;
    models::Gpt model(cfg, backend);
    const core::Graph g = model.train_graph(2, 16);
    const std::vector<std::string> order = gradient_order(g);
    ASSERT_EQ(order.size(), model.params().entries().size());
    auto index = [&](const std::string& s) {
      for (size_t i = 0; i < order.size(); ++i)
        if (order[i].find(s) != std::string::npos) return int(i);
      return -1;
    };
    EXPECT_LT(index("h.2."), index("h.0.")) << "layer 2's gradients come before layer 0's";
    EXPECT_EQ(order.back().find("wte") != std::string::npos || order.back().find("wpe") != std::string::npos, true)
        << order.back();
    EXPECT_GE(index("wte"), int(order.size()) - 2) << "the tied embedding's gradient ends with the embedding's piece";
    // The first accumulate runs well before the last node of the graph.
    size_t first = 0;
    for (size_t i = 0; i < g.nodes().size(); ++i)
      if (g.nodes()[i].op == core::OpKind::accumulate) {
        first = i;
        break;
      }
    EXPECT_LT(first, g.nodes().size() - g.nodes().size() / 4) << "accumulates are not all at the end";
  }
}

// ZeRO-1 from a fresh start never makes the full moments: AdamW built
// without state holds none until shard(), which makes only the pieces'.
TEST(ShardedAdamW, NoFullMomentsAndOnlyThePiecesStateAfterShard) {
  cpu::CpuBackend backend(1);
  models::Gpt model(small_gpt(2), backend);
  optim::AdamW adamw({}, model.params(), backend, /*allocate_state=*/false);
  EXPECT_EQ(model.params().state_bytes(), 0u);
  EXPECT_THROW(adamw.grad_norm(), core::Error) << "stepping before shard() must not pass silently";
  std::vector<std::pair<std::string, int64_t>> order;
  for (const auto& [name, e] : model.params().entries()) order.emplace_back(name, e.value.numel());
  const FlatLayout l = FlatLayout::make(order, 1 << 12, 4);
  const auto pieces = l.shard_pieces(1, 4);
  int64_t mine = 0;
  for (const auto& p : pieces) mine += p.count;
  adamw.shard(pieces, [](double x) { return x; });
  EXPECT_EQ(model.params().state_bytes(), 0u);
  EXPECT_EQ(adamw.shard_exp_avg().numel(), mine);
  EXPECT_LT(mine, model.params().num_params() / 3) << "a quarter of the elements, plus padding";
}

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

TEST(CommThread, ClocksSplitHiddenFromExposedTime) {
  CommThread t(0, 30);
  // A 60 ms collective while the caller computes for 120 ms: all hidden.
  t.submit([] { std::this_thread::sleep_for(std::chrono::milliseconds(60)); }, "hidden");
  std::this_thread::sleep_for(std::chrono::milliseconds(120));
  t.wait();
  EXPECT_GE(t.busy_seconds(), 0.055);
  EXPECT_LT(t.waited_seconds(), 0.03);
  t.reset_times();
  // The same collective waited for at once: all exposed.
  t.run([] { std::this_thread::sleep_for(std::chrono::milliseconds(60)); }, "exposed");
  EXPECT_GE(t.waited_seconds(), 0.055);
  EXPECT_GE(t.busy_seconds(), 0.055);
}

TEST(CommThread, JobsRunInOrderAndErrorsReachTheWaiter) {
  CommThread t(0, 30);
  std::vector<int> seen;
  for (int i = 0; i < 5; ++i) t.submit([&seen, i] { seen.push_back(i); }, "append");
  t.wait();
  EXPECT_EQ(seen, (std::vector<int>{0, 1, 2, 3, 4}));
  t.submit([] { throw std::runtime_error("peer gone"); }, "failing");
  EXPECT_THROW(t.wait(), std::runtime_error);
  t.run([] {}, "after an error the thread still works");
}

TEST(CommThreadDeathTest, AHungCollectiveEndsTheProcessWithAMessage) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        CommThread t(1, 0.2);
        t.set_step(7);
        t.submit([] { std::this_thread::sleep_for(std::chrono::seconds(5)); }, "the all-reduce of a gradient bucket");
        const double t0 = now();
        t.wait();
        std::fprintf(stderr, "waited %.1f s without timing out\n", now() - t0);
        std::exit(0);
      },
      ::testing::ExitedWithCode(3),
      "rank 1: the all-reduce of a gradient bucket at step 7 got no answer from the other ranks for 0.2 s");
}

// The limit holds per collective: a step's buckets may together take longer
// than dist.timeout_s while each finishes well within it (a slow link),
// which ended a healthy job as if a rank had died.
TEST(CommThreadDeathTest, ManyCollectivesMayTogetherTakeLongerThanTheLimit) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        CommThread t(0, 0.5);
        for (int i = 0; i < 8; ++i)
          t.submit([] { std::this_thread::sleep_for(std::chrono::milliseconds(100)); }, "a bucket");
        const double t0 = now();
        t.wait();
        std::fprintf(stderr, "waited %.1f s for 8 collectives\n", now() - t0);
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "waited 0\\.[89]|waited [1-9]");
}

// ---- the trainer's data-parallel path in one process -------------------------------
// A communicator of one rank: every collective is the identity. The trainer
// then runs its whole data-parallel path (flat buffers, bucket hooks, the
// communication thread, ZeRO-1 shards and their gathering for checkpoints)
// in this process, where the sanitizers see all of it, and must give the
// numbers of a run without it bit for bit.
class OneRank final : public core::Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "one-rank"; }
  void allreduce_sum(float*, size_t) override { ++calls; }
  void reduce_scatter_sum(float*, size_t) override { ++calls; }
  void allgather(float*, size_t) override { ++calls; }
  void broadcast_host(void*, size_t, int) override {}
  void allreduce_host(double*, size_t, Reduce) override {}
  void barrier() override {}
  std::atomic<int> calls{0};
};

train::TrainResult run_tiny(const std::string& dir, core::Communicator* comm, int zero) {
  const std::filesystem::path root = testing_util::corpus_dir("dist");
  const train::TrainConfig cfg = train::load_train_config(
      "", {"model.vocab_size=256", "model.n_layer=2", "model.n_embd=32", "model.n_head=2", "model.block_size=32",
           "train.batch=4", "train.seq=32", "train.grad_accum=2", "train.steps=6", "train.eval_every=0",
           "train.threads=1", "checkpoint.every=6", "dist.bucket_mb=0.01", "dist.zero=" + std::to_string(zero),
           "data.dir=" + (root / "data").string(), "checkpoint.dir=" + (root / dir).string()});
  cpu::CpuBackend backend(1);
  train::TrainOptions o;
  o.quiet = true;
  o.comm = comm;
  return train::train(cfg, backend, o);
}

void expect_same_files(const std::string& a, const std::string& b) {
  const auto fa = core::load_safetensors(a), fb = core::load_safetensors(b);
  ASSERT_EQ(fa.tensors.size(), fb.tensors.size());
  for (const auto& [name, t] : fa.tensors) {
    const auto& u = fb.tensors.at(name);
    ASSERT_EQ(t.bytes(), u.bytes()) << name;
    EXPECT_EQ(std::memcmp(t.data(), u.data(), t.bytes()), 0) << name << " differs between " << a << " and " << b;
  }
}

TEST(DataParallelOneRank, MatchesTheSingleProcessRunBitForBit) {
  const train::TrainResult plain = run_tiny("plain", nullptr, 0);
  for (int zero : {0, 1}) {
    OneRank comm;
    const std::string dir = "one_rank_zero" + std::to_string(zero);
    const train::TrainResult r = run_tiny(dir, &comm, zero);
    ASSERT_EQ(r.losses.size(), plain.losses.size());
    for (size_t i = 0; i < r.losses.size(); ++i) EXPECT_EQ(r.losses[i], plain.losses[i]) << "ZeRO-" << zero << " step " << i;
    EXPECT_EQ(r.world, 1);
    // 8 buckets of 0.01 MiB, once per step (the last micro-step only), plus
    // ZeRO-1's weight all-gathers and, at the checkpoint, its moments'.
    EXPECT_GT(comm.calls.load(), 6 * 2) << "the buckets went through the communicator";
    const std::filesystem::path root = testing_util::corpus_dir("dist");
    for (const char* f : {"model.safetensors", "optimizer.safetensors"})
      expect_same_files((root / dir / "step_0000006" / f).string(), (root / "plain" / "step_0000006" / f).string());
  }
}

}  // namespace
}  // namespace brisk::dist
