// The OpenAI API of `brisk serve` (docs/serving.md): /v1/completions bodies
// read into engine sequences here; the chat route, the building of answers
// and the running of a request in the headers below, which a server gets
// all of through this one.
#pragma once

#include <string>

#include "brisk/serve/api.h"
#include "brisk/serve/chat.h"
#include "brisk/serve/choice_builder.h"
#include "brisk/serve/generation.h"

namespace brisk::data {
class Tokenizer;
}

namespace brisk::serve {

// Parses and validates a /v1/completions body; throws ApiError (400 naming
// the field, 404 for another model's name). `prompt` is a string, a list of
// strings, a list of token ids or a list of such lists; each prompt gets `n`
// choices. A missing seed gets a random one.
Request parse_completions(const std::string& body, const ModelInfo& model, const data::Tokenizer& tok);

}  // namespace brisk::serve
