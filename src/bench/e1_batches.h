// The E1 benchmark's batches (train_e1_bench.cpp): the classifier trainer's
// batch stream rebuilt outside the trainer -- same record store, same
// stratified split, same RecordBatchSource options and seed, each batch's
// width rounded up to a multiple of 32 -- and a plain binary file that holds
// it, so brisk and the PyTorch peer train on byte-identical padded batches
// and the peer needs no LMDB.
//
// The file (little-endian): "BRISKE1B", u32 version (1), u32 batch count,
// then per batch i64 rows, i64 cols, i32 ids[rows*cols] (padding 0),
// i32 lengths[rows], i32 labels[rows]. bench/torch_encoder_peer.py reads it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "brisk/train/classify_config.h"

namespace brisk::bench {

// The width the trainer pads a batch of `cols` columns to
// (models::round_width), so the bench times the widths the trainer runs.
int64_t e1_round_width(int64_t cols, int64_t max_len);

struct E1Batch {
  int64_t rows = 0, cols = 0;  // cols: already rounded up
  std::vector<int32_t> ids, lengths, labels;
  int64_t real_tokens() const;
  int64_t cells() const { return rows * cols; }
};

// What the bench says about a stream beside its batches: epoch 0 as the
// trainer would see it, so a reader can tell whether the timed steps are a
// fair sample of the epoch.
struct E1Stream {
  bool bucket = true;
  std::vector<E1Batch> batches;
  int64_t train_records = 0, batches_per_epoch = 0, truncated = 0;
  double epoch_padding_waste = 0;            // epoch 0, widths rounded up as the trainer does
  double epoch_padding_waste_unrounded = 0;  // epoch 0, the batcher's own figure (no rounding)
};

// Every record's length and label and the trainer's train split, read once:
// both streams (bucketed and not) draw from it.
struct E1Corpus {
  std::vector<int64_t> lengths;
  std::vector<int32_t> labels;
  std::vector<int64_t> train;  // record indices of the train split, ascending
  int64_t records = 0, empty = 0;
  std::string tokenizer;
};
E1Corpus load_e1_corpus(const train::ClassifyConfig& cfg);

// The first `count` batches the classifier trainer trains on under `cfg`
// with data.bucket = `bucket` (later epochs follow when count is larger).
E1Stream e1_stream(const E1Corpus& corpus, const train::ClassifyConfig& cfg, bool bucket, int64_t count);

void write_e1_batches(const std::string& path, const std::vector<E1Batch>& batches);
// Throws IoError naming the file when it is missing, truncated or not a batch file.
std::vector<E1Batch> read_e1_batches(const std::string& path);

// One batch's fingerprint; a side's data hash is h = h * 1000003 + this over
// the batches it trained on (mod 2^64). The peer computes the same sum, so
// the table can say both sides consumed the same batches in the same order.
uint64_t e1_batch_hash(const E1Batch& b);

}  // namespace brisk::bench
