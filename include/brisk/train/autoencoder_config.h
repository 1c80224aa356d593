// Configuration of a sequence autoencoder run (`brisk train` with
// model.kind = "autoencoder", e.g. configs/protein.toml): a TOML file plus
// `--set section.key=value` overrides, every key known, parsed with the same
// plumbing as the GPT and encoder classifier configs (toml_config.h).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "brisk/models/seq_autoencoder.h"
#include "brisk/optim/optimizer.h"
#include "brisk/train/config.h"

namespace brisk::train {

struct AutoencoderConfig {
  // [model]
  models::SeqAutoencoderConfig model;  // vocab_size defaults to data::kFastaVocab
  // [data]
  std::string store = "data/protein.lmdb";  // a FASTA record store (brisk data fasta2lmdb; `make protein`)
  // The split: seeded, by distinct sequence. Records whose residues repeat an
  // earlier record are left out (counted), so one sequence never sits in two
  // parts. test = 1 - train - val.
  double train_frac = 0.8, val_frac = 0.1;
  uint64_t split_seed = 1;
  bool bucket = true;      // length bucketing (false: plain shuffled batches)
  int64_t cache_mb = 64;   // LRU cache of decoded records in front of the store
  // Sequences longer than model.max_len keep their first max_len residues.
  // [train]
  int64_t batch = 16, epochs = 10;
  optim::LrSchedule schedule;  // total_steps = epochs x batches per epoch, set at run time
  optim::AdamWConfig adamw;
  // Share of decoder input residues blanked while training (SeqAutoencoder::
  // set_input_dropout): without it the decoder learns to copy from the
  // residues before and the latent carries little.
  double input_dropout = 0.25;
  uint64_t seed = 1337;
  int threads = 0;  // 0: all cores
  int loader_workers = 1;
  int64_t log_every = 10;
  // Compute precision of both stacks' blocks while training
  // (SeqAutoencoderConfig::compute): fp32 or bf16; fp16 is refused (it needs
  // dynamic loss scaling, which only GPT runs have). bf16 falls back to fp32
  // with a warning where the CPU has no bf16 dot products, unless
  // precision_fallback = false (resolve_precision).
  Precision precision = Precision::fp32;
  bool precision_fallback = true;
  // The best epoch by validation (Hugging Face's load_best_model_at_end with
  // metric_for_best_model): "none", "val_loss" (lowest) or "val_accuracy"
  // (the highest teacher-forced accuracy). An epoch whose validation beats
  // every earlier one writes its weights to <out_dir>/best/, and the test
  // split is scored on the best weights. Needs a validation split.
  std::string keep_best = "none";
  // Epochs in a row without a better keep_best score after which training
  // stops (Hugging Face's EarlyStoppingCallback patience); 0: never. Needs
  // keep_best.
  int64_t early_stop = 0;
  // [checkpoint]
  std::string out_dir = "runs/protein";
  int64_t checkpoint_every = 0;  // steps between checkpoints within an epoch; 0: at epoch ends only
  int keep_checkpoints = 2;

  AutoencoderConfig();
};

// True when the TOML file at `path` says [model] kind = "autoencoder" (with the overrides applied).
bool is_autoencoder_config(const std::string& path, const std::vector<std::string>& overrides);

AutoencoderConfig load_autoencoder_config(const std::string& path, const std::vector<std::string>& overrides);
AutoencoderConfig parse_autoencoder_config(std::string_view text, const std::string& name,
                                           const std::vector<std::string>& overrides = {});
std::string to_toml(const AutoencoderConfig& c);

}  // namespace brisk::train
