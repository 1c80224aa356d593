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
#include "json_walk.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  brisk::infer::JsonConstraint json;
  const std::string text =
      brisk::fuzz::walk_json(json, std::string_view(reinterpret_cast<const char*>(data), size), /*live=*/false);
  if (json.done()) FUZZ_CHECK(brisk::fuzz::closed_json(json, text).is_object());
  return 0;
}
