// What the JSON fuzz targets (json_constraint, json_schema) share: bytes fed
// to the automaton one at a time, and the checks on what it lets through.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "brisk/infer/json_constraint.h"
#include "fuzz_util.h"

namespace brisk::fuzz {

// Feeds `bytes` one at a time until one is refused or the value closes;
// accepts() must answer what feed() then does, and with `live` some byte
// must go on at every step before the close. Returns the text let through.
inline std::string walk_json(infer::JsonConstraint& json, std::string_view bytes, bool live) {
  std::string text;
  for (size_t i = 0; i < bytes.size() && !json.done(); ++i) {
    if (live) {
      bool any = false;
      for (int b = 0; b < 256 && !any; ++b) any = json.accepts(std::string(1, char(b)));
      FUZZ_CHECK(any);
    }
    const std::string byte(1, bytes[i]);
    const bool ok = json.accepts(byte);
    infer::JsonConstraint fed = json;
    FUZZ_CHECK(fed.feed(byte) == ok);
    if (!ok) break;
    json = fed;
    text += byte;
  }
  return text;
}

// After the close: the text is JSON nlohmann reads, and nothing follows it.
inline nlohmann::json closed_json(const infer::JsonConstraint& json, const std::string& text) {
  FUZZ_CHECK(nlohmann::json::accept(text));
  for (int b = 0; b < 256; ++b) FUZZ_CHECK(!json.accepts(std::string(1, char(b))));
  return nlohmann::json::parse(text);
}

}  // namespace brisk::fuzz
