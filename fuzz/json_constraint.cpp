// Fuzz target: the JSON object automaton behind response_format
// json_object (infer::JsonConstraint, src/infer/json_constraint.cpp).
// Input: any bytes, fed one at a time until one is refused.
//
// It promises (json_constraint.h): what it lets through to the close is a
// JSON object that nlohmann's parser reads; accepts() answers what feed()
// then does; after the close it accepts nothing.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "brisk/infer/json_constraint.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using brisk::infer::JsonConstraint;
  JsonConstraint json;
  std::string text;
  for (size_t i = 0; i < size && !json.done(); ++i) {
    const std::string byte(1, char(data[i]));
    const bool ok = json.accepts(byte);
    JsonConstraint fed = json;
    FUZZ_CHECK(fed.feed(byte) == ok);
    if (!ok) break;
    json = fed;
    text += byte;
  }
  if (json.done()) {
    FUZZ_CHECK(nlohmann::json::accept(text));
    FUZZ_CHECK(nlohmann::json::parse(text).is_object());
    for (int b = 0; b < 256; ++b) FUZZ_CHECK(!json.accepts(std::string(1, char(b))));
  }
  return 0;
}
