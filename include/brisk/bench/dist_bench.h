// `brisk bench dist`: what data parallelism over processes buys on this
// machine. Trains one workload (W2 by default, configs/w2.toml) on the same
// global batch as (A) one process with --threads threads and (B) --np
// processes under mpirun with --threads / --np threads each, in interleaved
// rounds (A B, B A, A B, ...), and reports per configuration the median
// step time and tokens/s, for B the gradient collectives' time, its share of
// the step and how much of it backward hid, and the per-round ratio B/A of
// tokens/s (docs/distributed.md). Both configurations use the same cores:
// on one machine B splits them between ranks, it does not add any.
#pragma once

#include <cstdint>
#include <string>

namespace brisk::bench {

struct DistBenchOptions {
  std::string workload = "W2";  // W1 | W2: picks configs/w1.toml or configs/w2.toml
  std::string config;           // default: configs/<workload>.toml of this checkout
  int rounds = 3;               // interleaved rounds; medians and [min-max] over them
  int64_t steps = 30;           // training steps of each run
  int64_t warmup_steps = 5;     // the first steps of each run are not counted
  int np = 2;                   // processes of configuration B
  int threads = 2;              // A: one process with this many; B: threads / np per process
  int zero = 0;                 // dist.zero of configuration B (1: ZeRO-1 optimizer sharding)
  std::string mpirun = "/usr/bin/mpirun";
  std::string json_path;        // default: bench/results/dist_<workload>.json
};

// Prints the configuration, one progress line per run (stderr) and a table;
// writes the JSON report. Returns 0. Throws core::Error (no mpirun, missing
// data, bad options, a run that failed) with what to do about it.
int run_dist_bench(const DistBenchOptions& options);

}  // namespace brisk::bench
