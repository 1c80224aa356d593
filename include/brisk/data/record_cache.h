// A record store behind an LRU cache (cache.h): what an encoder run's loader
// workers read. Each record is cut to its first max_len tokens before it is
// cached, so the budget holds what batches use, not whole 30k-token records,
// and an epoch after the first finds its records decoded (the hit rate the
// run reports).
#pragma once

#include <cstdint>

#include "brisk/data/cache.h"
#include "brisk/data/record_store.h"

namespace brisk::data {

class RecordCache {
 public:
  RecordCache(const RecordStore& store, int64_t max_len, size_t budget_bytes);
  // Record `index`'s first max_len tokens (LruCache::tokens() reads them);
  // *hit (when given) says whether the cache held them.
  LruCache::Value get(int64_t index, bool* hit = nullptr);
  CacheStats stats() const { return cache_.stats(); }

 private:
  const RecordStore& store_;
  int64_t max_len_;
  LruCache cache_;
};

}  // namespace brisk::data
