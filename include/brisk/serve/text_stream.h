// Turns a sequence's tokens into the text a client may see, piece by piece.
//
// Two things are held back until the next token decides them: a tail that
// could be the start of a stop string (a stop string never reaches the
// client, streamed or not, unless include_stop) and a tail that could be the start of a UTF-8
// character. Every piece is valid UTF-8: an ill-formed sequence becomes
// one U+FFFD per maximal subpart (a valid start with the continuation bytes
// that still fit it, else one byte), as Python's and the WHATWG decoders
// replace it, so vLLM and Hugging Face show the same text. (A stop string's
// hold-back could split such a subpart between two pieces; then it shows as
// two.) The pieces joined equal the text of
// the whole sequence cut at its stop string, so a streamed completion and a
// non-streamed one of the same tokens are the same text.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace brisk::data {
class Tokenizer;
}
namespace brisk::infer {
struct TokenEvent;
}

namespace brisk::serve {

// `bytes` with every maximal ill-formed subpart replaced by U+FFFD.
std::string valid_utf8(const std::string& bytes);
// Where byte `raw` of `bytes` lands in valid_utf8(bytes): each U+FFFD is 3
// bytes for 1 to 3, so offsets into the raw bytes drift from offsets into the
// text a client gets. An offset inside a character maps to its start.
size_t valid_utf8_offset(const std::string& bytes, size_t raw);

class TextStream {
 public:
  // min_tokens: a stop string must end in the min_tokens-th token or later
  // (SamplingParams::min_tokens); one ending earlier is text like any other.
  // include_stop: the text ends after the stop string instead of before it,
  // except after `hidden_stop` (a route's own stop string, the chat turn's
  // end, which the client did not ask for).
  TextStream(const data::Tokenizer& tok, std::vector<std::string> stop, int64_t min_tokens = 0,
             bool include_stop = false, std::string hidden_stop = "");
  // Adds a token of the output; returns the text that is now safe to send.
  std::string add(int32_t token);
  // The sequence ended on a stop string: the rest of the text up to it.
  std::string finish_at_stop();
  // The sequence ended otherwise: everything still held back.
  std::string finish();
  // What an engine event adds, all of the above in one: its token (a stop
  // token is no part of the text), then, when the event ends the sequence,
  // what was held back, cut before a matched stop string.
  std::string add_event(const infer::TokenEvent& e);
  // Where the token added last starts in the text sent (logprobs'
  // text_offset): its raw bytes' offset, moved by the U+FFFD before it.
  size_t offset_of_last() const { return valid_utf8_offset(raw_, last_offset_); }

 private:
  std::string emit(size_t end);
  // Where the text ends at the first stop string in raw_ that may end it:
  // before it, or after it with include_stop_ (npos: none yet).
  size_t first_stop();
  const data::Tokenizer& tok_;
  std::vector<std::string> stop_;
  std::string raw_;   // decoded bytes of the tokens so far
  size_t sent_ = 0;   // raw_[0, sent_) has been handed out
  size_t last_offset_ = 0;
  int64_t min_tokens_ = 0;
  bool include_stop_ = false;
  std::string hidden_stop_;
  size_t cut_ = std::string::npos;  // where a stop string ended the text, once found
  int64_t tokens_ = 0;           // added so far
  size_t stops_end_after_ = 0;   // a stop string must end past this byte of raw_
};

}  // namespace brisk::serve
