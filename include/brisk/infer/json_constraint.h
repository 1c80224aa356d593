// Generation constrained to one JSON object: OpenAI's response_format
// {"type": "json_object"} (llama.cpp's server and vLLM do it with a grammar).
//
// A pushdown automaton over bytes (RFC 8259): the containers open so far on
// a stack, and where in a value the text is. Before each draw the engine
// asks which tokens' bytes may come next and gives the others a logit of
// -inf; after it, feeds the drawn token's bytes. The text it lets through
// is always a prefix of a JSON object, and once the object closes the
// sequence ends. Strings hold valid UTF-8 only (a JSON text is UTF-8);
// whitespace between tokens is limited to kMaxSpaces in a row, so a model
// cannot stall in it, and a number's integer part to kMaxIntegerDigits
// digits and its exponent to kMaxExponentDigits, so it stays a finite
// double for strict parsers (nlohmann, a C++ client's, refuses 1e400).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace brisk::infer {

class JsonConstraint {
 public:
  static constexpr int kMaxSpaces = 16;
  static constexpr size_t kMaxDepth = 64;  // containers open at once
  static constexpr int kMaxExponentDigits = 2;
  static constexpr int kMaxIntegerDigits = 100;

  // Whether `bytes` may come next (the state is left as it is).
  bool accepts(std::string_view bytes) const;
  // Feeds `bytes`; false (and the state undefined) if they may not come next.
  bool feed(std::string_view bytes);
  // The object is complete: nothing may follow.
  bool done() const { return mode_ == Mode::done; }
  // Inside a string, between characters: any plain text may come next
  // (JsonVocabulary's shortcut).
  bool in_plain_string() const { return mode_ == Mode::string && utf8_left_ == 0; }

 private:
  enum class Mode : uint8_t {
    top,          // before the object: whitespace or '{'
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
    done,
  };
  enum class Num : uint8_t { minus, zero, integer, dot, fraction, e, e_sign, exponent };

  bool step(unsigned char c);
  bool number(unsigned char c);
  bool value_start(unsigned char c);
  bool close(unsigned char c);
  void end_value() { mode_ = stack_.empty() ? Mode::done : Mode::after; }

  Mode mode_ = Mode::top;
  std::string stack_;       // '{' or '[' per open container
  bool key_ = false;        // the string being read is an object key
  Num num_ = Num::minus;
  std::string_view literal_;
  int integer_digits_ = 0, exponent_digits_ = 0;
  int hex_left_ = 0;
  bool hex_d_ = false;      // the \u escape's first digit is d (a surrogate may follow)
  int spaces_ = 0;          // whitespace bytes in a row
  int utf8_left_ = 0;       // continuation bytes the character in a string still needs
  unsigned char utf8_lo_ = 0x80, utf8_hi_ = 0xBF;  // the allowed range of the next one
};

// A vocabulary's token bytes, for masking the tokens that cannot come next.
// Trying every token on a copy of the automaton made a W1 token (GPT-2's
// 50,257) 2.7x as slow as an unconstrained one (3.74 against 1.38 ms, one
// sequence, 2 threads); most draws are inside strings, where a token of
// plain text (no quote, backslash or control byte; well-formed UTF-8 so far)
// always fits, and elsewhere most tokens fail on their first byte, so both
// are decided without a copy: 1.21x (docs/serving.md, JSON output).
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
  std::vector<uint8_t> plain_;  // the token is plain string text
};

}  // namespace brisk::infer
