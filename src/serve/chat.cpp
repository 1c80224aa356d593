// The chat template and /v1/chat/completions bodies; see brisk/serve/chat.h.
#include "brisk/serve/chat.h"

#include <algorithm>
#include <cctype>

#include "brisk/data/tokenizer.h"
#include "fields.h"

namespace brisk::serve {

using nlohmann::json;
using namespace fields;

std::string render_chat(const std::vector<ChatMessage>& messages) {
  std::string out;
  for (const ChatMessage& m : messages) {
    std::string role = m.role;
    if (!role.empty()) role[0] = char(std::toupper(static_cast<unsigned char>(role[0])));
    out += role + ": " + m.content + "\n";
  }
  return out + "Assistant:";
}

namespace {

ApiError bad_message(size_t i, const std::string& what) {
  return ApiError(400, "messages[" + std::to_string(i) + "]" + what, "messages");
}

// content: a string, or a list of text parts ({"type":"text","text":…}),
// which are joined.
std::string read_content(const json& m, size_t i) {
  auto it = m.find("content");
  if (it == m.end() || it->is_null()) throw bad_message(i, ".content is required");
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array()) throw bad_message(i, ".content must be a string or a list of text parts");
  std::string text;
  for (const json& part : *it) {
    if (!part.is_object() || part.value("type", json()) != "text" || !part.contains("text") ||
        !part["text"].is_string())
      throw bad_message(i, ".content parts must be {\"type\": \"text\", \"text\": string}; nothing else is supported");
    text += part["text"].get<std::string>();
  }
  return text;
}

std::vector<ChatMessage> read_messages(const json& body) {
  const json* ms = field(body, "messages");
  if (!ms) throw ApiError(400, "messages is required", "messages");
  if (!ms->is_array() || ms->empty()) throw ApiError(400, "messages must be a non-empty list of messages", "messages");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < ms->size(); ++i) {
    const json& m = (*ms)[i];
    if (!m.is_object()) throw bad_message(i, " must be an object with role and content");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) throw bad_message(i, ".role must be a string");
    std::string r = role->get<std::string>();
    // OpenAI's newer name for the system message (o1 and later models);
    // clients written for them send it, and it means the same here.
    if (r == "developer") r = "system";
    if (r != "system" && r != "user" && r != "assistant")
      throw bad_message(i, ".role must be system, developer, user or assistant, not " + dump(json(r)));
    out.push_back({r, read_content(m, i)});
  }
  return out;
}

}  // namespace

Request parse_chat(const std::string& body, const ModelInfo& model, const data::Tokenizer& tok) {
  const json j = parse_body(body);
  check_model_and_user(j, model);
  for (const char* unsupported : {"tools", "tool_choice", "functions", "function_call"})
    if (field(j, unsupported)) throw ApiError(400, std::string(unsupported) + " is not supported", unsupported);

  Request r;
  r.api = Api::chat;
  const std::vector<int32_t> prompt = tok.encode(render_chat(read_messages(j)));
  for (int32_t id : prompt)
    if (id < 0 || id >= model.vocab)
      throw ApiError(400, "the messages encode to token " + std::to_string(id) + ", outside the model's vocabulary",
                     "messages");
  const int64_t n = read_n(j, 1, model);

  infer::SamplingParams sp;
  // max_completion_tokens is OpenAI's newer name; it wins when both are given.
  const char* max_name = field(j, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  if (field(j, max_name)) {
    sp.max_tokens = integer(j, max_name, 0);
    if (sp.max_tokens < 1) throw ApiError(400, std::string(max_name) + " must be at least 1", max_name);
  } else {
    sp.max_tokens = model.context - int64_t(prompt.size());
    if (sp.max_tokens < 1)
      throw ApiError(400, "This model's maximum context length is " + std::to_string(model.context) +
                              " tokens, however your messages resulted in " + std::to_string(prompt.size()) +
                              " tokens (with the chat template). Please reduce the length of the messages.",
                     "messages", "invalid_request_error", "context_length_exceeded");
  }
  const bool seeded = read_sampling(j, sp);
  read_response_format(j, body, sp);
  if (std::find(sp.stop.begin(), sp.stop.end(), kChatStop) == sp.stop.end()) {
    sp.stop.push_back(kChatStop);
    r.route_stop = kChatStop;
  }
  stop_at_end_of_text(j, tok.eot_token(), sp);
  const bool logprobs = boolean(j, "logprobs", false);
  const int top = small_integer(j, "top_logprobs", 0);
  if (top < 0 || top > 20) throw ApiError(400, "top_logprobs must be in [0, 20]", "top_logprobs");
  if (field(j, "top_logprobs") && !logprobs)
    throw ApiError(400, "top_logprobs needs logprobs to be true", "top_logprobs");
  sp.logprobs = logprobs ? top : -1;
  read_stream(j, r);
  fields::validate(sp, model);
  check_context(prompt.size(), sp.max_tokens, model, max_name);
  fan_out({prompt}, n, sp, r);
  r.deterministic = seeded || sp.greedy();
  return r;
}

}  // namespace brisk::serve
