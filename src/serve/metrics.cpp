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

// One unlabelled series: its HELP and TYPE lines, then its value.
void series(std::string& out, const char* name, const char* type, const char* help, int64_t value) {
  header(out, name, type, help);
  line(out, "%s %" PRId64, name, value);
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
                                        "/metrics", "/tokenize", "/detokenize", "/classify", "/v1/embeddings"};
  const bool known = std::find(std::begin(kRoutes), std::end(kRoutes), path) != std::end(kRoutes);
  const bool one_model = path.rfind("/v1/models/", 0) == 0;  // one series for every id asked for
  std::lock_guard lk(m_);
  ++requests_[{known ? path : one_model ? std::string("/v1/models/{id}") : std::string("other"), status}];
}

std::string Metrics::render() const {
  std::string out;
  header(out, "brisk_requests_total", "counter", "HTTP requests answered, by path and status.");
  {
    std::lock_guard lk(m_);
    for (const auto& [key, n] : requests_)
      line(out, "brisk_requests_total{path=\"%s\",status=\"%d\"} %" PRIu64, key.first.c_str(), key.second, n);
  }
  series(out, "brisk_queue_length", "gauge", "Requests waiting for a slot.", int64_t(queue_length.load()));
  series(out, "brisk_slots_busy", "gauge", "Sequences decoding now.", int64_t(slots_busy.load()));
  series(out, "brisk_slots_total", "gauge", "Sequences the engine decodes at once (--slots).", int64_t(slots_total));
  series(out, "brisk_kv_blocks_used", "gauge",
         "Key/value cache blocks held by running sequences (cached prefixes nobody holds count as free).",
         int64_t(kv_blocks_total - kv_blocks_free.load()));
  series(out, "brisk_kv_blocks_total", "gauge", "Key/value cache blocks in the pool.", int64_t(kv_blocks_total));
  series(out, "brisk_prompt_tokens_total", "counter",
         "Prompt tokens of admitted requests.", int64_t(prompt_tokens.load()));
  series(out, "brisk_prefix_cache_hit_tokens_total", "counter",
         "Prompt tokens taken from the prefix cache (not computed again); "
         "over brisk_prompt_tokens_total: the hit ratio.",
         int64_t(prefix_cached_tokens.load()));
  series(out, "brisk_kv_blocks_cached", "gauge",
         "Key/value cache blocks holding a registered prompt prefix.", int64_t(kv_blocks_cached.load()));
  series(out, "brisk_generation_tokens_total", "counter", "Tokens generated.", int64_t(generation_tokens.load()));
  series(out, "brisk_engine_steps_total", "counter",
         "Engine steps (one forward over every running sequence).", int64_t(engine_steps.load()));
  series(out, "brisk_response_cache_hits_total", "counter",
         "Deterministic requests answered from the response cache.", int64_t(response_cache_hits.load()));
  series(out, "brisk_response_cache_misses_total", "counter",
         "Deterministic requests the response cache did not hold.", int64_t(response_cache_misses.load()));
  series(out, "brisk_response_cache_evictions_total", "counter",
         "Entries dropped to stay within the byte budget.", int64_t(response_cache_evictions.load()));
  series(out, "brisk_response_cache_bytes", "gauge",
         "Bytes held by the response cache.", int64_t(response_cache_bytes.load()));
  series(out, "brisk_response_cache_budget_bytes", "gauge",
         "The response cache's byte budget (--response-cache-mb).", int64_t(response_cache_budget));
  series(out, "brisk_response_cache_entries", "gauge",
         "Responses held by the response cache.", int64_t(response_cache_entries.load()));
  series(out, "brisk_draining", "gauge",
         "1 after SIGTERM/SIGINT: new requests get 503 while running ones finish.", int64_t(draining.load() ? 1 : 0));
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
