// Training configuration: a TOML file plus `--set section.key=value`
// overrides. Every key is known: a misspelled or out-of-range key raises a
// ConfigError that names it and says what is allowed.
#pragma once

#include <string>
#include <vector>

#include "brisk/models/gpt.h"
#include "brisk/optim/optimizer.h"

namespace brisk::train {

struct TrainConfig {
  // [model]
  std::string preset;  // empty: the explicit fields below
  models::GptConfig model;
  // [data]
  std::string data_dir = "data/kjv-bytes";
  // [train]
  int64_t batch = 8, seq = 256, grad_accum = 1, steps = 300;
  optim::LrSchedule schedule;        // max_lr, min_lr_ratio, warmup, kind; total_steps = steps
  optim::AdamWConfig adamw;
  uint64_t seed = 1337;
  int threads = 0;                   // 0: all cores
  int loader_workers = 2;            // data loader threads; 0: batches built on the training thread
  int64_t eval_every = 100, eval_batches = 8, log_every = 10;
  // [checkpoint]
  std::string out_dir = "runs/default";
  int64_t checkpoint_every = 100;
  int keep_checkpoints = 3;
};

// Reads `path` (if not empty) and applies overrides of the form "train.steps=100".
TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides);
// The resolved configuration as TOML (written next to checkpoints).
std::string to_toml(const TrainConfig& c);

}  // namespace brisk::train
