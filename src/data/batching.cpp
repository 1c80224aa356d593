// Variable-length batching (batching.h): filtering, group-by-length plans,
// dynamic padding and the record source for the loader.
//
// Randomness is counter-based (splitmix64 of (seed, epoch, i)) and the
// shuffle is our own Fisher-Yates rather than std::shuffle, whose use of the
// engine is left to each standard library: a plan must be the same on every
// machine a run is resumed on, not just on the same build.
#include "brisk/data/batching.h"

#include <algorithm>
#include <cstring>

#include "brisk/core/error.h"

namespace brisk::data {

namespace {

constexpr uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t below(uint64_t bits, uint64_t n) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(bits) * n) >> 64);
}

// Fisher-Yates driven by the random stream `key`.
template <typename T>
void shuffle(std::vector<T>& v, uint64_t key) {
  for (size_t i = v.size(); i > 1; --i) {
    const uint64_t bits = mix64(key + i * 0x9e3779b97f4a7c15ULL);
    std::swap(v[i - 1], v[below(bits, i)]);
  }
}

}  // namespace

BatchPlan plan_batches(std::span<const int64_t> lengths, const BucketingOptions& o, uint64_t epoch) {
  if (o.batch_size <= 0) throw core::ConfigError("batching: batch_size must be positive, got " + std::to_string(o.batch_size));
  if (o.max_len <= 0) throw core::ConfigError("batching: max_len must be positive, got " + std::to_string(o.max_len));
  if (o.chunk_batches <= 0)
    throw core::ConfigError("batching: chunk_batches must be positive, got " + std::to_string(o.chunk_batches));

  BatchPlan plan;
  std::vector<int64_t> kept;
  kept.reserve(lengths.size());
  for (size_t i = 0; i < lengths.size(); ++i) {
    const int64_t len = lengths[i];
    if (len <= 0) {
      ++plan.dropped_empty;
    } else if (len > o.max_len && !o.truncate) {
      ++plan.dropped_too_long;
    } else {
      if (len > o.max_len) ++plan.truncated;
      kept.push_back(static_cast<int64_t>(i));
    }
  }
  plan.kept = static_cast<int64_t>(kept.size());
  auto len_of = [&](int64_t i) { return std::min(lengths[static_cast<size_t>(i)], o.max_len); };

  const uint64_t key = mix64(mix64(o.seed ^ 0x3c6ef372fe94f82bULL) + epoch);
  shuffle(kept, key);
  const size_t b = static_cast<size_t>(o.batch_size);
  // The records that do not fill a last batch are dropped here, from the
  // shuffled order: a different, length-blind few each epoch. Dropped after
  // bucketing, they were the last chunk's longest, the same ones every epoch
  // when a chunk holds the whole split, so the longest records never trained.
  if (o.drop_last && kept.size() % b != 0 && kept.size() > b) {
    plan.dropped_last = static_cast<int64_t>(kept.size() % b);
    kept.resize(kept.size() - kept.size() % b);
  }
  if (o.bucket) {
    // Sorting within chunks, not globally: a global sort would make every
    // epoch walk the corpus from shortest to longest (the batch shuffle hides
    // the order but not that batch k of the sorted list always holds the same
    // records); chunks of a shuffled epoch give different neighbours each
    // epoch for nearly the same padding. Chunks are whole batches, so no
    // batch straddles two of them.
    const size_t chunk = b * static_cast<size_t>(o.chunk_batches);
    for (size_t c = 0; c < kept.size(); c += chunk) {
      auto first = kept.begin() + static_cast<std::ptrdiff_t>(c);
      auto last = kept.begin() + static_cast<std::ptrdiff_t>(std::min(kept.size(), c + chunk));
      std::stable_sort(first, last, [&](int64_t x, int64_t y) { return len_of(x) < len_of(y); });
    }
  }
  for (size_t i = 0; i < kept.size(); i += b)
    plan.batches.emplace_back(kept.begin() + static_cast<std::ptrdiff_t>(i),
                              kept.begin() + static_cast<std::ptrdiff_t>(std::min(kept.size(), i + b)));
  if (o.drop_last && !plan.batches.empty() && plan.batches.back().size() < b) {  // fewer than one batch
    plan.dropped_last = static_cast<int64_t>(plan.batches.back().size());
    plan.batches.pop_back();
  }
  // Sorted chunks would otherwise serve short batches, then long ones.
  if (o.bucket) shuffle(plan.batches, mix64(key ^ 0xa54ff53a5f1d36f1ULL));

  double cells = 0, real = 0;
  for (const auto& batch : plan.batches) {
    int64_t longest = 0;
    for (int64_t i : batch) {
      longest = std::max(longest, len_of(i));
      real += static_cast<double>(len_of(i));
    }
    cells += static_cast<double>(longest) * static_cast<double>(batch.size());
  }
  plan.padding_waste = cells > 0 ? 1.0 - real / cells : 0.0;
  return plan;
}

int64_t pad_into(const SequenceSource& src, std::span<const int64_t> indices, int64_t max_len, int32_t pad_id,
                 int32_t* ids, int32_t* lengths, uint8_t* mask, int32_t* labels, int64_t* cache_hits) {
  auto len_of = [&](int64_t i) {
    if (i < 0 || static_cast<size_t>(i) >= src.lengths.size())
      throw core::Error("batching: record " + std::to_string(i) + " outside [0, " +
                        std::to_string(src.lengths.size()) + ")");
    return std::min(src.lengths[static_cast<size_t>(i)], max_len);
  };
  int64_t cols = 0, hits = 0;
  for (int64_t i : indices) cols = std::max(cols, len_of(i));
  for (size_t r = 0; r < indices.size(); ++r) {
    const int64_t n = len_of(indices[r]);
    int32_t* row = ids + static_cast<int64_t>(r) * cols;
    hits += src.fetch(indices[r], n, row) ? 1 : 0;
    std::fill(row + n, row + cols, pad_id);
    if (mask) {
      uint8_t* m = mask + static_cast<int64_t>(r) * cols;
      std::memset(m, 1, static_cast<size_t>(n));
      std::memset(m + n, 0, static_cast<size_t>(cols - n));
    }
    if (lengths) lengths[r] = static_cast<int32_t>(n);
    if (labels) labels[r] = src.label ? src.label(indices[r]) : 0;
  }
  if (cache_hits) *cache_hits = hits;
  return cols;
}

int64_t PaddedBatch::real_tokens() const {
  int64_t n = 0;
  for (int32_t l : lengths) n += l;
  return n;
}

double PaddedBatch::padding_waste() const {
  const double cells = static_cast<double>(rows) * static_cast<double>(cols);
  return cells > 0 ? 1.0 - static_cast<double>(real_tokens()) / cells : 0.0;
}

PaddedBatch pad_batch(const SequenceSource& src, std::span<const int64_t> indices, int64_t max_len, int32_t pad_id) {
  PaddedBatch b;
  b.rows = static_cast<int64_t>(indices.size());
  for (int64_t i : indices)
    if (i >= 0 && static_cast<size_t>(i) < src.lengths.size())
      b.cols = std::max(b.cols, std::min(src.lengths[static_cast<size_t>(i)], max_len));
  b.ids.resize(static_cast<size_t>(b.rows * b.cols));
  b.mask.resize(b.ids.size());
  b.lengths.resize(static_cast<size_t>(b.rows));
  if (src.label) b.labels.resize(static_cast<size_t>(b.rows));
  pad_into(src, indices, max_len, pad_id, b.ids.data(), b.lengths.data(), b.mask.data(),
           src.label ? b.labels.data() : nullptr);
  return b;
}

// ---- the loader source -------------------------------------------------------------

RecordBatchSource::RecordBatchSource(const SequenceSource& src, const BucketingOptions& options, int32_t pad_id)
    : src_(src), options_(options), pad_id_(pad_id) {
  if (!src_.fetch) throw core::ConfigError("record batches: the sequence source has no fetch function");
  const auto first = plan_for(0);
  per_epoch_ = first->batches.size();
  if (per_epoch_ == 0)
    throw core::ConfigError("record batches: no batch survives filtering (" + std::to_string(src_.lengths.size()) +
                            " records, " + std::to_string(first->dropped_too_long) + " longer than max_len " +
                            std::to_string(options_.max_len) + ", " + std::to_string(first->dropped_empty) +
                            " empty)");
  // The widest batch any epoch can produce: plans of other epochs keep the
  // same records, only grouped differently.
  for (size_t i = 0; i < src_.lengths.size(); ++i) {
    const int64_t len = src_.lengths[i];
    if (len > 0 && (len <= options_.max_len || options_.truncate))
      max_cols_ = std::max(max_cols_, std::min(len, options_.max_len));
  }
}

BatchCapacity RecordBatchSource::capacity() const {
  BatchCapacity c;
  c.rows = options_.batch_size;
  c.cols = max_cols_;
  c.lengths = true;
  c.mask = true;
  c.labels = static_cast<bool>(src_.label);
  return c;
}

std::shared_ptr<const BatchPlan> RecordBatchSource::plan_for(uint64_t epoch) const {
  // Planned under the lock: workers that need the same epoch would otherwise
  // all compute it, and a plan is needed once per epoch.
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [e, p] : plans_)
    if (e == epoch) return p;
  auto p = std::make_shared<const BatchPlan>(plan_batches(src_.lengths, options_, epoch));
  if (plans_.size() >= 2) plans_.erase(plans_.begin());
  plans_.emplace_back(epoch, p);
  return p;
}

BatchPlan RecordBatchSource::plan(uint64_t epoch) const { return *plan_for(epoch); }

void RecordBatchSource::fill(uint64_t global_index, Batch& out) const {
  const auto p = plan_for(global_index / per_epoch_);
  const std::vector<int64_t>& rows = p->batches[global_index % per_epoch_];
  out.rows = static_cast<int64_t>(rows.size());
  out.cols = pad_into(src_, rows, options_.max_len, pad_id_, out.inputs, out.lengths, out.mask, out.labels,
                      &out.cache_hits);
}

}  // namespace brisk::data
