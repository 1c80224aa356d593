// Token shards: the training data on disk. A shard is a 64-byte header
// (magic "BRISKTOK", version, dtype, vocab size, token count, xxh64 checksum
// of the payload) followed by the tokens, uint16 when the vocab fits, else
// int32. Shards are memory-mapped for reading; a truncated, foreign or
// corrupted file is rejected with a core::IoError naming the file and the
// problem. A dataset directory holds train_NNNN.bin and val_NNNN.bin shards
// plus meta.json (tokenizer, vocab size, token counts).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace brisk::data {

// Writes to path.tmp, then renames: a crash never leaves a half shard.
void write_shard(const std::string& path, std::span<const int32_t> tokens, int64_t vocab_size);

class TokenShard {
 public:
  explicit TokenShard(const std::string& path);  // maps and validates (checksum included)
  ~TokenShard();
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;

  const std::string& path() const { return path_; }
  int64_t size() const { return count_; }
  int64_t vocab_size() const { return vocab_; }
  int32_t at(int64_t i) const;
  // Copies tokens [begin, begin + n) as int32.
  void read(int64_t begin, int64_t n, int32_t* out) const;

 private:
  std::string path_;
  const unsigned char* map_ = nullptr;
  size_t map_bytes_ = 0;
  const void* tokens_ = nullptr;
  int64_t count_ = 0, vocab_ = 0;
  int bytes_per_token_ = 2;
};

// All shards of one split ("train" or "val") of a dataset directory.
class TokenDataset {
 public:
  TokenDataset(const std::string& dir, const std::string& split);
  int64_t size() const { return total_; }
  int64_t vocab_size() const { return vocab_; }
  const std::string& tokenizer() const { return tokenizer_; }
  // "the val split of dataset DIR", for messages.
  const std::string& name() const { return name_; }
  // Copies tokens [begin, begin + n) across shard boundaries.
  void read(int64_t begin, int64_t n, int32_t* out) const;

 private:
  std::vector<std::unique_ptr<TokenShard>> shards_;
  std::vector<int64_t> starts_;
  int64_t total_ = 0, vocab_ = 0;
  std::string tokenizer_, name_;
};

// Random contiguous windows of seq+1 tokens: inputs x = w[0..seq), targets
// y = w[1..seq]. The sequence of windows depends only on the seed and the
// position, which a checkpoint saves and restores.
class WindowSampler {
 public:
  WindowSampler(const TokenDataset& data, int64_t batch, int64_t seq, uint64_t seed);
  // x and y each hold batch * seq int32.
  void next(int32_t* x, int32_t* y);
  uint64_t position() const { return position_; }
  void set_position(uint64_t p) { position_ = p; }

 private:
  const TokenDataset& data_;
  int64_t batch_, seq_;
  uint64_t seed_, position_ = 0;
};

struct PrepareOptions {
  std::vector<std::string> inputs;  // files or directories (read recursively, sorted)
  std::string tokenizer = "bytes";  // "bytes" | "gpt2"
  std::string vocab_dir;            // for gpt2 (default: default_gpt2_vocab_dir())
  std::string out_dir;
  double val_fraction = 0.01;       // the last tokens of the stream go to val
  int64_t shard_tokens = 100'000'000;
  int threads = 0;                  // 0: all cores
  bool progress = true;             // print throughput as it goes
  // Reject a file that is not valid UTF-8 (naming the file and the byte)
  // instead of tokenizing it as is (bytes) or with U+FFFD (gpt2).
  bool strict_utf8 = false;
};

struct PrepareSummary {
  int64_t files = 0, bytes = 0, train_tokens = 0, val_tokens = 0;
  double seconds = 0;
};

// Tokenizes the inputs into shards + meta.json under out_dir.
PrepareSummary prepare_dataset(const PrepareOptions& options);

}  // namespace brisk::data
