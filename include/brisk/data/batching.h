// Variable-length batching: records (e-mails, protein sequences, sentences)
// have different lengths, and an encoder batch is a rectangle. This file
// decides which records share a batch and lays a batch out:
//
// - Dynamic padding: a batch is as wide as its longest member, not as the
//   longest record in the corpus.
// - Length bucketing (group-by-length): within large shuffled chunks,
//   records are sorted by length and cut into batches, then the batches are
//   shuffled. Neighbours have similar lengths, so padding waste drops from
//   tens of percent to a few, while the chunk shuffle and batch shuffle keep
//   the order random across the epoch. Everything is a pure function of
//   (seed, epoch): a resumed run sees the same batches.
// - Max-length filtering: records longer than max_len are dropped (or
//   truncated, by option) and counted, as are empty ones.
// - The mask: 1 for real tokens, 0 for padding, what attention needs.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "brisk/data/loader.h"

namespace brisk::data {

// A sequence collection the batcher can draw from: lengths up front (cheap to
// know: LMDB metadata, a shard index) and a fetch that copies record i's
// first n tokens (n <= lengths[i]) into out and returns whether a cache
// held them (false when there is no cache). fetch must be thread-safe.
struct SequenceSource {
  std::vector<int64_t> lengths;
  std::function<bool(int64_t index, int64_t n, int32_t* out)> fetch;
  std::function<int32_t(int64_t index)> label;  // optional: a class label per record
};

struct BucketingOptions {
  int64_t batch_size = 32;     // rows per batch
  int64_t max_len = 512;       // longer records are dropped (or truncated)
  bool truncate = false;       // true: keep over-long records, cut to max_len
  bool bucket = true;          // false: plain shuffled batches (the baseline)
  int64_t chunk_batches = 64;  // a sorting chunk holds chunk_batches * batch_size records
  bool drop_last = false;      // drop an epoch's final, partial batch
  uint64_t seed = 0;
};

struct BatchPlan {
  std::vector<std::vector<int64_t>> batches;  // record indices per batch, in epoch order
  int64_t kept = 0, dropped_too_long = 0, dropped_empty = 0, truncated = 0, dropped_last = 0;
  // Padding the plan implies: padded cells / all cells, over the epoch.
  double padding_waste = 0;
};

// The batches of one epoch. Deterministic for (lengths, options, epoch).
BatchPlan plan_batches(std::span<const int64_t> lengths, const BucketingOptions& options, uint64_t epoch);

// A padded batch in owned memory (what tests, tools and simple callers use;
// the loader pads into its own slots through pad_into).
struct PaddedBatch {
  int64_t rows = 0, cols = 0;
  std::vector<int32_t> ids;      // rows*cols, padding = pad_id
  std::vector<int32_t> lengths;  // rows
  std::vector<uint8_t> mask;     // rows*cols, 1 = real token
  std::vector<int32_t> labels;   // rows, when the source has labels
  int64_t real_tokens() const;
  double padding_waste() const;  // padded cells / all cells
};

// Pads records `indices` of `src` into rows x cols = indices.size() x
// (longest length, capped at max_len) arrays; mask/lengths/labels may be null.
// Returns cols; *cache_hits (when given) gets the rows a cache served.
int64_t pad_into(const SequenceSource& src, std::span<const int64_t> indices, int64_t max_len, int32_t pad_id,
                 int32_t* ids, int32_t* lengths, uint8_t* mask, int32_t* labels, int64_t* cache_hits = nullptr);
PaddedBatch pad_batch(const SequenceSource& src, std::span<const int64_t> indices, int64_t max_len,
                      int32_t pad_id = 0);

// A loader source over records: global batch g is batch g % B of epoch
// g / B's plan (B = batches per epoch). Plans are computed on demand and the
// two most recent kept, so workers straddling an epoch boundary share them.
class RecordBatchSource final : public BatchSource {
 public:
  RecordBatchSource(const SequenceSource& src, const BucketingOptions& options, int32_t pad_id = 0);
  BatchCapacity capacity() const override;
  void fill(uint64_t global_index, Batch& out) const override;
  uint64_t batches_per_epoch() const override { return per_epoch_; }
  // Filtering counts and padding waste of an epoch's plan.
  BatchPlan plan(uint64_t epoch) const;

 private:
  std::shared_ptr<const BatchPlan> plan_for(uint64_t epoch) const;

  const SequenceSource& src_;
  BucketingOptions options_;
  int32_t pad_id_;
  uint64_t per_epoch_ = 0;
  int64_t max_cols_ = 0;
  mutable std::mutex mu_;
  mutable std::vector<std::pair<uint64_t, std::shared_ptr<const BatchPlan>>> plans_;
};

}  // namespace brisk::data
