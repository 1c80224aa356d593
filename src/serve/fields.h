// Reading the fields that /v1/completions and /v1/chat/completions share,
// so both routes accept and refuse them alike. A field that is absent or
// null keeps its default; one of the wrong type is a 400 naming it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "brisk/core/error.h"
#include "brisk/serve/api.h"

namespace brisk::serve::fields {

const nlohmann::json* field(const nlohmann::json& body, const char* name);
float number(const nlohmann::json& body, const char* name, float def);
int64_t integer(const nlohmann::json& body, const char* name, int64_t def);
// An integer that must fit an int (the engine's field type).
int small_integer(const nlohmann::json& body, const char* name, int def);
bool boolean(const nlohmann::json& body, const char* name, bool def);

// `model`, when given, must be the served name (404 otherwise); `user` a string.
void check_model_and_user(const nlohmann::json& body, const ModelInfo& model);
// temperature, top_p, top_k, min_p, the penalties, seed (random when
// absent), stop, stop_token_ids and min_tokens (read after sp.max_tokens: it
// may not pass it); not max_tokens, logprobs (the routes differ) or n. True
// when the body gave the seed.
bool read_sampling(const nlohmann::json& body, infer::SamplingParams& sp);
// response_format: {"type": "text"} (the default), {"type": "json_object"}
// (the output is one JSON object) or {"type": "json_schema", "json_schema":
// {"name": ..., "schema": {...}}} (an instance of the schema), or vLLM's
// guided_json (a schema, or its text) or guided_choice (the text is one of
// a list of strings); sets sp.json_object and
// sp.json_schema. Or vLLM's guided_regex or guided_grammar, or llama.cpp's
// grammar (GBNF): sets sp.grammar. One of these at most. The schema is read from `raw`, the body's text, where its
// properties keep their order. A schema that cannot be enforced is a 400
// naming its path.
void read_response_format(const nlohmann::json& body, const std::string& raw, infer::SamplingParams& sp);
// The body again as ordered_json (a schema's keys keep their order), once
// `body`, the same text parsed, is known to nest at most 300 deep: parsing
// as ordered_json copies a deep value that another key follows, and the
// copy recursed past the stack (a 400 naming `param` instead).
nlohmann::ordered_json ordered_body(const nlohmann::json& body, const std::string& raw, const char* param);
// OpenAI's rule for a schema's or a function's name: 1 to 64 of a-z, A-Z,
// 0-9, _ and -.
bool is_api_name(const nlohmann::json& name);
// A JSON schema (or guided_choice list) compiled for SamplingParams::
// json_schema, its ConfigError (which names the place in the schema) a 400
// naming `param`.
template <class Compile>
auto compiled_or_400(const char* param, Compile&& compile) {
  try {
    return compile();
  } catch (const core::ConfigError& e) {
    throw ApiError(400, e.what(), param);
  }
}
// The end-of-text token becomes a stop token (finish_reason "stop", as
// OpenAI's end) unless the body sets ignore_eos, which bans it instead (as
// llama.cpp's server does: the text does not run on past a document's end).
void stop_at_end_of_text(const nlohmann::json& body, int32_t eot_token, infer::SamplingParams& sp);
// stream, stream_options.include_usage and how the text ends (vLLM's
// include_stop_str_in_output).
void read_stream(const nlohmann::json& body, Request& r);
// n: at least 1, and n * prompts within model.max_choices.
int64_t read_n(const nlohmann::json& body, size_t prompts, const ModelInfo& model);
// best_of: sequences generated per prompt, n of them returned (default n; at least n).
int64_t read_best_of(const nlohmann::json& body, int64_t n, size_t prompts, const ModelInfo& model);
// The engine's own checks (infer::validate), as a 400 naming the field.
void validate(const infer::SamplingParams& sp, const ModelInfo& model);
// prompt + max_tokens must fit the context; `param` is the field to blame.
void check_context(size_t prompt, int64_t max_tokens, const ModelInfo& model, const std::string& param);
// n choices of every prompt into r.choices (r.n and r.best_of set to n);
// with a seed s, choice i of a prompt samples with seed s + i, so the
// choices differ but a request repeated gets the same ones.
void fan_out(const std::vector<std::vector<int32_t>>& prompts, int64_t n, const infer::SamplingParams& sp, Request& r);

}  // namespace brisk::serve::fields
