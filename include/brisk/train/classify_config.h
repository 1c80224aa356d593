// Configuration of an encoder classifier run (`brisk train` with
// model.kind = "encoder", e.g. configs/spam.toml): a TOML file plus `--set
// section.key=value` overrides, every key known, like a GPT run's config.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "brisk/models/encoder.h"
#include "brisk/optim/optimizer.h"
#include "brisk/train/config.h"

namespace brisk::train {

struct ClassifyConfig {
  // [model]
  std::string preset;  // empty: the explicit fields
  models::EncoderConfig model;
  // [data]
  std::string store = "data/spam-body-gpt2.lmdb";  // a record store (brisk data emails / fasta2lmdb)
  std::vector<std::string> label_names;        // one name per class; default "0", "1", ...
  // The store holds message bodies only (`brisk data emails --strip-headers`):
  // recorded in the checkpoint so `brisk classify` strips headers the same way.
  bool strip_headers = false;
  // The split: stratified by label, seeded, by record (each record lands in
  // exactly one part). test = 1 - train - val.
  double train_frac = 0.8, val_frac = 0.1;
  uint64_t split_seed = 1;
  bool bucket = true;         // length bucketing (false: plain shuffled batches, the padded baseline)
  int64_t cache_mb = 256;     // LRU cache of decoded records in front of the store
  // Records longer than model.max_len keep their first max_len tokens.
  // [train]
  int64_t batch = 16, epochs = 3;
  optim::LrSchedule schedule;  // total_steps = epochs x batches per epoch, set at run time
  optim::AdamWConfig adamw;
  uint64_t seed = 1337;
  int threads = 0;            // 0: all cores
  int loader_workers = 2;
  int64_t log_every = 10;
  // Compute precision of the encoder's blocks (EncoderConfig::compute): fp32
  // or bf16; fp16 is refused (it needs dynamic loss scaling, which only GPT
  // runs have). bf16 falls back to fp32 with a warning where the CPU has no
  // bf16 dot products, unless precision_fallback = false (resolve_precision).
  Precision precision = Precision::fp32;
  bool precision_fallback = true;
  // The best epoch by validation (Hugging Face's load_best_model_at_end with
  // metric_for_best_model): "none", "val_loss" (lowest) or "val_f1"
  // (highest). An epoch whose validation beats every earlier one writes its
  // weights to <out_dir>/best/, and the test split is scored on the best
  // weights. Needs a validation split.
  std::string keep_best = "none";
  // Epochs in a row without a better keep_best score after which training
  // stops (Hugging Face's EarlyStoppingCallback patience); 0: never. Needs
  // keep_best.
  int64_t early_stop = 0;
  // train.class_weights (PyTorch's CrossEntropyLoss weight): "none";
  // "balanced", n / (n_classes x count_c) from the train split's label
  // counts (scikit-learn's "balanced"; the trainer fills
  // model.class_weights); or "given", read from an array of n_classes
  // numbers into model.class_weights (which also applies when set directly,
  // whatever this says, unless it says "balanced").
  std::string class_weights = "none";
  // [checkpoint]
  std::string out_dir = "runs/spam";
  int64_t checkpoint_every = 0;  // steps between checkpoints within an epoch; 0: at epoch ends only
  int keep_checkpoints = 2;
};

// True when the TOML file at `path` says [model] kind = "encoder" (with the
// overrides applied): `brisk train` uses it to pick the trainer.
bool is_encoder_config(const std::string& path, const std::vector<std::string>& overrides);

ClassifyConfig load_classify_config(const std::string& path, const std::vector<std::string>& overrides);
ClassifyConfig parse_classify_config(std::string_view text, const std::string& name,
                                     const std::vector<std::string>& overrides = {});
std::string to_toml(const ClassifyConfig& c);

}  // namespace brisk::train
