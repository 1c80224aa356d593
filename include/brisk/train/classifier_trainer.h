// Training an encoder classifier on a labelled record store (`brisk train
// --config configs/spam.toml`): a stratified, seeded train/val/test split by
// record, length-bucketed batches through the prefetching loader with an LRU
// cache of decoded records in front of the store, AdamW with warmup and
// cosine decay, validation after each epoch, and at the end a report on the
// test split (accuracy, precision, recall, F1, ROC AUC, confusion matrix)
// next to a bag-of-words logistic-regression baseline on the same split.
// The run directory gets config.toml, metrics.jsonl, report.json and a
// checkpoint per epoch.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "brisk/data/tokenizer.h"
#include "brisk/train/bow_baseline.h"
#include "brisk/train/checkpoint.h"
#include "brisk/train/classify_config.h"
#include "brisk/train/classify_metrics.h"

namespace brisk::train {

// Rows of the logits programs that score the val and test splits (at most
// max_len wide): their arena lives beside the train step's (`brisk plan`).
constexpr int64_t kClassifierEvalBatch = 64;

// Which records form each part of the split, in ascending order.
struct Split {
  std::vector<int64_t> train, val, test;
};
// Per label: shuffle that label's records with `seed`, then the first
// round(n * train_frac) go to train, the next round(n * val_frac) to val, the
// rest to test. Each label keeps its share in every part.
Split stratified_split(const std::vector<int32_t>& labels, double train_frac, double val_frac, uint64_t seed);

// The labels stratified_split is given for a store's records: a record's
// own, or -1 (in no part) for an empty record and for one whose tokens
// repeat an earlier record's (`digests`: data::token_digest of each): a
// message and its copy in different parts would score the model on text it
// trained on (the SpamAssassin bodies hold 172 such copies). Counts both.
std::vector<int32_t> split_labels_of(const std::vector<int32_t>& labels, const std::vector<int64_t>& lengths,
                                     const std::vector<std::string>& digests, int64_t& empty, int64_t& repeats);

struct ClassifyOptions {
  bool quiet = false;  // no output (tests)
  // Continue from the newest checkpoint in checkpoint.dir (a fresh run when
  // there is none): the same weights as an uninterrupted run, bit for bit.
  bool resume = false;
  // Time every op of the train steps: the table is printed at the end and
  // kept in report.json ("profile").
  bool profile = false;
};

struct ClassifyResult {
  int64_t steps = 0, epochs = 0;  // steps: the run's total so far (a resumed run counts the earlier ones)
  int64_t start_step = 0;         // 0, or the checkpoint's step a resumed run continued from
  bool interrupted = false;       // stopped by SIGINT/SIGTERM: checkpoint saved, no test split or report
  double first_loss = 0, last_loss = 0;  // this process's first and last step
  double seconds = 0;
  double tokens_per_s = 0;         // real (unpadded) tokens per second of training steps
  double padded_tokens_per_s = 0;  // batch cells per second, padding included
  double padding_waste = 0;        // padded cells / all cells over the run
  double cache_hit_rate = 0;
  std::string precision_path = "fp32";  // fp32 | bf16-native | bf16-emulated (resolve_precision's path)
  int64_t dropped_empty = 0, repeats = 0, truncated = 0;  // repeats: records left out as copies of earlier ones
  Split split;
  ClassMetrics val, test;
  BowBaseline baseline;
  std::string checkpoint;  // the last one written
  // train.keep_best: the best epoch (1-based; 0: none kept), its score and
  // checkpoint (<out_dir>/best/step_*); `val` and `test` are then the best
  // weights' figures.
  int64_t best_epoch = 0;
  double best_score = 0;
  std::string best_checkpoint;
  bool early_stopped = false;  // train.early_stop ended training before train.epochs
};

// Class probabilities (sequences x n_classes, softmax of the logits) for
// token sequences, each cut to the model's max_len; batched by length. An
// empty sequence throws ShapeError naming it.
std::vector<float> predict_probs(models::Encoder& model, const std::vector<std::vector<int32_t>>& sequences);
// The softmax of each of `rows` rows of `k` logits, into `probs` (the same layout).
void class_probabilities(const float* logits, int64_t rows, int64_t k, float* probs);

// How a classifier reads a text message, as it was trained (brisk classify,
// brisk serve): the checkpoint's tokenizer, which must read text (bytes or
// gpt2; IoError naming `dir` and `command` otherwise), and what of the
// message it reads: the body for a model trained on bodies (empty when the
// message has none), else the whole message.
std::unique_ptr<data::Tokenizer> message_tokenizer(const EncoderCheckpoint& info, const std::string& dir,
                                                   const std::string& command);
std::string_view message_text(const EncoderCheckpoint& info, std::string_view message);

// The compute dtype a classifier reads messages in (brisk classify and
// brisk serve --precision): "fp32", or "bf16" where this CPU has bf16 dot
// products; without them bf16 falls back to fp32 and `say` gets the
// warning. `say` also gets one line naming the path taken. Throws
// ConfigError for another name.
core::DType classifier_compute(const std::string& precision, const std::function<void(const std::string&)>& say);

ClassifyResult train_classifier(const ClassifyConfig& config, const ClassifyOptions& options = {});

}  // namespace brisk::train
