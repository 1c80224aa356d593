// A JSON Schema compiled for constrained generation: OpenAI's
// response_format {"type": "json_schema"}, vLLM's guided_json, llama.cpp's
// --json-schema. JsonConstraint walks it byte by byte, so every text it lets
// through to the close is an instance of the schema.
//
// The subset (docs/serving.md, JSON output, lists it for users):
// - type (a name or a list), enum, const;
// - objects: properties, required, additionalProperties. With properties,
//   keys come in the schema's order, each at most once, the required ones
//   always (as OpenAI's structured outputs and xgrammar write them); other
//   keys are never written, whatever additionalProperties says. Without
//   properties, any keys, their values by additionalProperties;
// - arrays: items, minItems, maxItems;
// - strings: minLength, maxLength (in characters; an escape is one);
// - integer: no fraction or exponent;
// - anyOf / oneOf whose alternatives begin with different bytes (a string,
//   a number, an object, null...), so the first byte picks one;
// - $ref to "#", "#/$defs/..." or "#/definitions/..." (recursion included),
//   and allOf with one schema (how Pydantic wraps a $ref);
// - annotations (title, description, default, examples, format, $schema,
//   $id, $comment...) are read past: format is not asserted, as JSON
//   Schema's default vocabulary does not.
// Any other assertion (pattern, minimum, multipleOf, uniqueItems,
// prefixItems, not, if...) is refused by name, never ignored: a client must
// not believe a constraint holds that the text may break.
//
// The root must allow an object or an array (a value the text can close: a
// top-level number has no last digit), every schema must have a finite
// instance (a required property may not lead back to itself) that fits in
// kMaxDepth containers, and `false` is refused wherever it stands.
#pragma once

#include <bitset>
#include <cstdint>
#include <limits>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace brisk::infer {

struct JsonSchemaNode {
  static constexpr int64_t kUnlimited = std::numeric_limits<int64_t>::max();
  // Containers open at once in a text (JsonConstraint's stack).
  static constexpr int32_t kMaxDepth = 64;
  enum Kind : uint8_t { kObject = 1, kArray = 2, kString = 4, kNumber = 8, kBoolean = 16, kNull = 32, kAll = 63 };

  uint8_t kinds = 0;     // the kinds of value allowed (Kind bits)
  bool integer = false;  // numbers: no fraction or exponent
  // anyOf / oneOf: the value is one of these (their first bytes are disjoint).
  std::vector<const JsonSchemaNode*> any_of;
  // enum / const: the value's compact JSON text is one of these (sorted).
  std::vector<std::string> literals;
  // The literals are plain text, not JSON (vLLM's guided_choice): the whole
  // text is one of them. Only a root is raw.
  bool raw = false;

  // Objects with properties: values in schema order; keys[] are the names'
  // JSON texts (quotes included), sorted, key_property[i] the property of
  // keys[i]; next_required[i] the first required property at or after i
  // (properties.size() when none), with one entry past the end.
  std::vector<const JsonSchemaNode*> properties;
  std::vector<std::string> keys;
  std::vector<int32_t> key_property;
  std::vector<int32_t> next_required;
  // Objects without properties: any keys, their values this (null: no keys).
  const JsonSchemaNode* additional = nullptr;

  const JsonSchemaNode* items = nullptr;  // arrays: each item (never null once compiled)
  int64_t min_items = 0, max_items = kUnlimited;
  int64_t min_length = 0, max_length = kUnlimited;  // strings, in characters

  std::bitset<256> first;  // the bytes a value may begin with
  bool one_of = false;     // any_of came from oneOf: no value may match two alternatives
  // The fewest containers a value opens (its own included): any value,
  // one that begins with '{', one that begins with '['. A text refuses a
  // value, key or item whose depth would pass kMaxDepth, so it never
  // reaches a point where no byte can go on.
  int32_t min_depth = 0, object_depth = 0, array_depth = 0;
  // While compiling: this node is a $ref (or a one-schema allOf) to that one.
  const JsonSchemaNode* alias = nullptr;

  bool keyed() const { return !properties.empty(); }
};

class JsonSchema {
 public:
  // Throws core::ConfigError naming the schema's path (from `name`) and what
  // is wrong or not supported there ("schema.properties.age: 'minimum' is
  // not supported"). Ordered: the properties' order is the keys' order.
  static std::shared_ptr<const JsonSchema> compile(const nlohmann::ordered_json& schema,
                                                   const std::string& name = "schema");
  // The same from a schema's JSON text.
  static std::shared_ptr<const JsonSchema> compile_text(const std::string& text, const std::string& name = "schema");
  // {"type": "object"}: any object (response_format json_object).
  static const JsonSchema& any_object();
  // Not JSON: the whole text is one of `texts` (vLLM's guided_choice).
  // Throws core::ConfigError naming `name` for an empty list or text, or a
  // text that begins another (after it the text could neither end nor
  // go on by itself).
  static std::shared_ptr<const JsonSchema> choices(const std::vector<std::string>& texts,
                                                   const std::string& name = "guided_choice");

  const JsonSchemaNode* root() const { return root_; }
  // The schema's compact text (the response cache keys on it).
  const std::string& text() const { return text_; }

 private:
  JsonSchema() = default;
  std::vector<std::unique_ptr<JsonSchemaNode>> nodes_;
  const JsonSchemaNode* root_ = nullptr;
  std::string text_;
  friend class JsonSchemaCompiler;
};

}  // namespace brisk::infer
