// What `brisk bench train` and its ablation share (train_bench.cpp): the
// workloads, option defaults, and one table row per child process with every
// derived figure computed by one formula, so two tables cannot disagree on a
// definition.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "bench_util.h"
#include "brisk/bench/train_bench.h"
#include "brisk/core/dtype.h"

namespace brisk::bench {

struct Workload {
  std::string id, name, tokenizer, data_dir;
};
// W1 / gpt2-tiny, W2 / char-small; throws ConfigError listing them.
Workload workload_of(const std::string& id);

// E1 / spam-encoder has a benchmark of its own (train_e1_bench.cpp): other
// data, variable-width batches, two kinds of batches side by side.
bool is_encoder_workload(const std::string& id);
int run_e1_bench(const TrainBenchOptions& options);
int run_e1_worker(const TrainBenchOptions& options);

// The options with every default filled in; throws ConfigError on bad counts.
TrainBenchOptions resolve_options(TrainBenchOptions o);
// Missing data is the one failure every first run meets: throws IoError
// naming the commands that create it.
void require_data(const TrainBenchOptions& o);

struct Row {
  std::string name;
  nlohmann::json report;  // the side's own JSON (empty when it failed)
  std::string error;      // why there are no numbers
  double tokens_per_s = 0, ms_per_step = 0, gflops = 0, pct_peak = 0;
  double rss_mib = 0;  // peak RSS growth over the process's baseline
  double peak_rss_mib = 0, baseline_rss_mib = 0;
  double loss_first = 0, loss_last = 0;
  double others_pct = -1;
  bool ok() const { return error.empty(); }
  // Over rounds: the largest RSS growth, with the peak and baseline of the
  // round it came from (so peak - baseline = growth in the JSON).
  void keep_largest_growth(const Row& round) {
    if (round.rss_mib > rss_mib)
      rss_mib = round.rss_mib, peak_rss_mib = round.peak_rss_mib, baseline_rss_mib = round.baseline_rss_mib;
  }
};

// A row from a side's report: median step time, tokens/s, GFLOP/s, % of
// the fp32 peak, peak RSS, first and last loss.
Row make_row(const std::string& name, const ChildResult& c, const TrainBenchOptions& o, int64_t tokens_per_step,
             double flops_per_token, double peak_gflops);
nlohmann::json row_json(const Row& r);

// What a brisk worker's matrix products run on for a graph of this compute
// dtype, as its report names it ("oneDNN bf16 (...)", "onednn fp32 (...)").
std::string gemm_description(core::DType compute);

}  // namespace brisk::bench
