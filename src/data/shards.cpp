// Token shards, datasets, window sampling and dataset preparation.
//
// A shard is a flat, memory-mappable array of token ids behind a 64-byte
// header, so training reads data at page-cache speed with no parsing and no
// per-run tokenization. Every failure a user can cause (a truncated copy, a
// foreign file, a flipped bit, a missing directory) becomes a core::IoError
// that names the file and says what is wrong, because "bad data" found halfway
// through a week of training is the costliest bug there is. That is also why
// the payload carries an xxh64 checksum (validated at open: xxh64 runs at
// memory speed, so it costs milliseconds even for a 100M-token shard) and why
// shards and meta.json are written to a temporary name, fsync'ed and renamed.
//
// The on-disk integers are little-endian; we only build for little-endian
// hosts (x86-64, aarch64), so the header is a plain struct.
#include "brisk/data/shards.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "brisk/core/atomic_file.h"
#include "brisk/core/error.h"
#include "brisk/core/json_excerpt.h"
#include "brisk/data/tokenizer.h"

namespace brisk::data {

namespace fs = std::filesystem;
using core::ConfigError;
using core::IoError;

namespace {

static_assert(std::endian::native == std::endian::little, "shards are little-endian on disk");

constexpr char kMagic[8] = {'B', 'R', 'I', 'S', 'K', 'T', 'O', 'K'};
constexpr uint32_t kVersion = 1;
constexpr uint32_t kDtypeU16 = 0, kDtypeI32 = 1;

struct ShardHeader {
  char magic[8];
  uint32_t version;
  uint32_t dtype;
  int64_t vocab_size;
  int64_t count;
  uint64_t checksum;  // xxh64 (seed 0) of the payload bytes
  uint8_t reserved[24];
};
static_assert(sizeof(ShardHeader) == 64);

std::string errno_text() { return std::strerror(errno); }

// Closes a file descriptor on every exit path, including throws.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  auto* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw IoError("cannot write " + path + ": " + errno_text());
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

// Writes bytes to path.tmp, fsyncs, renames over path, then fsyncs the
// directory so the rename itself survives a crash.
template <typename Body>
void write_atomically(const std::string& path, Body&& body) {
  std::string tmp = path + ".tmp";
  {
    Fd f{::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)};
    if (f.fd < 0) throw IoError("cannot create " + tmp + ": " + errno_text());
    body(f.fd, tmp);
    if (::fsync(f.fd) != 0) throw IoError("cannot fsync " + tmp + ": " + errno_text());
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    throw IoError("cannot rename " + tmp + " to " + path + ": " + errno_text());
  fs::path dir = fs::path(path).parent_path();
  Fd d{::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (d.fd >= 0) ::fsync(d.fd);  // best effort: some file systems refuse directory fsync
}

// splitmix64's finaliser: a bijective 64-bit mixer with full avalanche.
constexpr uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Uniform in [0, n) from 64 random bits (Lemire's multiply-shift); the bias
// is below n / 2^64, far under anything a training run could notice.
uint64_t below(uint64_t bits, uint64_t n) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(bits) * n) >> 64);
}

// The index of the first token outside [0, vocab), or -1. A shard is checked
// at open like its checksum: an id past the vocabulary would otherwise reach
// the embedding table mid-run. Chunks are scanned without branches (the loop
// vectorizes); only a failing chunk is searched for the position.
template <class T>
int64_t first_out_of_vocab(const T* tokens, int64_t n, int64_t vocab) {
  constexpr int64_t kChunk = 4096;
  for (int64_t b = 0; b < n; b += kChunk) {
    const int64_t e = std::min(n, b + kChunk);
    bool bad = false;
    for (int64_t i = b; i < e; ++i) bad |= static_cast<uint64_t>(int64_t{tokens[i]}) >= static_cast<uint64_t>(vocab);
    if (!bad) continue;
    for (int64_t i = b; i < e; ++i)
      if (static_cast<uint64_t>(int64_t{tokens[i]}) >= static_cast<uint64_t>(vocab)) return i;
  }
  return -1;
}

}  // namespace

// ---- writing ----------------------------------------------------------------------

void write_shard(const std::string& path, std::span<const int32_t> tokens, int64_t vocab_size) {
  if (vocab_size <= 0 || vocab_size > (int64_t{1} << 31))
    throw ConfigError("write_shard " + path + ": vocab size " + std::to_string(vocab_size) +
                      " is outside [1, 2^31]");
  const bool narrow = vocab_size <= 65536;
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= vocab_size)
      throw ConfigError("write_shard " + path + ": token " + std::to_string(tokens[i]) + " at index " +
                        std::to_string(i) + " is outside the vocabulary [0, " +
                        std::to_string(vocab_size) + ")");

  ShardHeader h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.version = kVersion;
  h.dtype = narrow ? kDtypeU16 : kDtypeI32;
  h.vocab_size = vocab_size;
  h.count = static_cast<int64_t>(tokens.size());

  // uint16 payloads are narrowed in chunks: the checksum is computed on the
  // exact bytes written, and no full-size copy of a large shard is ever made.
  constexpr size_t kChunk = 1 << 16;
  std::vector<uint16_t> buf(narrow ? std::min(kChunk, tokens.size()) : 0);
  auto for_each_chunk = [&](auto&& fn) {
    if (!narrow) {
      fn(tokens.data(), tokens.size_bytes());
      return;
    }
    for (size_t b = 0; b < tokens.size(); b += kChunk) {
      size_t n = std::min(kChunk, tokens.size() - b);
      for (size_t i = 0; i < n; ++i) buf[i] = static_cast<uint16_t>(tokens[b + i]);
      fn(buf.data(), n * sizeof(uint16_t));
    }
  };
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, 0);
  for_each_chunk([&](const void* p, size_t n) { XXH64_update(st, p, n); });
  h.checksum = XXH64_digest(st);
  XXH64_freeState(st);

  write_atomically(path, [&](int fd, const std::string& tmp) {
    write_all(fd, &h, sizeof h, tmp);
    for_each_chunk([&](const void* p, size_t n) { write_all(fd, p, n, tmp); });
  });
}

// ---- reading one shard ------------------------------------------------------------

TokenShard::TokenShard(const std::string& path) : path_(path) {
  const std::string what = "token shard " + path + ": ";
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (f.fd < 0) throw IoError("cannot open " + what + errno_text());
  struct stat sb {};
  if (::fstat(f.fd, &sb) != 0) throw IoError("cannot stat " + what + errno_text());
  const auto file_bytes = static_cast<uint64_t>(sb.st_size);
  if (file_bytes < sizeof(ShardHeader))
    throw IoError(what + "truncated header (" + std::to_string(file_bytes) +
                  " bytes; a shard header is 64)");
  void* m = ::mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, f.fd, 0);
  if (m == MAP_FAILED) throw IoError("cannot map " + what + errno_text());
  map_ = static_cast<const unsigned char*>(m);
  map_bytes_ = file_bytes;

  // From here on a throw must unmap: the destructor does not run for a
  // constructor that throws.
  auto fail = [&](const std::string& problem) {
    ::munmap(const_cast<unsigned char*>(map_), map_bytes_);
    map_ = nullptr;
    throw IoError(what + problem);
  };
  ShardHeader h;
  std::memcpy(&h, map_, sizeof h);
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) fail("not a brisk token shard (bad magic)");
  if (h.version != kVersion)
    fail("unsupported shard version " + std::to_string(h.version) + " (this build reads version " +
         std::to_string(kVersion) + ")");
  if (h.dtype != kDtypeU16 && h.dtype != kDtypeI32)
    fail("unsupported token dtype " + std::to_string(h.dtype) + " (0 = uint16, 1 = int32)");
  bytes_per_token_ = h.dtype == kDtypeU16 ? 2 : 4;
  if (h.vocab_size <= 0 || (h.dtype == kDtypeU16 && h.vocab_size > 65536))
    fail("bad vocab size " + std::to_string(h.vocab_size) + " for dtype " +
         (h.dtype == kDtypeU16 ? "uint16" : "int32"));
  if (h.count < 0) fail("negative token count " + std::to_string(h.count));
  // count * bytes_per_token can wrap around (2^62 int32 tokens would "need"
  // 64 bytes and pass the size check), so the product is checked.
  const uint64_t payload = file_bytes - sizeof(ShardHeader);
  uint64_t expected = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(h.count), uint64_t(bytes_per_token_), &expected) ||
      __builtin_add_overflow(expected, sizeof(ShardHeader), &expected))
    fail("truncated: the header's token count " + std::to_string(h.count) +
         " needs more than 2^64 bytes; the file has " + std::to_string(file_bytes));
  if (expected > file_bytes)
    fail("truncated: expected " + std::to_string(expected) + " bytes, found " +
         std::to_string(file_bytes));
  if (expected < file_bytes)
    fail("the file has " + std::to_string(file_bytes - expected) + " bytes past the header's " +
         std::to_string(h.count) + " tokens (expected " + std::to_string(expected) + " bytes, found " +
         std::to_string(file_bytes) + ")");
  tokens_ = map_ + sizeof(ShardHeader);
  if (XXH64(tokens_, payload, 0) != h.checksum)
    fail("checksum mismatch (corrupted)");
  const int64_t bad = bytes_per_token_ == 2
                          ? first_out_of_vocab(static_cast<const uint16_t*>(tokens_), h.count, h.vocab_size)
                          : first_out_of_vocab(static_cast<const int32_t*>(tokens_), h.count, h.vocab_size);
  if (bad >= 0) {
    const int32_t id = bytes_per_token_ == 2 ? static_cast<const uint16_t*>(tokens_)[bad]
                                             : static_cast<const int32_t*>(tokens_)[bad];
    fail("token " + std::to_string(id) + " at index " + std::to_string(bad) +
         " is outside the vocabulary [0, " + std::to_string(h.vocab_size) + ") of the header");
  }
  count_ = h.count;
  vocab_ = h.vocab_size;
  // Windows are drawn at random offsets: read-ahead would mostly fetch pages
  // no one asked for.
  ::madvise(const_cast<unsigned char*>(map_), map_bytes_, MADV_RANDOM);
}

TokenShard::~TokenShard() {
  if (map_) ::munmap(const_cast<unsigned char*>(map_), map_bytes_);
}

int32_t TokenShard::at(int64_t i) const {
  if (i < 0 || i >= count_)
    throw core::Error("token shard " + path_ + ": index " + std::to_string(i) + " outside [0, " +
                      std::to_string(count_) + ")");
  if (bytes_per_token_ == 2) return static_cast<const uint16_t*>(tokens_)[i];
  return static_cast<const int32_t*>(tokens_)[i];
}

void TokenShard::read(int64_t begin, int64_t n, int32_t* out) const {
  if (begin < 0 || n < 0 || begin + n > count_)
    throw core::Error("token shard " + path_ + ": range [" + std::to_string(begin) + ", " +
                      std::to_string(begin + n) + ") outside [0, " + std::to_string(count_) + ")");
  if (bytes_per_token_ == 2) {
    const uint16_t* src = static_cast<const uint16_t*>(tokens_) + begin;
    for (int64_t i = 0; i < n; ++i) out[i] = src[i];
  } else {
    std::memcpy(out, static_cast<const int32_t*>(tokens_) + begin, static_cast<size_t>(n) * 4);
  }
}

// ---- a dataset split ---------------------------------------------------------------

namespace {

nlohmann::json read_meta(const std::string& dir) {
  const fs::path meta = fs::path(dir) / "meta.json";
  if (!fs::is_directory(dir))
    throw IoError("dataset directory " + dir +
                  " does not exist; create it with `brisk data prepare --input <inputs> --out " + dir + "`");
  if (!fs::exists(meta))
    throw IoError("dataset " + dir + " has no meta.json (" + meta.string() +
                  " is missing); create the dataset with `brisk data prepare --input <inputs> --out " + dir +
                  "`");
  std::ifstream in(meta);
  if (!in) throw IoError("cannot read " + meta.string());
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw IoError(meta.string() + " is not valid JSON: " + e.what());
  }
  if (!j.is_object()) throw IoError(meta.string() + " must be a JSON object, got " + core::json_excerpt(j));
  return j;
}

// meta.json's field `key`, checked to be a string / an integer of at least
// `min`, so that a wrong type names the field.
const nlohmann::json& meta_field(const nlohmann::json& meta, const std::string& key, const std::string& path) {
  if (!meta.contains(key)) throw IoError(path + ": field '" + key + "' is missing");
  return meta[key];
}
std::string meta_string(const nlohmann::json& meta, const std::string& key, const std::string& path) {
  const nlohmann::json& v = meta_field(meta, key, path);
  if (!v.is_string()) throw IoError(path + ": field '" + key + "' must be a string, got " + core::json_excerpt(v));
  return v.get<std::string>();
}
int64_t meta_integer(const nlohmann::json& meta, const std::string& key, const std::string& path, int64_t min) {
  const nlohmann::json& v = meta_field(meta, key, path);
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)) ||
      v.get<int64_t>() < min)
    throw IoError(path + ": field '" + key + "' must be an integer >= " + std::to_string(min) + ", got " +
                  core::json_excerpt(v));
  return v.get<int64_t>();
}

// Shard file names of one split, in stream order: by length first, so that
// train_10000.bin follows train_9999.bin.
std::vector<std::string> split_shards(const std::string& dir, const std::string& split) {
  std::vector<std::string> names;
  const std::string prefix = split + "_";
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string name = e.path().filename().string();
    if (e.is_regular_file() && name.starts_with(prefix) && name.ends_with(".bin"))
      names.push_back(name);
  }
  std::sort(names.begin(), names.end(), [](const std::string& a, const std::string& b) {
    return a.size() != b.size() ? a.size() < b.size() : a < b;
  });
  return names;
}

}  // namespace

TokenDataset::TokenDataset(const std::string& dir, const std::string& split)
    : name_("the " + split + " split of dataset " + dir) {
  const nlohmann::json meta = read_meta(dir);
  const std::string meta_path = (fs::path(dir) / "meta.json").string();
  tokenizer_ = meta_string(meta, "tokenizer", meta_path);
  // Checkpoints name their tokenizer after the data's: any other name would
  // train to the end and leave checkpoints nothing can load.
  if (tokenizer_ != "bytes" && tokenizer_ != "gpt2")
    throw IoError(meta_path + ": field 'tokenizer' is '" + tokenizer_ + "'; expected 'bytes' or 'gpt2'");
  vocab_ = meta_integer(meta, "vocab_size", meta_path, 1);
  const int64_t meta_tokens =
      meta.contains(split + "_tokens") ? meta_integer(meta, split + "_tokens", meta_path, 0) : -1;

  const std::vector<std::string> names = split_shards(dir, split);
  // meta.json's list, when it has one, is what prepare wrote: the PyTorch
  // peers read it, so a shard left over or missing would feed the two others.
  if (meta.contains(split + "_shards")) {
    const nlohmann::json& listed = meta[split + "_shards"];
    std::vector<std::string> want;
    if (listed.is_array())
      for (const auto& n : listed)
        if (n.is_string()) want.push_back(n.get<std::string>());
    if (!listed.is_array() || want.size() != listed.size())
      throw IoError(meta_path + ": field '" + split + "_shards' must be a list of file names");
    if (want != names) {  // the peers read the list in its order, brisk in names'
      std::vector<std::string> have = names;  // both in plain order, to name what differs
      std::sort(have.begin(), have.end());
      std::sort(want.begin(), want.end());
      auto first_not_in = [](const std::vector<std::string>& a, const std::vector<std::string>& b) {
        for (const std::string& x : a)
          if (!std::binary_search(b.begin(), b.end(), x)) return x;
        return std::string();
      };
      const std::string stray = first_not_in(have, want), missing = first_not_in(want, have);
      const std::string what =
          !stray.empty()   ? "shard " + stray + " is not in meta.json's " + split + "_shards (left over?)"
          : !missing.empty() ? "shard " + missing + " of meta.json's " + split + "_shards is missing"
          : want.size() != have.size() || std::adjacent_find(want.begin(), want.end()) != want.end()
              ? "meta.json's " + split + "_shards names a shard twice"
              : "meta.json's " + split + "_shards lists the shards in another order than their names'";
      throw IoError("dataset " + dir + ": " + what + "; re-run `brisk data prepare`");
    }
  }
  for (const std::string& name : names) {
    auto shard = std::make_unique<TokenShard>((fs::path(dir) / name).string());
    if (shard->vocab_size() != vocab_)
      throw IoError("token shard " + shard->path() + " has vocab size " +
                    std::to_string(shard->vocab_size()) + " but " + meta_path + " says " +
                    std::to_string(vocab_));
    if (shard->size() == 0) continue;
    starts_.push_back(total_);
    total_ += shard->size();
    shards_.push_back(std::move(shard));
  }
  if (shards_.empty())
    throw IoError("dataset " + dir + " has no " + split + "_*.bin shards with tokens in them" +
                  (split == "val" ? " (a dataset prepared with --val-fraction 0 has none; a training run "
                                    "with train.eval_every = 0 needs none)"
                                  : "") +
                  "; create the dataset with `brisk data prepare --input <inputs> --out " + dir + "`");
  if (meta_tokens >= 0 && meta_tokens != total_)
    throw IoError("dataset " + dir + ": meta.json says " + std::to_string(meta_tokens) + " " + split +
                  " tokens but the " + split + "_*.bin shards hold " + std::to_string(total_) +
                  " (a shard is missing or left over); re-run `brisk data prepare`");
}

void TokenDataset::read(int64_t begin, int64_t n, int32_t* out) const {
  if (begin < 0 || n < 0 || begin + n > total_)
    throw core::Error("token dataset: range [" + std::to_string(begin) + ", " +
                      std::to_string(begin + n) + ") outside [0, " + std::to_string(total_) + ")");
  // The shard holding `begin`, then walk forward across boundaries.
  size_t s = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), begin) -
                                 starts_.begin()) - 1;
  while (n > 0) {
    int64_t off = begin - starts_[s];
    int64_t take = std::min(n, shards_[s]->size() - off);
    shards_[s]->read(off, take, out);
    out += take;
    begin += take;
    n -= take;
    ++s;
  }
}

// ---- windows -------------------------------------------------------------------------

WindowSampler::WindowSampler(const TokenDataset& data, int64_t batch, int64_t seq, uint64_t seed)
    : data_(data), batch_(batch), seq_(seq), seed_(seed) {
  if (batch <= 0 || seq <= 0)
    throw ConfigError("window sampler: batch (" + std::to_string(batch) + ") and seq (" +
                      std::to_string(seq) + ") must be positive");
  if (data.size() < seq + 1)
    throw ConfigError(data.name() + " holds " + std::to_string(data.size()) +
                      " tokens, fewer than one window of seq + 1 = " + std::to_string(seq + 1) +
                      ": use a shorter sequence length or more data");
}

void WindowSampler::next(int32_t* x, int32_t* y) {
  // Counter-based: window p's start is a pure function of (seed, p), so a
  // checkpoint restores the exact stream from one integer, and any window can
  // be recomputed without replaying the ones before it.
  const uint64_t starts = static_cast<uint64_t>(data_.size() - seq_);  // start in [0, size-seq-1]
  const uint64_t key = mix64(seed_ ^ 0x6a09e667f3bcc909ULL);
  for (int64_t b = 0; b < batch_; ++b) {
    const uint64_t bits = mix64(key + (position_ + 1) * 0x9e3779b97f4a7c15ULL);
    const auto start = static_cast<int64_t>(below(bits, starts));
    ++position_;
    // Targets are the inputs shifted by one: two reads straight into the
    // rows, so drawing a batch needs no buffer of its own.
    data_.read(start, seq_, x + b * seq_);
    data_.read(start + 1, seq_, y + b * seq_);
  }
}

// ---- preparing a dataset ----------------------------------------------------------------

namespace {

// Every regular file under the inputs: a directory contributes its files
// recursively in sorted order, a file itself; the inputs keep the order
// given. Hidden entries (.git), the output directory `out` and, where `out`
// is an input directory itself, its dataset files are skipped: a dataset
// written inside an input directory would otherwise be read as text by the
// next prepare.
std::vector<fs::path> collect_inputs(const std::vector<std::string>& inputs, const fs::path& out) {
  std::error_code ec;
  const fs::path out_abs = fs::weakly_canonical(out, ec);
  auto is_out = [&](const fs::path& p) {
    std::error_code e;
    return !out_abs.empty() && fs::weakly_canonical(p, e) == out_abs;
  };
  // The dataset's own files, where the output is an input directory itself
  // (`--input d --out d`): the last prepare's shards and meta.json are not text.
  auto is_dataset_file = [&](const fs::path& p) {
    const std::string name = p.filename().string();
    const bool shard = (name.starts_with("train_") || name.starts_with("val_")) && name.ends_with(".bin");
    std::error_code e;
    return (shard || name == "meta.json") && !out_abs.empty() && fs::weakly_canonical(p.parent_path(), e) == out_abs;
  };
  std::vector<fs::path> files;
  for (const std::string& in : inputs) {
    fs::path p(in);
    if (fs::is_regular_file(p)) {
      files.push_back(p);
    } else if (fs::is_directory(p)) {
      std::vector<fs::path> found;
      for (auto it = fs::recursive_directory_iterator(p); it != fs::recursive_directory_iterator();
           ++it) {
        if (it->path().filename().string().starts_with(".") || (it->is_directory() && is_out(it->path()))) {
          if (it->is_directory()) it.disable_recursion_pending();
          continue;
        }
        if (it->is_regular_file() && !is_dataset_file(it->path())) found.push_back(it->path());
      }
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else {
      throw IoError("data prepare: input " + in + " is neither a file nor a directory");
    }
  }
  if (files.empty()) throw IoError("data prepare: the inputs hold no files");
  return files;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError("data prepare: cannot read " + path.string());
  std::string text(static_cast<size_t>(fs::file_size(path)), '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.gcount() != static_cast<std::streamsize>(text.size()))
    throw IoError("data prepare: short read of " + path.string() + " (changed while reading?)");
  return text;
}

// Tokens at the end of a stream of `total` tokens that form the val split:
// val_fraction of it, at least 1024 (a few sequences to evaluate on) while
// that leaves train the larger half.
int64_t val_tokens_for(int64_t total, double fraction) {
  if (fraction <= 0) return 0;
  int64_t v = std::max<int64_t>(std::llround(fraction * static_cast<double>(total)), 1024);
  return std::min(v, total / 2);
}

// Cuts the token stream into shards of at most shard_tokens as it grows.
class ShardWriter {
 public:
  ShardWriter(fs::path dir, std::string split, int64_t shard_tokens, int64_t vocab)
      : dir_(std::move(dir)), split_(std::move(split)), shard_tokens_(shard_tokens), vocab_(vocab) {}

  void add(const int32_t* t, int64_t n) {
    while (n > 0) {
      int64_t take = std::min(n, shard_tokens_ - static_cast<int64_t>(buf_.size()));
      buf_.insert(buf_.end(), t, t + take);
      t += take;
      n -= take;
      if (static_cast<int64_t>(buf_.size()) == shard_tokens_) flush();
    }
  }
  void finish() {
    if (!buf_.empty()) flush();
  }
  const std::vector<std::string>& names() const { return names_; }
  int64_t tokens() const { return tokens_; }

 private:
  void flush() {
    char name[64];
    std::snprintf(name, sizeof name, "%s_%04zu.bin", split_.c_str(), names_.size());
    write_shard((dir_ / name).string(), buf_, vocab_);
    names_.push_back(name);
    tokens_ += static_cast<int64_t>(buf_.size());
    buf_.clear();
  }

  fs::path dir_;
  std::string split_;
  int64_t shard_tokens_, vocab_, tokens_ = 0;
  std::vector<int32_t> buf_;
  std::vector<std::string> names_;
};

}  // namespace

namespace {

constexpr const char* kStagingDir = ".prepare.tmp";

// A dataset is its meta.json plus every shard of each split, so shards left
// from an earlier dataset would silently join the new one: they go first.
bool dataset_file(const std::string& name) {
  return name == "meta.json" || ((name.starts_with("train_") || name.starts_with("val_")) &&
                                 (name.ends_with(".bin") || name.ends_with(".bin.tmp")));
}

// Moves the complete dataset in `staging` into `out` in place of the old one:
// the old meta.json goes first and the new one comes last, so a crash in
// between leaves a directory without meta.json, which the loader refuses as
// unfinished, never a mix of the two datasets.
void replace_dataset(const fs::path& staging, const fs::path& out) {
  fs::remove(out / "meta.json");
  for (const auto& e : fs::directory_iterator(out))
    if (e.is_regular_file() && dataset_file(e.path().filename().string())) fs::remove(e.path());
  for (const auto& e : fs::directory_iterator(staging))
    if (e.path().filename() != "meta.json") fs::rename(e.path(), out / e.path().filename());
  fs::rename(staging / "meta.json", out / "meta.json");
  Fd d{::open(out.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (d.fd >= 0) ::fsync(d.fd);  // best effort, as in write_atomically
  fs::remove(staging);
}

}  // namespace

PrepareSummary prepare_dataset(const PrepareOptions& options) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  if (options.out_dir.empty()) throw ConfigError("data prepare: no output directory given");
  if (!(options.val_fraction >= 0 && options.val_fraction < 1))
    throw ConfigError("data prepare: val_fraction " + std::to_string(options.val_fraction) +
                      " is outside [0, 1)");
  if (options.shard_tokens <= 0)
    throw ConfigError("data prepare: shard_tokens must be positive, got " +
                      std::to_string(options.shard_tokens));
  const std::vector<fs::path> files = collect_inputs(options.inputs, options.out_dir);
  const auto tok = make_tokenizer(options.tokenizer, options.vocab_dir);
  const int threads =
      options.threads > 0 ? options.threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));

  // The new dataset is written into a staging directory inside out and moved
  // in only once it is complete, so a failure (no text, invalid UTF-8, a full
  // disk) leaves any dataset already in out as it was.
  const fs::path out(options.out_dir);
  // The outermost directory this prepare creates (out or a parent of it),
  // removed again if the prepare fails.
  fs::path created;
  for (fs::path p = fs::absolute(out).lexically_normal(); !p.empty() && !fs::exists(p); p = p.parent_path()) {
    created = p;
    if (p == p.parent_path()) break;
  }
  fs::create_directories(out);
  // One prepare at a time per output: a second one wiped the first's staging
  // directory, and either could move the other's shards in. The lock dies
  // with its process, so a prepare that was killed leaves nothing in the way.
  struct PrepareLock {
    std::string path;
    int fd;
    ~PrepareLock() {
      ::unlink(path.c_str());  // before the lock goes with the descriptor
      ::close(fd);
    }
  } lock{(out / ".prepare.lock").string(), core::open_locked_temporary((out / ".prepare.lock").string(), out.string())};
  const fs::path staging = out / kStagingDir;
  fs::remove_all(staging);  // left by an earlier run that died
  fs::create_directory(staging);
  // A failed prepare leaves no staging directory, and none of the
  // directories it created for the output.
  struct RemoveOnFailure {
    fs::path dir, created;
    bool done = false;
    ~RemoveOnFailure() {
      std::error_code ec;
      if (done) return;
      fs::remove_all(dir, ec);
      if (!created.empty()) fs::remove_all(created, ec);  // made by this prepare: holds nothing else
    }
  } cleanup{staging, created};

  PrepareSummary sum;
  int64_t total_bytes = 0;
  for (const auto& f : files) total_bytes += static_cast<int64_t>(fs::file_size(f));

  // Val is the tail of the stream, but its length depends on the final total.
  // Since total - val_tokens_for(total) never decreases as the stream grows,
  // everything before that point for the tokens seen so far is train for
  // certain and goes to disk; only the possible tail stays in memory.
  ShardWriter train(staging, "train", options.shard_tokens, tok->vocab_size());
  ShardWriter val(staging, "val", options.shard_tokens, tok->vocab_size());
  std::vector<int32_t> pending;  // tokens [committed, total): the possible val tail
  int64_t total = 0, committed = 0;
  const int32_t eot = tok->eot_token();
  nlohmann::json file_list = nlohmann::json::array();
  auto last_report = t0;
  auto report = [&](bool final) {
    const auto now = Clock::now();
    if (!options.progress || (!final && now - last_report < std::chrono::seconds(1))) return;
    last_report = now;
    const double s = std::chrono::duration<double>(now - t0).count();
    std::fprintf(stderr, "data prepare: %lld/%zu files, %.1f/%.1f MB, %lld tokens, %.1f MB/s\n",
                 static_cast<long long>(sum.files), files.size(), sum.bytes / 1e6, total_bytes / 1e6,
                 static_cast<long long>(total), s > 0 ? sum.bytes / 1e6 / s : 0.0);
  };

  for (const fs::path& f : files) {
    const std::string text = read_file(f);
    if (options.strict_utf8) {
      if (const int64_t bad = first_invalid_utf8(text); bad >= 0)
        throw core::IoError(f.string() + ": not valid UTF-8 at byte " + std::to_string(bad) + " (0x" +
                            [&] {
                              char hex[3];
                              std::snprintf(hex, sizeof hex, "%02X", static_cast<unsigned char>(text[size_t(bad)]));
                              return std::string(hex);
                            }() +
                            "); drop --strict-utf8 to tokenize it anyway");
    }
    const std::vector<int32_t> ids = tok->encode_parallel(text, threads);
    // eot separates documents: an empty file is none, so no eot opens the
    // stream, and inputs that are all empty hold no text.
    const bool separate = eot >= 0 && total > 0 && !ids.empty();
    if (separate) pending.push_back(eot);
    pending.insert(pending.end(), ids.begin(), ids.end());
    total += static_cast<int64_t>(ids.size()) + (separate ? 1 : 0);
    sum.files += 1;
    sum.bytes += static_cast<int64_t>(text.size());
    file_list.push_back({{"path", f.string()}, {"bytes", text.size()}});

    const int64_t safe = total - val_tokens_for(total, options.val_fraction);
    train.add(pending.data(), safe - committed);
    pending.erase(pending.begin(), pending.begin() + (safe - committed));
    committed = safe;
    report(false);
  }
  if (total == 0) throw IoError("data prepare: the input files hold no text");

  const int64_t n_val = val_tokens_for(total, options.val_fraction);
  const int64_t n_train_rest = total - n_val - committed;
  train.add(pending.data(), n_train_rest);
  train.finish();
  val.add(pending.data() + n_train_rest, n_val);
  val.finish();
  sum.train_tokens = train.tokens();
  sum.val_tokens = val.tokens();

  nlohmann::json meta = {
      {"format", "brisk token shards"},
      {"version", kVersion},
      {"tokenizer", tok->name()},
      {"vocab_size", tok->vocab_size()},
      {"eot_token", eot},
      {"train_tokens", sum.train_tokens},
      {"val_tokens", sum.val_tokens},
      {"val_fraction", options.val_fraction},
      {"shard_tokens", options.shard_tokens},
      {"train_shards", train.names()},
      {"val_shards", val.names()},
      {"files", file_list},
      {"bytes", sum.bytes},
  };
  const std::string text = meta.dump(2) + "\n";
  write_atomically((staging / "meta.json").string(), [&](int fd, const std::string& tmp) {
    write_all(fd, text.data(), text.size(), tmp);
  });
  replace_dataset(staging, out);
  cleanup.done = true;
  sum.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  report(true);
  return sum;
}

}  // namespace brisk::data
