// One choice of an answer, built from its sequence's events: the text,
// finish reason and logprobs, in the shapes of the route it came through.
// Streamed chunks and the whole response come from the same pieces, so
// their texts agree.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "brisk/infer/engine.h"
#include "brisk/serve/api.h"
#include "brisk/serve/text_stream.h"

namespace brisk::data {
class Tokenizer;
}

namespace brisk::serve {

class CompletionBuilder {
 public:
  CompletionBuilder(const data::Tokenizer& tok, const CompletionRequest& req, std::string id, int64_t created,
                    std::string model, Api api = Api::completions, int64_t index = 0);
  // The chunk a chat stream opens each choice with (its role); null for
  // the completions route, whose chunks carry no role.
  nlohmann::json first_chunk() const;
  // The chunk this event produces for a stream; null when it adds nothing
  // a client can see (text held back, no logprobs, not the end).
  nlohmann::json add(const infer::TokenEvent& e);
  bool finished() const { return !finish_reason_.empty(); }
  int64_t completion_tokens() const { return completion_tokens_; }
  // Prompt positions the engine took from its prefix cache (known at the first event).
  int64_t cached_tokens() const { return cached_tokens_; }
  // id, object, created, model: of a stream chunk or of the whole response.
  nlohmann::json envelope(bool chunk) const;
  // This choice in the non-streamed response, after its finishing event;
  // `index` >= 0 numbers it anew (best_of keeps some choices, renumbered).
  nlohmann::json choice(int64_t index = -1) const;
  // The mean log-probability of its generated tokens (what best_of ranks
  // by); -infinity before any token. Needs the engine's logprobs.
  double mean_logprob() const;
  nlohmann::json usage() const;
  // The final usage chunk of a stream (choices empty).
  nlohmann::json usage_chunk() const;
  // The non-streamed response of this choice alone.
  nlohmann::json response() const;

 private:
  nlohmann::json logprobs_of(const infer::TokenChoice& c);
  // echo: the prompt's text, and its tokens' logprobs (the first has none).
  void echo_prompt(const infer::TokenEvent& first, std::string& piece, nlohmann::json& lp);
  nlohmann::json chunk(const std::string& piece, const nlohmann::json& lp) const;
  const data::Tokenizer& tok_;
  TextStream text_;
  std::string route_stop_;  // CompletionRequest::route_stop
  std::string tool_name_;   // CompletionRequest::tool_name: the text is this call's arguments
  bool tool_named_;
  // The call's id: the response's id with "call" for "chatcmpl", and the choice's index.
  std::string tool_call_id() const;
  std::string id_, model_;
  int64_t created_;
  Api api_;
  int64_t index_;
  int logprobs_;
  bool echo_;
  std::vector<int32_t> prompt_;
  bool started_ = false;  // the first event came
  size_t echo_bytes_ = 0;  // the echoed prompt's length: where the completion's text offsets start
  int64_t prompt_tokens_, completion_tokens_ = 0, cached_tokens_ = 0;
  double logprob_sum_ = 0;  // of the generated tokens
  std::string all_text_, finish_reason_;
  // vLLM's stop_reason: the stop string matched, or the stop token id of
  // stop_token_ids; null when the end-of-text token or the length ended it.
  nlohmann::json stop_reason_ = nullptr;
  // The whole response's logprobs: the completions route's four lists, or
  // the chat route's list of token entries (in lp_tokens_).
  nlohmann::json lp_tokens_ = nlohmann::json::array(), lp_values_ = nlohmann::json::array(),
                 lp_top_ = nlohmann::json::array(), lp_offsets_ = nlohmann::json::array();
};

}  // namespace brisk::serve
