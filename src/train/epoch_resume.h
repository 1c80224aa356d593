// `brisk train --resume` for the epoch-based runs (the encoder classifier and
// the sequence autoencoder). A checkpoint holds the weights, the AdamW
// moments and step count, the step, and what built the batch stream
// (EpochRunState). A batch is a pure function of the stream's settings and
// its index (data/loader.h), so a resumed run sets the loader to the
// checkpoint's step and continues with the batches, learning rates and
// dropout draws the uninterrupted run would have used: the same weights, bit
// for bit. Internal to src/train.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "brisk/train/checkpoint.h"
#include "stop_signal.h"

namespace brisk::train::detail {

// The train split's digest (EpochRunState::train_digest): the records'
// token digests (data::token_digest) in split order, with their labels when
// given, digested again, in hex.
std::string split_digest(const std::vector<std::string>& record_digests, const std::vector<int64_t>& train,
                         const std::vector<int32_t>* labels);

// This config's stream, before any step.
template <class Config>
EpochRunState epoch_run_state(const Config& c, int64_t steps_per_epoch, int64_t train_records,
                              std::string train_digest) {
  EpochRunState s;
  s.train_digest = std::move(train_digest);
  s.batch = c.batch;
  s.steps_per_epoch = steps_per_epoch;
  s.train_records = train_records;
  s.bucket = c.bucket;
  s.split_seed = c.split_seed;
  s.train_frac = c.train_frac;
  s.val_frac = c.val_frac;
  return s;
}

// What the checkpoint at `ckpt` says about its run.
struct SavedRun {
  int64_t step = 0;
  uint64_t seed = 0;
  std::optional<EpochRunState> run;
};

// Throws ConfigError unless this config continues the run saved in `ckpt`:
// the same train.seed and stream (naming the first key that differs and both
// values) and a step within this config's `total_steps`.
void check_resumable(const std::string& ckpt, const SavedRun& saved, uint64_t seed, const EpochRunState& now,
                     int64_t total_steps);

// What the step loop does after a step.
enum class AfterStep { next, epoch_end, stop };

// After a step (`step` steps done; the epoch ends at `epoch_end`): at an
// epoch's end the caller validates and checkpoints; before it, a checkpoint
// (`save()`, metrics flushed first) when checkpoint.every says so or a stop
// signal came, and then `stop`.
template <class Save>
AfterStep after_step(int64_t step, int64_t epoch_end, int64_t every, std::FILE* metrics, const Save& save) {
  if (step == epoch_end) return AfterStep::epoch_end;
  const bool stop = stop_signal() != 0;
  if (stop || (every > 0 && step % every == 0)) {
    std::fflush(metrics);
    save();
  }
  return stop ? AfterStep::stop : AfterStep::next;
}

// "resumed from <ckpt> at step S (epoch E, batch b of P)\n".
std::string resumed_line(const std::string& ckpt, int64_t step, int64_t steps_per_epoch, int64_t total_steps);

// A resumed run that trained no step here (it was at its last step): the
// training figures of its report are unknown (null in report.json), not 0.
template <class Result>
void no_training_figures(Result& res) {
  res.first_loss = res.last_loss = res.tokens_per_s = res.padded_tokens_per_s = res.padding_waste = std::nan("");
}
// "stopped by SIGINT after step S: checkpoint saved to <ckpt>; ... --resume ...\n".
std::string stopped_line(int64_t step, const std::string& ckpt);

}  // namespace brisk::train::detail
