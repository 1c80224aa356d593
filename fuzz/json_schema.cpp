// Fuzz target: JSON schemas compiled for constrained generation
// (infer::JsonSchema, src/infer/json_schema.cpp), the schema text coming
// from requests (response_format json_schema, guided_json), and the
// automaton walking them (infer::JsonConstraint).
// Input: a schema's text, a NUL byte, then bytes fed one at a time until one
// is refused.
//
// It promises (json_schema.h, json_constraint.h): a schema compiles or is
// refused with a ConfigError, never a crash or a hang (a $ref or anyOf
// cycle, nesting); under a compiled schema accepts() answers what feed()
// then does, some byte always goes on until the value closes, what closes
// is JSON nlohmann reads (an object or an array), and nothing follows it.
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "brisk/core/error.h"
#include "brisk/infer/json_constraint.h"
#include "brisk/infer/json_schema.h"
#include "json_walk.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace brisk;
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string schema_text = input.substr(0, nul);
  const std::string bytes = nul == std::string::npos ? std::string() : input.substr(nul + 1, 256);
  std::shared_ptr<const infer::JsonSchema> schema;
  try {
    schema = infer::JsonSchema::compile_text(schema_text);
  } catch (const core::ConfigError&) {
    return 0;  // refused, by name
  }
  infer::JsonConstraint json(*schema);
  const std::string text = fuzz::walk_json(json, bytes, /*live=*/true);
  if (json.done()) {
    const nlohmann::json v = fuzz::closed_json(json, text);
    FUZZ_CHECK(v.is_object() || v.is_array());
  }
  return 0;
}
