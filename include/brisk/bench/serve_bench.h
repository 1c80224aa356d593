// `brisk bench serve --workload I2|I3`: a load generator for `brisk serve`
// (docs/workloads.md). It starts the real server binary as a child process,
// measures a single stream first, then keeps N streaming /v1/completions
// requests in flight and reports client-side TTFT, inter-token latency,
// TPOT and end-to-end latency (p50/p90/p99), throughput against the single
// stream, errors, the server's RSS over the run and its exit code on
// SIGTERM. Table on stdout, JSON in bench/results/.
#pragma once

#include <cstdint>
#include <string>

namespace brisk::bench {

struct ServeBenchOptions {
  std::string workload = "I2";  // I2: 16 concurrent streams; I3: 64
  std::string checkpoint;       // default runs/w1 (newest); random W1 weights when absent
  std::string data_dir;         // prompt tokens (default data/kjv-gpt2)
  int concurrency = 0;          // 0: the workload's
  int64_t requests = 0;         // per round; 0: 2 x concurrency (unbounded with --duration-s)
  int64_t prompt_tokens = 32;
  int64_t new_tokens = 128;
  double temperature = 0;       // 0: greedy (the workloads); > 0: each request samples, unseeded
  int slots = 0;                // 0: the concurrency, at most 64
  int threads = 2;              // the server engine's CPU threads
  int single_requests = 3;      // the single-stream baseline per round (after one untimed request)
  int rounds = 3;               // single stream then load, this many times (1 with duration_s)
  double duration_s = 0;        // > 0: stop starting requests after this long
  double rss_every_s = 10;      // server RSS sampling period during the load
  std::string json_path;        // default bench/results/serve_<workload>.json
};

// 0 when every request succeeded and the server exited 0 on SIGTERM.
int run_serve_bench(const ServeBenchOptions& o);

}  // namespace brisk::bench
