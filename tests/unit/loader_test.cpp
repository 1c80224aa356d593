// The prefetching loader: batches identical to WindowSampler's stream and the
// same for 0, 1, 2 and 4 workers; exact resume mid-stream and mid-epoch;
// disjoint, covering shards across ranks; workers filling the ring ahead of
// the consumer and data wait counted when it must wait (both shown through a
// source the test gates, with no wall-clock upper bound); source errors
// surfacing on the consumer's thread; slots taken from the allocator once.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
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
    return false;
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

// A source the test drives. fill(g) records that it started and on which
// thread, then blocks until the test opens batch g. The test waits for fills
// to start or finish through the same mutex and condition variable, so every
// step is ordered by synchronisation, not by how fast a thread happens to
// run. The one clock is a guard that turns a hang (a fill that never comes)
// into a failure; it bounds nothing that a slow machine could reach.
class GatedSource final : public BatchSource {
 public:
  struct Fill {
    uint64_t global = 0;
    std::thread::id thread;
    bool finished = false;
  };
  static constexpr uint64_t kAll = ~uint64_t{0};

  explicit GatedSource(uint64_t open_below = 0) : open_below_(open_below) {}

  BatchCapacity capacity() const override { return {.rows = 1, .cols = 4}; }
  void fill(uint64_t g, Batch& out) const override {
    std::unique_lock<std::mutex> lock(mu_);
    const size_t me = fills_.size();
    fills_.push_back({g, std::this_thread::get_id()});
    cv_.notify_all();
    cv_.wait(lock, [&] { return g < open_below_; });
    out.rows = 1;
    out.cols = 4;
    for (int i = 0; i < 4; ++i) out.inputs[i] = static_cast<int32_t>(g);
    fills_[me].finished = true;
    cv_.notify_all();
  }

  // Lets the fills of batches below n complete.
  void open_below(uint64_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    open_below_ = std::max(open_below_, n);
    cv_.notify_all();
  }
  // Blocks until pred(fills so far) holds; false if it still does not after
  // the hang guard.
  bool await(const std::function<bool(const std::vector<Fill>&)>& pred) const {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(10), [&] { return pred(fills_); });
  }
  std::vector<Fill> fills() const {
    std::lock_guard<std::mutex> lock(mu_);
    return fills_;
  }

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  mutable std::vector<Fill> fills_;
  uint64_t open_below_;
};

// Opens the gate on the way out. Declared after the Loader it is destroyed
// first, even after a failed ASSERT, so the Loader's destructor never waits
// to join a worker blocked in fill.
struct OpenOnExit {
  GatedSource& src;
  ~OpenOnExit() { src.open_below(GatedSource::kAll); }
};

// Predicates for GatedSource::await.
auto started(uint64_t g) {
  return [g](const std::vector<GatedSource::Fill>& fs) {
    return std::any_of(fs.begin(), fs.end(), [&](const GatedSource::Fill& f) { return f.global == g; });
  };
}
auto finished_below(uint64_t n) {
  return [n](const std::vector<GatedSource::Fill>& fs) {
    std::vector<bool> done(n, false);
    for (const GatedSource::Fill& f : fs)
      if (f.finished && f.global < n) done[f.global] = true;
    return std::all_of(done.begin(), done.end(), [](bool d) { return d; });
  };
}

// Workers fill batches ahead of the consumer, as far as the ring allows, and
// next() hands out a batch that is already filled: no fill on the consumer's
// thread, and no batch filled twice.
TEST(Loader, WorkersPrefetchAheadOfTheConsumer) {
  GatedSource src(GatedSource::kAll);
  Loader l(src, {.workers = 2, .prefetch_factor = 2});
  const uint64_t n = l.slot_count();  // 5: the consumer's slot and 4 in flight
  l.start();
  // Nothing asked for yet: the workers fill one batch per slot on their own.
  ASSERT_TRUE(src.await(finished_below(n))) << "the workers did not fill batches 0.." << n - 1 << " ahead";
  const uint64_t taken = 30;
  for (uint64_t k = 0; k < taken; ++k) {
    SCOPED_TRACE("batch " + std::to_string(k));
    const Batch& b = l.next();
    ASSERT_EQ(b.step, k);
    EXPECT_EQ(b.inputs[0], int32_t(k));
    // The consumer holds batch k and has handed back k-1: its slot is free,
    // so the workers fill up to batch k + n - 1 before it asks again...
    ASSERT_TRUE(src.await(finished_below(k + n))) << "the workers did not refill the ring";
    // ...and never further: a worker may not claim a slot the consumer holds.
    for (const GatedSource::Fill& f : src.fills()) EXPECT_LT(f.global, k + n) << "filled beyond the ring";
  }
  // Batches 0 .. taken + n - 2: the ones taken and those prefetched after.
  std::vector<int> times_filled(taken + n - 1, 0);
  for (const GatedSource::Fill& f : src.fills()) {
    EXPECT_NE(f.thread, std::this_thread::get_id()) << "batch " << f.global << " was filled on the consumer's thread";
    times_filled.at(f.global) += 1;
  }
  for (size_t g = 0; g < times_filled.size(); ++g) EXPECT_EQ(times_filled[g], 1) << "batch " << g;
  EXPECT_EQ(l.stats().batches, taken);
}

// The consumer waits when its batch is not filled yet, and that wait is what
// the stats report. Batch 0's fill is held until 50 ms after it began, and
// it begins inside next() (nothing was started before), so that next()
// blocks for at least 50 ms: a lower bound set by a sleep, safe under load.
TEST(Loader, DataWaitIsMeasured) {
  using namespace std::chrono_literals;
  for (int workers : {0, 1, 2}) {
    SCOPED_TRACE(std::to_string(workers) + " workers");
    GatedSource src;
    Loader l(src, {.workers = workers, .prefetch_factor = 2});
    OpenOnExit open_on_exit{src};
    bool fill_began = false;
    std::thread opener([&] {
      fill_began = src.await(started(0));
      std::this_thread::sleep_for(50ms);
      src.open_below(1);
    });
    const Batch& b0 = l.next();
    opener.join();
    EXPECT_TRUE(fill_began);
    EXPECT_EQ(b0.inputs[0], 0);
    const double first_wait = l.last_wait_seconds();
    EXPECT_GE(first_wait, 0.050) << "the consumer blocked on an unfilled batch and that was not counted as wait";
    EXPECT_GE(l.stats().fill_s_total, 0.050);

    const auto consumer = std::this_thread::get_id();
    if (workers == 0) {
      // Without workers nothing is prefetched: batch 1 is filled only inside
      // next(), on the consumer's thread.
      EXPECT_EQ(src.fills().size(), 1u);
      src.open_below(GatedSource::kAll);
      l.next();
      const auto fills = src.fills();
      ASSERT_EQ(fills.size(), 2u);
      for (const GatedSource::Fill& f : fills) EXPECT_EQ(f.thread, consumer);
    } else {
      // With workers, batch 1 is filled ahead; next() takes it as it is.
      src.open_below(GatedSource::kAll);
      ASSERT_TRUE(src.await(finished_below(2))) << "batch 1 was not filled ahead of the consumer";
      l.next();
      for (const GatedSource::Fill& f : src.fills())
        EXPECT_NE(f.thread, consumer) << "batch " << f.global << " was filled on the consumer's thread";
    }
    const LoaderStats s = l.stats();
    EXPECT_EQ(s.batches, 2u);
    EXPECT_DOUBLE_EQ(s.wait_s_total, first_wait + l.last_wait_seconds()) << "every next()'s wait is summed";
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
