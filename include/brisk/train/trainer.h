// The training loop: micro-batches with gradient accumulation, LR schedule,
// clipping, periodic evaluation, live progress, JSONL metrics, checkpoints
// and exact resume, and a clean stop on SIGINT/SIGTERM (checkpoint first).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "brisk/core/backend.h"
#include "brisk/core/communicator.h"
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
  bool profile_skips_first = false;  // the table leaves out this run's first step (one-time work)
  std::string trace;    // the Chrome trace written for TrainOptions::trace_path; "" if none
  std::string precision = "fp32";  // the precision the run computed in (after any fallback)
  std::string precision_warning;   // why a requested precision fell back; empty if none
  std::string precision_path = "fp32";  // fp32 | bf16-native | bf16-emulated | fp16-emulated
  int64_t skipped_steps = 0;       // steps skipped by the loss scaler (overflow)
  double loss_scale = 0;           // the loss scaler's final scale; 0 when loss scaling was off
  // Several processes (docs/distributed.md): this one's rank, their number,
  // and the run's gradient communication: seconds in collectives and seconds
  // the steps waited for them (the rest was hidden behind backward).
  int rank = 0, world = 1;
  double comm_s = 0, comm_exposed_s = 0;
  // On a GPU, at the end of the run: the device memory in use (the driver's
  // total - free: this process's allocations, its CUDA context and anything
  // else on the card), the card's total, and the part the planner accounts
  // for (train arena, parameters, gradients, optimizer state). 0 on the CPU.
  size_t device_memory_used = 0, device_memory_total = 0, device_memory_planned = 0;
};

struct TrainOptions {
  bool resume = false;
  bool progress = true;   // live bar on a terminal; false: plain log lines
  bool quiet = false;     // no output at all (tests)
  bool profile = false;   // time every op of the train step, print a breakdown
  // --trace: a Chrome trace (docs/monitoring.md) of steps trace_steps
  // (1-based, as in metrics.jsonl; empty: StepTrace::default_steps) to this
  // path; "" for none. Rank 0 only.
  std::string trace_path{};  // (initializers: no -Wmissing-field-initializers for {.quiet = true})
  std::vector<int64_t> trace_steps{};
  // Data parallelism: the communicator of the ranks of this run (mpirun),
  // nullptr for one process. train(config, options) connects one itself
  // when an MPI launcher started the process.
  core::Communicator* comm = nullptr;
};

// The backend train.device names: the CPU one, or the CUDA one (loaded at
// run time). No usable GPU is a ConfigError that says why, never a quiet CPU run.
// device_index: the GPU (one per rank of a data-parallel run).
std::unique_ptr<core::Backend> make_backend(const TrainConfig& config, int device_index = 0);

// A training run, one optimizer step at a time. The constructor sets up
// (data, model, optimizer, loader, run directory) and resumes from the
// newest checkpoint when options.resume; step() runs one optimizer step and
// what follows it (progress, metrics row, evaluation and checkpoint when
// due). In the steady state a step allocates nothing outside evaluation and
// checkpointing (tests/unit/no_alloc_test.cpp).
class Trainer {
 public:
  Trainer(const TrainConfig& config, core::Backend& backend, const TrainOptions& options);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  bool done() const;  // every step ran, or a stop signal ended the run
  void step();
  TrainResult finish();  // the summary; call once, after the last step

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Runs a whole training (SIGINT/SIGTERM save a checkpoint and stop) on the
// given backend, or on make_backend(config).
TrainResult train(const TrainConfig& config, core::Backend& backend, const TrainOptions& options);
TrainResult train(const TrainConfig& config, const TrainOptions& options);

}  // namespace brisk::train
