// /v1/completions bodies in, OpenAI-shaped JSON out; see brisk/serve/completions.h.
#include "brisk/serve/completions.h"

#include <cstdint>
#include <random>

#include "brisk/core/error.h"
#include "brisk/data/tokenizer.h"

namespace brisk::serve {

using nlohmann::json;

json error_json(const ApiError& e) {
  return {{"error",
           {{"message", e.what()},
            {"type", e.type},
            {"param", e.param.empty() ? json(nullptr) : json(e.param)},
            {"code", nullptr}}}};
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json parse_body(const std::string& body) {
  json j;
  try {
    j = json::parse(body);
  } catch (const json::parse_error& e) {
    throw ApiError(400, std::string("the request body is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw ApiError(400, "the request body must be a JSON object");
  return j;
}

namespace {

// A field that is absent or null keeps its default.
const json* field(const json& body, const char* name) {
  auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

float number(const json& body, const char* name, float def) {
  const json* v = field(body, name);
  if (!v) return def;
  if (!v->is_number()) throw ApiError(400, std::string(name) + " must be a number", name);
  return v->get<float>();
}

int64_t integer(const json& body, const char* name, int64_t def) {
  const json* v = field(body, name);
  if (!v) return def;
  if (!v->is_number_integer()) throw ApiError(400, std::string(name) + " must be an integer", name);
  return v->get<int64_t>();
}

// An integer that must fit an int (the engine's field type).
int small_integer(const json& body, const char* name, int def) {
  const int64_t v = integer(body, name, def);
  if (v < INT32_MIN || v > INT32_MAX) throw ApiError(400, std::string(name) + " is out of range", name);
  return int(v);
}

bool boolean(const json& body, const char* name, bool def) {
  const json* v = field(body, name);
  if (!v) return def;
  if (!v->is_boolean()) throw ApiError(400, std::string(name) + " must be a boolean", name);
  return v->get<bool>();
}

std::vector<int32_t> read_prompt(const json& body, const ModelInfo& model, const data::Tokenizer& tok) {
  const json* p = field(body, "prompt");
  if (!p) throw ApiError(400, "prompt is required", "prompt");
  std::vector<int32_t> ids;
  if (p->is_string()) {
    ids = tok.encode(p->get<std::string>());
  } else if (p->is_array() && !p->empty() && (*p)[0].is_string()) {
    if (p->size() != 1) throw ApiError(400, "only one prompt per request is supported for now (got a list of " +
                                               std::to_string(p->size()) + ")", "prompt");
    ids = tok.encode((*p)[0].get<std::string>());
  } else if (p->is_array()) {
    for (const json& t : *p) {
      if (!t.is_number_integer())
        throw ApiError(400, "prompt must be a string or a list of token ids", "prompt");
      const int64_t id = t.get<int64_t>();
      if (id < 0 || id >= model.vocab)
        throw ApiError(400, "prompt token " + std::to_string(id) + " is outside the vocabulary [0, " +
                                std::to_string(model.vocab) + ")", "prompt");
      ids.push_back(int32_t(id));
    }
  } else {
    throw ApiError(400, "prompt must be a string or a list of token ids", "prompt");
  }
  if (ids.empty()) throw ApiError(400, "prompt must not be empty", "prompt");
  for (int32_t id : ids)
    if (id >= model.vocab)
      throw ApiError(400, "the prompt encodes to token " + std::to_string(id) + ", outside the model's vocabulary",
                     "prompt");
  return ids;
}

std::vector<std::string> read_stop(const json& body) {
  const json* v = field(body, "stop");
  if (!v) return {};
  std::vector<std::string> stop;
  if (v->is_string()) {
    stop.push_back(v->get<std::string>());
  } else if (v->is_array()) {
    for (const json& s : *v) {
      if (!s.is_string()) throw ApiError(400, "stop must be a string or a list of strings", "stop");
      stop.push_back(s.get<std::string>());
    }
  } else {
    throw ApiError(400, "stop must be a string or a list of strings", "stop");
  }
  for (const std::string& s : stop)
    if (s.empty()) throw ApiError(400, "stop strings must not be empty", "stop");
  return stop;
}

}  // namespace

CompletionRequest parse_completion(const std::string& body, const ModelInfo& model, const data::Tokenizer& tok) {
  const json j = parse_body(body);
  if (const json* m = field(j, "model")) {
    if (!m->is_string()) throw ApiError(400, "model must be a string", "model");
    if (m->get<std::string>() != model.name)
      throw ApiError(404, "The model `" + m->get<std::string>() + "` does not exist; this server serves `" +
                              model.name + "`", "model");
  }
  if (integer(j, "n", 1) != 1)
    throw ApiError(400, "n must be 1: several choices per request are not supported yet", "n");
  if (integer(j, "best_of", 1) != 1) throw ApiError(400, "best_of must be 1: not supported yet", "best_of");
  if (boolean(j, "echo", false)) throw ApiError(400, "echo is not supported yet", "echo");
  if (field(j, "suffix")) throw ApiError(400, "suffix is not supported", "suffix");
  if (const json* u = field(j, "user"); u && !u->is_string()) throw ApiError(400, "user must be a string", "user");

  CompletionRequest r;
  r.prompt = read_prompt(j, model, tok);
  infer::SamplingParams& sp = r.params;
  sp.max_tokens = integer(j, "max_tokens", 16);
  if (sp.max_tokens < 1) throw ApiError(400, "max_tokens must be at least 1", "max_tokens");
  sp.temperature = number(j, "temperature", 1.0f);
  sp.top_p = number(j, "top_p", 1.0f);
  sp.top_k = small_integer(j, "top_k", 0);
  sp.min_p = number(j, "min_p", 0.0f);
  sp.presence_penalty = number(j, "presence_penalty", 0.0f);
  sp.frequency_penalty = number(j, "frequency_penalty", 0.0f);
  sp.repetition_penalty = number(j, "repetition_penalty", 1.0f);
  sp.logprobs = small_integer(j, "logprobs", -1);
  if (field(j, "logprobs") && sp.logprobs < 0) throw ApiError(400, "logprobs must be >= 0", "logprobs");
  if (field(j, "seed")) {
    sp.seed = uint64_t(integer(j, "seed", 0));
  } else {
    std::random_device rd;
    sp.seed = uint64_t(rd()) << 32 | rd();
  }
  sp.stop = read_stop(j);
  r.stream = boolean(j, "stream", false);
  if (const json* so = field(j, "stream_options")) {
    if (!so->is_object()) throw ApiError(400, "stream_options must be an object", "stream_options");
    r.include_usage = boolean(*so, "include_usage", false);
  }
  try {
    infer::validate(sp, model.vocab);
  } catch (const core::ConfigError& e) {
    const std::string msg = e.what();
    throw ApiError(400, msg, msg.substr(0, msg.find(' ')));
  }
  // Compared as a difference: max_tokens may be near the int64 limit.
  const uint64_t want = uint64_t(r.prompt.size()) + uint64_t(sp.max_tokens);
  if (sp.max_tokens > model.context - int64_t(r.prompt.size()))
    throw ApiError(400, "This model's maximum context length is " + std::to_string(model.context) +
                            " tokens, however you requested " + std::to_string(want) + " tokens (" +
                            std::to_string(r.prompt.size()) + " in your prompt; " + std::to_string(sp.max_tokens) +
                            " for the completion). Please reduce your prompt or completion length.",
                   "max_tokens");
  return r;
}

CompletionBuilder::CompletionBuilder(const data::Tokenizer& tok, const CompletionRequest& req, std::string id,
                                     int64_t created, std::string model)
    : tok_(tok),
      text_(tok, req.params.stop),
      id_(std::move(id)),
      model_(std::move(model)),
      created_(created),
      logprobs_(req.params.logprobs),
      prompt_tokens_(int64_t(req.prompt.size())) {}

json CompletionBuilder::envelope() const {
  return {{"id", id_}, {"object", "text_completion"}, {"created", created_}, {"model", model_}};
}

json CompletionBuilder::add(const infer::TokenEvent& e) {
  if (e.choice.token < 0) return nullptr;
  ++completion_tokens_;
  std::string piece;
  json lp = nullptr;
  // A stop token ends the sequence without being part of its text.
  const bool stop_token = e.finish == infer::Finish::stop && e.stop_matched.empty();
  if (!stop_token) {
    piece = text_.add(e.choice.token);
    if (logprobs_ >= 0) {
      const int32_t t = e.choice.token;
      json top = json::object();
      for (const auto& [id, v] : e.choice.top) top[valid_utf8(tok_.decode(std::span<const int32_t>(&id, 1)))] = v;
      const std::string s = valid_utf8(tok_.decode(std::span<const int32_t>(&t, 1)));
      const size_t offset = text_.offset_of_last();
      lp = {{"tokens", json::array({s})},
            {"token_logprobs", json::array({e.choice.logprob})},
            {"top_logprobs", json::array({top})},
            {"text_offset", json::array({offset})}};
      lp_tokens_.push_back(s);
      lp_values_.push_back(e.choice.logprob);
      lp_top_.push_back(top);
      lp_offsets_.push_back(offset);
    }
  }
  if (e.finish == infer::Finish::stop) {
    piece += e.stop_matched.empty() ? text_.finish() : text_.finish_at_stop();
    finish_reason_ = "stop";
  } else if (e.finish == infer::Finish::length) {
    piece += text_.finish();
    finish_reason_ = "length";
  }
  all_text_ += piece;
  if (piece.empty() && lp.is_null() && finish_reason_.empty()) return nullptr;
  json chunk = envelope();
  chunk["choices"] = json::array({{{"index", 0},
                                   {"text", piece},
                                   {"logprobs", lp},
                                   {"finish_reason", finish_reason_.empty() ? json(nullptr) : json(finish_reason_)}}});
  return chunk;
}

json CompletionBuilder::usage() const {
  return {{"prompt_tokens", prompt_tokens_},
          {"completion_tokens", completion_tokens_},
          {"total_tokens", prompt_tokens_ + completion_tokens_}};
}

json CompletionBuilder::usage_chunk() const {
  json chunk = envelope();
  chunk["choices"] = json::array();
  chunk["usage"] = usage();
  return chunk;
}

json CompletionBuilder::response() const {
  json lp = nullptr;
  if (logprobs_ >= 0)
    lp = {{"tokens", lp_tokens_},
          {"token_logprobs", lp_values_},
          {"top_logprobs", lp_top_},
          {"text_offset", lp_offsets_}};
  json r = envelope();
  r["choices"] =
      json::array({{{"index", 0}, {"text", all_text_}, {"logprobs", lp}, {"finish_reason", finish_reason_}}});
  r["usage"] = usage();
  return r;
}

}  // namespace brisk::serve
