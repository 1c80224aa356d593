// The response cache of `brisk serve` (--response-cache-mb): the engine's
// token events of every choice of a deterministic request (greedy, or with
// a seed), kept so that the same request again is answered without running
// the model.
//
// What is cached is the events, not the bytes sent: a hit is replayed
// through the same builders as a fresh run, so it gets its own id and
// created time and can be streamed or not whichever way the first one was.
// The key is everything that decides the events: the model, each choice's
// prompt tokens and sampling parameters (the seed left out when the choice
// is greedy, where it changes nothing). Least recently used entries leave
// first when the byte budget is full; an entry larger than the whole budget
// is not kept. Hits, misses, evictions and bytes appear in /metrics.
#pragma once

#include <cstdint>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "brisk/infer/engine.h"
#include "brisk/serve/api.h"
#include "brisk/serve/metrics.h"

namespace brisk::serve {

using ChoiceEvents = std::vector<std::vector<infer::TokenEvent>>;  // per choice, in order

class ResponseCache {
 public:
  // budget_bytes 0: the cache is off (every lookup misses, nothing is kept).
  ResponseCache(int64_t budget_bytes, Metrics& metrics);

  bool enabled() const { return budget_ > 0; }
  // The key of a deterministic request; empty for one that is not.
  static std::string key_of(const Request& r, const std::string& model);
  std::optional<ChoiceEvents> get(const std::string& key);
  void put(const std::string& key, ChoiceEvents events);
  int64_t bytes() const;

 private:
  struct Entry {
    std::string key;
    ChoiceEvents events;
    int64_t bytes;
  };
  static int64_t size_of(const std::string& key, const ChoiceEvents& events);
  void publish();  // bytes and entries into the metrics (lock held)

  const int64_t budget_;
  Metrics& metrics_;
  mutable std::mutex m_;
  std::list<Entry> lru_;  // most recently used first
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
  int64_t bytes_ = 0;
};

}  // namespace brisk::serve
