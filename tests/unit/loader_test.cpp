// The prefetching loader: batches identical to WindowSampler's stream and the
// same for 0, 1, 2 and 4 workers; exact resume mid-stream and mid-epoch;
// disjoint, covering shards across ranks; data wait measured; source errors
// surfacing on the consumer's thread; slots taken from the allocator once.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "brisk/core/allocator.h"
#include "brisk/core/error.h"
#include "brisk/data/batching.h"
#include "brisk/data/loader.h"
#include "brisk/data/shards.h"

namespace fs = std::filesystem;
using namespace brisk;
using namespace brisk::data;

namespace {

// A one-shard dataset of random tokens in a fresh directory.
class TinyDataset {
 public:
  explicit TinyDataset(int64_t tokens = 20000, int64_t vocab = 256) {
    static int counter = 0;
    dir_ = fs::temp_directory_path() /
           ("brisk_loader_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::mt19937 rng(7);
    std::vector<int32_t> t(static_cast<size_t>(tokens));
    for (auto& v : t) v = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
    write_shard((dir_ / "train_0000.bin").string(), t, vocab);
    nlohmann::json meta = {{"tokenizer", "bytes"}, {"vocab_size", vocab}, {"train_tokens", tokens}};
    std::ofstream(dir_ / "meta.json") << meta.dump();
    data_ = std::make_unique<TokenDataset>(dir_.string(), "train");
  }
  ~TinyDataset() {
    data_.reset();
    fs::remove_all(dir_);
  }
  const TokenDataset& data() const { return *data_; }

 private:
  fs::path dir_;
  std::unique_ptr<TokenDataset> data_;
};

// A batch's contents as plain vectors, to compare batches from loaders that
// are gone or have moved on.
struct Copy {
  uint64_t step = 0, global = 0;
  int64_t rows = 0, cols = 0;
  std::vector<int32_t> inputs, targets, lengths, labels;
  std::vector<uint8_t> mask;
  bool operator==(const Copy&) const = default;
};

Copy copy_of(const Batch& b) {
  Copy c;
  c.step = b.step;
  c.global = b.global_index;
  c.rows = b.rows;
  c.cols = b.cols;
  const size_t cells = static_cast<size_t>(b.rows * b.cols), rows = static_cast<size_t>(b.rows);
  c.inputs.assign(b.inputs, b.inputs + cells);
  if (b.targets) c.targets.assign(b.targets, b.targets + cells);
  if (b.lengths) c.lengths.assign(b.lengths, b.lengths + rows);
  if (b.mask) c.mask.assign(b.mask, b.mask + cells);
  if (b.labels) c.labels.assign(b.labels, b.labels + rows);
  return c;
}

std::vector<Copy> take(Loader& l, int n) {
  std::vector<Copy> out;
  for (int i = 0; i < n; ++i) out.push_back(copy_of(l.next()));
  return out;
}

// Records 0..n-1 of pseudo-random lengths; token j of record i is i*1000+j,
// so a batch's contents name the records in it.
SequenceSource synthetic_records(int64_t n, int64_t max_len, uint32_t seed) {
  SequenceSource s;
  std::mt19937 rng(seed);
  for (int64_t i = 0; i < n; ++i) s.lengths.push_back(1 + static_cast<int64_t>(rng() % static_cast<uint32_t>(max_len)));
  s.fetch = [](int64_t i, int64_t len, int32_t* out) {
    for (int64_t j = 0; j < len; ++j) out[j] = static_cast<int32_t>(i * 1000 + j);
  };
  s.label = [](int64_t i) { return static_cast<int32_t>(i % 2); };
  return s;
}

}  // namespace

TEST(Loader, TokenWindowsMatchWindowSampler) {
  TinyDataset ds;
  const int64_t B = 4, T = 32;
  TokenWindowSource src(ds.data(), B, T, 42);
  Loader loader(src, {.workers = 2, .prefetch_factor = 2});
  WindowSampler sampler(ds.data(), B, T, 42);
  std::vector<int32_t> x(size_t(B * T)), y(x.size());
  for (int i = 0; i < 25; ++i) {
    sampler.next(x.data(), y.data());
    const Batch& b = loader.next();
    ASSERT_EQ(b.rows, B);
    ASSERT_EQ(b.cols, T);
    EXPECT_EQ(b.step, uint64_t(i));
    EXPECT_EQ(std::vector<int32_t>(b.inputs, b.inputs + B * T), x) << "batch " << i;
    EXPECT_EQ(std::vector<int32_t>(b.targets, b.targets + B * T), y) << "batch " << i;
    // The loader's position counts batches; a checkpoint's counts windows.
    EXPECT_EQ(loader.position() * uint64_t(B), sampler.position());
  }
}

TEST(Loader, SameSeedSameBatchesForAnyWorkerCount) {
  TinyDataset ds;
  TokenWindowSource src(ds.data(), 8, 16, 5);
  Loader ref(src, {.workers = 0});
  const auto expected = take(ref, 60);
  for (int workers : {1, 2, 4}) {
    for (int prefetch : {1, 3}) {
      Loader l(src, {.workers = workers, .prefetch_factor = prefetch});
      EXPECT_EQ(l.slot_count(), size_t(workers * prefetch + 1));
      EXPECT_EQ(take(l, 60), expected) << workers << " workers, prefetch " << prefetch;
    }
  }
  TokenWindowSource other(ds.data(), 8, 16, 6);
  Loader l(other, {.workers = 2});
  EXPECT_NE(take(l, 60), expected) << "another seed gives other batches";
}

TEST(Loader, RecordBatchesSameForAnyWorkerCount) {
  const SequenceSource recs = synthetic_records(300, 40, 3);
  RecordBatchSource src(recs, {.batch_size = 8, .max_len = 32, .seed = 9});
  Loader ref(src, {.workers = 0});
  const auto expected = take(ref, 100);  // crosses two epoch boundaries
  for (int workers : {1, 2, 4}) {
    Loader l(src, {.workers = workers, .prefetch_factor = 2});
    EXPECT_EQ(take(l, 100), expected) << workers << " workers";
  }
}

TEST(Loader, ResumeMidStreamYieldsTheExactRemainingSequence) {
  TinyDataset ds;
  TokenWindowSource src(ds.data(), 4, 24, 11);
  Loader straight(src, {.workers = 2});
  const auto all = take(straight, 50);

  // A fresh loader set to a saved position, as after a restart.
  Loader first(src, {.workers = 2});
  take(first, 17);
  const uint64_t saved = first.position();
  EXPECT_EQ(saved, 17u);
  Loader resumed(src, {.workers = 4});
  resumed.set_position(saved);
  EXPECT_EQ(take(resumed, 33), std::vector<Copy>(all.begin() + 17, all.end()));

  // A running loader moved back and forward: prefetched batches are dropped.
  Loader moved(src, {.workers = 2});
  take(moved, 30);
  moved.set_position(5);
  EXPECT_EQ(take(moved, 10), std::vector<Copy>(all.begin() + 5, all.begin() + 15));
  moved.set_position(40);
  EXPECT_EQ(take(moved, 10), std::vector<Copy>(all.begin() + 40, all.end()));
}

TEST(Loader, ResumeMidEpochOfRecords) {
  const SequenceSource recs = synthetic_records(200, 50, 4);
  RecordBatchSource src(recs, {.batch_size = 16, .max_len = 64, .seed = 1});
  const uint64_t per_epoch = src.batches_per_epoch();
  ASSERT_EQ(per_epoch, 13u);  // 200 records / 16, the last batch partial
  Loader straight(src, {.workers = 2});
  const auto all = take(straight, 40);
  for (uint64_t at : {uint64_t(1), uint64_t(6), per_epoch - 1, per_epoch, per_epoch + 4}) {
    Loader l(src, {.workers = 3});
    l.set_position(at);
    EXPECT_EQ(l.epoch(), at / per_epoch);
    EXPECT_EQ(take(l, int(40 - at)), std::vector<Copy>(all.begin() + long(at), all.end())) << "resumed at " << at;
  }
}

TEST(Loader, ShardsAreDisjointAndCovering) {
  TinyDataset ds;
  TokenWindowSource src(ds.data(), 2, 8, 3);
  Loader whole(src, {.workers = 1});
  const auto global = take(whole, 60);
  const int world = 3;
  std::set<uint64_t> seen;
  for (int rank = 0; rank < world; ++rank) {
    Loader l(src, {.workers = 2, .rank = rank, .world_size = world});
    const auto mine = take(l, 20);
    for (const Copy& c : mine) {
      EXPECT_EQ(c.global % world, uint64_t(rank));
      EXPECT_TRUE(seen.insert(c.global).second) << "global batch " << c.global << " seen twice";
      Copy g = global[c.global];  // the same data as the single-rank stream
      g.step = c.step;
      EXPECT_EQ(c, g);
    }
  }
  EXPECT_EQ(seen.size(), 60u);
  EXPECT_EQ(*seen.rbegin(), 59u);

  // Records: in one epoch the ranks' batches hold every kept record once.
  const SequenceSource recs = synthetic_records(120, 30, 8);
  RecordBatchSource rsrc(recs, {.batch_size = 5, .max_len = 30, .seed = 2});
  ASSERT_EQ(rsrc.batches_per_epoch(), 24u);
  std::multiset<int32_t> records;
  for (int rank = 0; rank < 4; ++rank) {
    Loader l(rsrc, {.workers = 1, .rank = rank, .world_size = 4});
    for (int i = 0; i < 6; ++i) {
      const Batch& b = l.next();
      for (int64_t r = 0; r < b.rows; ++r) records.insert(b.inputs[r * b.cols] / 1000);
    }
  }
  EXPECT_EQ(records.size(), 120u);
  EXPECT_EQ(std::set<int32_t>(records.begin(), records.end()).size(), 120u);
}

// A source that takes a fixed time per batch.
class SlowSource final : public BatchSource {
 public:
  explicit SlowSource(std::chrono::milliseconds per_batch) : per_batch_(per_batch) {}
  BatchCapacity capacity() const override { return {.rows = 1, .cols = 4}; }
  void fill(uint64_t g, Batch& out) const override {
    std::this_thread::sleep_for(per_batch_);
    if (g == fail_at) throw core::IoError("record " + std::to_string(g) + " is damaged");
    out.rows = 1;
    out.cols = 4;
    for (int i = 0; i < 4; ++i) out.inputs[i] = static_cast<int32_t>(g);
  }
  uint64_t fail_at = ~uint64_t{0};

 private:
  std::chrono::milliseconds per_batch_;
};

TEST(Loader, DataWaitIsMeasured) {
  using namespace std::chrono_literals;
  SlowSource src(20ms);
  {
    // The consumer outruns one worker: each batch costs ~ a fill of wait.
    Loader l(src, {.workers = 1, .prefetch_factor = 2});
    for (int i = 0; i < 5; ++i) {
      l.next();
      EXPECT_GE(l.last_wait_seconds(), 0.010) << "batch " << i;
    }
    EXPECT_GE(l.stats().wait_s_total, 0.05);
    EXPECT_EQ(l.stats().batches, 5u);
    EXPECT_GE(l.stats().fill_s_total, 0.09);
  }
  {
    // A consumer slower than the workers waits (almost) only for the first.
    Loader l(src, {.workers = 2, .prefetch_factor = 2});
    l.start();
    std::this_thread::sleep_for(60ms);
    double later = 0;
    for (int i = 0; i < 8; ++i) {
      l.next();
      if (i > 0) later += l.last_wait_seconds();
      std::this_thread::sleep_for(30ms);
    }
    // 7 steps of 30 ms of "compute": generous for a loaded machine.
    EXPECT_LT(later, 0.5 * 7 * 0.030);
  }
  {
    Loader l(src, {.workers = 0});
    l.next();
    EXPECT_GE(l.last_wait_seconds(), 0.015) << "without workers all data time is wait";
  }
}

TEST(Loader, SourceErrorsReachTheConsumer) {
  using namespace std::chrono_literals;
  SlowSource src(1ms);
  src.fail_at = 3;
  for (int workers : {0, 2}) {
    Loader l(src, {.workers = workers});
    for (int i = 0; i < 3; ++i) EXPECT_EQ(l.next().inputs[0], i);
    try {
      l.next();
      ADD_FAILURE() << "batch 3 should have thrown";
    } catch (const core::IoError& e) {
      EXPECT_NE(std::string(e.what()).find("record 3 is damaged"), std::string::npos);
    }
    EXPECT_EQ(l.next().inputs[0], 4) << "the loader goes on after a failed batch";
  }
}

TEST(Loader, SlotsComeFromTheAllocatorOnce) {
  TinyDataset ds;
  TokenWindowSource src(ds.data(), 8, 64, 1);
  core::CountingAllocator counting(core::HostAllocator::instance());
  {
    Loader l(src, {.workers = 2, .prefetch_factor = 2}, counting);
    EXPECT_EQ(counting.allocations(), 5u);  // 2 * 2 + 1 slots
    EXPECT_EQ(counting.live_bytes(), 5 * l.slot_bytes());
    take(l, 100);
    l.set_position(3);
    take(l, 10);
    EXPECT_EQ(counting.allocations(), 5u) << "the ring persists: no allocation per batch";
    const Batch& b = l.next();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.inputs) % core::kAlignment, 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.targets) % core::kAlignment, 0u);
  }
  EXPECT_EQ(counting.live_bytes(), 0u);
}

TEST(Loader, RejectsBadOptions) {
  TinyDataset ds;
  TokenWindowSource src(ds.data(), 2, 8, 1);
  EXPECT_THROW(Loader(src, {.workers = -1}), core::ConfigError);
  EXPECT_THROW(Loader(src, {.prefetch_factor = 0}), core::ConfigError);
  EXPECT_THROW(Loader(src, {.rank = 2, .world_size = 2}), core::ConfigError);
  EXPECT_THROW(TokenWindowSource(ds.data(), 2, 30000, 1), core::ConfigError);
}

TEST(Loader, DestroyedWhileWorkersWait) {
  // Workers blocked on a full ring, and a consumer that never took a batch.
  TinyDataset ds;
  TokenWindowSource src(ds.data(), 2, 8, 1);
  for (int i = 0; i < 20; ++i) {
    Loader l(src, {.workers = 4, .prefetch_factor = 1});
    l.start();
    if (i % 2) l.next();
  }
}
