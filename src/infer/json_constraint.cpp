// The JSON object automaton; see brisk/infer/json_constraint.h.
#include "brisk/infer/json_constraint.h"

#include <algorithm>
#include <limits>

#include "brisk/core/utf8.h"

namespace brisk::infer {

namespace {

bool is_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
bool is_hex(unsigned char c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

}  // namespace

bool JsonConstraint::accepts(std::string_view bytes) const {
  JsonConstraint probe = *this;
  return probe.feed(bytes);
}

bool JsonConstraint::feed(std::string_view bytes) {
  for (const char ch : bytes)
    if (!step(static_cast<unsigned char>(ch))) return false;
  return true;
}

bool JsonConstraint::value_start(unsigned char c) {
  switch (c) {
    case '{':
    case '[':
      if (stack_.size() >= kMaxDepth) return false;
      stack_.push_back(char(c));
      mode_ = c == '{' ? Mode::first_key : Mode::first_value;
      return true;
    case '"':
      mode_ = Mode::string;
      key_ = false;
      return true;
    case '-':
      mode_ = Mode::number, num_ = Num::minus;
      return true;
    case 't':
      mode_ = Mode::literal, literal_ = "rue";
      return true;
    case 'f':
      mode_ = Mode::literal, literal_ = "alse";
      return true;
    case 'n':
      mode_ = Mode::literal, literal_ = "ull";
      return true;
    default:
      if (!is_digit(c)) return false;
      mode_ = Mode::number, num_ = c == '0' ? Num::zero : Num::integer, integer_digits_ = 1;
      return true;
  }
}

bool JsonConstraint::close(unsigned char c) {
  if (stack_.empty() || (c == '}') != (stack_.back() == '{')) return false;
  stack_.pop_back();
  end_value();
  return true;
}

namespace {

// Plain string text: bytes a string takes as they are from between two
// characters (printable, UTF-8 that is well formed so far; no quote, which
// would end it, and no backslash, which starts an escape).
bool plain_text(std::string_view bytes) {
  if (bytes.empty()) return false;
  for (const char c : bytes)
    if (c == '"' || c == '\\') return false;
  JsonConstraint inside;
  return inside.feed("{\"") && inside.feed(bytes);
}

}  // namespace

JsonVocabulary::JsonVocabulary(std::vector<std::string> token_bytes) : bytes_(std::move(token_bytes)) {
  plain_.reserve(bytes_.size());
  for (const std::string& b : bytes_) plain_.push_back(plain_text(b));
}

int64_t JsonVocabulary::mask(const JsonConstraint& json, float* row) const {
  constexpr float never = -std::numeric_limits<float>::infinity();
  const bool plain_fits = json.in_plain_string();
  int8_t first_fits[256];  // by first byte: -1 unknown, 0 no, 1 maybe (the rest is tried)
  std::fill(std::begin(first_fits), std::end(first_fits), int8_t(-1));
  int64_t left = 0;
  for (size_t t = 0; t < bytes_.size(); ++t) {
    if (row[t] == never) continue;
    if (plain_fits && plain_[t]) {
      ++left;
      continue;
    }
    const std::string& b = bytes_[t];
    if (b.empty()) {
      row[t] = never;  // no text: it would not move the object on
      continue;
    }
    int8_t& first = first_fits[static_cast<unsigned char>(b[0])];
    if (first < 0) first = json.accepts(std::string_view(b.data(), 1));
    if (!first || (b.size() > 1 && !json.accepts(b))) row[t] = never;
    else ++left;
  }
  return left;
}

// -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?
bool JsonConstraint::number(unsigned char c) {
  const bool digit = is_digit(c);
  switch (num_) {
    case Num::minus:
      if (digit) num_ = c == '0' ? Num::zero : Num::integer, integer_digits_ = 1;
      return digit;
    case Num::dot:
      if (digit) num_ = Num::fraction;
      return digit;
    case Num::e:
      if (c == '+' || c == '-') {
        num_ = Num::e_sign;
        return true;
      }
      [[fallthrough]];
    case Num::e_sign:
      if (digit) num_ = Num::exponent, exponent_digits_ = 1;
      return digit;
    case Num::integer:
    case Num::zero:
    case Num::fraction:
    case Num::exponent:
      // At most kMaxExponentDigits exponent digits: a strict parser (nlohmann,
      // a C++ client's) refuses a number past the double range, 1e400.
      if (digit && num_ == Num::exponent) return ++exponent_digits_ <= kMaxExponentDigits;
      if (digit && num_ == Num::integer) return ++integer_digits_ <= kMaxIntegerDigits;
      if (digit && num_ != Num::zero) return true;
      if (c == '.' && (num_ == Num::zero || num_ == Num::integer)) {
        num_ = Num::dot;
        return true;
      }
      if ((c == 'e' || c == 'E') && num_ != Num::exponent) {
        num_ = Num::e;
        return true;
      }
      end_value();  // the number is complete; this byte is the next thing's
      return step(c);
  }
  return false;
}

bool JsonConstraint::step(unsigned char c) {
  switch (mode_) {
    case Mode::top:
    case Mode::value:
    case Mode::first_value:
    case Mode::key:
    case Mode::first_key:
    case Mode::colon:
    case Mode::after:
      if (is_space(c)) return ++spaces_ <= kMaxSpaces;
      spaces_ = 0;
      break;
    default:
      break;
  }
  switch (mode_) {
    case Mode::top:
      return c == '{' && value_start(c);
    case Mode::first_value:
      if (c == ']') return close(c);
      [[fallthrough]];
    case Mode::value:
      return value_start(c);
    case Mode::first_key:
      if (c == '}') return close(c);
      [[fallthrough]];
    case Mode::key:
      if (c != '"') return false;
      mode_ = Mode::string;
      key_ = true;
      return true;
    case Mode::colon:
      if (c != ':') return false;
      mode_ = Mode::value;
      return true;
    case Mode::after:
      if (c == ',') {
        mode_ = stack_.back() == '{' ? Mode::key : Mode::value;
        return true;
      }
      return (c == '}' || c == ']') && close(c);
    case Mode::string:
      if (utf8_left_ > 0) {  // a continuation byte, in the range the character allows
        if (c < utf8_lo_ || c > utf8_hi_) return false;
        --utf8_left_;
        utf8_lo_ = 0x80, utf8_hi_ = 0xBF;
        return true;
      }
      if (c == '"') {
        if (key_) mode_ = Mode::colon;
        else end_value();
        return true;
      }
      if (c == '\\') {
        mode_ = Mode::escape;
        return true;
      }
      if (c < 0x20) return false;  // control characters must be escaped
      {
        const core::Utf8Lead lead = core::utf8_lead(c);  // ASCII, or how a character goes on
        if (lead.continuation < 0) return false;
        utf8_left_ = lead.continuation, utf8_lo_ = lead.lo, utf8_hi_ = lead.hi;
        return true;
      }
    case Mode::escape:
      if (c == 'u') {
        mode_ = Mode::hex, hex_left_ = 4;
        return true;
      }
      mode_ = Mode::string;
      return c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' || c == 't';
    case Mode::hex:
      if (!is_hex(c)) return false;
      // No \uD800-\uDFFF: a surrogate must come in a pair, which this does
      // not track; a character past the BMP can be written as UTF-8.
      if (hex_left_ == 4) hex_d_ = (c | 0x20) == 'd';
      if (hex_left_ == 3 && hex_d_ && !(c >= '0' && c <= '7')) return false;
      if (--hex_left_ == 0) mode_ = Mode::string;
      return true;
    case Mode::literal:
      if (c != static_cast<unsigned char>(literal_.front())) return false;
      literal_.remove_prefix(1);
      if (literal_.empty()) end_value();
      return true;
    case Mode::number:
      return number(c);
    case Mode::done:
      return false;
  }
  return false;
}

}  // namespace brisk::infer
