// The LRU record cache: eviction order, the byte budget under any sequence of
// puts, hit-rate arithmetic, oversized values, token round trips and
// concurrent use from several threads.
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "brisk/data/cache.h"

using namespace brisk::data;

namespace {

std::vector<uint8_t> bytes(size_t n, uint8_t v) { return std::vector<uint8_t>(n, v); }

}  // namespace

TEST(LruCache, EvictsLeastRecentlyUsed) {
  LruCache c(30);  // three entries of 1-byte key + 9 bytes
  EXPECT_TRUE(c.put("a", bytes(9, 1)));
  EXPECT_TRUE(c.put("b", bytes(9, 2)));
  EXPECT_TRUE(c.put("c", bytes(9, 3)));
  EXPECT_EQ(c.keys_by_recency(), (std::vector<std::string>{"c", "b", "a"}));
  ASSERT_TRUE(c.get("a"));  // a becomes the most recent
  EXPECT_TRUE(c.put("d", bytes(9, 4)));
  EXPECT_EQ(c.keys_by_recency(), (std::vector<std::string>{"d", "a", "c"}));
  EXPECT_FALSE(c.contains("b"));
  EXPECT_EQ(c.stats().evictions, 1u);

  // A larger value evicts as many as it needs, oldest first.
  EXPECT_TRUE(c.put("e", bytes(19, 5)));
  EXPECT_EQ(c.keys_by_recency(), (std::vector<std::string>{"e", "d"}));
  EXPECT_EQ(c.stats().evictions, 3u);
  EXPECT_EQ(c.stats().bytes_used, 30u);
  EXPECT_EQ(c.stats().entries, 2u);

  // Replacing a key updates its bytes and recency without an eviction.
  EXPECT_TRUE(c.put("d", bytes(4, 6)));
  EXPECT_EQ(c.keys_by_recency(), (std::vector<std::string>{"d", "e"}));
  EXPECT_EQ(c.stats().bytes_used, 25u);
  EXPECT_EQ(*c.get("d"), bytes(4, 6));
  EXPECT_EQ(c.stats().evictions, 3u);
}

TEST(LruCache, HitRateArithmetic) {
  LruCache c(1000);
  EXPECT_EQ(c.stats().hit_rate(), 0.0);
  c.put("x", bytes(10, 1));
  EXPECT_TRUE(c.get("x"));
  EXPECT_TRUE(c.get("x"));
  EXPECT_TRUE(c.get("x"));
  EXPECT_FALSE(c.get("y"));
  const CacheStats s = c.stats();
  EXPECT_EQ(s.hits, 3u);
  EXPECT_EQ(s.misses, 1u);
  EXPECT_DOUBLE_EQ(s.hit_rate(), 0.75);
  EXPECT_FALSE(c.contains("y"));
  EXPECT_EQ(c.stats().misses, 1u) << "contains() is not a lookup";

  int loads = 0;
  auto load = [&](std::string_view k) {
    ++loads;
    return bytes(k.size(), 7);
  };
  EXPECT_EQ(*c.get_or_load("zz", load), bytes(2, 7));
  EXPECT_EQ(*c.get_or_load("zz", load), bytes(2, 7));
  EXPECT_EQ(loads, 1);
  EXPECT_DOUBLE_EQ(c.stats().hit_rate(), 4.0 / 6.0);
}

TEST(LruCache, BudgetRespectedUnderRandomPuts) {
  const size_t budget = 5000;
  LruCache c(budget);
  std::mt19937 rng(1);
  std::vector<size_t> charge(100, 0);  // the charge of each live key (model)
  for (int i = 0; i < 20000; ++i) {
    const int k = int(rng() % 100);
    const size_t n = rng() % 700;
    const std::string key = "key" + std::to_string(k);
    c.put(key, bytes(n, uint8_t(k)));
    const CacheStats s = c.stats();
    ASSERT_LE(s.bytes_used, budget) << "after put " << i;
    if (i % 997 == 0) {
      size_t sum = 0;
      for (const std::string& kk : c.keys_by_recency()) sum += kk.size() + c.get(kk)->size();
      EXPECT_EQ(sum, c.stats().bytes_used);
    }
  }
  // A value that alone exceeds the budget is refused, and drops the old one.
  c.put("big", bytes(10, 1));
  EXPECT_FALSE(c.put("big", bytes(budget, 1)));
  EXPECT_FALSE(c.contains("big"));
  EXPECT_EQ(c.stats().rejected, 1u);
  c.clear();
  EXPECT_EQ(c.stats().bytes_used, 0u);
  EXPECT_EQ(c.stats().entries, 0u);
}

TEST(LruCache, TokensRoundTrip) {
  LruCache c(1 << 20);
  const std::vector<int32_t> t = {50256, 0, -1, 12345, 7};
  c.put("doc", LruCache::pack_tokens(t));
  const auto v = c.get("doc");
  const auto back = LruCache::tokens(v);
  EXPECT_EQ(std::vector<int32_t>(back.begin(), back.end()), t);
  EXPECT_EQ(c.stats().bytes_used, 3u + 5u * 4u);
  EXPECT_TRUE(LruCache::tokens(nullptr).empty());
}

TEST(LruCache, ValuesOutliveEviction) {
  LruCache c(20);
  c.put("a", bytes(10, 9));
  const auto held = c.get("a");
  c.put("b", bytes(15, 1));  // evicts a
  EXPECT_FALSE(c.contains("a"));
  EXPECT_EQ(*held, bytes(10, 9));
}

TEST(LruCache, ConcurrentAccess) {
  // 4 threads over 300 keys whose values name the key; the budget holds
  // about a third of them. Every returned value must be the key's own, the
  // counters must add up and the budget must hold throughout.
  const size_t budget = 100 * (8 + 64);
  LruCache c(budget);
  std::atomic<bool> over_budget{false};
  std::atomic<uint64_t> wrong{0}, loads{0};
  const int threads = 4, ops = 20000;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      std::mt19937 rng(uint32_t(t + 1));
      for (int i = 0; i < ops; ++i) {
        // Skewed keys (a hot set), as epochs over bucketed records give.
        const uint32_t r = rng() % 1000;
        const uint32_t k = r < 700 ? r % 60 : r % 300;
        char key[16];
        std::snprintf(key, sizeof key, "rec%05u", k);
        const auto v = c.get_or_load(key, [&](std::string_view) {
          ++loads;
          return bytes(64, uint8_t(k));
        });
        if (v->size() != 64 || (*v)[0] != uint8_t(k) || (*v)[63] != uint8_t(k)) ++wrong;
        if (i % 64 == 0 && c.stats().bytes_used > budget) over_budget = true;
      }
    });
  for (auto& th : pool) th.join();
  const CacheStats s = c.stats();
  EXPECT_EQ(wrong.load(), 0u);
  EXPECT_FALSE(over_budget.load());
  EXPECT_EQ(s.hits + s.misses, uint64_t(threads * ops));
  EXPECT_EQ(s.misses, loads.load());
  EXPECT_LE(s.bytes_used, budget);
  EXPECT_EQ(s.entries, c.keys_by_recency().size());
  EXPECT_GT(s.hit_rate(), 0.5) << "the hot set fits the budget";
  EXPECT_LT(s.hit_rate(), 1.0);
}
