// `brisk bench generate --workload I1`: KV-cache decoding with brisk (fp32,
// int8, int4; batch 1 and batch 16) against the PyTorch peer
// (bench/torch_generate_peer.py) on the same weights and prompt, in
// interleaved rounds; greedy output checked against brisk's recompute path
// and the peer; with --quality, validation perplexity and top-1 agreement of
// each weight format. Table on stdout, JSON in bench/results/.
#pragma once

#include <cstdint>
#include <string>

namespace brisk::bench {

struct GenerateBenchOptions {
  std::string workload = "I1";
  std::string checkpoint;  // default runs/w1 (newest); random W1 weights when absent
  std::string data_dir;    // prompt and perplexity text (default data/kjv-gpt2)
  int64_t prompt_tokens = 32;
  int64_t new_tokens = 128;
  int64_t batch = 16;  // the batched row
  int rounds = 3;
  int threads = 2;
  bool peer = true;
  bool quality = false;
  int64_t quality_windows = 16;  // validation windows of block_size tokens
  std::string python = "/usr/bin/python3";
  std::string json_path;
};

int run_generate_bench(const GenerateBenchOptions& o);

}  // namespace brisk::bench
