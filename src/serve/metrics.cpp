// Prometheus metrics of `brisk serve`; see brisk/serve/metrics.h.
#include "brisk/serve/metrics.h"

#include <algorithm>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>

namespace brisk::serve {

namespace {

void line(std::string& out, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void line(std::string& out, const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  const int n = std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (n > 0) out.append(buf, size_t(std::min<int>(n, int(sizeof buf) - 1)));
  out += '\n';
}

void header(std::string& out, const char* name, const char* type, const char* help) {
  line(out, "# HELP %s %s", name, help);
  line(out, "# TYPE %s %s", name, type);
}

// Seconds: 5 ms .. 30 s, roughly doubling (TTFT and whole requests).
std::vector<double> latency_bounds() { return {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}; }
// Seconds: 1 ms .. 1 s (the gap between two tokens of one stream).
std::vector<double> token_bounds() { return {0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1}; }

}  // namespace

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  std::lock_guard lk(m_);
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::render(std::string& out, const std::string& name) const {
  std::lock_guard lk(m_);
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    line(out, "%s_bucket{le=\"%g\"} %" PRIu64, name.c_str(), bounds_[i], cum);
  }
  line(out, "%s_bucket{le=\"+Inf\"} %" PRIu64, name.c_str(), count_);
  line(out, "%s_sum %.6f", name.c_str(), sum_);
  line(out, "%s_count %" PRIu64, name.c_str(), count_);
}

Metrics::Metrics()
    : time_to_first_token(latency_bounds()), inter_token_latency(token_bounds()), request_latency(latency_bounds()) {}

void Metrics::count_request(const std::string& path, int status) {
  // Only the server's own routes get a series of their own: a client
  // probing random paths must not grow the label set without bound.
  static const char* const kRoutes[] = {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health",
                                        "/metrics", "/tokenize", "/detokenize"};
  const bool known = std::find(std::begin(kRoutes), std::end(kRoutes), path) != std::end(kRoutes);
  std::lock_guard lk(m_);
  ++requests_[{known ? path : std::string("other"), status}];
}

std::string Metrics::render() const {
  std::string out;
  header(out, "brisk_requests_total", "counter", "HTTP requests answered, by path and status.");
  {
    std::lock_guard lk(m_);
    for (const auto& [key, n] : requests_)
      line(out, "brisk_requests_total{path=\"%s\",status=\"%d\"} %" PRIu64, key.first.c_str(), key.second, n);
  }
  header(out, "brisk_queue_length", "gauge", "Requests waiting for a slot.");
  line(out, "brisk_queue_length %" PRId64, queue_length.load());
  header(out, "brisk_slots_busy", "gauge", "Sequences decoding now.");
  line(out, "brisk_slots_busy %" PRId64, slots_busy.load());
  header(out, "brisk_slots_total", "gauge", "Sequences the engine decodes at once (--slots).");
  line(out, "brisk_slots_total %" PRId64, slots_total);
  header(out, "brisk_kv_blocks_used", "gauge",
         "Key/value cache blocks held by running sequences (cached prefixes nobody holds count as free).");
  line(out, "brisk_kv_blocks_used %" PRId64, kv_blocks_total - kv_blocks_free.load());
  header(out, "brisk_kv_blocks_total", "gauge", "Key/value cache blocks in the pool.");
  line(out, "brisk_kv_blocks_total %" PRId64, kv_blocks_total);
  header(out, "brisk_prompt_tokens_total", "counter", "Prompt tokens of admitted requests.");
  line(out, "brisk_prompt_tokens_total %" PRIu64, prompt_tokens.load());
  header(out, "brisk_prefix_cache_hit_tokens_total", "counter",
         "Prompt tokens taken from the prefix cache (not computed again); over brisk_prompt_tokens_total: the hit ratio.");
  line(out, "brisk_prefix_cache_hit_tokens_total %" PRIu64, prefix_cached_tokens.load());
  header(out, "brisk_kv_blocks_cached", "gauge", "Key/value cache blocks holding a registered prompt prefix.");
  line(out, "brisk_kv_blocks_cached %" PRId64, kv_blocks_cached.load());
  header(out, "brisk_generation_tokens_total", "counter", "Tokens generated.");
  line(out, "brisk_generation_tokens_total %" PRIu64, generation_tokens.load());
  header(out, "brisk_engine_steps_total", "counter", "Engine steps (one forward over every running sequence).");
  line(out, "brisk_engine_steps_total %" PRIu64, engine_steps.load());
  header(out, "brisk_response_cache_hits_total", "counter", "Deterministic requests answered from the response cache.");
  line(out, "brisk_response_cache_hits_total %" PRIu64, response_cache_hits.load());
  header(out, "brisk_response_cache_misses_total", "counter", "Deterministic requests the response cache did not hold.");
  line(out, "brisk_response_cache_misses_total %" PRIu64, response_cache_misses.load());
  header(out, "brisk_response_cache_evictions_total", "counter", "Entries dropped to stay within the byte budget.");
  line(out, "brisk_response_cache_evictions_total %" PRIu64, response_cache_evictions.load());
  header(out, "brisk_response_cache_bytes", "gauge", "Bytes held by the response cache.");
  line(out, "brisk_response_cache_bytes %" PRId64, response_cache_bytes.load());
  header(out, "brisk_response_cache_budget_bytes", "gauge", "The response cache's byte budget (--response-cache-mb).");
  line(out, "brisk_response_cache_budget_bytes %" PRId64, response_cache_budget);
  header(out, "brisk_response_cache_entries", "gauge", "Responses held by the response cache.");
  line(out, "brisk_response_cache_entries %" PRId64, response_cache_entries.load());
  header(out, "brisk_draining", "gauge", "1 after SIGTERM/SIGINT: new requests get 503 while running ones finish.");
  line(out, "brisk_draining %d", draining.load() ? 1 : 0);
  header(out, "brisk_time_to_first_token_seconds", "histogram",
         "From a request's arrival in the queue to its first token.");
  time_to_first_token.render(out, "brisk_time_to_first_token_seconds");
  header(out, "brisk_inter_token_latency_seconds", "histogram", "Between two consecutive tokens of one request.");
  inter_token_latency.render(out, "brisk_inter_token_latency_seconds");
  header(out, "brisk_request_duration_seconds", "histogram",
         "From a request's arrival in the queue to its last token.");
  request_latency.render(out, "brisk_request_duration_seconds");
  return out;
}

}  // namespace brisk::serve
