// The training loop: micro-batches with gradient accumulation, LR schedule,
// clipping, periodic evaluation, live progress, JSONL metrics, checkpoints
// and exact resume, and a clean stop on SIGINT/SIGTERM (checkpoint first).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "brisk/train/config.h"

namespace brisk::train {

struct StepMetrics {
  int64_t step = 0;
  double loss = 0, lr = 0, grad_norm = 0, tokens_per_s = 0, ms_per_step = 0, mfu = 0;
};

struct TrainResult {
  std::vector<double> losses;  // per step, in order
  double first_loss = 0, last_loss = 0, last_val_loss = -1;
  double median_tokens_per_s = 0;
  // Seconds the steps of this run waited for training data, and the steps'
  // total time: their ratio is the data-wait share of the run.
  double data_wait_s = 0, step_time_s = 0;
  int64_t steps_done = 0;
  std::string last_checkpoint;
  bool interrupted = false;
  std::string profile;  // per-op time table when TrainOptions::profile
  std::string precision = "fp32";  // the precision the run computed in (after any fallback)
  std::string precision_warning;   // why a requested precision fell back; empty if none
  std::string precision_path = "fp32";  // fp32 | bf16-native | bf16-emulated | fp16-emulated
  int64_t skipped_steps = 0;       // steps skipped by the loss scaler (overflow)
  double loss_scale = 0;           // the loss scaler's final scale; 0 when loss scaling was off
};

struct TrainOptions {
  bool resume = false;
  bool progress = true;   // live bar on a terminal; false: plain log lines
  bool quiet = false;     // no output at all (tests)
  bool profile = false;   // time every op of the train step, print a breakdown
};

TrainResult train(const TrainConfig& config, const TrainOptions& options);

}  // namespace brisk::train
