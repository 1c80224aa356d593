// The sampler (sampler.h). Top-k keeps the k largest logits with a partial
// selection (std::nth_element, O(vocab)) and sorts only those; without top-k
// but with top-p, the candidates are the tokens whose logit is within ~30
// nats of the best (the rest cannot matter to any p < 1 in float) before
// sorting. Greedy is one pass.
#include "brisk/infer/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "brisk/core/error.h"

namespace brisk::infer {

void validate(const SamplingParams& p, int64_t vocab) {
  using core::ConfigError;
  if (p.max_tokens < 0) throw ConfigError("max_tokens must not be negative, got " + std::to_string(p.max_tokens));
  if (!(p.temperature >= 0) || !std::isfinite(p.temperature)) throw ConfigError("temperature must be >= 0");
  if (p.top_k < 0) throw ConfigError("top_k must be >= 0, got " + std::to_string(p.top_k));
  if (!(p.top_p > 0 && p.top_p <= 1)) throw ConfigError("top_p must be in (0, 1]");
  if (!(p.min_p >= 0 && p.min_p <= 1)) throw ConfigError("min_p must be in [0, 1]");
  if (!(p.repetition_penalty > 0) || !std::isfinite(p.repetition_penalty))
    throw ConfigError("repetition_penalty must be > 0 (1 = off)");
  if (!std::isfinite(p.frequency_penalty) || std::fabs(p.frequency_penalty) > 2)
    throw ConfigError("frequency_penalty must be in [-2, 2]");
  if (!std::isfinite(p.presence_penalty) || std::fabs(p.presence_penalty) > 2)
    throw ConfigError("presence_penalty must be in [-2, 2]");
  if (p.logprobs > 20) throw ConfigError("logprobs must be at most 20, got " + std::to_string(p.logprobs));
  if (p.prompt_logprobs > 20)
    throw ConfigError("prompt_logprobs must be at most 20, got " + std::to_string(p.prompt_logprobs));
  for (int32_t t : p.stop_tokens)
    if (t < 0 || t >= vocab)
      throw ConfigError("stop token " + std::to_string(t) + " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
  for (const std::string& s : p.stop)
    if (s.empty()) throw ConfigError("a stop string must not be empty");
}

void SequenceHistory::add_prompt(const std::vector<int32_t>& ids) {
  for (int32_t id : ids)
    if (!seen_[size_t(id)]) {
      seen_[size_t(id)] = 1;
      distinct_.push_back(id);
    }
}

void SequenceHistory::add_generated(int32_t id) {
  ++counts_[size_t(id)];
  generated_.push_back(id);
  if (!seen_[size_t(id)]) {
    seen_[size_t(id)] = 1;
    distinct_.push_back(id);
  }
}

namespace {

void apply_penalties(float* logits, const SamplingParams& p, const SequenceHistory& h) {
  if (p.repetition_penalty != 1.f)
    for (int32_t t : h.distinct()) {
      float& l = logits[t];
      l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
    }
  if (p.frequency_penalty != 0.f || p.presence_penalty != 0.f)
    for (int32_t t : h.distinct())
      if (const int32_t n = h.count(t); n > 0) logits[t] -= float(n) * p.frequency_penalty + p.presence_penalty;
}

// The first index of the largest logit, in one pass over memory: a
// vectorised max per chunk of 1024, and a search only in a chunk that raises
// it (that chunk is still in L1). std::max_element's compare-and-track chain
// was ~4x slower over a 50k vocabulary, and a max pass followed by a search
// pass read batched decoding's logits (16 rows x 200 KB, past L2) twice.
// (NaN logits are not expected; with one, the result is some index rather
// than the NaN's.)
int32_t argmax(const float* logits, int64_t vocab) {
  constexpr int64_t kChunk = 1024;
  float best = -std::numeric_limits<float>::infinity();
  int64_t at = 0;
  for (int64_t c0 = 0; c0 < vocab; c0 += kChunk) {
    const float* chunk = logits + c0;
    const int64_t n = std::min(kChunk, vocab - c0);
    float top = -std::numeric_limits<float>::infinity();
    // std::max(top, x) spelled out: GCC 12 keeps the loop scalar with std::max itself.
#pragma omp simd reduction(max : top)
    for (int64_t i = 0; i < n; ++i) top = top < chunk[i] ? chunk[i] : top;
    if (top > best) {
      best = top;
      at = c0 + (std::find(chunk, chunk + n, top) - chunk);
    }
  }
  return int32_t(at);
}

// log(sum(exp(logits))) over the whole vocabulary.
double log_sum_exp(const float* logits, int64_t vocab) {
  const float top = *std::max_element(logits, logits + vocab);
  double s = 0;
  for (int64_t i = 0; i < vocab; ++i) s += std::exp(double(logits[i]) - top);
  return top + std::log(s);
}

void fill_logprobs(const float* logits, int64_t vocab, int n, TokenChoice& c, std::vector<int32_t>& scratch) {
  const double lse = log_sum_exp(logits, vocab);
  c.logprob = float(double(logits[c.token]) - lse);
  if (n <= 0) return;
  scratch.resize(size_t(vocab));
  std::iota(scratch.begin(), scratch.end(), 0);
  const auto better = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  std::partial_sort(scratch.begin(), scratch.begin() + n, scratch.end(), better);
  for (int i = 0; i < n; ++i) c.top.push_back({scratch[size_t(i)], float(double(logits[scratch[size_t(i)]]) - lse)});
}

}  // namespace

TokenChoice score_token(const float* logits, int64_t vocab, int32_t token, int n, SamplerScratch& work) {
  TokenChoice c;
  c.token = token;
  fill_logprobs(logits, vocab, n, c, work.ids);
  return c;
}

TokenChoice sample(float* logits, int64_t vocab, const SamplingParams& p, const SequenceHistory& history,
                   uint64_t index, SamplerScratch& work) {
  std::vector<int32_t>& scratch = work.ids;
  std::vector<double>& prob = work.prob;
  apply_penalties(logits, p, history);
  TokenChoice c;
  if (p.temperature == 0.f) {
    c.token = argmax(logits, vocab);
    if (p.logprobs >= 0) fill_logprobs(logits, vocab, p.logprobs, c, scratch);
    return c;
  }
  // Candidates: the top-k, or every token that can carry probability.
  const float top = *std::max_element(logits, logits + vocab);
  const float inv_t = 1.f / p.temperature;
  scratch.clear();
  const auto better = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  if (p.top_k > 0 && p.top_k < vocab) {
    scratch.resize(size_t(vocab));
    std::iota(scratch.begin(), scratch.end(), 0);
    std::nth_element(scratch.begin(), scratch.begin() + (p.top_k - 1), scratch.end(), better);
    scratch.resize(size_t(p.top_k));
  } else {
    const float floor = top - 30.f * p.temperature;  // exp(-30) ~ 1e-13 of the top: nothing any filter keeps
    for (int32_t i = 0; i < vocab; ++i)
      if (logits[i] >= floor) scratch.push_back(i);
  }
  std::sort(scratch.begin(), scratch.end(), better);
  // Probabilities of the candidates (relative to the top one).
  prob.resize(scratch.size());
  double total = 0;
  for (size_t i = 0; i < scratch.size(); ++i) total += prob[i] = std::exp(double(logits[scratch[i]] - top) * inv_t);
  size_t keep = scratch.size();
  if (p.min_p > 0) {  // prob[0] is the top token's (1 before normalising)
    size_t n = 1;
    while (n < keep && prob[n] >= p.min_p * prob[0]) ++n;
    keep = n;
  }
  if (p.top_p < 1.f) {
    double all = 0;
    for (size_t i = 0; i < keep; ++i) all += prob[i];
    double cum = 0;
    size_t n = 0;
    while (n < keep && cum < p.top_p * all) cum += prob[n++];
    keep = std::max<size_t>(1, n);
  }
  total = 0;
  for (size_t i = 0; i < keep; ++i) total += prob[i];
  // A counter-based draw: (seed, index) -> u, the same wherever the sequence runs.
  std::mt19937_64 rng(p.seed * 0x9e3779b97f4a7c15ull ^ (index + 1) * 0xbf58476d1ce4e5b9ull);
  double u = std::uniform_real_distribution<double>(0, total)(rng);
  c.token = scratch[keep - 1];
  for (size_t i = 0; i < keep; ++i) {
    u -= prob[i];
    if (u <= 0) {
      c.token = scratch[i];
      break;
    }
  }
  if (p.logprobs >= 0) {
    // Log-probabilities under the temperature-scaled softmax, before filtering.
    for (int64_t i = 0; i < vocab; ++i) logits[i] *= inv_t;
    fill_logprobs(logits, vocab, p.logprobs, c, scratch);
  }
  return c;
}

}  // namespace brisk::infer
