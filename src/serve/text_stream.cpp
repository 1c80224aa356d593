// Incremental detokenization with stop-string hold-back; see
// brisk/serve/text_stream.h.
#include "brisk/serve/text_stream.h"

#include <algorithm>

#include "brisk/core/utf8.h"
#include "brisk/data/tokenizer.h"
#include "brisk/infer/engine.h"
#include "brisk/infer/sampler.h"

namespace brisk::serve {

namespace {

// What starts at s[i..n): a well-formed character of `len` bytes; an
// ill-formed sequence whose `len` bytes become one U+FFFD (the "maximal
// subpart" of Unicode's substitution practice, which Python's and the WHATWG
// decoders follow: a valid start and the valid continuation bytes after it,
// or one byte); or a well-formed start cut off by the end of the bytes.
struct Unit {
  enum Kind { character, ill_formed, cut } kind;
  size_t len;
};

Unit unit_at(const unsigned char* s, size_t i, size_t n) {
  const core::Utf8Lead lead = core::utf8_lead(s[i]);
  if (lead.continuation < 0) return {Unit::ill_formed, 1};
  const int len = lead.continuation + 1;
  for (int k = 1; k < len; ++k) {
    if (i + size_t(k) >= n) return {Unit::cut, size_t(k)};
    const unsigned char b = s[i + size_t(k)];
    if (k == 1 ? (b < lead.lo || b > lead.hi) : (b < 0x80 || b > 0xBF)) return {Unit::ill_formed, size_t(k)};
  }
  return {Unit::character, size_t(len)};
}

// Where a character cut off by the end of s[0, n) starts (n when none is).
size_t complete_prefix(const std::string& s, size_t from, size_t n) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  for (size_t i = from; i < n;) {
    const Unit u = unit_at(p, i, n);
    if (u.kind == Unit::cut) return i;
    i += u.len;
  }
  return n;
}

constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD, 3 bytes

}  // namespace

std::string valid_utf8(const std::string& bytes) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    const Unit u = unit_at(p, i, bytes.size());
    if (u.kind == Unit::character) out.append(bytes, i, u.len);
    else out += kReplacement;  // a cut start at the very end too: nothing follows to complete it
    i += u.len;
  }
  return out;
}

size_t valid_utf8_offset(const std::string& bytes, size_t raw) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  size_t out = 0;
  for (size_t i = 0; i < bytes.size();) {  // the walk of valid_utf8
    const Unit u = unit_at(p, i, bytes.size());
    if (i + u.len > raw) break;
    out += u.kind == Unit::character ? u.len : sizeof kReplacement - 1;
    i += u.len;
  }
  return out;
}

TextStream::TextStream(const data::Tokenizer& tok, std::vector<std::string> stop, int64_t min_tokens,
                       bool include_stop, std::string hidden_stop)
    : tok_(tok),
      stop_(std::move(stop)),
      min_tokens_(min_tokens),
      include_stop_(include_stop),
      hidden_stop_(std::move(hidden_stop)) {}

size_t TextStream::first_stop() {
  if (cut_ != std::string::npos || tokens_ < min_tokens_) return cut_;
  // The engine's choice (infer::first_stop_string), so the text ends at the
  // string it reports; starting at sent_ (nothing sent is cut) and ending
  // past stops_end_after_ (min_tokens).
  const infer::StopMatch m = infer::first_stop_string(raw_, stop_, sent_, stops_end_after_);
  // Once found the end stays: with include_stop the text up to it may be
  // sent before the sequence's last event, and a search from sent_ would
  // then miss it.
  if (m.stop) cut_ = include_stop_ && *m.stop != hidden_stop_ ? m.at + m.stop->size() : m.at;
  return cut_;
}

std::string TextStream::emit(size_t end) {
  end = std::max(end, sent_);
  std::string piece = valid_utf8(raw_.substr(sent_, end - sent_));
  sent_ = end;
  return piece;
}

std::string TextStream::add(int32_t token) {
  last_offset_ = raw_.size();
  raw_ += tok_.decode(std::span<const int32_t>(&token, 1));
  if (++tokens_ == min_tokens_) stops_end_after_ = last_offset_;
  // Hold back the longest tail that is a proper prefix of a stop string.
  size_t safe = raw_.size();
  for (const std::string& s : stop_) {
    const size_t longest = std::min(s.size() - 1, raw_.size() - sent_);
    for (size_t len = longest; len > 0; --len)
      if (raw_.compare(raw_.size() - len, len, s, 0, len) == 0) {
        safe = std::min(safe, raw_.size() - len);
        break;
      }
  }
  // A stop string that is now complete ends the text before it.
  safe = std::min(safe, first_stop());
  return emit(complete_prefix(raw_, sent_, safe));
}

std::string TextStream::finish_at_stop() { return emit(std::min(raw_.size(), first_stop())); }

std::string TextStream::finish() { return emit(raw_.size()); }

std::string TextStream::add_event(const infer::TokenEvent& e) {
  std::string piece;
  const bool stop_token = e.ended_by_stop_token();
  if (e.choice.token >= 0 && !stop_token) piece += add(e.choice.token);
  if (e.finish == infer::Finish::stop && !e.stop_matched.empty()) piece += finish_at_stop();
  else if (e.finish != infer::Finish::none) piece += finish();
  return piece;
}

}  // namespace brisk::serve
