// What `brisk serve` counts, and its Prometheus text exposition at
// GET /metrics (docs/serving.md lists every series).
//
// Counters and gauges are atomics, so the scheduler thread and the HTTP
// threads update them without a lock; histograms take a short mutex. Time
// to first token and inter-token latency are measured by the scheduler, at
// the moment it hands a token to the request (server-side: what a client
// sees adds the network).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace brisk::serve {

// A Prometheus histogram: cumulative counts per upper bound, sum, count.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  // "<name>_bucket{le=...} n" lines, then _sum and _count.
  void render(std::string& out, const std::string& name) const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex m_;
  std::vector<uint64_t> counts_;  // per bucket, non-cumulative; the last is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();

  // Requests answered, by path and HTTP status (an HTTP thread, after the response).
  void count_request(const std::string& path, int status);
  // The scheduler's view, published after each step.
  std::atomic<int64_t> queue_length{0}, slots_busy{0}, kv_blocks_free{0};
  int64_t slots_total = 0, kv_blocks_total = 0;  // set once at start
  std::atomic<uint64_t> prompt_tokens{0}, generation_tokens{0}, engine_steps{0};
  std::atomic<uint64_t> prefix_cached_tokens{0};  // prompt tokens taken from the engine's prefix cache
  std::atomic<int64_t> kv_blocks_cached{0};
  std::atomic<bool> draining{false};
  // The response cache (response_cache.h).
  std::atomic<uint64_t> response_cache_hits{0}, response_cache_misses{0}, response_cache_evictions{0};
  std::atomic<int64_t> response_cache_bytes{0}, response_cache_entries{0};
  int64_t response_cache_budget = 0;  // set once at start
  Histogram time_to_first_token, inter_token_latency, request_latency;

  // The whole exposition (text format 0.0.4).
  std::string render() const;

 private:
  mutable std::mutex m_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
};

}  // namespace brisk::serve
