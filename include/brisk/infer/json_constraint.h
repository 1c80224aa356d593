// Generation constrained to JSON: OpenAI's response_format {"type":
// "json_object"} (any object) and {"type": "json_schema"} (an instance of
// a schema, json_schema.h); llama.cpp's server and vLLM do both with a
// grammar.
//
// A pushdown automaton over bytes (RFC 8259): the containers open so far on
// a stack, each with its schema, and where in a value the text is. Before
// each draw the engine asks which tokens' bytes may come next and gives the
// others a logit of -inf; after it, feeds the drawn token's bytes. The text
// it lets through is always a prefix of a JSON value the schema allows (an
// object or an array), and once that closes the sequence ends. Strings hold
// valid UTF-8 only (a JSON text is UTF-8); whitespace between tokens is one
// space, or a newline and an indent of at most kMaxIndent spaces or tabs
// (llama.cpp's JSON grammar's rule), so a model cannot spend its tokens
// on it: allowed up to 16 bytes of any whitespace per gap, the demo's byte
// model (never trained on JSON) closed 0 of 24 three-key objects within
// 120 tokens, and 16 of 24 under this rule; and a
// number's integer part to kMaxIntegerDigits digits and its exponent to
// kMaxExponentDigits, so it stays a finite double for strict parsers
// (nlohmann, a C++ client's, refuses 1e400). An enum's or const's value is
// written exactly as its compact JSON text; an object's listed keys too.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "brisk/infer/json_schema.h"

namespace brisk::infer {

class JsonConstraint {
 public:
  static constexpr int kMaxIndent = 20;  // spaces or tabs after a newline between tokens
  // Tokens one gap's whitespace may come from: GPT-2 has no token of two
  // spaces, so under kMaxIndent alone a W1 model spent 137 of 150 tokens on
  // "\n" and 20 " "s (the object unclosed at max_tokens); now a newline
  // and one indent token, or one token holding both.
  static constexpr int kMaxGapTokens = 2;
  static constexpr size_t kMaxDepth = JsonSchemaNode::kMaxDepth;  // containers open at once
  static constexpr int kMaxExponentDigits = 2;
  static constexpr int kMaxIntegerDigits = 100;

  // Any object (json_object).
  JsonConstraint() : JsonConstraint(JsonSchema::any_object()) {}
  // An instance of `schema`, which must outlive the automaton and its copies.
  explicit JsonConstraint(const JsonSchema& schema) : root_(schema.root()) {
    if (root_->raw)  // a guided_choice: the text is one of the literals, from its first byte
      mode_ = Mode::choice, choice_ = &root_->literals, choice_hi_ = root_->literals.size();
  }

  // Whether `bytes`, as the next token, may come next (the state is left
  // as it is).
  bool accepts(std::string_view bytes) const;
  // Feeds `bytes` as one token (kMaxGapTokens counts feeds); false (and
  // the state undefined) if they may not come next.
  bool feed(std::string_view bytes);
  // The value is complete: nothing may follow.
  bool done() const { return mode_ == Mode::done; }
  // Inside a string, between characters: plain text of up to this many
  // characters may come next (the schema's maxLength, else unlimited);
  // -1 elsewhere (JsonVocabulary's shortcut).
  int64_t plain_room() const {
    if (mode_ != Mode::string || utf8_left_ != 0) return -1;
    return string_node_ && string_node_->max_length != JsonSchemaNode::kUnlimited ? string_node_->max_length - chars_
                                                                                   : JsonSchemaNode::kUnlimited;
  }
  bool in_plain_string() const { return plain_room() >= 0; }

 private:
  enum class Mode : uint8_t {
    top,          // before the value: whitespace, '{' or '['
    value,        // a value: any of them
    first_value,  // an array's first value, or its ']'
    key,          // an object's key ('"'), after a ','
    first_key,    // an object's first key, or its '}'
    colon,        // between a key and its value
    after,        // after a value: ',' or the container's close
    string,       // inside a string (key or value)
    escape,       // after a backslash
    hex,          // in \uXXXX (hex_left digits to go)
    number,       // in a number (num_ says where)
    literal,      // in true / false / null (literal_ says what is left)
    choice,       // in an enum's value or a listed key: one of choice_'s texts
    done,
  };
  enum class Num : uint8_t { minus, zero, integer, dot, fraction, e, e_sign, exponent };

  using Node = JsonSchemaNode;
  struct Frame {
    const Node* node;
    // '{': the last listed key written (-1: none yet); '[': items begun.
    int64_t index;
    char kind;  // '{' or '['
  };

  bool step(unsigned char c);
  bool number(unsigned char c);
  bool value_start(unsigned char c, const Node* node);
  const Node* value_node() const;
  bool key_start();
  bool choice(unsigned char c);
  bool key_allowed(int32_t property) const;
  bool fits(const Node* n) const;
  bool more_allowed() const;
  bool take_char();
  bool gap(unsigned char c);
  bool close(unsigned char c);
  void end_value() { mode_ = stack_.empty() ? Mode::done : Mode::after; }

  const Node* root_;
  Mode mode_ = Mode::top;
  std::vector<Frame> stack_;  // the open containers
  bool key_ = false;          // the string being read is an object key
  const Node* string_node_ = nullptr;  // the string's schema (null: a key's)
  int64_t chars_ = 0;                  // characters in the string so far
  bool integer_ = false;               // the number may have no fraction or exponent
  // Mode::choice: the texts in [choice_lo_, choice_hi_) of *choice_ begin
  // with the choice_pos_ bytes so far; choice_key_: they are keys.
  const std::vector<std::string>* choice_ = nullptr;
  size_t choice_lo_ = 0, choice_hi_ = 0, choice_pos_ = 0;
  bool choice_key_ = false;
  Num num_ = Num::minus;
  std::string_view literal_;
  int integer_digits_ = 0, exponent_digits_ = 0;
  int hex_left_ = 0;
  bool hex_d_ = false;      // the \u escape's first digit is d (a surrogate may follow)
  int spaces_ = 0;          // whitespace bytes in this gap between tokens
  uint32_t tokens_ = 0;     // feeds so far
  uint32_t gap_token_ = 0;  // the feed that last added to the gap
  int gap_tokens_ = 0;      // feeds that added to it
  bool gap_newline_ = false;  // the gap began with a newline (an indent may follow)
  int utf8_left_ = 0;       // continuation bytes the character in a string still needs
  unsigned char utf8_lo_ = 0x80, utf8_hi_ = 0xBF;  // the allowed range of the next one
};

// A vocabulary's token bytes, for masking the tokens that cannot come next.
// Trying every token on a copy of the automaton made a W1 token (GPT-2's
// 50,257) 2.7x as slow as an unconstrained one (3.74 against 1.38 ms, one
// sequence, 2 threads); most draws are inside strings, where a token of
// plain text (no quote, backslash or control byte; well-formed UTF-8 so far)
// fits if the string has room for its characters (maxLength), and elsewhere
// most tokens fail on their first byte or their first two (" word" where
// whitespace may come), so these are decided without a copy: 1.21x
// (docs/serving.md, JSON output).
class JsonVocabulary {
 public:
  explicit JsonVocabulary(std::vector<std::string> token_bytes);
  const std::string& bytes(int32_t token) const { return bytes_[size_t(token)]; }
  int64_t size() const { return int64_t(bytes_.size()); }
  // row[t] = -inf for every token t whose bytes cannot come next; returns
  // how many tokens are left (finite).
  int64_t mask(const JsonConstraint& json, float* row) const;

 private:
  std::vector<std::string> bytes_;
  std::vector<uint8_t> plain_;   // the token is plain string text
  std::vector<int32_t> chars_;   // its characters (UTF-8 lead and ASCII bytes), where it is
};

}  // namespace brisk::infer
