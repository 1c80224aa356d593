// Incremental detokenization with stop-string hold-back; see
// brisk/serve/text_stream.h.
#include "brisk/serve/text_stream.h"

#include <algorithm>

#include "brisk/data/tokenizer.h"
#include "brisk/infer/engine.h"

namespace brisk::serve {

namespace {

// Length of the well-formed UTF-8 character at s[i..n), 0 when the bytes
// there are ill-formed, -1 when they are a well-formed but cut-off start.
int char_length(const unsigned char* s, size_t i, size_t n) {
  const unsigned char c = s[i];
  if (c < 0x80) return 1;
  int len;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) len = 2;
  else if (c == 0xE0) len = 3, lo = 0xA0;
  else if (c >= 0xE1 && c <= 0xEC) len = 3;
  else if (c == 0xED) len = 3, hi = 0x9F;  // no surrogates
  else if (c >= 0xEE && c <= 0xEF) len = 3;
  else if (c == 0xF0) len = 4, lo = 0x90;
  else if (c >= 0xF1 && c <= 0xF3) len = 4;
  else if (c == 0xF4) len = 4, hi = 0x8F;  // nothing past U+10FFFF
  else return 0;
  for (int k = 1; k < len; ++k) {
    if (i + size_t(k) >= n) return -1;
    const unsigned char b = s[i + size_t(k)];
    if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return 0;
  }
  return len;
}

// Where a character cut off by the end of s[0, n) starts (n when none is).
size_t complete_prefix(const std::string& s, size_t from, size_t n) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = from;
  while (i < n) {
    const int len = char_length(p, i, n);
    if (len < 0) return i;
    i += len == 0 ? 1 : size_t(len);
  }
  return n;
}

}  // namespace

std::string valid_utf8(const std::string& bytes) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    const int len = char_length(p, i, bytes.size());
    if (len <= 0) {
      out += "\xEF\xBF\xBD";
      ++i;
    } else {
      out.append(bytes, i, size_t(len));
      i += size_t(len);
    }
  }
  return out;
}

size_t valid_utf8_offset(const std::string& bytes, size_t raw) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  size_t out = 0;
  for (size_t i = 0; i < bytes.size();) {  // the walk of valid_utf8
    const int len = char_length(p, i, bytes.size());
    const size_t step = len <= 0 ? 1 : size_t(len);
    if (i + step > raw) break;
    out += len <= 0 ? 3 : size_t(len);
    i += step;
  }
  return out;
}

TextStream::TextStream(const data::Tokenizer& tok, std::vector<std::string> stop, int64_t min_tokens)
    : tok_(tok), stop_(std::move(stop)), min_tokens_(min_tokens) {}

size_t TextStream::first_stop() const {
  if (tokens_ < min_tokens_) return std::string::npos;
  size_t first = std::string::npos;
  for (const std::string& s : stop_) {
    // Starting at sent_ (nothing sent is cut) and late enough to end past stops_end_after_.
    const size_t from = std::max(sent_, stops_end_after_ + 1 > s.size() ? stops_end_after_ + 1 - s.size() : 0);
    if (size_t at = raw_.find(s, from); at != std::string::npos) first = std::min(first, at);
  }
  return first;
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
  const bool stop_token = e.finish == infer::Finish::stop && e.stop_matched.empty();
  if (e.choice.token >= 0 && !stop_token) piece += add(e.choice.token);
  if (e.finish == infer::Finish::stop && !e.stop_matched.empty()) piece += finish_at_stop();
  else if (e.finish != infer::Finish::none) piece += finish();
  return piece;
}

}  // namespace brisk::serve
