// The JSON automaton; see brisk/infer/json_constraint.h.
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
  // One probe per thread, assigned rather than constructed: its stack keeps
  // its capacity, so trying a token allocates nothing (the mask tries
  // thousands per draw).
  thread_local JsonConstraint probe;
  probe = *this;
  return probe.feed(bytes);
}

bool JsonConstraint::feed(std::string_view bytes) {
  ++tokens_;
  for (const char ch : bytes)
    if (!step(static_cast<unsigned char>(ch))) return false;
  return true;
}

// The schema of the value that may begin now.
const JsonSchemaNode* JsonConstraint::value_node() const {
  if (stack_.empty()) return root_;
  const Frame& f = stack_.back();
  if (f.kind == '[') return f.node->items;
  return f.node->keyed() ? f.node->properties[size_t(f.index)] : f.node->additional;
}

bool JsonConstraint::value_start(unsigned char c, const Node* n) {
  while (!n->any_of.empty()) {  // the alternative this byte begins (their first bytes are disjoint)
    const Node* pick = nullptr;
    for (const Node* a : n->any_of)
      if (a->first.test(c)) pick = a;
    if (!pick) return false;
    n = pick;
  }
  if (!n->first.test(c)) return false;
  if (!n->literals.empty()) {
    mode_ = Mode::choice;
    choice_ = &n->literals, choice_lo_ = 0, choice_hi_ = n->literals.size(), choice_pos_ = 0, choice_key_ = false;
    return choice(c);
  }
  switch (c) {
    case '{':
    case '[':
      // Its fewest containers must fit, or the text would reach a point
      // where nothing can go on.
      if (stack_.size() + size_t(c == '{' ? n->object_depth : n->array_depth) > kMaxDepth) return false;
      stack_.push_back(Frame{n, c == '{' ? -1 : 0, char(c)});
      mode_ = c == '{' ? Mode::first_key : Mode::first_value;
      return true;
    case '"':
      mode_ = Mode::string;
      key_ = false;
      string_node_ = n, chars_ = 0;
      return true;
    case '-':
      mode_ = Mode::number, num_ = Num::minus, integer_ = n->integer;
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
      mode_ = Mode::number, num_ = c == '0' ? Num::zero : Num::integer, integer_digits_ = 1, integer_ = n->integer;
      return true;
  }
}

// A key's opening quote: a listed key (one of the schema's, in its order)
// or, without properties, any string where additionalProperties allows one.
bool JsonConstraint::key_start() {
  const Node* n = stack_.back().node;
  if (n->keyed()) {
    mode_ = Mode::choice;
    choice_ = &n->keys, choice_lo_ = 0, choice_hi_ = n->keys.size(), choice_pos_ = 0, choice_key_ = true;
    return choice('"');
  }
  if (!n->additional || !fits(n->additional)) return false;
  mode_ = Mode::string;
  key_ = true;
  string_node_ = nullptr, chars_ = 0;
  return true;
}

// Listed keys come in the schema's order, after the last one written, and
// none past a required one not yet written.
bool JsonConstraint::key_allowed(int32_t property) const {
  const Frame& f = stack_.back();
  return property > f.index && property <= f.node->next_required[size_t(f.index + 1)] &&
         fits(f.node->properties[size_t(property)]);
}

// A value of `n` may begin inside the open containers: its fewest own fit.
bool JsonConstraint::fits(const Node* n) const { return stack_.size() + size_t(n->min_depth) <= kMaxDepth; }

// After a value, ',' needs something that may follow it: another item, or a
// key (a listed one allowed there, or any where the object takes any).
bool JsonConstraint::more_allowed() const {
  const Frame& f = stack_.back();
  if (f.kind == '[') return f.index < f.node->max_items && fits(f.node->items);
  if (!f.node->keyed()) return f.node->additional && fits(f.node->additional);
  for (int32_t p = int32_t(f.index + 1); p < int32_t(f.node->properties.size()); ++p)
    if (key_allowed(p)) return true;
  return false;
}

// One byte of an enum's text or a listed key. The candidates are sorted, so
// those that go on with `c` are a run of them. A value's text may be a
// prefix of another's (1 and 12): it ends when the next byte goes on with
// none of them, and that byte is the next thing's. A key ends at its
// closing quote, which no other key goes on from.
bool JsonConstraint::choice(unsigned char c) {
  const std::vector<std::string>& texts = *choice_;
  const size_t pos = choice_pos_;
  const auto begin = texts.begin() + std::ptrdiff_t(choice_lo_), end = texts.begin() + std::ptrdiff_t(choice_hi_);
  const auto lo = std::partition_point(begin, end, [&](const std::string& t) {
    return t.size() <= pos || static_cast<unsigned char>(t[pos]) < c;
  });
  const auto hi =
      std::partition_point(lo, end, [&](const std::string& t) { return static_cast<unsigned char>(t[pos]) == c; });
  bool goes_on = lo != hi;
  if (goes_on && choice_key_) {
    goes_on = false;
    for (auto t = lo; t != hi && !goes_on; ++t)
      goes_on = key_allowed(stack_.back().node->key_property[size_t(t - texts.begin())]);
  }
  if (goes_on) {
    choice_lo_ = size_t(lo - texts.begin()), choice_hi_ = size_t(hi - texts.begin()), choice_pos_ = pos + 1;
    const bool complete = choice_hi_ - choice_lo_ == 1 && texts[choice_lo_].size() == choice_pos_;
    if (complete && choice_key_) {
      stack_.back().index = stack_.back().node->key_property[choice_lo_];
      mode_ = Mode::colon;
    } else if (complete) {
      end_value();
    }
    return true;
  }
  if (choice_key_ || texts[choice_lo_].size() != pos) return false;
  end_value();  // the value is complete; this byte is the next thing's
  return step(c);
}

// Whitespace between tokens: nothing, one space, or a newline and an indent
// of up to kMaxIndent spaces or tabs, from at most kMaxGapTokens fed
// tokens. spaces_ counts the gap's bytes so far; gap_newline_ says it
// began with a newline.
bool JsonConstraint::gap(unsigned char c) {
  if (spaces_ == 0) {
    if (c != ' ' && c != '\n') return false;
    gap_newline_ = c == '\n';
    spaces_ = 1;
    gap_tokens_ = 1;
    gap_token_ = tokens_;
    return true;
  }
  if (!gap_newline_ || (c != ' ' && c != '\t')) return false;
  if (gap_token_ != tokens_) {  // a later token goes on with the gap
    if (++gap_tokens_ > kMaxGapTokens) return false;
    gap_token_ = tokens_;
  }
  return ++spaces_ <= kMaxIndent + 1;
}

// A string's next character: within its schema's maxLength.
bool JsonConstraint::take_char() {
  if (string_node_ && chars_ >= string_node_->max_length) return false;
  ++chars_;
  return true;
}

bool JsonConstraint::close(unsigned char c) {
  if (stack_.empty() || (c == '}') != (stack_.back().kind == '{')) return false;
  const Frame& f = stack_.back();
  if (f.kind == '[' && f.index < f.node->min_items) return false;
  if (f.kind == '{' && f.node->keyed() && f.node->next_required[size_t(f.index + 1)] < int32_t(f.node->properties.size()))
    return false;  // a required key is still to come
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
  chars_.reserve(bytes_.size());
  for (const std::string& b : bytes_) {
    plain_.push_back(plain_text(b));
    chars_.push_back(int32_t(std::count_if(b.begin(), b.end(), [](char c) { return (c & 0xC0) != 0x80; })));
  }
}

int64_t JsonVocabulary::mask(const JsonConstraint& json, float* row) const {
  constexpr float never = -std::numeric_limits<float>::infinity();
  const int64_t plain_room = json.plain_room();  // -1: not inside a string
  // By first byte, then by first two: -1 unknown, 0 no, 1 yes (the rest
  // is tried). Most tokens that get past their first byte outside a string
  // are " word"s (whitespace may come next) that the second byte refuses:
  // ~35,000 of GPT-2's, in some 60 distinct pairs.
  int8_t first_fits[256];
  std::fill(std::begin(first_fits), std::end(first_fits), int8_t(-1));
  thread_local std::vector<int8_t> pair_fits(65536);
  bool pairs_clear = false;  // cleared on first use: inside strings it is rarely needed
  int64_t left = 0;
  for (size_t t = 0; t < bytes_.size(); ++t) {
    if (row[t] == never) continue;
    if (plain_room >= 0 && plain_[t]) {  // a plain token fits if the string has room for it
      if (chars_[t] <= plain_room) ++left;
      else row[t] = never;
      continue;
    }
    const std::string& b = bytes_[t];
    if (b.empty()) {
      row[t] = never;  // no text: it would not move the object on
      continue;
    }
    const auto b0 = static_cast<unsigned char>(b[0]);
    int8_t& first = first_fits[b0];
    if (first < 0) first = json.accepts(std::string_view(b.data(), 1));
    bool fits = first;
    if (fits && b.size() > 1) {
      if (!pairs_clear) std::fill(pair_fits.begin(), pair_fits.end(), int8_t(-1)), pairs_clear = true;
      int8_t& pair = pair_fits[size_t(b0) << 8 | static_cast<unsigned char>(b[1])];
      if (pair < 0) pair = json.accepts(std::string_view(b.data(), 2));
      fits = pair && (b.size() == 2 || json.accepts(b));
    }
    if (fits) ++left;
    else row[t] = never;
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
      if (c == '.' && (num_ == Num::zero || num_ == Num::integer) && !integer_) {
        num_ = Num::dot;
        return true;
      }
      if ((c == 'e' || c == 'E') && num_ != Num::exponent && !integer_) {
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
      if (is_space(c)) return gap(c);
      spaces_ = 0;
      break;
    default:
      break;
  }
  switch (mode_) {
    case Mode::top:
      return (c == '{' || c == '[') && value_start(c, root_);
    case Mode::first_value: {
      if (c == ']') return close(c);
      Frame& f = stack_.back();
      if (f.node->max_items == 0) return false;
      f.index = 1;
      return value_start(c, f.node->items);
    }
    case Mode::value:
      return value_start(c, value_node());
    case Mode::first_key:
      if (c == '}') return close(c);
      [[fallthrough]];
    case Mode::key:
      return c == '"' && key_start();
    case Mode::colon:
      if (c != ':') return false;
      mode_ = Mode::value;
      return true;
    case Mode::after: {
      if (c != ',') return (c == '}' || c == ']') && close(c);
      if (!more_allowed()) return false;
      Frame& f = stack_.back();
      if (f.kind == '[') ++f.index;
      mode_ = f.kind == '[' ? Mode::value : Mode::key;
      return true;
    }
    case Mode::string:
      if (utf8_left_ > 0) {  // a continuation byte, in the range the character allows
        if (c < utf8_lo_ || c > utf8_hi_) return false;
        --utf8_left_;
        utf8_lo_ = 0x80, utf8_hi_ = 0xBF;
        return true;
      }
      if (c == '"') {
        if (string_node_ && chars_ < string_node_->min_length) return false;
        if (key_) mode_ = Mode::colon;
        else end_value();
        return true;
      }
      if (c == '\\') {
        mode_ = Mode::escape;
        return take_char();  // an escape is one character
      }
      if (c < 0x20) return false;  // control characters must be escaped
      {
        const core::Utf8Lead lead = core::utf8_lead(c);  // ASCII, or how a character goes on
        if (lead.continuation < 0 || !take_char()) return false;
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
    case Mode::choice:
      return choice(c);
    case Mode::done:
      return false;
  }
  return false;
}

}  // namespace brisk::infer
