// Choosing the next token from a row of logits: the penalties, then
// temperature, top-k, top-p and min-p filtering, then a draw; greedy at
// temperature 0. Each sequence has its own seed and each draw is a function
// of (seed, token index) only, so a sequence samples the same text whatever
// else shares the batch.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace brisk::infer {

class Grammar;
class JsonSchema;

struct SamplingParams {
  // Temperatures below this sample greedily, as 0 does (vLLM's rule): at
  // 1e-39 the scaled logits overflowed and the logprobs came out NaN.
  static constexpr float kGreedyBelow = 1e-5f;

  int64_t max_tokens = 128;
  float temperature = 1.0f;       // 0 (or below kGreedyBelow): greedy
  int top_k = 0;                  // 0: off
  float top_p = 1.0f;             // 1: off
  float min_p = 0.0f;             // 0: off; keeps tokens with p >= min_p * p(top token)
  float repetition_penalty = 1.0f;  // 1: off; > 1 discourages tokens already in the context (CTRL / HF style)
  float frequency_penalty = 0.0f;   // subtracts count * this from a generated token's logit (OpenAI style)
  float presence_penalty = 0.0f;    // subtracts this once from every token generated so far
  // Added to these tokens' logits after the penalties (OpenAI's logit_bias:
  // -100 in effect bans a token, 100 forces it); each bias in [-100, 100].
  std::vector<std::pair<int32_t, float>> logit_bias;
  uint64_t seed = 0;
  std::vector<int32_t> stop_tokens;   // end the sequence after producing one of these
  std::vector<std::string> stop;      // end the sequence when its text contains one of these
  // vLLM's min_tokens: the first min_tokens tokens are never stop tokens
  // (their logits are -inf), and a stop string ending in them does not end
  // the sequence. At most max_tokens.
  int64_t min_tokens = 0;
  // Never drawn: their logits are -inf (the server's ignore_eos bans the
  // end-of-text token, as llama.cpp's server does).
  std::vector<int32_t> banned_tokens;
  // The text must be one JSON object (JsonConstraint, json_constraint.h):
  // a token that cannot continue one is never drawn, no stop token comes
  // before the object closes, and the sequence ends (Finish::stop) when it
  // does. Needs the engine's tokenizer.
  bool json_object = false;
  // With json_object: the text is an instance of this schema (an object or
  // an array; json_schema.h), not just any object; or, for a schema made by
  // JsonSchema::choices (guided_choice), one of its texts.
  std::shared_ptr<const JsonSchema> json_schema;
  // The text is one the grammar derives (GrammarConstraint,
  // grammar_constraint.h: llama.cpp's GBNF, vLLM's guided_grammar and
  // guided_regex): a token whose bytes cannot continue one is never drawn,
  // a stop token only where the text is a whole one, and the sequence ends
  // (Finish::stop) where nothing more may follow. Not with json_object.
  // Needs the engine's tokenizer.
  std::shared_ptr<const Grammar> grammar;
  int logprobs = -1;                  // -1: none; n >= 0: the chosen token's log-probability and the n most likely
  // -1: none; n >= 0: each prompt token's log-probability given the tokens
  // before it (from the model's plain softmax: no penalty or temperature)
  // and the n most likely there, on the sequence's first event. Such a
  // sequence computes every prompt position (no prefix cache). With
  // max_tokens 0 nothing is generated: the sequence ends (Finish::length,
  // no token) once its prompt is in the cache, scored if asked.
  int prompt_logprobs = -1;

  bool greedy() const { return temperature < kGreedyBelow; }
};

// Throws ConfigError naming the first bad field (e.g. "top_p must be in (0, 1]").
void validate(const SamplingParams& p, int64_t vocab);

// The stop string that ends a text: of those in `text` that start at or
// after `start_from` and end past byte `end_after`, the one starting first,
// the shorter on a tie. The engine (which stop ended a sequence) and the
// server's text stream (where its text is cut) both ask this, so the two
// agree. `stop` is null when there is none.
struct StopMatch {
  size_t at = std::string::npos;
  const std::string* stop = nullptr;
};
StopMatch first_stop_string(std::string_view text, const std::vector<std::string>& stops, size_t start_from,
                            size_t end_after);

struct TokenChoice {
  int32_t token = 0;
  float logprob = 0.f;                             // of the chosen token, under the unfiltered softmax of the
                                                   // penalized logits (0 when logprobs were not asked for)
  std::vector<std::pair<int32_t, float>> top;      // the n most likely (token, logprob), best first
};

// Per-sequence state the penalties need: how often each token was generated,
// and which tokens the context holds (prompt and output).
class SequenceHistory {
 public:
  explicit SequenceHistory(int64_t vocab = 0) : counts_(size_t(vocab), 0), seen_(size_t(vocab), 0) {}
  void add_prompt(const std::vector<int32_t>& ids);
  void add_generated(int32_t id);
  const std::vector<int32_t>& generated_ids() const { return generated_; }
  int32_t count(int32_t id) const { return counts_[size_t(id)]; }
  bool seen(int32_t id) const { return seen_[size_t(id)] != 0; }
  const std::vector<int32_t>& distinct() const { return distinct_; }  // every token in the context, once

 private:
  std::vector<int32_t> counts_;     // generated occurrences
  std::vector<uint8_t> seen_;       // in the prompt or generated
  std::vector<int32_t> distinct_;   // tokens with seen_ set, in the order first seen
  std::vector<int32_t> generated_;
};

// A token top-k keeps: its (penalized) logit, its weight exp((logit - top) /
// temperature) and its id.
struct SampleCandidate {
  float logit;
  float weight;
  int32_t id;
};

// Working memory of the sampler: kept by the caller between calls so that
// sampling does not allocate once it has grown.
struct SamplerScratch {
  std::vector<int32_t> ids;                      // the best tokens (top-k, logprobs), best first
  std::vector<int32_t> band;                     // tokens near a top-k / top-p boundary: ids,
  std::vector<float> band_logits, band_weights;  // and their logits and weights
  std::vector<int32_t> over;                     // tokens above that band
  std::vector<float> values;                     // every token's weight
  std::vector<SampleCandidate> candidates;       // top-k's kept tokens, best first
  std::vector<double> chunk_sums;                // of the weights, for the draw
};

// `token`'s log-probability under the plain softmax of `logits`, and the n
// most likely tokens with theirs (best first; ties to the lower id).
TokenChoice score_token(const float* logits, int64_t vocab, int32_t token, int n, SamplerScratch& work);

// Picks the token for draw number `index` of a sequence. `logits` (vocab) is
// modified (penalties, temperature).
TokenChoice sample(float* logits, int64_t vocab, const SamplingParams& p, const SequenceHistory& history,
                   uint64_t index, SamplerScratch& scratch);

}  // namespace brisk::infer
