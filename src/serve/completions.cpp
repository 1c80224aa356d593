// /v1/completions bodies into engine sequences; see brisk/serve/completions.h.
#include "brisk/serve/completions.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>

#include "brisk/data/tokenizer.h"
#include "fields.h"

namespace brisk::serve {

using nlohmann::json;
using namespace fields;

json error_json(const ApiError& e) {
  return {{"error",
           {{"message", e.what()},
            {"type", e.type},
            {"param", e.param.empty() ? json(nullptr) : json(e.param)},
            {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
}

std::string request_timeout_message(double seconds) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "the request took longer than the server's limit of %g s (--request-timeout)", seconds);
  return buf;
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json parse_body(const std::string& body) {
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number like 1e999
    throw ApiError(400, std::string("the request body is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw ApiError(400, "the request body must be a JSON object");
  return j;
}

namespace {

// One prompt: a string or a list of token ids.
std::vector<int32_t> read_prompt(const json& p, const ModelInfo& model, const data::Tokenizer& tok) {
  std::vector<int32_t> ids;
  if (p.is_string()) {
    ids = tok.encode(p.get<std::string>());
  } else if (p.is_array()) {
    for (const json& t : p) {
      if (!t.is_number_integer())
        throw ApiError(400, "prompt must be a string, a list of token ids, or a list of either", "prompt");
      const int64_t id = t.get<int64_t>();
      if (id < 0 || id >= model.vocab)
        throw ApiError(400, "prompt token " + std::to_string(id) + " is outside the vocabulary [0, " +
                                std::to_string(model.vocab) + ")", "prompt");
      ids.push_back(int32_t(id));
    }
  } else {
    throw ApiError(400, "prompt must be a string, a list of token ids, or a list of either", "prompt");
  }
  if (ids.empty()) throw ApiError(400, "prompt must not be empty", "prompt");
  for (int32_t id : ids)
    if (id >= model.vocab)
      throw ApiError(400, "the prompt encodes to token " + std::to_string(id) + ", outside the model's vocabulary",
                     "prompt");
  return ids;
}

// A list whose first item is a string or a list is a list of prompts (as
// OpenAI reads it); anything else is one prompt.
std::vector<std::vector<int32_t>> read_prompts(const json& body, const ModelInfo& model,
                                               const data::Tokenizer& tok) {
  const json* p = field(body, "prompt");
  if (!p) throw ApiError(400, "prompt is required", "prompt");
  std::vector<std::vector<int32_t>> prompts;
  if (p->is_array() && !p->empty() && ((*p)[0].is_string() || (*p)[0].is_array())) {
    for (const json& one : *p) prompts.push_back(read_prompt(one, model, tok));
  } else {
    prompts.push_back(read_prompt(*p, model, tok));
  }
  return prompts;
}

// The body as a Request; `n` and `prompts` say how its choices came about.
Request parse(const json& j, const std::string& body, const ModelInfo& model, const data::Tokenizer& tok, int64_t& n,
              size_t& prompt_count) {
  check_model_and_user(j, model);
  if (field(j, "suffix")) throw ApiError(400, "suffix is not supported", "suffix");

  Request r;
  r.api = Api::completions;
  r.echo = boolean(j, "echo", false);
  const std::vector<std::vector<int32_t>> prompts = read_prompts(j, model, tok);
  prompt_count = prompts.size();
  n = read_n(j, prompts.size(), model);
  infer::SamplingParams sp;
  sp.max_tokens = integer(j, "max_tokens", 16);
  // max_tokens 0 with echo scores the prompt and generates nothing (how
  // evaluation harnesses ask for a text's log-likelihood).
  if (sp.max_tokens < (r.echo ? 0 : 1))
    throw ApiError(400, r.echo ? "max_tokens must be >= 0" : "max_tokens must be at least 1 (0 only with echo)",
                   "max_tokens");
  const bool seeded = read_sampling(j, sp);
  read_response_format(j, body, sp);  // vLLM takes it here too
  // The end-of-text token ends a completion with finish_reason "stop", as
  // OpenAI's do; it is no part of the text.
  stop_at_end_of_text(j, tok.eot_token(), sp);
  sp.logprobs = small_integer(j, "logprobs", -1);
  if (field(j, "logprobs") && sp.logprobs < 0) throw ApiError(400, "logprobs must be >= 0", "logprobs");
  if (r.echo && sp.logprobs >= 0) sp.prompt_logprobs = sp.logprobs;
  read_stream(j, r);
  // best_of: more sequences than choices, the best n returned, so only a
  // whole answer can have them (OpenAI refuses to stream it too).
  const int64_t best_of = read_best_of(j, n, prompts.size(), model);
  if (best_of > n && r.stream)
    throw ApiError(400, "best_of (" + std::to_string(best_of) + ") above n (" + std::to_string(n) +
                            ") cannot be streamed: the best choices are known only when all have finished",
                   "best_of");
  const bool hide_logprobs = best_of > n && sp.logprobs < 0;
  if (best_of > n) sp.logprobs = std::max(sp.logprobs, 0);  // the chosen tokens' logprobs rank the sequences
  fields::validate(sp, model);
  for (const std::vector<int32_t>& p : prompts) check_context(p.size(), sp.max_tokens, model, "max_tokens");
  fan_out(prompts, best_of, sp, r);
  r.n = n;
  for (CompletionRequest& c : r.choices) c.hide_logprobs = hide_logprobs;
  r.deterministic = seeded || sp.greedy();
  return r;
}

}  // namespace

Request parse_completions(const std::string& body, const ModelInfo& model, const data::Tokenizer& tok) {
  int64_t n = 1;
  size_t prompts = 1;
  return parse(parse_body(body), body, model, tok, n, prompts);
}

}  // namespace brisk::serve
