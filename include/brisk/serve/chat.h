// /v1/chat/completions on a base (not chat-tuned) GPT: the messages are
// rendered as plain text with one fixed template, and the model continues
// it as the assistant (docs/serving.md shows the template).
#pragma once

#include <string>
#include <vector>

#include "brisk/serve/api.h"

namespace brisk::data {
class Tokenizer;
}

namespace brisk::serve {

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

// Every message as "<Role>: <content>\n" (Role capitalized), then
// "Assistant:", which the model continues. No blank lines are added.
std::string render_chat(const std::vector<ChatMessage>& messages);

// Added to the request's stop strings: without it a base model goes on to
// write the user's next turn itself.
inline constexpr const char* kChatStop = "\nUser:";

// Parses and validates a /v1/chat/completions body; throws ApiError (400
// naming the field, 404 for another model's name). The rendered messages
// are every choice's prompt; max_tokens (or max_completion_tokens) defaults
// to the rest of the context. A missing seed gets a random one.
Request parse_chat(const std::string& body, const ModelInfo& model, const data::Tokenizer& tok);

}  // namespace brisk::serve
