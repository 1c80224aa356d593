// Cached, truncated records (record_cache.h).
#include "brisk/data/record_cache.h"

#include <algorithm>
#include <cstring>

namespace brisk::data {

RecordCache::RecordCache(const RecordStore& store, int64_t max_len, size_t budget_bytes)
    : store_(store), max_len_(max_len), cache_(budget_bytes) {}

LruCache::Value RecordCache::get(int64_t index, bool* hit) {
  char key[sizeof index];  // the index's bytes: records are immutable, so the index names the value
  std::memcpy(key, &index, sizeof index);
  return cache_.get_or_load(std::string_view(key, sizeof key), [&](std::string_view) {
    Record r = store_.get(index);
    r.tokens.resize(std::min<size_t>(r.tokens.size(), size_t(max_len_)));
    return LruCache::pack_tokens(r.tokens);
  }, hit);
}

}  // namespace brisk::data
