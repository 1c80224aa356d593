// An LRU cache of decoded or tokenized records under a byte budget.
//
// Decoding a record (an LMDB read, zstd, BPE) costs far more than keeping its
// tokens, and encoder epochs revisit the same records, so a bounded cache in
// front of the store pays for itself. The budget is in bytes, not entries,
// because records range from a 20-token subject line to a 30k-residue
// protein. Values are shared, immutable buffers: a reader keeps what it got
// even if the entry is evicted a moment later, and a hit copies nothing.
//
// Thread-safe with one mutex: loader workers look up a few records per batch,
// far below the rate where a sharded map would matter.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace brisk::data {

struct CacheStats {
  uint64_t hits = 0, misses = 0, insertions = 0, evictions = 0;
  uint64_t rejected = 0;  // values larger than the whole budget, never stored
  size_t bytes_used = 0, budget_bytes = 0, entries = 0;
  double hit_rate() const {  // hits / lookups; 0 before the first lookup
    const uint64_t n = hits + misses;
    return n ? static_cast<double>(hits) / static_cast<double>(n) : 0.0;
  }
};

class LruCache {
 public:
  using Value = std::shared_ptr<const std::vector<uint8_t>>;

  explicit LruCache(size_t budget_bytes);

  // The value for key (and marks it most recently used), or null: a lookup,
  // counted as a hit or a miss.
  Value get(std::string_view key);
  // Inserts or replaces, then evicts least recently used entries until the
  // budget holds. An entry is charged key.size() + value size. Returns false
  // (and stores nothing) when that alone exceeds the budget.
  bool put(std::string_view key, std::vector<uint8_t> bytes);
  // get(), or on a miss load(key) outside the lock and put the result. Two
  // threads missing the same key both load it; the second put replaces the
  // first with equal bytes. *hit (when given) says which it was.
  Value get_or_load(std::string_view key, const std::function<std::vector<uint8_t>(std::string_view)>& load,
                    bool* hit = nullptr);

  bool contains(std::string_view key) const;  // no stats, no reordering
  void clear();                               // keeps the counters
  CacheStats stats() const;
  // Keys from most to least recently used (tests, debugging).
  std::vector<std::string> keys_by_recency() const;

  // Tokens as cache values: int32 ids, native byte order.
  static std::vector<uint8_t> pack_tokens(std::span<const int32_t> tokens);
  static std::span<const int32_t> tokens(const Value& v);

 private:
  struct Entry {
    std::string key;
    Value value;
    size_t charge;
  };
  bool insert(std::string_view key, Value value);
  void evict_to(size_t budget);

  size_t budget_;
  mutable std::mutex mu_;
  std::list<Entry> lru_;  // front = most recently used
  std::unordered_map<std::string_view, std::list<Entry>::iterator> index_;  // views into Entry::key
  CacheStats stats_;
};

}  // namespace brisk::data
