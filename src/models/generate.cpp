// Sampling (generate.h). The context is padded up to a multiple of 64 tokens
// so a handful of cached programs serve every prompt length; causal attention
// makes the padding invisible to the positions that are read.
#include "brisk/models/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "brisk/core/error.h"

namespace brisk::models {

void validate(const SampleOptions& o) {
  if (o.max_new_tokens < 0) throw core::ConfigError("--max-new must not be negative");
  if (o.temperature < 0) throw core::ConfigError("--temperature must be >= 0");
  if (o.top_k < 0) throw core::ConfigError("--top-k must be >= 0");
  if (!(o.top_p > 0 && o.top_p <= 1)) throw core::ConfigError("--top-p must be in (0, 1]");
}

int32_t sample_token(const float* logits, int64_t vocab, const SampleOptions& o, uint64_t draw) {
  if (o.temperature == 0.f) return int32_t(std::max_element(logits, logits + vocab) - logits);
  std::vector<int32_t> idx(static_cast<size_t>(vocab));
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  size_t keep = idx.size();
  if (o.top_k > 0) keep = std::min(keep, size_t(o.top_k));
  std::vector<double> p(keep);
  const double top = logits[idx[0]];
  double total = 0;
  for (size_t i = 0; i < keep; ++i) total += p[i] = std::exp((double(logits[idx[i]]) - top) / o.temperature);
  if (o.top_p < 1.f) {
    double cum = 0;
    size_t n = 0;
    while (n < keep && cum < o.top_p * total) cum += p[n++];
    keep = std::max<size_t>(1, n);
    total = cum;
  }
  std::mt19937_64 rng(o.seed * 0x9e3779b97f4a7c15ull + draw);
  double u = std::uniform_real_distribution<double>(0, total)(rng);
  for (size_t i = 0; i < keep; ++i) {
    u -= p[i];
    if (u <= 0) return idx[i];
  }
  return idx[keep - 1];
}

std::vector<int32_t> generate(Gpt& model, std::vector<int32_t> prompt, const SampleOptions& options,
                              const std::function<bool(int32_t)>& on_token) {
  validate(options);
  const GptConfig& c = model.config();
  for (size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= c.vocab_size)
      throw core::Error("prompt token " + std::to_string(prompt[i]) + " at position " + std::to_string(i) +
                        " is outside the model's vocabulary [0, " + std::to_string(c.vocab_size) + ")");
  if (prompt.empty()) prompt.push_back(0);
  std::vector<int32_t> window;
  for (int64_t n = 0; n < options.max_new_tokens; ++n) {
    const int64_t len = std::min<int64_t>(int64_t(prompt.size()), c.block_size);
    const int64_t padded = std::min<int64_t>(c.block_size, (len + 63) / 64 * 64);
    window.assign(prompt.end() - len, prompt.end());
    window.resize(size_t(padded), 0);
    const float* logits = model.logits(window.data(), 1, padded);
    const int32_t next = sample_token(logits + (len - 1) * c.vocab_size, c.vocab_size, options, uint64_t(n));
    prompt.push_back(next);
    if (on_token && !on_token(next)) break;
  }
  return prompt;
}

}  // namespace brisk::models
