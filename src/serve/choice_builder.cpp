// One choice's answer in OpenAI's shapes; see brisk/serve/choice_builder.h.
#include "brisk/serve/choice_builder.h"

#include <limits>

#include "brisk/data/tokenizer.h"

namespace brisk::serve {

using nlohmann::json;

CompletionBuilder::CompletionBuilder(const data::Tokenizer& tok, const CompletionRequest& req, std::string id,
                                     int64_t created, std::string model, Api api, int64_t index)
    : tok_(tok),
      text_(tok, req.params.stop, req.params.min_tokens, req.include_stop_str, req.route_stop),
      route_stop_(req.route_stop),
      tool_name_(req.tool_name),
      tool_named_(req.tool_named),
      id_(std::move(id)),
      model_(std::move(model)),
      created_(created),
      api_(api),
      index_(index),
      logprobs_(req.hide_logprobs ? -1 : req.params.logprobs),
      echo_(req.echo && api == Api::completions),
      prompt_(echo_ ? req.prompt : std::vector<int32_t>{}),
      prompt_tokens_(int64_t(req.prompt.size())) {}

json CompletionBuilder::envelope(bool chunk) const {
  const char* object = api_ == Api::completions ? "text_completion"
                       : chunk                  ? "chat.completion.chunk"
                                                : "chat.completion";
  return {{"id", id_}, {"object", object}, {"created", created_}, {"model", model_}};
}

std::string CompletionBuilder::tool_call_id() const {
  const size_t dash = id_.find('-');
  return "call" + (dash == std::string::npos ? "-" + id_ : id_.substr(dash)) + "-" + std::to_string(index_);
}

json CompletionBuilder::first_chunk() const {
  if (api_ != Api::chat) return nullptr;
  json c = envelope(true);
  // A tool call opens with its id and name; its arguments follow as text.
  const json delta =
      tool_name_.empty()
          ? json{{"role", "assistant"}, {"content", ""}}
          : json{{"role", "assistant"},
                 {"content", nullptr},
                 {"tool_calls", json::array({{{"index", 0},
                                               {"id", tool_call_id()},
                                               {"type", "function"},
                                               {"function", {{"name", tool_name_}, {"arguments", ""}}}}})}};
  c["choices"] = json::array({{{"index", index_}, {"delta", delta}, {"logprobs", nullptr}, {"finish_reason", nullptr}}});
  return c;
}

// Records the token's logprobs for the whole response and returns them as
// one chunk carries them. A token that is only part of a UTF-8 character
// shows as U+FFFD; the chat route's `bytes` keep its real bytes.
json CompletionBuilder::logprobs_of(const infer::TokenChoice& c) {
  auto raw = [&](int32_t id) { return tok_.decode(std::span<const int32_t>(&id, 1)); };
  if (api_ == Api::chat) {
    auto entry = [&](int32_t id, float logprob) {
      const std::string b = raw(id);
      json bytes = json::array();
      for (unsigned char ch : b) bytes.push_back(int(ch));
      return json{{"token", valid_utf8(b)}, {"logprob", logprob}, {"bytes", bytes}};
    };
    json e = entry(c.token, c.logprob);
    e["top_logprobs"] = json::array();
    for (const auto& [id, v] : c.top) e["top_logprobs"].push_back(entry(id, v));
    lp_tokens_.push_back(e);
    return {{"content", json::array({e})}, {"refusal", nullptr}};
  }
  json top = json::object();
  for (const auto& [id, v] : c.top) top[valid_utf8(raw(id))] = v;
  const std::string s = valid_utf8(raw(c.token));
  const size_t offset = echo_bytes_ + text_.offset_of_last();
  lp_tokens_.push_back(s);
  lp_values_.push_back(c.logprob);
  lp_top_.push_back(top);
  lp_offsets_.push_back(offset);
  return {{"tokens", json::array({s})},
          {"token_logprobs", json::array({c.logprob})},
          {"top_logprobs", json::array({top})},
          {"text_offset", json::array({offset})}};
}

json CompletionBuilder::chunk(const std::string& piece, const json& lp) const {
  const json finish = finished() ? json(finish_reason_) : json(nullptr);
  json c = envelope(true);
  if (api_ == Api::chat) {
    // The last chunk of a choice may carry no text: its delta is then empty.
    json delta = json::object();
    if (!piece.empty() || !lp.is_null())
      delta = tool_name_.empty()
                  ? json{{"content", piece}}
                  : json{{"tool_calls", json::array({{{"index", 0}, {"function", {{"arguments", piece}}}}})}};
    c["choices"] = json::array({{{"index", index_}, {"delta", delta}, {"logprobs", lp}, {"finish_reason", finish}}});
  } else {
    c["choices"] = json::array({{{"index", index_}, {"text", piece}, {"logprobs", lp}, {"finish_reason", finish}}});
  }
  if (finished()) c["choices"][0]["stop_reason"] = stop_reason_;
  return c;
}

// The prompt's text (decoded whole) and, with logprobs, one entry per
// prompt token in the completions route's four lists: the first token has
// no logprob (null, as OpenAI answers), the others the engine's prompt
// logprobs (SamplingParams::prompt_logprobs).
void CompletionBuilder::echo_prompt(const infer::TokenEvent& first, std::string& piece, json& lp) {
  const std::string prompt_bytes = tok_.decode(std::span<const int32_t>(prompt_));
  piece = valid_utf8(prompt_bytes);
  echo_bytes_ = piece.size();
  if (logprobs_ < 0) return;
  json tokens = json::array(), values = json::array(), tops = json::array(), offsets = json::array();
  size_t offset = 0;  // in the raw bytes; the text's offset is where that byte lands in `piece`
  for (size_t i = 0; i < prompt_.size(); ++i) {
    const std::string raw = tok_.decode(std::span<const int32_t>(&prompt_[i], 1));
    tokens.push_back(valid_utf8(raw));
    offsets.push_back(valid_utf8_offset(prompt_bytes, offset));
    offset += raw.size();
    if (i == 0 || i - 1 >= first.prompt_logprobs.size()) {
      values.push_back(nullptr);
      tops.push_back(nullptr);
      continue;
    }
    const infer::TokenChoice& c = first.prompt_logprobs[i - 1];
    json top = json::object();
    for (const auto& [id, v] : c.top) top[valid_utf8(tok_.decode(std::span<const int32_t>(&id, 1)))] = v;
    values.push_back(c.logprob);
    tops.push_back(top);
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    lp_tokens_.push_back(tokens[i]);
    lp_values_.push_back(values[i]);
    lp_top_.push_back(tops[i]);
    lp_offsets_.push_back(offsets[i]);
  }
  lp = {{"tokens", tokens}, {"token_logprobs", values}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json CompletionBuilder::add(const infer::TokenEvent& e) {
  // A token-less event ends a choice that generates nothing (max_tokens 0);
  // a cancelled choice never reaches here.
  if (e.choice.token < 0 && e.finish != infer::Finish::length) return nullptr;
  std::string piece;
  json lp = nullptr;
  if (!started_) {
    started_ = true;
    cached_tokens_ = e.cached_prompt_tokens;
    if (echo_) echo_prompt(e, piece, lp);
  }
  // A stop token ends the sequence without being part of its text.
  const bool stop_token = e.ended_by_stop_token();
  if (e.choice.token >= 0) ++completion_tokens_, logprob_sum_ += double(e.choice.logprob);
  piece += text_.add_event(e);
  if (logprobs_ >= 0 && e.choice.token >= 0 && !stop_token) {
    const json mine = logprobs_of(e.choice);
    if (lp.is_null()) {
      lp = mine;
    } else {  // after the echoed prompt's entries, in the same chunk
      for (const char* list : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
        lp[list].push_back(mine[list][0]);
    }
  }
  if (e.finish == infer::Finish::stop) {
    // A call whose arguments closed ends as OpenAI's do: "tool_calls" for
    // tool_choice "required", "stop" for a named function.
    finish_reason_ = !tool_name_.empty() && e.constraint_closed && !tool_named_ ? "tool_calls" : "stop";
    if (!e.stop_matched.empty() && e.stop_matched != route_stop_) stop_reason_ = e.stop_matched;
    else if (e.ended_by_stop_token() && e.choice.token != tok_.eot_token()) stop_reason_ = e.choice.token;
  }
  else if (e.finish == infer::Finish::length) finish_reason_ = "length";
  all_text_ += piece;
  if (piece.empty() && lp.is_null() && finish_reason_.empty()) return nullptr;
  return chunk(piece, lp);
}

double CompletionBuilder::mean_logprob() const {
  return completion_tokens_ > 0 ? logprob_sum_ / double(completion_tokens_) : -std::numeric_limits<double>::infinity();
}

json CompletionBuilder::choice(int64_t index) const {
  if (index < 0) index = index_;
  json lp = nullptr;
  // `refusal` is in OpenAI's chat types (string | null): a model that never
  // refuses sends null, so clients' typed objects have every field.
  if (logprobs_ >= 0 && api_ == Api::chat) lp = {{"content", lp_tokens_}, {"refusal", nullptr}};
  if (logprobs_ >= 0 && api_ == Api::completions)
    lp = {{"tokens", lp_tokens_},
          {"token_logprobs", lp_values_},
          {"top_logprobs", lp_top_},
          {"text_offset", lp_offsets_}};
  if (api_ == Api::chat && !tool_name_.empty())
    return {{"index", index},
            {"message",
             {{"role", "assistant"},
              {"content", nullptr},
              {"tool_calls", json::array({{{"id", tool_call_id()},
                                           {"type", "function"},
                                           {"function", {{"name", tool_name_}, {"arguments", all_text_}}}}})},
              {"refusal", nullptr}}},
            {"logprobs", lp},
            {"finish_reason", finish_reason_},
            {"stop_reason", stop_reason_}};
  if (api_ == Api::chat)
    return {{"index", index},
            {"message", {{"role", "assistant"}, {"content", all_text_}, {"refusal", nullptr}}},
            {"logprobs", lp},
            {"finish_reason", finish_reason_},
            {"stop_reason", stop_reason_}};
  return {{"index", index},
          {"text", all_text_},
          {"logprobs", lp},
          {"finish_reason", finish_reason_},
          {"stop_reason", stop_reason_}};
}

json CompletionBuilder::usage() const {
  return {{"prompt_tokens", prompt_tokens_},
          {"completion_tokens", completion_tokens_},
          {"total_tokens", prompt_tokens_ + completion_tokens_},
          {"prompt_tokens_details", {{"cached_tokens", cached_tokens_}}}};
}

json CompletionBuilder::usage_chunk() const {
  json c = envelope(true);
  c["choices"] = json::array();
  c["usage"] = usage();
  return c;
}

json CompletionBuilder::response() const {
  json r = envelope(false);
  r["choices"] = json::array({choice()});
  r["usage"] = usage();
  return r;
}

}  // namespace brisk::serve
