// `brisk bench train`: brisk and the PyTorch peer on a WORKLOADS.md training
// workload in one run, one table, one JSON file (src/bench/train_bench.cpp).
// Kept out of main.cpp so that the benchmark's many options do not crowd the
// everyday commands; the hidden --worker flag is how the benchmark starts the
// brisk side in a process of its own (for a per-side peak RSS).
#include "bench_cmd.h"

#include <memory>

#include "brisk/bench/train_bench.h"

namespace brisk::cli {

BenchCommand add_bench_command(CLI::App& parent) {
  auto* bench = parent.add_subcommand("bench", "Benchmarks against peers (WORKLOADS.md)");
  bench->require_subcommand(1);
  auto* train = bench->add_subcommand("train", "Train W1 or W2 with brisk and PyTorch side by side; table + JSON");
  auto o = std::make_shared<bench::TrainBenchOptions>();
  auto worker = std::make_shared<bool>(false);
  train->add_option("--workload", o->workload, "W1 (gpt2-tiny) | W2 (char-small)")
      ->check(CLI::IsMember({"W1", "W2", "gpt2-tiny", "char-small"}))
      ->capture_default_str();
  train->add_option("--steps", o->steps, "Timed steps (the median is reported)")->capture_default_str();
  train->add_option("--warmup", o->warmup, "Untimed steps first")->capture_default_str();
  train->add_option("--threads", o->threads, "CPU threads for each side")->capture_default_str();
  train->add_option("--json", o->json_path, "Report path (default bench/results/train_<workload>.json)");
  train->add_flag("--no-peer", [o](int64_t) { o->peer = false; }, "Run brisk only");
  train->add_flag("--bf16", o->peer_bf16, "Also run the peer under torch.autocast bf16 (a separate row)");
  train->add_flag("--fix-blas", o->fix_blas,
                  "If the system BLAS is the slow reference one, let the peer select OpenBLAS (update-alternatives)");
  train->add_option("--data", o->data_dir, "Dataset directory (default data/kjv-gpt2 for W1, data/kjv-bytes for W2)");
  train->add_option("--seed", o->seed, "Weights and data windows")->capture_default_str();
  train->add_option("--python", o->python, "Python with torch for the peer")->capture_default_str();
  train->add_option("--peer-script", o->peer_script, "The peer (default bench/torch_peer.py)");
  // The benchmark starts itself with this flag to run the brisk side alone.
  train->add_flag("--worker", *worker)->group("");

  BenchCommand cmd;
  cmd.app = bench;
  cmd.run = [train, o, worker]() -> int {
    if (!*train) return 2;
    return *worker ? bench::run_train_worker(*o) : bench::run_train_bench(*o);
  };
  return cmd;
}

}  // namespace brisk::cli
