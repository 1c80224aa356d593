// The fields both OpenAI routes share; see fields.h.
#include "fields.h"

#include <charconv>
#include <climits>
#include <random>

#include "brisk/core/error.h"
#include "brisk/core/json_nesting.h"
#include "brisk/infer/grammar.h"
#include "brisk/infer/json_schema.h"

namespace brisk::serve::fields {

using nlohmann::json;

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

void check_model_and_user(const json& body, const ModelInfo& model) {
  if (const json* m = field(body, "model")) {
    if (!m->is_string()) throw ApiError(400, "model must be a string", "model");
    if (m->get<std::string>() != model.name)
      throw ApiError(404, "The model `" + m->get<std::string>() + "` does not exist; this server serves `" +
                              model.name + "`", "model", "invalid_request_error", "model_not_found");
  }
  if (const json* u = field(body, "user"); u && !u->is_string()) throw ApiError(400, "user must be a string", "user");
}

namespace {

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

// OpenAI's logit_bias: {"<token id>": bias, ...}; the ids and biases are
// range-checked with the other sampling fields (infer::validate).
std::vector<std::pair<int32_t, float>> read_logit_bias(const json& body) {
  std::vector<std::pair<int32_t, float>> out;
  const json* v = field(body, "logit_bias");
  if (!v) return out;
  if (!v->is_object()) throw ApiError(400, "logit_bias must be an object of token ids to biases", "logit_bias");
  for (const auto& [key, bias] : v->items()) {
    int64_t id = -1;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (ec != std::errc() || end != key.data() + key.size() || id < 0 || id > INT32_MAX)
      throw ApiError(400, "logit_bias keys must be token ids, got '" + key + "'", "logit_bias");
    if (!bias.is_number()) throw ApiError(400, "logit_bias values must be numbers", "logit_bias");
    out.emplace_back(int32_t(id), bias.get<float>());
  }
  return out;
}

}  // namespace

bool read_sampling(const json& body, infer::SamplingParams& sp) {
  sp.temperature = number(body, "temperature", 1.0f);
  sp.top_p = number(body, "top_p", 1.0f);
  sp.top_k = small_integer(body, "top_k", 0);
  if (sp.top_k == -1) sp.top_k = 0;  // vLLM's "off", which tools written for it send
  sp.min_p = number(body, "min_p", 0.0f);
  sp.presence_penalty = number(body, "presence_penalty", 0.0f);
  sp.frequency_penalty = number(body, "frequency_penalty", 0.0f);
  sp.repetition_penalty = number(body, "repetition_penalty", 1.0f);
  const bool seeded = field(body, "seed") != nullptr;
  if (seeded) {
    sp.seed = uint64_t(integer(body, "seed", 0));
  } else {
    std::random_device rd;
    sp.seed = uint64_t(rd()) << 32 | rd();
  }
  sp.stop = read_stop(body);
  sp.logit_bias = read_logit_bias(body);
  // vLLM's stop_token_ids: more stop tokens (in the vocabulary: validate()).
  if (const json* ids = field(body, "stop_token_ids")) {
    if (!ids->is_array()) throw ApiError(400, "stop_token_ids must be a list of token ids", "stop_token_ids");
    for (const json& t : *ids) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX)
        throw ApiError(400, "stop_token_ids must be a list of token ids", "stop_token_ids");
      sp.stop_tokens.push_back(int32_t(t.get<int64_t>()));
    }
  }
  sp.min_tokens = integer(body, "min_tokens", 0);
  if (sp.min_tokens < 0) throw ApiError(400, "min_tokens must be >= 0", "min_tokens");
  if (sp.min_tokens > sp.max_tokens)
    throw ApiError(400, "min_tokens (" + std::to_string(sp.min_tokens) + ") must be at most max_tokens (" +
                            std::to_string(sp.max_tokens) + ")",
                   "min_tokens");
  return seeded;
}

nlohmann::ordered_json ordered_body(const json& body, const std::string& raw, const char* param) {
  constexpr size_t kMaxNesting = 300;  // above the schema's own 256, so that its message names the schema
  if (core::json_nesting(body) > kMaxNesting)
    throw ApiError(400, "the request's JSON nests deeper than " + std::to_string(kMaxNesting) + " levels", param);
  return nlohmann::ordered_json::parse(raw);
}

bool is_api_name(const json& name) {
  const std::string n = name.is_string() ? name.get<std::string>() : std::string();
  return !n.empty() && n.size() <= 64 &&
         n.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") == std::string::npos;
}

void read_response_format(const json& body, const std::string& raw, infer::SamplingParams& sp) {
  const json* rf = field(body, "response_format");
  // vLLM's guided_json, or llama.cpp's server's json_schema: the same.
  const char* guided_name = field(body, "json_schema") ? "json_schema" : "guided_json";
  const json* guided = field(body, guided_name);
  const json type = rf && rf->is_object() ? rf->value("type", json()) : json();
  if (rf && type != "text" && type != "json_object" && type != "json_schema")
    throw ApiError(400,
                   "response_format must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or {\"type\": "
                   "\"json_schema\", \"json_schema\": {\"name\": ..., \"schema\": {...}}}",
                   "response_format");
  // One constraint at most: which would hold where they disagree?
  std::vector<std::string> given;
  if (rf && type != "text") given.push_back("a JSON response_format");
  for (const char* name : {"guided_json", "json_schema", "guided_choice", "guided_regex", "guided_grammar", "grammar"})
    if (field(body, name)) given.push_back(name);
  if (given.size() > 1)
    throw ApiError(400, "give one of a JSON response_format, guided_json, json_schema, guided_choice, guided_regex, "
                        "guided_grammar and grammar, not " + given[0] + " and " + given[1],
                   given[1] == "a JSON response_format" ? "response_format" : given[1]);
  // vLLM's guided_regex (the whole text matches) and guided_grammar, and
  // llama.cpp's grammar (both GBNF).
  for (const char* name : {"guided_regex", "guided_grammar", "grammar"}) {
    const json* g = field(body, name);
    if (!g) continue;
    const bool regex = std::string(name) == "guided_regex";
    if (!g->is_string() || g->get_ref<const std::string&>().empty())
      throw ApiError(400, std::string(name) + (regex ? " must be a regular expression" : " must be a GBNF grammar") +
                              " (a non-empty string)", name);
    sp.grammar = compiled_or_400(name, [&] {
      return regex ? infer::Grammar::regex(g->get<std::string>(), name) : infer::Grammar::gbnf(g->get<std::string>(), name);
    });
    return;
  }
  if (const json* choice = field(body, "guided_choice")) {  // vLLM's: the text is one of these
    std::vector<std::string> texts;
    if (choice->is_array())
      for (const json& t : *choice)
        if (t.is_string()) texts.push_back(t.get<std::string>());
    if (!choice->is_array() || texts.size() != choice->size())
      throw ApiError(400, "guided_choice must be a list of strings", "guided_choice");
    sp.json_schema = compiled_or_400("guided_choice", [&] { return infer::JsonSchema::choices(texts); });
    sp.json_object = true;
    return;
  }
  if (guided) {
    const std::string name = guided_name;
    if (guided->is_string()) {
      sp.json_schema = compiled_or_400(
          guided_name, [&] { return infer::JsonSchema::compile_text(guided->get<std::string>(), name); });
    } else if (guided->is_object()) {
      const nlohmann::ordered_json schema = ordered_body(body, raw, guided_name)[name];
      sp.json_schema = compiled_or_400(guided_name, [&] { return infer::JsonSchema::compile(schema, name); });
    } else {
      throw ApiError(400, name + " must be a JSON schema (an object, or its text)", guided_name);
    }
    sp.json_object = true;
    return;
  }
  if (type == "json_object") sp.json_object = true;
  if (type != "json_schema") return;
  const json* spec = rf->contains("json_schema") ? &(*rf)["json_schema"] : nullptr;
  if (!spec || !spec->is_object())
    throw ApiError(400, "response_format json_schema needs \"json_schema\": {\"name\": ..., \"schema\": {...}}",
                   "response_format");
  if (spec->contains("name") && !is_api_name((*spec)["name"]))
    throw ApiError(400, "response_format.json_schema.name must be 1 to 64 of a-z, A-Z, 0-9, _ and -",
                   "response_format");
  if (spec->contains("strict") && !(*spec)["strict"].is_boolean())
    throw ApiError(400, "response_format.json_schema.strict must be a boolean", "response_format");
  if (!spec->contains("schema"))
    throw ApiError(400, "response_format.json_schema.schema is missing: give the JSON schema", "response_format");
  const nlohmann::ordered_json schema = ordered_body(body, raw, "response_format")["response_format"]["json_schema"]["schema"];
  sp.json_schema = compiled_or_400(
      "response_format", [&] { return infer::JsonSchema::compile(schema, "response_format.json_schema.schema"); });
  sp.json_object = true;
}

void stop_at_end_of_text(const json& body, int32_t eot_token, infer::SamplingParams& sp) {
  if (eot_token < 0) return;
  if (boolean(body, "ignore_eos", false)) sp.banned_tokens.push_back(eot_token);
  else sp.stop_tokens.push_back(eot_token);
}

void read_stream(const json& body, Request& r) {
  r.include_stop_str = boolean(body, "include_stop_str_in_output", false);
  r.stream = boolean(body, "stream", false);
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object()) throw ApiError(400, "stream_options must be an object", "stream_options");
    if (!r.stream)  // as OpenAI answers: the options would be ignored
      throw ApiError(400, "stream_options is only allowed when stream is true", "stream_options");
    r.include_usage = boolean(*so, "include_usage", false);
  }
}

namespace {

// body[key]: sequences per prompt, `fallback` when absent, at least `least`
// (`least_what` says why), and over all prompts within what one request may
// ask for.
int64_t per_prompt(const json& body, const char* key, int64_t fallback, int64_t least, const std::string& least_what,
                   size_t prompts, const ModelInfo& model) {
  const int64_t v = integer(body, key, fallback);
  if (v < least)
    throw ApiError(400, std::string(key) + " must be at least " + least_what + ", got " + std::to_string(v), key);
  // Compared as a quotient: v may be near the int64 limit.
  if (v > model.max_choices / int64_t(prompts))
    throw ApiError(400, std::string(key) + " (" + std::to_string(v) + ") times the number of prompts (" +
                            std::to_string(prompts) + ") is more than the " + std::to_string(model.max_choices) +
                            " sequences one request may ask for (the server's queue capacity)", key);
  return v;
}

}  // namespace

int64_t read_n(const json& body, size_t prompts, const ModelInfo& model) {
  return per_prompt(body, "n", 1, 1, "1", prompts, model);
}

int64_t read_best_of(const json& body, int64_t n, size_t prompts, const ModelInfo& model) {
  return per_prompt(body, "best_of", n, n, "n (" + std::to_string(n) + ")", prompts, model);
}

void validate(const infer::SamplingParams& sp, const ModelInfo& model) {
  try {
    infer::validate(sp, model.vocab);
  } catch (const core::ConfigError& e) {
    const std::string msg = e.what();
    // The engine names its fields; a stop token out of range came from stop_token_ids.
    throw ApiError(400, msg, msg.rfind("stop token ", 0) == 0 ? "stop_token_ids" : msg.substr(0, msg.find(' ')));
  }
}

void check_context(size_t prompt, int64_t max_tokens, const ModelInfo& model, const std::string& param) {
  // Compared as a difference: max_tokens may be near the int64 limit.
  if (max_tokens <= model.context - int64_t(prompt)) return;
  const uint64_t want = uint64_t(prompt) + uint64_t(max_tokens);
  throw ApiError(400, "This model's maximum context length is " + std::to_string(model.context) +
                          " tokens, however you requested " + std::to_string(want) + " tokens (" +
                          std::to_string(prompt) + " in your prompt; " + std::to_string(max_tokens) +
                          " for the completion). Please reduce your prompt or completion length.",
                 param, "invalid_request_error", "context_length_exceeded");
}

void fan_out(const std::vector<std::vector<int32_t>>& prompts, int64_t n, const infer::SamplingParams& sp, Request& r) {
  r.choices.clear();
  r.prompt_tokens = 0;
  r.best_of = r.n = n;
  for (const std::vector<int32_t>& p : prompts) {
    r.prompt_tokens += int64_t(p.size());
    for (int64_t i = 0; i < n; ++i) {
      CompletionRequest c;
      c.prompt = p;
      c.params = sp;
      c.params.seed = sp.seed + uint64_t(i);
      c.stream = r.stream;
      c.include_usage = r.include_usage;
      c.echo = r.echo;
      c.include_stop_str = r.include_stop_str;
      c.route_stop = r.route_stop;
      c.tool_name = r.tool_name;
      c.tool_named = r.tool_named;
      r.choices.push_back(std::move(c));
    }
  }
}

}  // namespace brisk::serve::fields
