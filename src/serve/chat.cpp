// The chat template and /v1/chat/completions bodies; see brisk/serve/chat.h.
#include "brisk/serve/chat.h"

#include <algorithm>
#include <cctype>

#include "brisk/core/error.h"
#include "brisk/data/tokenizer.h"
#include "brisk/infer/json_schema.h"
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
    if (r != "system" && r != "user" && r != "assistant" && r != "tool")
      throw bad_message(i, ".role must be system, developer, user, assistant or tool, not " + dump(json(r)));
    if (r == "tool") {  // a call's result, answering the assistant's tool_calls
      auto id = m.find("tool_call_id");
      if (id == m.end() || !id->is_string()) throw bad_message(i, ".tool_call_id (a string) is required for role tool");
    }
    // An assistant turn that called tools has no content (null); the calls
    // are its text in the prompt: name(arguments) per call.
    auto calls = m.find("tool_calls");
    if (r == "assistant" && calls != m.end() && !calls->is_null()) {
      std::string text;
      if (auto c = m.find("content"); c != m.end() && !c->is_null()) text = read_content(m, i);
      if (!calls->is_array()) throw bad_message(i, ".tool_calls must be a list");
      for (const json& call : *calls) {
        const json* fn = call.is_object() && call.contains("function") ? &call["function"] : nullptr;
        if (!fn || !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string() ||
            !fn->contains("arguments") || !(*fn)["arguments"].is_string())
          throw bad_message(i, ".tool_calls entries must be {\"function\": {\"name\": string, \"arguments\": string}}");
        text += (text.empty() ? "" : " ") + (*fn)["name"].get<std::string>() + "(" +
                (*fn)["arguments"].get<std::string>() + ")";
      }
      out.push_back({r, text});
      continue;
    }
    out.push_back({r, read_content(m, i)});
  }
  return out;
}

}  // namespace

// tools and tool_choice. A forced call (tool_choice naming a function, or
// "required" with one tool) constrains the text to the function's
// parameters schema and answers it as tool_calls; "none" answers in text.
// "auto" would need a model trained to choose between text and a call, in a
// format of its own: a 400 that says what works.
void read_tools(const json& j, const std::string& body, infer::SamplingParams& sp, Request& r) {
  for (const char* old : {"functions", "function_call"})  // OpenAI's deprecated names
    if (field(j, old)) throw ApiError(400, std::string(old) + " is not supported: use tools and tool_choice", old);
  if (const json* p = field(j, "parallel_tool_calls"); p && !p->is_boolean())
    throw ApiError(400, "parallel_tool_calls must be a boolean", "parallel_tool_calls");
  const json* tools = field(j, "tools");
  const json* choice = field(j, "tool_choice");
  if (!tools) {
    if (choice && *choice != "none") throw ApiError(400, "tool_choice needs tools", "tool_choice");
    return;
  }
  if (!tools->is_array() || tools->empty()) throw ApiError(400, "tools must be a non-empty list of tools", "tools");
  std::vector<std::string> names;
  for (size_t i = 0; i < tools->size(); ++i) {
    const json& t = (*tools)[i];
    const std::string at = "tools[" + std::to_string(i) + "]";
    if (!t.is_object() || t.value("type", json()) != "function" || !t.contains("function") || !t["function"].is_object())
      throw ApiError(400, at + " must be {\"type\": \"function\", \"function\": {\"name\": ..., \"parameters\": {...}}}",
                     "tools");
    const json name = t["function"].value("name", json());
    if (!is_api_name(name)) throw ApiError(400, at + ".function.name must be 1 to 64 of a-z, A-Z, 0-9, _ and -", "tools");
    const std::string n = name.get<std::string>();
    if (std::find(names.begin(), names.end(), n) != names.end())
      throw ApiError(400, at + ".function.name " + n + " is given twice", "tools");
    names.push_back(n);
  }
  if (!choice || *choice == "auto")
    throw ApiError(400,
                   "tool_choice \"auto\" (the default with tools) is not supported: this model has no format for "
                   "choosing between text and a call. Name a function ({\"type\": \"function\", \"function\": "
                   "{\"name\": ...}}), or give \"required\" with one tool, or \"none\"",
                   "tool_choice");
  if (*choice == "none") return;
  size_t pick = 0;
  if (*choice == "required") {
    if (names.size() != 1)
      throw ApiError(400, "tool_choice \"required\" is supported with one tool; name the function to call",
                     "tool_choice");
  } else {
    const json* fn = choice->is_object() && choice->value("type", json()) == "function" && choice->contains("function")
                         ? &(*choice)["function"]
                         : nullptr;
    const json name = fn && fn->is_object() ? fn->value("name", json()) : json();
    if (!name.is_string())
      throw ApiError(400,
                     "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                     "\"function\": {\"name\": ...}}",
                     "tool_choice");
    const auto at = std::find(names.begin(), names.end(), name.get<std::string>());
    if (at == names.end()) throw ApiError(400, "tool_choice names " + name.get<std::string>() + ", which is not in tools", "tool_choice");
    pick = size_t(at - names.begin());
    r.tool_named = true;
  }
  if (sp.json_object || sp.grammar)
    throw ApiError(400, "a forced tool call cannot be combined with a response_format or a guided_ or grammar constraint",
                   "tool_choice");
  // The schema as the body wrote it (its keys' order is the arguments').
  const nlohmann::ordered_json fn = ordered_body(j, body, "tools")["tools"][pick]["function"];
  const std::string path = "tools[" + std::to_string(pick) + "].function.parameters";
  // No parameters: a function that takes none, called with {}.
  const nlohmann::ordered_json params =
      fn.contains("parameters") ? fn["parameters"] : nlohmann::ordered_json{{"type", "object"}, {"additionalProperties", false}};
  if (!params.is_object() || params.value("type", nlohmann::ordered_json()) != "object")
    throw ApiError(400, path + " must be a JSON schema of \"type\": \"object\" (a call's arguments are an object)", "tools");
  sp.json_schema = compiled_or_400("tools", [&] { return infer::JsonSchema::compile(params, path); });
  sp.json_object = true;
  r.tool_name = names[pick];
}

Request parse_chat(const std::string& body, const ModelInfo& model, const data::Tokenizer& tok) {
  const json j = parse_body(body);
  check_model_and_user(j, model);

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
  read_tools(j, body, sp, r);
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
