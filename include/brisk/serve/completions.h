// The OpenAI completions API on brisk's engine: reading a request body
// into engine inputs, and writing responses and stream chunks in OpenAI's
// shapes (docs/serving.md lists the fields).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "brisk/infer/engine.h"
#include "brisk/serve/text_stream.h"

namespace brisk::data {
class Tokenizer;
}

namespace brisk::serve {

// What the API says about the served model.
struct ModelInfo {
  std::string name;
  int64_t vocab = 0;    // token ids a prompt may hold
  int64_t context = 0;  // prompt + completion tokens at most
};

// A request the server refuses, as an OpenAI error object.
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, const std::string& message, std::string param = "", std::string type = "invalid_request_error")
      : std::runtime_error(message), status(status), param(std::move(param)), type(std::move(type)) {}
  int status;
  std::string param, type;
};

// {"error":{"message","type","param","code":null}}; param null when empty.
nlohmann::json error_json(const ApiError& e);
// A request body that must be a JSON object; 400 otherwise.
nlohmann::json parse_body(const std::string& body);
// JSON text for the wire: invalid UTF-8 (never expected) is replaced, not thrown.
std::string dump(const nlohmann::json& j);

struct CompletionRequest {
  std::vector<int32_t> prompt;
  infer::SamplingParams params;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
};

// Parses and validates a /v1/completions body; throws ApiError (400 naming
// the field, 404 for another model's name). A missing seed gets a random one.
CompletionRequest parse_completion(const std::string& body, const ModelInfo& model, const data::Tokenizer& tok);

// The text, finish reason and logprobs of one sequence, built from its
// events. Streamed chunks and the whole response come from the same pieces,
// so their texts agree.
class CompletionBuilder {
 public:
  CompletionBuilder(const data::Tokenizer& tok, const CompletionRequest& req, std::string id, int64_t created,
                    std::string model);
  // The chunk this event produces for a stream; null when it adds nothing
  // a client can see (text held back, no logprobs, not the end).
  nlohmann::json add(const infer::TokenEvent& e);
  bool finished() const { return !finish_reason_.empty(); }
  nlohmann::json usage() const;
  // The final usage chunk of a stream (choices empty).
  nlohmann::json usage_chunk() const;
  // The non-streamed response, after the finishing event.
  nlohmann::json response() const;

 private:
  nlohmann::json envelope() const;
  const data::Tokenizer& tok_;
  TextStream text_;
  std::string id_, model_;
  int64_t created_;
  int logprobs_;
  int64_t prompt_tokens_, completion_tokens_ = 0;
  std::string all_text_, finish_reason_;
  nlohmann::json lp_tokens_ = nlohmann::json::array(), lp_values_ = nlohmann::json::array(),
                 lp_top_ = nlohmann::json::array(), lp_offsets_ = nlohmann::json::array();
};

}  // namespace brisk::serve
