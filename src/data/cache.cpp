// The LRU cache (cache.h): a list in recency order plus a hash index into it.
// The index is keyed by views of the keys stored in the list nodes, which
// never move (splicing relinks nodes), so each key is stored once.
#include "brisk/data/cache.h"

#include <cstring>

namespace brisk::data {

LruCache::LruCache(size_t budget_bytes) : budget_(budget_bytes) { stats_.budget_bytes = budget_bytes; }

LruCache::Value LruCache::get(std::string_view key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(key);
  if (it == index_.end()) {
    ++stats_.misses;
    return nullptr;
  }
  ++stats_.hits;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->value;
}

bool LruCache::put(std::string_view key, std::vector<uint8_t> bytes) {
  // Built outside the lock: the move into a shared buffer allocates.
  return insert(key, std::make_shared<const std::vector<uint8_t>>(std::move(bytes)));
}

bool LruCache::insert(std::string_view key, Value value) {
  const size_t charge = key.size() + value->size();
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = index_.find(key); it != index_.end()) {
    const auto node = it->second;
    stats_.bytes_used -= node->charge;
    index_.erase(it);
    lru_.erase(node);
  }
  if (charge > budget_) {
    ++stats_.rejected;
    stats_.entries = lru_.size();
    return false;
  }
  // Make room first, so bytes_used never exceeds the budget, even briefly.
  evict_to(budget_ - charge);
  lru_.push_front(Entry{std::string(key), std::move(value), charge});
  index_.emplace(lru_.front().key, lru_.begin());
  stats_.bytes_used += charge;
  stats_.entries = lru_.size();
  ++stats_.insertions;
  return true;
}

LruCache::Value LruCache::get_or_load(std::string_view key,
                                      const std::function<std::vector<uint8_t>(std::string_view)>& load,
                                      bool* hit) {
  Value v = get(key);
  if (hit) *hit = v != nullptr;
  if (v) return v;
  // The caller gets the loaded bytes even when they do not fit the budget.
  v = std::make_shared<const std::vector<uint8_t>>(load(key));
  insert(key, v);
  return v;
}

void LruCache::evict_to(size_t budget) {
  while (stats_.bytes_used > budget && !lru_.empty()) {
    Entry& e = lru_.back();
    stats_.bytes_used -= e.charge;
    index_.erase(e.key);
    lru_.pop_back();
    ++stats_.evictions;
  }
  stats_.entries = lru_.size();
}

bool LruCache::contains(std::string_view key) const {
  std::lock_guard<std::mutex> lock(mu_);
  return index_.count(key) != 0;
}

void LruCache::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  index_.clear();
  lru_.clear();
  stats_.bytes_used = 0;
  stats_.entries = 0;
}

CacheStats LruCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

std::vector<std::string> LruCache::keys_by_recency() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> keys;
  keys.reserve(lru_.size());
  for (const Entry& e : lru_) keys.push_back(e.key);
  return keys;
}

std::vector<uint8_t> LruCache::pack_tokens(std::span<const int32_t> tokens) {
  std::vector<uint8_t> bytes(tokens.size_bytes());
  if (!bytes.empty()) std::memcpy(bytes.data(), tokens.data(), bytes.size());
  return bytes;
}

std::span<const int32_t> LruCache::tokens(const Value& v) {
  if (!v) return {};
  // operator new aligns vector storage to at least 16 bytes, enough for int32.
  return {reinterpret_cast<const int32_t*>(v->data()), v->size() / sizeof(int32_t)};
}

}  // namespace brisk::data
