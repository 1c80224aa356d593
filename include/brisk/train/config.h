// Training configuration: a TOML file plus `--set section.key=value`
// overrides. Every key is known: a misspelled or out-of-range key raises a
// ConfigError that names it and says what is allowed.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "brisk/dist/dist_config.h"
#include "brisk/models/gpt.h"
#include "brisk/optim/optimizer.h"

namespace brisk::train {

// Compute precision of the matrix products (master weights and optimizer
// state are always fp32).
enum class Precision { fp32, bf16, fp16 };
const char* precision_name(Precision p);
Precision parse_precision(const std::string& name);  // throws ConfigError listing the allowed values

// What a run actually computes in. bf16 has a fast path where the CPU has
// bf16 dot products (cpu::cpu_features(): avx512_bf16 or AMX, through
// oneDNN): there it runs natively. Elsewhere, and for fp16 everywhere, the
// low-precision products would widen to fp32, costing more than fp32: with
// `fallback` (train.precision_fallback, default true) such a request falls
// back to fp32 and `warning` says so and why (CPU features, missing engine
// path); without it the low-precision graph runs anyway, emulated, and `note`
// says so: what the numerics checks use.
struct PrecisionChoice {
  Precision requested = Precision::fp32, effective = Precision::fp32;
  std::string warning;  // empty unless the run fell back
  std::string note;     // one line when the run is low precision without a fast path
  bool emulated = false;
  // The path taken, as the start-up line and the benchmarks' JSON name it:
  // "fp32", "bf16-native", "bf16-emulated", "fp16-emulated".
  std::string path = "fp32";
  std::string reason;   // why that path (CPU flags, oneDNN ISA, overrides)
};
// On device "cuda" bf16 and fp16 always have their fast path (tensor cores
// through cuBLASLt); the CPU checks its flags.
PrecisionChoice resolve_precision(Precision requested, bool fallback = true, const std::string& device = "cpu");
// The graph dtype of a precision: f32, bf16, f16.
core::DType compute_dtype(Precision p);

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
  // Where the step runs: "cpu", or "cuda" (GPU 0: weights, gradients,
  // optimizer state and activations in GPU memory; an error where there is
  // no usable GPU, never a silent fall back to the CPU).
  std::string device = "cpu";
  int threads = 0;                   // 0: all cores (cpu)
  int loader_workers = 2;            // data loader threads; 0: batches built on the training thread
  int64_t eval_every = 100, eval_batches = 8, log_every = 10;
  // Every metrics.jsonl scalar also goes to a TensorBoard event file in
  // checkpoint.dir (docs/monitoring.md); false: none is written.
  bool tensorboard = true;
  Precision precision = Precision::fp32;  // requested; see resolve_precision
  bool precision_fallback = true;         // false: run bf16/fp16 emulated where no fast path exists
  // Dynamic loss scaling (optim::LossScaler). Unset: on iff the effective
  // precision is fp16; true forces it on (also over fp32 compute, for tests).
  std::optional<bool> loss_scaling;
  float loss_scale_init = 65536.0f;
  int64_t loss_scale_growth_interval = 2000;
  // Fine-tuning (docs/pruning.md). init_from: a checkpoint or run directory
  // whose weights start the run instead of random ones (step 0, a fresh
  // optimizer, the data stream from its start); the model shape must match.
  // --resume, when checkpoint.dir has a checkpoint, takes precedence.
  std::string init_from;
  // Hold the block Linear weights that are exactly 0 in the starting weights
  // (a pruned model) at 0: re-zeroed, with their AdamW moments, after every
  // update. Needs weights to start from (init_from or a resumed run); cpu only.
  bool keep_mask = false;
  // train.preset: a named group of settings ("high-performance",
  // "memory-constrained", "production"; docs/tuning.md) that fills the keys
  // the file and --set leave unset. Empty: none.
  std::string run_preset;
  // train.memory_budget: a host-memory budget such as "4GiB". At start-up
  // the trainer picks the micro-batch (keeping batch x grad_accum), the
  // recompute level and the fused classifier whose planned peak fits it
  // (brisk/train/tune.h, `brisk tune`). Empty: the config as written.
  std::string memory_budget;
  // [dist]: several processes (mpirun / srun); train.batch is the global
  // batch, each of N ranks computes train.batch / N of it.
  dist::DistConfig dist;
  // [checkpoint]
  std::string out_dir = "runs/default";
  int64_t checkpoint_every = 100;
  int keep_checkpoints = 3;
};

// Reads `path` (if not empty) and applies overrides of the form "train.steps=100".
TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides);
// The same from TOML text in memory; `name` stands for the file in errors.
TrainConfig parse_train_config(std::string_view text, const std::string& name,
                               const std::vector<std::string>& overrides = {});
// The resolved configuration as TOML (written next to checkpoints).
std::string to_toml(const TrainConfig& c);
// `v` as a TOML basic string, quoted and escaped (also for --set values).
std::string toml_string(const std::string& v);
// `v` in the fewest digits that read back as the same float or double: a
// stream's default 6 digits made lr 0.01000004 read back as 0.01 (and two
// ranks' configs compare equal).
std::string toml_number(double v);
std::string toml_number(float v);

}  // namespace brisk::train
