// GPT-2 byte-level BPE, matching the JavaScript encoder of the npm package
// gpt-3-encoder id for id (tests/unit/tokenizer_test.cpp runs that encoder as
// an oracle). The JS code defines the behaviour, including its quirks, so
// this file mirrors it step by step, only faster:
//  * Text is what node gets from reading the bytes as 'utf8': every invalid
//    UTF-8 sequence becomes U+FFFD (WHATWG "maximal subpart" rule, which V8
//    uses). So encode() is lossless only for valid UTF-8; for other input it
//    matches the JS package instead of round-tripping the stray bytes.
//  * Pre-tokenization is the JS regex run by PCRE2 (UTF, UCP, JIT). JS's \s is
//    not PCRE2's (JS has U+FEFF, PCRE2 has U+0085 and U+180E), so the pattern
//    spells the ECMAScript white-space set out. \p{L} and \p{N} come from each
//    engine's Unicode tables. Checked over all code points: PCRE2 10.42
//    (Unicode 14) and node 20 (Unicode 17) differ only on 14,049 characters
//    unassigned in Unicode 14 that node counts as letters or digits; text
//    using those (Unicode 15+ additions) may tokenize differently.
//  * Merge ranks are looked up under the JS object key "a,b", so the pairs
//    ("\",", "\"") and ("\"", ",\"") share a rank: 11 such alias pairs exist
//    in GPT-2's vocab.bpe. The pair table is keyed by symbol ids but holds
//    every split of every key, which reproduces that. Among pairs of equal
//    rank JS picks the last one in the word; so does bpe_word().
//  * Words are cached per thread (thread_local, tied to one tokenizer at a
//    time) so that encode() stays const and lock-free on many threads.
#include <omp.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cstring>
#include <exception>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "brisk/core/error.h"
#include "brisk/data/tokenizer.h"
#include "bpe_tables.h"

namespace brisk::data {

namespace {

using namespace detail;

// ---- the pre-tokenizer -----------------------------------------------------------------

// /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu
struct Pretokenizer {
  pcre2_code* code = nullptr;
  bool jit = false;

  Pretokenizer() {
    const std::string ws = kJsSpace;
    const std::string pat = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" + ws +
                            "\\p{L}\\p{N}]+|[" + ws + "]+(?![^" + ws + "])|[" + ws + "]+";
    int err = 0;
    PCRE2_SIZE at = 0;
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pat.c_str()), pat.size(),
                         PCRE2_UTF | PCRE2_UCP, &err, &at, nullptr);
    if (!code) throw core::Error("gpt2 tokenizer: cannot compile the pre-tokenizer regex: " + message(err));
    // Without JIT support (some architectures) the interpreter gives the same matches.
    jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  }
  ~Pretokenizer() { pcre2_code_free(code); }

  static std::string message(int err) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(err, buf, sizeof buf);
    return reinterpret_cast<const char*>(buf);
  }
};

const Pretokenizer& pretokenizer() {
  static const Pretokenizer p;  // compiled once; pcre2_code is read-only while matching
  return p;
}

// ---- per-thread state ------------------------------------------------------------------

struct ThreadState {
  uint64_t owner = 0;  // serial of the tokenizer the cache belongs to
  WordCache cache;
  pcre2_match_data* md = nullptr;
  pcre2_match_context* mctx = nullptr;
  pcre2_jit_stack* stack = nullptr;
  std::vector<int32_t> sym, rank, merged, sym2, rank2, merged2, orig;
  std::vector<uint8_t> fresh;

  ~ThreadState() {
    pcre2_match_data_free(md);
    pcre2_match_context_free(mctx);
    pcre2_jit_stack_free(stack);
  }
  void bind(uint64_t serial) {
    if (!md) {
      md = pcre2_match_data_create_from_pattern(pretokenizer().code, nullptr);
      mctx = pcre2_match_context_create(nullptr);
      stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
      if (!md || !mctx || !stack) throw core::Error("gpt2 tokenizer: out of memory for regex state");
      pcre2_jit_stack_assign(mctx, nullptr, stack);
    }
    if (owner != serial || cache.full()) {
      cache.clear();
      owner = serial;
    }
  }
};

thread_local ThreadState tls;
std::atomic<uint64_t> next_serial{1};

// ---- the tokenizer ---------------------------------------------------------------------

class Gpt2Tokenizer final : public Tokenizer {
 public:
  Gpt2Tokenizer(std::vector<std::string> vocab, std::array<int32_t, 256> byte_id,
                std::array<int, 512> unicode_to_byte, PairTable pairs, int32_t eot)
      : byte_id_(byte_id), pairs_(std::move(pairs)), eot_(eot), serial_(next_serial++) {
    vocab_size_ = static_cast<int64_t>(vocab.size());
    offsets_.push_back(0);
    for (const std::string& tok : vocab) {  // token text -> the raw bytes it stands for
      for (size_t i = 0; i < tok.size(); i += seq_len(tok, i))
        bytes_ += static_cast<char>(unicode_to_byte[utf8_at(tok, i)]);
      offsets_.push_back(static_cast<uint32_t>(bytes_.size()));
    }
  }

  std::string name() const override { return "gpt2"; }
  int64_t vocab_size() const override { return vocab_size_; }
  int32_t eot_token() const override { return eot_; }

  std::vector<int32_t> encode(std::string_view text) const override {
    std::string buf;
    const std::string_view s = well_formed(text, buf);
    std::vector<int32_t> out;
    out.reserve(s.size() / 4 + 16);
    encode_range(s, 0, s.size(), out);
    return out;
  }

  std::string decode(std::span<const int32_t> ids) const override {
    std::string out;
    for (size_t i = 0; i < ids.size(); ++i) {
      const int32_t id = ids[i];
      if (id < 0 || id >= vocab_size_)
        throw core::Error("gpt2 tokenizer: token id " + std::to_string(id) + " at position " +
                          std::to_string(i) + " is outside [0, " + std::to_string(vocab_size_) + ")");
      out.append(bytes_, offsets_[id], offsets_[id + 1] - offsets_[id]);
    }
    return out;
  }

  // Splits right after a '\n' that is followed by a non-space character. The
  // regex has no look-behind, so matching from a position depends only on the
  // text after it; every match holding that '\n' is a run of white space and
  // so cannot reach the non-space; hence a match ends exactly at the split in
  // the whole-text matching, and a chunk matched inside the whole subject (so
  // that the (?!\S) look-ahead still sees the next chunk) yields the same
  // tokens. Chunks are not matched as separate strings: at a chunk's end,
  // "  \n" would then be one token instead of "  " + "\n".
  std::vector<int32_t> encode_parallel(std::string_view text, int threads) const override {
    if (threads <= 0) threads = omp_get_max_threads();
    constexpr size_t kMinChunk = 64 * 1024;
    std::string buf;
    const std::string_view s = well_formed(text, buf);
    const size_t n = s.size();
    if (threads == 1 || n < 2 * kMinChunk) {
      std::vector<int32_t> out;
      encode_range(s, 0, n, out);
      return out;
    }
    // Several chunks per thread even out lines of different difficulty.
    const size_t want = std::min<size_t>(size_t(threads) * 4, n / kMinChunk);
    std::vector<size_t> cut{0};
    for (size_t k = 1; k < want; ++k) {
      const size_t at = split_after(s, std::max(k * n / want, cut.back()));
      if (at >= n) break;
      if (at > cut.back()) cut.push_back(at);
    }
    cut.push_back(n);
    const int chunks = static_cast<int>(cut.size()) - 1;
    std::vector<std::vector<int32_t>> parts(chunks);
    std::exception_ptr error;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
    for (int c = 0; c < chunks; ++c) {
      try {
        encode_range(s, cut[c], cut[c + 1], parts[c]);
      } catch (...) {
#pragma omp critical(brisk_gpt2_error)
        if (!error) error = std::current_exception();
      }
    }
    if (error) std::rethrow_exception(error);
    size_t total = 0;
    for (const auto& p : parts) total += p.size();
    std::vector<int32_t> out;
    out.reserve(total);
    for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
    return out;
  }

 private:
  static size_t seq_len(std::string_view s, size_t i) {
    const auto b = static_cast<unsigned char>(s[i]);
    return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
  }

  // First position after `from` that directly follows a '\n' whose next
  // character is not white space; s.size() if there is none.
  static size_t split_after(std::string_view s, size_t from) {
    for (size_t p = s.find('\n', from); p != std::string_view::npos; p = s.find('\n', p + 1))
      if (p + 1 < s.size() && !is_js_space(utf8_at(s, p + 1))) return p + 1;
    return s.size();
  }

  // Tokens of the matches that start in [begin, end), matched in all of `s`.
  void encode_range(std::string_view s, size_t begin, size_t end, std::vector<int32_t>& out) const {
    ThreadState& ts = tls;
    ts.bind(serial_);
    const Pretokenizer& re = pretokenizer();
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    size_t at = begin;
    while (at < end) {
      const int rc = re.jit ? pcre2_jit_match(re.code, subject, s.size(), at, 0, ts.md, ts.mctx)
                            : pcre2_match(re.code, subject, s.size(), at, PCRE2_NO_UTF_CHECK, ts.md, ts.mctx);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0)
        throw core::Error("gpt2 tokenizer: regex match failed at byte " + std::to_string(at) + ": " +
                          Pretokenizer::message(rc));
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(ts.md);
      if (ov[0] >= end) break;
      encode_word(s.substr(ov[0], ov[1] - ov[0]), ts, out);
      at = ov[1];
    }
  }

  void encode_word(std::string_view word, ThreadState& ts, std::vector<int32_t>& out) const {
    if (word.size() == 1) {
      out.push_back(byte_id_[static_cast<unsigned char>(word[0])]);
      return;
    }
    const uint64_t h = hash_bytes(word);
    uint32_t len = 0;
    if (const int32_t* ids = ts.cache.find(word, h, &len)) {
      out.insert(out.end(), ids, ids + len);
      return;
    }
    const size_t first = out.size();
    bpe_word(word, ts, out);
    ts.cache.insert(word, h, out.data() + first, out.size() - first);
  }

  void lookup(int32_t a, int32_t b, int32_t& rank, int32_t& merged) const {
    const PairTable::Entry* e = pairs_.find(a, b);
    rank = e ? e->rank : PairTable::kNone;
    merged = e ? e->merged : -1;
  }

  // The JS bpe(): repeatedly take the lowest-ranked adjacent pair (the last
  // one in the word on ties) and merge all its occurrences left to right.
  // Only pairs next to a new symbol need a fresh rank lookup.
  void bpe_word(std::string_view word, ThreadState& ts, std::vector<int32_t>& out) const {
    size_t m = word.size();
    auto &sym = ts.sym, &rank = ts.rank, &merged = ts.merged;
    sym.resize(m);
    rank.resize(m);
    merged.resize(m);
    for (size_t i = 0; i < m; ++i) sym[i] = byte_id_[static_cast<unsigned char>(word[i])];
    for (size_t i = 0; i + 1 < m; ++i) lookup(sym[i], sym[i + 1], rank[i], merged[i]);
    rank[m - 1] = PairTable::kNone;
    ts.sym2.resize(m);
    ts.rank2.resize(m);
    ts.merged2.resize(m);
    ts.orig.resize(m);
    ts.fresh.resize(m);
    while (m > 1) {
      int32_t best = PairTable::kNone;
      size_t pos = m;
      for (size_t i = 0; i + 1 < m; ++i)
        if (rank[i] <= best && rank[i] != PairTable::kNone) best = rank[i], pos = i;
      if (pos == m) break;
      const int32_t a = sym[pos], b = sym[pos + 1], ab = merged[pos];
      size_t w = 0;
      for (size_t i = 0; i < m; ++w) {
        ts.orig[w] = static_cast<int32_t>(i);
        if (i + 1 < m && sym[i] == a && sym[i + 1] == b) {
          ts.sym2[w] = ab, ts.fresh[w] = 1, i += 2;
        } else {
          ts.sym2[w] = sym[i], ts.fresh[w] = 0, i += 1;
        }
      }
      for (size_t j = 0; j + 1 < w; ++j) {
        if (ts.fresh[j] || ts.fresh[j + 1]) {
          lookup(ts.sym2[j], ts.sym2[j + 1], ts.rank2[j], ts.merged2[j]);
        } else {
          ts.rank2[j] = rank[ts.orig[j]];
          ts.merged2[j] = merged[ts.orig[j]];
        }
      }
      ts.rank2[w - 1] = PairTable::kNone;
      std::swap(sym, ts.sym2);
      std::swap(rank, ts.rank2);
      std::swap(merged, ts.merged2);
      m = w;
    }
    out.insert(out.end(), sym.begin(), sym.begin() + m);
  }

  std::array<int32_t, 256> byte_id_;  // byte -> id of its one-character token
  PairTable pairs_;
  int32_t eot_;
  uint64_t serial_;
  int64_t vocab_size_ = 0;
  std::string bytes_;              // every token's bytes, back to back
  std::vector<uint32_t> offsets_;  // token id -> [offsets_[id], offsets_[id + 1]) in bytes_
};

// ---- loading ---------------------------------------------------------------------------

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f)
    throw core::IoError("gpt2 tokenizer: cannot open " + path +
                        " (run scripts/fetch_data.sh to fetch the GPT-2 vocabulary, or set BRISK_GPT2_VOCAB)");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes stand for themselves,
// the others for 256, 257, ... in byte order, so no token text holds a space
// or control character.
std::array<char32_t, 256> bytes_to_unicode() {
  std::array<char32_t, 256> cs{};
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    cs[b] = printable ? char32_t(b) : next++;
  }
  return cs;
}

// JS: lines.slice(1, lines.length - 1), each split on white space.
std::vector<std::pair<std::string, std::string>> read_merges(const std::string& path) {
  const std::string text = read_file(path);
  std::vector<std::string_view> lines;
  for (size_t at = 0;;) {
    const size_t nl = text.find('\n', at);
    lines.emplace_back(text.data() + at, (nl == std::string::npos ? text.size() : nl) - at);
    if (nl == std::string::npos) break;
    at = nl + 1;
  }
  std::vector<std::pair<std::string, std::string>> merges;
  for (size_t l = 1; l + 1 < lines.size(); ++l) {
    std::vector<std::string> parts;
    std::string_view line = lines[l];
    for (size_t i = 0; i < line.size();) {
      const size_t b = line.find_first_not_of(" \t\r\v\f", i);
      if (b == std::string_view::npos) break;
      const size_t e = std::min(line.find_first_of(" \t\r\v\f", b), line.size());
      parts.emplace_back(line.substr(b, e - b));
      i = e;
    }
    if (parts.size() != 2)
      throw core::IoError("gpt2 tokenizer: " + path + " line " + std::to_string(l + 1) +
                          ": expected two symbols, got '" + std::string(line) + "'");
    merges.emplace_back(std::move(parts[0]), std::move(parts[1]));
  }
  return merges;
}

}  // namespace

std::unique_ptr<Tokenizer> load_gpt2_tokenizer(const std::string& dir) {
  const std::string enc_path = dir + "/encoder.json", bpe_path = dir + "/vocab.bpe";
  const std::string enc_text = read_file(enc_path);
  auto bad = [&](const std::string& what) {
    return core::IoError("gpt2 tokenizer: " + enc_path + ": " + what);
  };

  std::unordered_map<std::string, int32_t> encoder;
  std::vector<std::string> vocab;
  try {
    const nlohmann::json j = nlohmann::json::parse(enc_text);
    if (!j.is_object() || j.empty()) throw bad("expected a non-empty JSON object of token -> id");
    vocab.resize(j.size());
    std::vector<bool> seen(j.size());
    for (const auto& [tok, v] : j.items()) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= int64_t(j.size()))
        throw bad("id of token '" + tok + "' is not an integer in [0, " + std::to_string(j.size()) + ")");
      const auto id = v.get<int32_t>();
      if (seen[id]) throw bad("id " + std::to_string(id) + " is used twice");
      seen[id] = true;
      vocab[id] = tok;
      encoder.emplace(tok, id);
    }
  } catch (const nlohmann::json::exception& e) {
    throw bad(std::string("not valid JSON: ") + e.what());
  }

  const auto cs = bytes_to_unicode();
  std::array<int32_t, 256> byte_id{};
  std::array<int, 512> unicode_to_byte;
  unicode_to_byte.fill(-1);
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    append_utf8(ch, cs[b]);
    auto it = encoder.find(ch);
    if (it == encoder.end()) throw bad("no token for byte " + std::to_string(b));
    byte_id[b] = it->second;
    unicode_to_byte[cs[b]] = b;
  }
  for (const std::string& tok : vocab) {
    std::string buf;
    well_formed(tok, buf);
    if (!buf.empty()) throw bad("token '" + tok + "' is not valid UTF-8");
    for (size_t i = 0; i < tok.size();) {
      const char32_t c = utf8_at(tok, i);
      if (c >= unicode_to_byte.size() || unicode_to_byte[c] < 0)
        throw bad("token '" + tok + "' holds a character that stands for no byte");
      i += c < 0x80 ? 1 : c < 0x800 ? 2 : 3;
    }
  }

  // JS keys its rank object by String([a, b]) == a + "," + b; a later line
  // with the same key overwrites the rank, like dictZip does.
  const auto merges = read_merges(bpe_path);
  std::unordered_map<std::string, int32_t> key_rank;
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto& [a, b] = merges[r];
    if (!encoder.count(a) || !encoder.count(b) || !encoder.count(a + b))
      throw core::IoError("gpt2 tokenizer: " + bpe_path + " line " + std::to_string(r + 2) + ": merge '" +
                          a + " " + b + "' uses or makes a token missing from encoder.json");
    key_rank[a + "," + b] = static_cast<int32_t>(r);
  }
  // Every way of cutting a key at a comma into two tokens ranks as that key.
  // A cut whose concatenation is no token could never merge into a valid id
  // in JS either (it would yield `undefined`); it is left out.
  struct Cut {
    int32_t a, b, rank, ab;
  };
  std::vector<Cut> cuts;
  for (const auto& [key, rank] : key_rank) {
    for (size_t p = key.find(','); p != std::string::npos; p = key.find(',', p + 1)) {
      auto a = encoder.find(key.substr(0, p)), b = encoder.find(key.substr(p + 1));
      if (a == encoder.end() || b == encoder.end()) continue;
      auto ab = encoder.find(a->first + b->first);
      if (ab != encoder.end()) cuts.push_back({a->second, b->second, rank, ab->second});
    }
  }
  PairTable pairs;
  pairs.reserve(cuts.size());
  for (const Cut& c : cuts) pairs.insert(c.a, c.b, c.rank, c.ab);

  auto eot = encoder.find("<|endoftext|>");
  return std::make_unique<Gpt2Tokenizer>(std::move(vocab), byte_id, unicode_to_byte, std::move(pairs),
                                         eot == encoder.end() ? -1 : eot->second);
}

std::string byte_level_text(std::string_view bytes) {
  static const auto cs = bytes_to_unicode();
  std::string out;
  for (unsigned char b : bytes) append_utf8(out, cs[b]);
  return out;
}

std::vector<std::pair<std::string, std::string>> load_gpt2_merges(const std::string& dir) {
  return read_merges(dir + "/vocab.bpe");
}

}  // namespace brisk::data
