// The response cache; see brisk/serve/response_cache.h.
#include "brisk/serve/response_cache.h"

#include <cstring>

#include "brisk/infer/grammar.h"
#include "brisk/infer/json_schema.h"

namespace brisk::serve {

namespace {

// Appends a value's bytes: the key is compared byte for byte, never parsed.
template <class T>
void put_raw(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

void put_string(std::string& out, const std::string& s) {
  put_raw(out, uint64_t(s.size()));
  out += s;
}

}  // namespace

ResponseCache::ResponseCache(int64_t budget_bytes, Metrics& metrics)
    : budget_(std::max<int64_t>(0, budget_bytes)), metrics_(metrics) {
  metrics_.response_cache_budget = budget_;
}

std::string ResponseCache::key_of(const Request& r, const std::string& model) {
  if (!r.deterministic) return {};
  std::string k;
  put_string(k, model);
  put_raw(k, uint64_t(r.choices.size()));
  put_raw(k, r.n);  // best_of: how many of them the answer shows
  for (const CompletionRequest& c : r.choices) {
    const infer::SamplingParams& p = c.params;
    put_raw(k, uint64_t(c.prompt.size()));
    k.append(reinterpret_cast<const char*>(c.prompt.data()), c.prompt.size() * sizeof(int32_t));
    put_raw(k, p.max_tokens);
    put_raw(k, p.min_tokens);
    put_raw(k, uint8_t(p.json_object));
    put_string(k, p.json_schema ? p.json_schema->text() : std::string());
    put_string(k, p.grammar ? p.grammar->source() : std::string());
    put_raw(k, p.temperature);
    put_raw(k, p.top_k);
    put_raw(k, p.top_p);
    put_raw(k, p.min_p);
    put_raw(k, p.repetition_penalty);
    put_raw(k, p.frequency_penalty);
    put_raw(k, p.presence_penalty);
    put_raw(k, uint64_t(p.logit_bias.size()));
    for (const auto& [t, bias] : p.logit_bias) {
      put_raw(k, t);
      put_raw(k, bias);
    }
    put_raw(k, p.greedy() ? uint64_t(0) : p.seed);  // greedy: the seed changes nothing
    put_raw(k, uint64_t(p.stop_tokens.size()));
    k.append(reinterpret_cast<const char*>(p.stop_tokens.data()), p.stop_tokens.size() * sizeof(int32_t));
    put_raw(k, uint64_t(p.banned_tokens.size()));
    k.append(reinterpret_cast<const char*>(p.banned_tokens.data()), p.banned_tokens.size() * sizeof(int32_t));
    put_raw(k, uint64_t(p.stop.size()));
    for (const std::string& s : p.stop) put_string(k, s);
    put_raw(k, p.logprobs);
    put_raw(k, p.prompt_logprobs);  // (echo itself is the builder's: the events are the same)
    put_raw(k, uint8_t(c.hide_logprobs));
  }
  return k;
}

int64_t ResponseCache::size_of(const std::string& key, const ChoiceEvents& events) {
  int64_t bytes = int64_t(sizeof(Entry) + key.size());
  for (const auto& choice : events) {
    bytes += int64_t(sizeof(choice) + choice.size() * sizeof(infer::TokenEvent));
    for (const infer::TokenEvent& e : choice) {
      bytes += int64_t(e.choice.top.size() * sizeof(e.choice.top[0]) + e.stop_matched.size());
      for (const infer::TokenChoice& c : e.prompt_logprobs)
        bytes += int64_t(sizeof(c) + c.top.size() * sizeof(c.top[0]));
    }
  }
  return bytes;
}

std::optional<ChoiceEvents> ResponseCache::get(const std::string& key) {
  if (!enabled() || key.empty()) return std::nullopt;
  std::lock_guard lk(m_);
  auto it = index_.find(key);
  if (it == index_.end()) {
    ++metrics_.response_cache_misses;
    return std::nullopt;
  }
  lru_.splice(lru_.begin(), lru_, it->second);
  ++metrics_.response_cache_hits;
  return it->second->events;
}

void ResponseCache::put(const std::string& key, ChoiceEvents events) {
  if (!enabled() || key.empty()) return;
  const int64_t bytes = size_of(key, events);
  if (bytes > budget_) return;
  std::lock_guard lk(m_);
  if (index_.count(key)) return;  // two identical requests ran at once: keep the first
  while (bytes_ + bytes > budget_ && !lru_.empty()) {
    bytes_ -= lru_.back().bytes;
    index_.erase(lru_.back().key);
    lru_.pop_back();
    ++metrics_.response_cache_evictions;
  }
  lru_.push_front(Entry{key, std::move(events), bytes});
  index_[key] = lru_.begin();
  bytes_ += bytes;
  publish();
}

int64_t ResponseCache::bytes() const {
  std::lock_guard lk(m_);
  return bytes_;
}

void ResponseCache::publish() {
  metrics_.response_cache_bytes = bytes_;
  metrics_.response_cache_entries = int64_t(lru_.size());
}

}  // namespace brisk::serve
