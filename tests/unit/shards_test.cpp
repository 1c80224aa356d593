// Token shards: round trips in both token widths, rejection of truncated,
// foreign and corrupted files with messages that name the file and the
// problem, datasets spanning several shards, deterministic window sampling,
// and dataset preparation with the byte tokenizer.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "brisk/core/error.h"
#include "brisk/data/shards.h"
#include "brisk/data/tokenizer.h"

namespace fs = std::filesystem;
using namespace brisk;
using namespace brisk::data;

namespace {

// A fresh directory per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ = fs::temp_directory_path() /
            ("brisk_shards_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::vector<int32_t> random_tokens(size_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> t(n);
  for (auto& v : t) v = d(rng);
  return t;
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Opens the shard and returns the IoError message (empty if it opened).
std::string open_error(const std::string& path) {
  try {
    TokenShard s(path);
  } catch (const core::IoError& e) {
    return e.what();
  }
  return "";
}

void write_meta(const TempDir& dir, int64_t vocab, int64_t train_tokens) {
  nlohmann::json meta = {{"tokenizer", "bytes"}, {"vocab_size", vocab}, {"train_tokens", train_tokens}};
  write_bytes(dir.file("meta.json"), meta.dump());
}

}  // namespace

TEST(Shards, RoundTripUint16) {
  TempDir dir;
  const auto tokens = random_tokens(10007, 50257, 1);
  const std::string path = dir.file("a.bin");
  write_shard(path, tokens, 50257);
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  EXPECT_EQ(fs::file_size(path), 64u + 2u * tokens.size());  // uint16 payload
  TokenShard s(path);
  EXPECT_EQ(s.size(), 10007);
  EXPECT_EQ(s.vocab_size(), 50257);
  EXPECT_EQ(s.path(), path);
  std::vector<int32_t> back(tokens.size());
  s.read(0, s.size(), back.data());
  EXPECT_EQ(back, tokens);
  EXPECT_EQ(s.at(1234), tokens[1234]);
  std::vector<int32_t> part(5);
  s.read(10002, 5, part.data());
  EXPECT_EQ(part, std::vector<int32_t>(tokens.end() - 5, tokens.end()));
}

TEST(Shards, RoundTripInt32) {
  TempDir dir;
  auto tokens = random_tokens(4099, 70000, 2);
  tokens[0] = 69999;  // above the uint16 range
  const std::string path = dir.file("b.bin");
  write_shard(path, tokens, 70000);
  EXPECT_EQ(fs::file_size(path), 64u + 4u * tokens.size());  // int32 payload
  TokenShard s(path);
  EXPECT_EQ(s.vocab_size(), 70000);
  std::vector<int32_t> back(tokens.size());
  s.read(0, s.size(), back.data());
  EXPECT_EQ(back, tokens);
  EXPECT_EQ(s.at(0), 69999);
}

TEST(Shards, HeaderLayout) {
  TempDir dir;
  const std::string path = dir.file("h.bin");
  write_shard(path, std::vector<int32_t>{1, 2, 3}, 256);
  const std::string b = read_bytes(path);
  ASSERT_EQ(b.size(), 64u + 6u);
  EXPECT_EQ(b.substr(0, 8), "BRISKTOK");
  auto u32 = [&](size_t off) { uint32_t v; std::memcpy(&v, b.data() + off, 4); return v; };
  auto i64 = [&](size_t off) { int64_t v; std::memcpy(&v, b.data() + off, 8); return v; };
  EXPECT_EQ(u32(8), 1u);    // version
  EXPECT_EQ(u32(12), 0u);   // dtype uint16
  EXPECT_EQ(i64(16), 256);  // vocab
  EXPECT_EQ(i64(24), 3);    // count
  for (size_t i = 40; i < 64; ++i) EXPECT_EQ(b[i], 0) << i;
}

TEST(Shards, EmptyShardAndOutOfVocabTokens) {
  TempDir dir;
  write_shard(dir.file("e.bin"), std::vector<int32_t>{}, 256);
  EXPECT_EQ(TokenShard(dir.file("e.bin")).size(), 0);
  EXPECT_THROW(write_shard(dir.file("x.bin"), std::vector<int32_t>{5, 256}, 256), core::Error);
  EXPECT_THROW(write_shard(dir.file("x.bin"), std::vector<int32_t>{-1}, 256), core::Error);
}

TEST(Shards, RejectsTruncatedHeader) {
  TempDir dir;
  const std::string path = dir.file("short.bin");
  write_bytes(path, "BRISKTOK\x01");
  const std::string msg = open_error(path);
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated header"), std::string::npos) << msg;
}

TEST(Shards, RejectsTruncatedPayload) {
  TempDir dir;
  const std::string path = dir.file("cut.bin");
  write_shard(path, random_tokens(1000, 50257, 3), 50257);
  fs::resize_file(path, 64 + 2 * 1000 - 10);
  const std::string msg = open_error(path);
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated: expected 2064 bytes, found 2054"), std::string::npos) << msg;
  // Longer than its count is not "truncated": the bytes past it are named.
  fs::resize_file(path, 64 + 2 * 1000 + 4);
  const std::string longer = open_error(path);
  EXPECT_EQ(longer.find("truncated"), std::string::npos) << longer;
  EXPECT_NE(longer.find("4 bytes past the header's 1000 tokens"), std::string::npos) << longer;
}

TEST(Shards, RejectsBadMagic) {
  TempDir dir;
  const std::string path = dir.file("foreign.bin");
  write_bytes(path, std::string(200, 'x'));
  const std::string msg = open_error(path);
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("not a brisk token shard (bad magic)"), std::string::npos) << msg;
}

TEST(Shards, RejectsUnsupportedVersion) {
  TempDir dir;
  const std::string path = dir.file("v2.bin");
  write_shard(path, std::vector<int32_t>{1, 2}, 256);
  std::string b = read_bytes(path);
  b[8] = 2;
  write_bytes(path, b);
  const std::string msg = open_error(path);
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("unsupported shard version 2"), std::string::npos) << msg;
}

TEST(Shards, RejectsFlippedPayloadByte) {
  TempDir dir;
  const std::string path = dir.file("flip.bin");
  write_shard(path, random_tokens(5000, 50257, 4), 50257);
  std::string b = read_bytes(path);
  b[64 + 777] ^= 0x10;
  write_bytes(path, b);
  const std::string msg = open_error(path);
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("checksum mismatch (corrupted)"), std::string::npos) << msg;
}

TEST(Shards, MissingFileIsIoError) {
  TempDir dir;
  const std::string msg = open_error(dir.file("nope.bin"));
  EXPECT_NE(msg.find(dir.file("nope.bin")), std::string::npos) << msg;
}

TEST(TokenDatasetTest, ReadsAcrossShards) {
  TempDir dir;
  // Three shards of different lengths; the stream is their concatenation.
  std::vector<int32_t> all;
  const size_t sizes[] = {100, 37, 250};
  for (int i = 0; i < 3; ++i) {
    auto t = random_tokens(sizes[i], 256, 10 + i);
    write_shard(dir.file("train_000" + std::to_string(i) + ".bin"), t, 256);
    all.insert(all.end(), t.begin(), t.end());
  }
  write_shard(dir.file("val_0000.bin"), random_tokens(50, 256, 20), 256);
  write_meta(dir, 256, static_cast<int64_t>(all.size()));

  TokenDataset ds(dir.path().string(), "train");
  EXPECT_EQ(ds.size(), 387);
  EXPECT_EQ(ds.vocab_size(), 256);
  EXPECT_EQ(ds.tokenizer(), "bytes");
  std::vector<int32_t> got(all.size());
  ds.read(0, ds.size(), got.data());
  EXPECT_EQ(got, all);
  // A range spanning all three shards.
  std::vector<int32_t> mid(200);
  ds.read(90, 200, mid.data());
  EXPECT_EQ(mid, std::vector<int32_t>(all.begin() + 90, all.begin() + 290));
  EXPECT_THROW(ds.read(300, 100, mid.data()), core::Error);
  EXPECT_EQ(TokenDataset(dir.path().string(), "val").size(), 50);
}

TEST(TokenDatasetTest, MissingPiecesAreNamed) {
  TempDir dir;
  const std::string d = dir.path().string();
  try {
    TokenDataset ds(d, "train");
    FAIL() << "no meta.json must throw";
  } catch (const core::IoError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("meta.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find("brisk data prepare"), std::string::npos) << msg;
  }
  write_meta(dir, 256, 10);
  try {
    TokenDataset ds(d, "train");
    FAIL() << "no shards must throw";
  } catch (const core::IoError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("train_*.bin"), std::string::npos) << msg;
    EXPECT_NE(msg.find("brisk data prepare"), std::string::npos) << msg;
  }
  // A shard whose count disagrees with meta.json (one missing).
  write_shard(dir.file("train_0000.bin"), random_tokens(7, 256, 1), 256);
  EXPECT_THROW(TokenDataset(d, "train"), core::IoError);
  EXPECT_THROW(TokenDataset(dir.file("absent"), "train"), core::IoError);
}

// meta.json's shard list, when it has one, must be the directory's: a shard
// left over (or missing) would feed brisk and the PyTorch peers, which read
// the list, different tokens. Without a token count the list is the check.
TEST(TokenDatasetTest, ShardsMustBeMetaJsonsList) {
  TempDir dir;
  const std::string d = dir.path().string();
  write_shard(dir.file("train_0000.bin"), random_tokens(7, 256, 1), 256);
  write_shard(dir.file("train_0001.bin"), random_tokens(5, 256, 2), 256);
  auto meta_with = [&](nlohmann::json shards) {
    write_bytes(dir.file("meta.json"),
                nlohmann::json{{"tokenizer", "bytes"}, {"vocab_size", 256}, {"train_shards", shards}}.dump());
    try {
      TokenDataset ds(d, "train");
      return std::to_string(ds.size());
    } catch (const core::IoError& e) {
      return std::string(e.what());
    }
  };
  EXPECT_EQ(meta_with({"train_0000.bin", "train_0001.bin"}), "12");
  EXPECT_NE(meta_with({"train_0001.bin", "train_0000.bin"}).find("in another order"), std::string::npos);
  EXPECT_NE(meta_with({"train_0000.bin", "train_0001.bin", "train_0001.bin"}).find("names a shard twice"),
            std::string::npos);
  EXPECT_NE(meta_with({"train_0000.bin"}).find("shard train_0001.bin is not in meta.json's train_shards"),
            std::string::npos);
  EXPECT_NE(meta_with({"train_0000.bin", "train_0001.bin", "train_0002.bin"})
                .find("shard train_0002.bin of meta.json's train_shards is missing"),
            std::string::npos);
  EXPECT_NE(meta_with("train_0000.bin").find("must be a list of file names"), std::string::npos);
}

TEST(WindowSamplerTest, DeterministicAndShifted) {
  TempDir dir;
  // Token i of the stream is i % 1000, so a window reveals its own start.
  std::vector<int32_t> all(5000);
  for (int i = 0; i < 5000; ++i) all[i] = i % 1000;
  write_shard(dir.file("train_0000.bin"), std::span(all).first(3000), 1000);
  write_shard(dir.file("train_0001.bin"), std::span(all).subspan(3000), 1000);
  write_meta(dir, 1000, 5000);
  TokenDataset ds(dir.path().string(), "train");

  const int64_t B = 4, T = 64;
  std::vector<int32_t> x1(B * T), y1(B * T), x2(B * T), y2(B * T);
  WindowSampler a(ds, B, T, 42), b(ds, B, T, 42), c(ds, B, T, 43);
  std::vector<std::vector<int32_t>> batches;
  bool differs_from_other_seed = false;
  for (int step = 0; step < 20; ++step) {
    a.next(x1.data(), y1.data());
    b.next(x2.data(), y2.data());
    EXPECT_EQ(x1, x2);
    EXPECT_EQ(y1, y2);
    batches.push_back(x1);
    c.next(x2.data(), y2.data());
    if (x1 != x2) differs_from_other_seed = true;
    for (int64_t r = 0; r < B; ++r)
      for (int64_t t = 0; t < T; ++t) {
        // y is x shifted by one, and each window is contiguous in the stream.
        if (t + 1 < T) {
          EXPECT_EQ(y1[r * T + t], x1[r * T + t + 1]);
        }
        EXPECT_EQ(y1[r * T + t], (x1[r * T] + t + 1) % 1000);
      }
  }
  EXPECT_TRUE(differs_from_other_seed);
  EXPECT_EQ(a.position(), uint64_t(20 * B));

  // Restoring a position replays the stream exactly.
  WindowSampler d(ds, B, T, 42);
  d.set_position(uint64_t(7 * B));
  for (int step = 7; step < 20; ++step) {
    d.next(x2.data(), y2.data());
    EXPECT_EQ(x2, batches[step]) << step;
  }
  a.set_position(uint64_t(3 * B));
  a.next(x1.data(), y1.data());
  EXPECT_EQ(x1, batches[3]);
}

TEST(WindowSamplerTest, CoversTheWholeRange) {
  TempDir dir;
  // With size = seq + 3 there are exactly three starts: 0, 1 and 2; all must occur.
  std::vector<int32_t> all(19);
  for (int i = 0; i < 19; ++i) all[i] = i;
  write_shard(dir.file("train_0000.bin"), all, 256);
  write_meta(dir, 256, 19);
  TokenDataset ds(dir.path().string(), "train");
  WindowSampler s(ds, 1, 16, 7);
  std::vector<int32_t> x(16), y(16);
  int seen[3] = {0, 0, 0};
  for (int i = 0; i < 300; ++i) {
    s.next(x.data(), y.data());
    ASSERT_GE(x[0], 0);
    ASSERT_LE(x[0], 2);
    ++seen[x[0]];
    EXPECT_EQ(y[15], x[0] + 16);
  }
  for (int k = 0; k < 3; ++k) EXPECT_GT(seen[k], 50) << k;
  EXPECT_THROW(WindowSampler(ds, 1, 19, 7), core::ConfigError);
}

TEST(PrepareDataset, ByteTokenizerSmallDirectory) {
  TempDir in, out;
  fs::create_directories(in.path() / "sub");
  // Mixed content, including bytes that are not UTF-8.
  std::string a(3000, 'a'), b = "hello\nworld\n", c(2500, '\0');
  for (size_t i = 0; i < c.size(); ++i) c[i] = static_cast<char>(i * 7 + 0x80);
  write_bytes(in.file("b.txt"), b);
  write_bytes(in.file("a.txt"), a);
  write_bytes((in.path() / "sub" / "c.bin").string(), c);
  write_bytes(in.file(".hidden"), "skipped");

  PrepareOptions opt;
  opt.inputs = {in.path().string()};
  opt.tokenizer = "bytes";
  opt.out_dir = out.path().string();
  opt.val_fraction = 0.05;
  opt.shard_tokens = 1000;
  opt.threads = 2;
  opt.progress = false;
  const PrepareSummary sum = prepare_dataset(opt);

  const int64_t total = int64_t(a.size() + b.size() + c.size());
  EXPECT_EQ(sum.files, 3);
  EXPECT_EQ(sum.bytes, total);
  EXPECT_EQ(sum.train_tokens + sum.val_tokens, total);  // bytes: no separators
  EXPECT_EQ(sum.val_tokens, 1024);  // 5% is 276, below the 1024 minimum
  EXPECT_FALSE(fs::exists(out.file("meta.json.tmp")));

  TokenDataset train(out.path().string(), "train"), val(out.path().string(), "val");
  EXPECT_EQ(train.size(), sum.train_tokens);
  EXPECT_EQ(val.size(), sum.val_tokens);
  EXPECT_EQ(train.vocab_size(), 256);
  EXPECT_EQ(train.tokenizer(), "bytes");
  EXPECT_TRUE(fs::exists(out.file("train_0004.bin")));  // 4488 train tokens in shards of 1000
  EXPECT_FALSE(fs::exists(out.file("train_0005.bin")));
  EXPECT_EQ(TokenShard(out.file("train_0000.bin")).size(), 1000);

  // The stream is the sorted files concatenated: a.txt, b.txt, sub/c.bin.
  const std::string stream = a + b + c;
  std::vector<int32_t> got(static_cast<size_t>(train.size())), tail(static_cast<size_t>(val.size()));
  train.read(0, train.size(), got.data());
  val.read(0, val.size(), tail.data());
  got.insert(got.end(), tail.begin(), tail.end());
  ASSERT_EQ(got.size(), stream.size());
  for (size_t i = 0; i < stream.size(); ++i)
    ASSERT_EQ(got[i], static_cast<unsigned char>(stream[i])) << i;

  const auto meta = nlohmann::json::parse(read_bytes(out.file("meta.json")));
  EXPECT_EQ(meta["tokenizer"], "bytes");
  EXPECT_EQ(meta["vocab_size"], 256);
  EXPECT_EQ(meta["train_tokens"], sum.train_tokens);
  EXPECT_EQ(meta["val_tokens"], sum.val_tokens);
  ASSERT_EQ(meta["files"].size(), 3u);
  EXPECT_EQ(meta["files"][0]["path"], in.file("a.txt"));
  EXPECT_EQ(meta["files"][0]["bytes"], 3000);
  EXPECT_EQ(meta["files"][1]["bytes"], int64_t(b.size()));
  EXPECT_EQ(meta["files"][2]["bytes"], 2500);

  // Preparing again into the same directory with bigger shards leaves no
  // stale shards behind.
  opt.shard_tokens = 100000;
  prepare_dataset(opt);
  EXPECT_FALSE(fs::exists(out.file("train_0001.bin")));
  EXPECT_EQ(TokenDataset(out.path().string(), "train").size(), sum.train_tokens);
}

// A prepare that fails part-way (input with no text, invalid UTF-8 under
// --strict-utf8) leaves the dataset already in the directory as it was, and
// no staging files behind.
TEST(PrepareDataset, FailureKeepsTheExistingDataset) {
  TempDir in, out;
  write_bytes(in.file("good.txt"), std::string(4000, 'g'));
  write_bytes(in.file("empty.txt"), "");
  write_bytes(in.file("bad.txt"), std::string("abc\xff" "def"));
  PrepareOptions opt;
  opt.inputs = {in.file("good.txt")};
  opt.tokenizer = "bytes";
  opt.out_dir = out.path().string();
  opt.shard_tokens = 1000;
  opt.progress = false;
  const PrepareSummary first = prepare_dataset(opt);
  const std::string meta = read_bytes(out.file("meta.json"));
  const std::string shard = read_bytes(out.file("train_0000.bin"));
  auto listing = [&] {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(out.path())) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  };
  const std::vector<std::string> before = listing();

  opt.inputs = {in.file("empty.txt")};
  EXPECT_THROW(prepare_dataset(opt), core::IoError);
  opt.inputs = {in.file("good.txt"), in.file("bad.txt")};
  opt.strict_utf8 = true;
  opt.shard_tokens = 100;  // the failed run would have written shards 0-39 of good.txt first
  EXPECT_THROW(prepare_dataset(opt), core::IoError);

  EXPECT_EQ(listing(), before);
  EXPECT_EQ(read_bytes(out.file("meta.json")), meta);
  EXPECT_EQ(read_bytes(out.file("train_0000.bin")), shard);
  EXPECT_EQ(TokenDataset(out.path().string(), "train").size(), first.train_tokens);
}

// An output directory inside an input directory is not read back as text
// by the next prepare (its meta.json and binary shards were).
TEST(PrepareDataset, OutputInsideTheInputIsSkipped) {
  TempDir in;
  write_bytes(in.file("a.txt"), std::string(3000, 'a'));
  PrepareOptions opt;
  opt.inputs = {in.path().string()};
  opt.tokenizer = "bytes";
  opt.out_dir = in.file("ds");
  opt.progress = false;
  const PrepareSummary first = prepare_dataset(opt);
  const PrepareSummary again = prepare_dataset(opt);
  EXPECT_EQ(first.files, 1);
  EXPECT_EQ(again.files, 1);
  EXPECT_EQ(again.train_tokens + again.val_tokens, 3000);
}

// The output directory as the input directory itself (`--input d --out d`):
// the last prepare's meta.json and shards are not read as text (the second
// run read 3 files, 531 tokens, from one text file of 34 bytes).
TEST(PrepareDataset, AnOutputThatIsTheInputDirectoryReadsOnlyItsText) {
  TempDir in;
  write_bytes(in.file("a.txt"), "hello world, this is a text file.\n");
  PrepareOptions opt;
  opt.inputs = {in.path().string()};
  opt.tokenizer = "bytes";
  opt.out_dir = in.path().string();
  opt.val_fraction = 0;
  opt.progress = false;
  const PrepareSummary first = prepare_dataset(opt);
  const std::string meta = read_bytes(in.file("meta.json"));
  const PrepareSummary again = prepare_dataset(opt);
  EXPECT_EQ(first.files, 1);
  EXPECT_EQ(again.files, 1);
  EXPECT_EQ(again.train_tokens, 34);
  EXPECT_EQ(read_bytes(in.file("meta.json")), meta);  // the same dataset
}

// Empty files are no documents: no end-of-text opens the stream, and inputs
// that are all empty are "no text" with either tokenizer (GPT-2 made a
// dataset of one end-of-text token). A failed prepare into a new directory
// leaves no empty directory behind.
TEST(PrepareDataset, EmptyFilesAreNoDocuments) {
  TempDir in, out;
  write_bytes(in.file("a_empty.txt"), "");
  write_bytes(in.file("b_empty.txt"), "");
  write_bytes(in.file("c.txt"), "Hi");
  write_bytes(in.file("d.txt"), "Hi");
  PrepareOptions opt;
  opt.tokenizer = "gpt2";
  opt.vocab_dir = default_gpt2_vocab_dir();
  opt.val_fraction = 0;
  opt.progress = false;
  for (const char* tok : {"gpt2", "bytes"}) {
    opt.tokenizer = tok;
    opt.inputs = {in.file("a_empty.txt"), in.file("b_empty.txt")};
    opt.out_dir = out.file(std::string("none_") + tok);
    EXPECT_THROW(prepare_dataset(opt), core::IoError) << tok;
    EXPECT_FALSE(fs::exists(opt.out_dir)) << tok;
  }
  opt.out_dir = out.file("new1/new2/ds");  // every directory it created goes
  EXPECT_THROW(prepare_dataset(opt), core::IoError);
  EXPECT_FALSE(fs::exists(out.file("new1")));
  EXPECT_TRUE(fs::exists(out.path()));
  opt.tokenizer = "gpt2";
  opt.inputs = {in.file("a_empty.txt"), in.file("c.txt"), in.file("b_empty.txt"), in.file("d.txt")};
  opt.out_dir = out.file("two");
  prepare_dataset(opt);
  TokenDataset ds(opt.out_dir, "train");
  std::vector<int32_t> got(size_t(ds.size()));
  ds.read(0, ds.size(), got.data());
  EXPECT_EQ(got, (std::vector<int32_t>{17250, 50256, 17250}));  // "Hi" <|endoftext|> "Hi"
}

// A dataset prepared with --val-fraction 0 has no val split: opening it
// says so; and meta.json's tokenizer must be one brisk has.
TEST(TokenDatasetTest, NoValSplitAndUnknownTokenizersAreNamed) {
  TempDir in, out;
  write_bytes(in.file("a.txt"), std::string(3000, 'a'));
  PrepareOptions opt;
  opt.inputs = {in.file("a.txt")};
  opt.tokenizer = "bytes";
  opt.out_dir = out.path().string();
  opt.val_fraction = 0;
  opt.progress = false;
  prepare_dataset(opt);
  EXPECT_EQ(TokenDataset(out.path().string(), "train").size(), 3000);
  try {
    TokenDataset val(out.path().string(), "val");
    ADD_FAILURE() << "an empty val split opened";
  } catch (const core::IoError& e) {
    EXPECT_NE(std::string(e.what()).find("--val-fraction 0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("brisk data prepare --input <inputs> --out"), std::string::npos) << e.what();
  }
  auto meta = nlohmann::json::parse(read_bytes(out.file("meta.json")));
  meta["tokenizer"] = "foo";
  write_bytes(out.file("meta.json"), meta.dump());
  try {
    TokenDataset train(out.path().string(), "train");
    ADD_FAILURE() << "tokenizer 'foo' accepted";
  } catch (const core::IoError& e) {
    EXPECT_NE(std::string(e.what()).find("'foo'; expected 'bytes' or 'gpt2'"), std::string::npos) << e.what();
  }
}

TEST(PrepareDataset, BadInputsAreErrors) {
  TempDir out;
  PrepareOptions opt;
  opt.inputs = {out.file("does_not_exist")};
  opt.out_dir = out.file("ds");
  opt.progress = false;
  EXPECT_THROW(prepare_dataset(opt), core::IoError);
  opt.inputs = {out.path().string()};
  opt.val_fraction = 1.5;
  EXPECT_THROW(prepare_dataset(opt), core::ConfigError);
}

TEST(PrepareDataset, StrictUtf8RejectsInvalidTextNamingFileAndByte) {
  TempDir in, out;
  write_bytes(in.file("good.txt"), "plain text, caf\xc3\xa9\n");
  write_bytes(in.file("bad.txt"), std::string("abc\xff" "def"));
  PrepareOptions opt;
  opt.inputs = {in.file("good.txt"), in.file("bad.txt")};
  opt.out_dir = out.file("ds");
  opt.progress = false;
  opt.strict_utf8 = true;
  try {
    prepare_dataset(opt);
    FAIL() << "expected an IoError";
  } catch (const core::IoError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("bad.txt"), std::string::npos) << msg;
    EXPECT_NE(msg.find("byte 3"), std::string::npos) << msg;
    EXPECT_NE(msg.find("0xFF"), std::string::npos) << msg;
  }
  // Without the flag the bytes tokenizer takes any bytes.
  opt.strict_utf8 = false;
  EXPECT_EQ(prepare_dataset(opt).files, 2);
  EXPECT_EQ(first_invalid_utf8("ok \xc3\xa9"), -1);
  EXPECT_EQ(first_invalid_utf8("\xe0\x80\x80"), 0);  // overlong
  EXPECT_EQ(first_invalid_utf8("ab\xed\xa0\x80"), 2);  // surrogate
}
