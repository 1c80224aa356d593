// The training benchmark: brisk and its PyTorch peer train the same GPT (W1,
// W2) or encoder classifier (E1) on the same data, one after the other in the
// same run, and one table compares them
// (docs/workloads.md: every performance figure names a workload, a peer
// measured in the same run, and the ratio).
//
// Each side runs in its own process so that its peak resident memory is its
// own: the brisk side is this executable started again with a worker flag
// (run_train_worker), the peer is bench/torch_peer.py under Debian's Python.
// Both print one JSON line on stdout; run_train_bench collects them, prints
// the table and writes the JSON report.
#pragma once

#include <cstdint>
#include <string>

#include "brisk/models/gpt.h"
#include "brisk/optim/optimizer.h"

namespace brisk::bench {

struct TrainBenchOptions {
  std::string workload = "W2";  // W1 (gpt2-tiny), W2 (char-small) or E1 (spam-encoder)
  int steps = 20;               // timed steps; the median is reported
  int warmup = 3;               // untimed steps before them
  int threads = 2;
  int64_t batch = 8;            // docs/workloads.md: micro-batch 8, seq = block size
  uint64_t seed = 1337;         // weights and data windows
  std::string data_dir;         // default: data/kjv-gpt2 (W1), data/kjv-bytes (W2)
  std::string json_path;        // default: bench/results/train_<workload>.json
  bool peer = true;             // run the PyTorch peer
  bool peer_bf16 = false;       // also bf16 rows: brisk bf16 and the peer under torch.autocast bf16
  int rounds = 3;               // interleaved rounds of every side; medians and ranges over them
  bool fix_blas = false;        // let the peer switch the system BLAS to OpenBLAS
  std::string python = "/usr/bin/python3";  // Debian's, which has python3-torch
  std::string peer_script;      // default: bench/torch_peer.py of this checkout
  // The brisk side's speed techniques, over brisk's defaults: a comma list of
  // key=value (see apply_variant). Empty: brisk as `brisk train` runs it.
  std::string variant;
  bool ablation = false;        // run_ablation_bench instead of the two-sided table
  // E1 only (train_e1_bench.cpp): the classifier config whose store, split,
  // batch, seed and AdamW settings the bench uses (default configs/spam.toml).
  std::string config;
  // E1 workers only, set by the parent: its plan (model, optimizer, weights,
  // batch files) and which batches to train on (bucketed | padded).
  std::string plan, batches;
};

// Applies a variant ("attention=flash,fused_adamw=0,...") to a model and an
// optimizer config. Keys: attention (plain|flash), fused_classifier,
// fuse_bias_gelu, fused_adamw (0|1), the fusion modes fuse_residual_layernorm,
// fuse_layernorm_backward, fuse_gelu_backward, fuse_bias_backward,
// fuse_weight_casts (auto|on|off; 1 / 0 mean on / off), recompute
// (none|selective|full), precision (fp32|bf16: the graph's compute dtype,
// run even where it has no fast path). Throws ConfigError naming a bad pair.
void apply_variant(const std::string& variant, models::GptConfig& model, optim::AdamWConfig& adamw);

// `brisk bench train --ablation`: the PyTorch peer (fp32) and brisk with the
// techniques off (fp32 baseline: unfused, plain attention, per-parameter
// AdamW, no recomputation), each technique alone on top of the baseline, and
// all of them on, each in a process of its own; a Markdown table (tokens/s,
// ms/step, % of peak, peak RSS, planned memory, speed-up, final loss) on
// stdout and in bench/results/ablation_<W>.md, the numbers in JSON beside it.
int run_ablation_bench(const TrainBenchOptions& options);

// The whole benchmark; returns the process exit code (0, or 1 when a side
// failed or the loss did not fall). Throws core::Error for user errors such as
// missing data, with the commands that fix them.
int run_train_bench(const TrainBenchOptions& options);

// The brisk side alone, in this process: prints one JSON line on stdout,
// progress on stderr. Returns the exit code.
int run_train_worker(const TrainBenchOptions& options);

}  // namespace brisk::bench
