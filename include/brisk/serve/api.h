// What every OpenAI route of `brisk serve` shares: the served model's
// limits, the error a refused request gets, and a parsed request of either
// /v1/completions or /v1/chat/completions as the engine sequences it becomes
// (docs/serving.md).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "brisk/infer/engine.h"

namespace brisk::serve {

// What the API knows of the served model and the server's limits.
struct ModelInfo {
  std::string name;
  int64_t vocab = 0;    // token ids a prompt may hold (the server lowers it to its tokenizer's)
  int64_t context = 0;  // prompt + completion tokens at most
  // Sequences one request may ask for (n times the prompts). Set it to the
  // scheduler's queue capacity: a request whose choices could never all
  // wait in the queue is refused (400) rather than left to fail (429) forever.
  int64_t max_choices = 128;
};

// A request the server refuses, as an OpenAI error object.
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, const std::string& message, std::string param = "", std::string type = "invalid_request_error",
           std::string code = "")
      : std::runtime_error(message), status(status), param(std::move(param)), type(std::move(type)),
        code(std::move(code)) {}
  int status;
  std::string param, type;
  std::string code;  // OpenAI's machine-readable code ("model_not_found", ...); "" sends null
};

// {"error":{"message","type","param","code"}}; param and code null when empty.
nlohmann::json error_json(const ApiError& e);
// The 504's message of a request over --request-timeout (`seconds`).
std::string request_timeout_message(double seconds);
// A request body that must be a JSON object; 400 otherwise.
nlohmann::json parse_body(const std::string& body);
// JSON text for the wire: invalid UTF-8 (never expected) is replaced, not thrown.
std::string dump(const nlohmann::json& j);

// The route a request came through: its answers have that route's shapes.
enum class Api { completions, chat };

// One engine sequence.
struct CompletionRequest {
  std::vector<int32_t> prompt;
  infer::SamplingParams params;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool echo = false;           // /v1/completions' echo: the answer starts with the prompt (and its logprobs)
  bool include_stop_str = false;  // vLLM's include_stop_str_in_output: the text ends after the stop string
  // The route's own stop string (chat's turn end) when the client did not
  // list it: never part of the text, and no stop_reason.
  std::string route_stop;
  // best_of asked the engine for logprobs to rank the choices by; the
  // client did not ask to see them.
  bool hide_logprobs = false;
  // Chat with a forced tool call: the text (constrained to the function's
  // parameters schema) is the call's arguments, answered as tool_calls.
  // tool_named: tool_choice named the function (finish_reason "stop", as
  // OpenAI answers), else "required" ("tool_calls").
  std::string tool_name;
  bool tool_named = false;
};

// A whole request: one sequence per choice, in the order of the choices'
// `index` (prompt p, choice i of n at p * n + i, as OpenAI numbers them;
// with best_of, sequence i of prompt p at p * best_of + i).
struct Request {
  Api api = Api::completions;
  std::vector<CompletionRequest> choices;
  // Every prompt counted once, however many choices it has: OpenAI's usage
  // (the engine still prefills it once per choice).
  int64_t prompt_tokens = 0;
  bool stream = false;
  bool include_usage = false;
  bool echo = false;  // /v1/completions' echo, for every choice
  bool include_stop_str = false;  // include_stop_str_in_output, for every choice
  std::string route_stop;         // CompletionRequest::route_stop, for every choice
  std::string tool_name;          // CompletionRequest::tool_name, for every choice
  bool tool_named = false;
  // Sequences generated per prompt (best_of) and choices returned per
  // prompt (n): the n of each prompt's best_of with the highest mean token
  // logprob. Equal unless best_of was given; best_of > n is never streamed.
  int64_t best_of = 1, n = 1;
  // The same request gives the same answer: greedy, or a seed was given.
  // Only such requests may be answered from the response cache.
  bool deterministic = false;
};

}  // namespace brisk::serve
