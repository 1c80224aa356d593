// Text generation by sampling from a GPT: temperature, top-k and top-p
// (nucleus) filtering, a seed for reproducible samples, greedy when the
// temperature is 0. This version recomputes the context each token; the
// KV-cache decoder of the serving path replaces it for long outputs.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "brisk/models/gpt.h"

namespace brisk::models {

struct SampleOptions {
  int64_t max_new_tokens = 200;
  float temperature = 0.8f;  // 0: greedy
  int top_k = 0;             // 0: off
  float top_p = 1.0f;        // 1: off
  uint64_t seed = 1;
};

// Validates options; throws ConfigError naming the bad one.
void validate(const SampleOptions& o);

// Picks the next token from one row of logits.
int32_t sample_token(const float* logits, int64_t vocab, const SampleOptions& o, uint64_t draw);

// Appends up to max_new_tokens to `prompt`; calls on_token for each new id
// (return false to stop early). Throws core::Error if a prompt id is outside
// the model's vocabulary.
std::vector<int32_t> generate(Gpt& model, std::vector<int32_t> prompt, const SampleOptions& options,
                              const std::function<bool(int32_t)>& on_token = {});

}  // namespace brisk::models
