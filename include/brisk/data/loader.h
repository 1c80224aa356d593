// The prefetching batch loader. Worker threads fill a bounded ring of batch
// slots ahead of the trainer, so reading and assembling batch i+1.. overlaps
// the compute of batch i and the trainer only blocks ("data wait") when the
// workers fall behind.
//
// Determinism is the contract: batch i of rank r is a pure function of
// (source, i, r, world_size) -- the source's seed lives in the source -- so
// the sequence of batches is the same for any worker count, any timing, and
// after a restore from position(). Workers claim batch indices in order and
// the consumer takes them strictly in order; a worker never decides *which*
// data goes into a batch, only *when* it is assembled.
//
// Sharding: rank r of w sees the global batches r, r + w, r + 2w, ...: the
// ranks' streams are disjoint and together cover the global stream.
//
// Slot memory comes from a caller-given Allocator (the CUDA backend passes a
// page-locked one so host-to-device copies can be asynchronous) and is taken
// once, at construction: the ring persists across epochs and steps, and a
// steady-state step allocates nothing.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "brisk/core/allocator.h"

namespace brisk::data {

class TokenDataset;

// One assembled batch: views into a slot's memory. Arrays a source does not
// use are null. Row-major, rows x cols; cols may be below the source's
// capacity (dynamic padding), rows too (the last batch of an epoch).
struct Batch {
  uint64_t step = 0;          // this rank's batch number (what position() counts)
  uint64_t global_index = 0;  // step * world_size + rank
  int64_t rows = 0, cols = 0;
  int32_t* inputs = nullptr;   // rows*cols token ids
  int32_t* targets = nullptr;  // rows*cols next-token targets (token windows)
  int32_t* lengths = nullptr;  // rows real lengths (variable-length records)
  uint8_t* mask = nullptr;     // rows*cols, 1 for real tokens, 0 for padding
  int32_t* labels = nullptr;   // rows, one label per sequence (records)
  // Rows whose record a cache in front of the source held (record sources).
  // Counted per batch so a run's hit rate covers the batches it consumed,
  // not the ones workers prefetched past its last step.
  int64_t cache_hits = 0;
};

// The most a batch of a source can hold, and which arrays it uses: the
// loader sizes every slot from this once.
struct BatchCapacity {
  int64_t rows = 0, cols = 0;
  bool targets = false, lengths = false, mask = false, labels = false;
};

// Where batches come from. fill() must be a pure function of global_index
// (plus the source's immutable settings such as its seed) and safe to call
// from several threads at once on different Batch objects.
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual BatchCapacity capacity() const = 0;
  // Sets out.rows/out.cols (within capacity) and fills the arrays.
  virtual void fill(uint64_t global_index, Batch& out) const = 0;
  // Global batches per epoch; 0 for an endless stream (random windows).
  virtual uint64_t batches_per_epoch() const { return 0; }
};

// Random token windows with WindowSampler's semantics: global batch g holds
// windows [g*B, (g+1)*B) of the deterministic window stream for `seed`, so
// batch index * B is exactly a checkpoint's data_position (windows drawn).
class TokenWindowSource final : public BatchSource {
 public:
  TokenWindowSource(const TokenDataset& data, int64_t batch, int64_t seq, uint64_t seed);
  BatchCapacity capacity() const override;
  void fill(uint64_t global_index, Batch& out) const override;
  int64_t batch() const { return batch_; }

 private:
  const TokenDataset& data_;
  int64_t batch_, seq_;
  uint64_t seed_;
};

struct LoaderOptions {
  int workers = 2;          // 0: batches are assembled on the consumer's thread
  int prefetch_factor = 2;  // batches in flight per worker; the ring has
                            // workers * prefetch_factor + 1 slots (one is the consumer's)
  int rank = 0, world_size = 1;
};

struct LoaderStats {
  uint64_t batches = 0;          // taken by the consumer
  double wait_s_total = 0;       // consumer blocked, summed
  double last_wait_s = 0;        // consumer blocked in the latest next()
  double fill_s_total = 0;       // time workers spent assembling batches
};

class Loader {
 public:
  Loader(const BatchSource& source, const LoaderOptions& options = {},
         core::Allocator& allocator = core::HostAllocator::instance());
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // Starts the workers prefetching (next() does so too): call it early so
  // the first step does not wait for its batch.
  void start();

  // The next batch in order. The views stay valid until the following next()
  // or set_position(); the slot is handed back to the workers then. Rethrows
  // (once, for that batch) an exception the source threw assembling it.
  const Batch& next();

  // Batches taken so far. A Loader set to p yields exactly the batch an
  // uninterrupted one would yield as its (p+1)-th.
  uint64_t position() const { return consumed_; }
  // Drops prefetched batches and restarts the workers at p.
  void set_position(uint64_t p);

  // Epoch of the next batch (global stream), 0 for endless sources.
  uint64_t epoch() const;

  double last_wait_seconds() const { return stats_.last_wait_s; }
  LoaderStats stats() const;
  int workers() const { return options_.workers; }
  size_t slot_count() const { return slots_.size(); }
  size_t slot_bytes() const { return slot_bytes_; }

 private:
  enum class SlotState { kFree, kFilling, kReady };
  struct Slot {
    void* memory = nullptr;
    Batch batch;
    SlotState state = SlotState::kFree;
    uint64_t step = 0;
    std::exception_ptr error;
  };

  void carve(Slot& s);
  void fill_slot(Slot& s, uint64_t step);
  void start_workers();
  void stop_workers();
  void worker_loop();

  const BatchSource& source_;
  LoaderOptions options_;
  core::Allocator& allocator_;
  BatchCapacity cap_;
  size_t slot_bytes_ = 0;
  std::vector<Slot> slots_;

  // Guarded by mu_: claim order, slot states, stop flag, fill time.
  mutable std::mutex mu_;
  std::condition_variable work_cv_, ready_cv_;
  uint64_t next_claim_ = 0;  // next step a worker will assemble
  uint64_t released_ = 0;    // steps < released_ have given their slots back
  bool stop_ = false;
  double fill_s_ = 0;
  std::vector<std::thread> threads_;

  uint64_t consumed_ = 0;  // consumer side only
  bool holding_ = false;   // the consumer holds slot (consumed_-1) % n
  LoaderStats stats_;
};

}  // namespace brisk::data
