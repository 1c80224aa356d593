// `brisk bench precision`: does low-precision training track fp32? Trains a
// workload (W2 by default, configs/w2.toml) from the same seed once in fp32
// and once in bf16 or fp16 with train.precision_fallback = false (so the
// low-precision graph runs even where it has no fast path), and compares the
// final losses: the mean of the last 10 steps' training losses. Issue 4's
// "bf16 training tracks fp32" check is this run with --steps 300: exit code 1
// when the relative difference exceeds --tolerance (2%).
#pragma once

#include <cstdint>
#include <string>

namespace brisk::bench {

struct PrecisionBenchOptions {
  std::string workload = "W2";    // W1 | W2: picks configs/w1.toml or configs/w2.toml
  std::string config;             // default: configs/<workload>.toml of this checkout
  std::string precision = "bf16"; // bf16 | fp16 (fp16 adds dynamic loss scaling)
  int64_t steps = 300;
  int threads = 2;
  double tolerance = 0.02;        // max |lowp - fp32| / fp32 of the final losses
  int tail = 10;                  // final loss = mean of this many last steps
  std::string json_path;          // default: bench/results/precision_<workload>_<precision>.json
};

// Prints the configuration, both runs' progress (stderr) and a table; writes
// the JSON report. Returns 0, or 1 when the difference exceeds the tolerance.
// Throws core::Error (missing data, bad options) with what to do about it.
int run_precision_bench(const PrecisionBenchOptions& options);

}  // namespace brisk::bench
