// The request and response bodies of the encoder routes (pooled.h): vLLM's
// POST /classify and OpenAI's POST /v1/embeddings. Parsing checks every
// field and names the one at fault in a 400.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "brisk/serve/api.h"
#include "brisk/serve/pooled.h"

namespace brisk::serve {

// Inputs one request may hold: a request's inputs run before later
// requests', so one request cannot hold the service for long.
inline constexpr int64_t kMaxPooledInputs = 2048;

struct PooledRequest {
  std::vector<std::vector<int32_t>> sequences;  // one per input, cut to the model's max_len
  int64_t tokens = 0;                           // what the model reads of them
  bool base64 = false;                          // /v1/embeddings: encoding_format "base64"
};

// `input`: a string, a list of strings, a list of token ids, or a list of
// such lists, as both APIs take it, at most kMaxPooledInputs of them;
// `model` and `user` as for the other
// routes. /v1/embeddings also reads encoding_format ("float" or "base64")
// and dimensions (only the model's own width).
PooledRequest parse_pooled(const std::string& body, const ModelInfo& info, const PooledModel& model,
                           const PooledEncode& encode);

// vLLM's classification response: per input its label, probs and
// num_classes; usage counts the tokens read.
nlohmann::json classify_response(const PooledRequest& r, const std::vector<std::vector<float>>& probs,
                                 const PooledModel& model, const std::string& id, int64_t created,
                                 const std::string& name);
// OpenAI's embeddings response: per input an embedding, a list of floats or
// (base64) the little-endian float32 bytes in base64.
nlohmann::json embeddings_response(const PooledRequest& r, const std::vector<std::vector<float>>& vectors,
                                   const std::string& name);

// Standard base64 (RFC 4648, with padding).
std::string base64(const void* data, size_t n);

}  // namespace brisk::serve
