// `brisk bench train`: brisk and the PyTorch peer on a docs/workloads.md training
// workload in one run, one table, one JSON file (src/bench/train_bench.cpp).
// Kept out of main.cpp so that the benchmark's many options do not crowd the
// everyday commands; the hidden --worker flag is how the benchmark starts the
// brisk side in a process of its own (for a per-side peak RSS).
#include "bench_cmd.h"

#include <memory>

#include "brisk/bench/dist_bench.h"
#include "brisk/bench/generate_bench.h"
#include "brisk/bench/precision_bench.h"
#include "brisk/bench/serve_bench.h"
#include "brisk/bench/train_bench.h"

namespace brisk::cli {

BenchCommand add_bench_command(CLI::App& parent) {
  auto* bench = parent.add_subcommand("bench", "Benchmarks against peers (docs/workloads.md)");
  bench->require_subcommand(1);
  auto* train = bench->add_subcommand("train", "Train W1, W2 or E1 with brisk and PyTorch side by side; table + JSON");
  auto o = std::make_shared<bench::TrainBenchOptions>();
  auto worker = std::make_shared<bool>(false);
  train->add_option("--workload", o->workload, "W1 (gpt2-tiny) | W2 (char-small) | E1 (spam-encoder)")
      ->check(CLI::IsMember({"W1", "W2", "E1", "gpt2-tiny", "char-small", "spam-encoder"}))
      ->capture_default_str();
  train->add_option("--steps", o->steps, "Timed steps (the median is reported)")->capture_default_str();
  train->add_option("--warmup", o->warmup, "Untimed steps first")->capture_default_str();
  train->add_option("--threads", o->threads, "CPU threads for each side")->capture_default_str();
  train->add_option("--json", o->json_path, "Report path (default bench/results/train_<workload>.json)");
  train->add_flag("--no-peer", [o](int64_t) { o->peer = false; }, "Run brisk only");
  train->add_flag("--bf16", o->peer_bf16,
                  "Also bf16 rows: brisk in bf16 (native or emulated, as this CPU allows) and the peer under "
                  "torch.autocast bf16");
  train->add_option("--rounds", o->rounds,
                    "Interleaved rounds of every side (A B C D, A B C D, ...); medians and ranges over them")
      ->capture_default_str();
  train->add_flag("--fix-blas", o->fix_blas,
                  "If the system BLAS is the slow reference one, let the peer select OpenBLAS (update-alternatives)");
  train->add_option("--data", o->data_dir, "Dataset directory (default data/kjv-gpt2 for W1, data/kjv-bytes for W2)");
  train->add_option("--config", o->config,
                    "E1: the classifier config whose store, split, batch, seed and AdamW settings are used "
                    "(default configs/spam.toml)");
  train->add_option("--seed", o->seed, "Weights and data windows (W1/W2; E1 uses train.seed of --config)")
      ->capture_default_str();
  train->add_option("--python", o->python, "Python with torch for the peer")->capture_default_str();
  train->add_option("--peer-script", o->peer_script,
                    "The peer (default bench/torch_peer.py; bench/torch_encoder_peer.py for E1)");
  train->add_flag("--ablation", o->ablation,
                  "Each speed technique alone and all together, beside PyTorch: Markdown + JSON "
                  "(bench/results/ablation_<workload>.{md,json})");
  train->add_option("--variant", o->variant,
                    "brisk's techniques over its defaults, e.g. attention=flash,fused_adamw=0 (keys: attention, "
                    "fused_classifier, fuse_bias_gelu, fuse_residual_layernorm, fused_adamw, recompute, dropout, "
                    "attention_dropout, precision)");
  // The benchmark starts itself with this flag to run the brisk side alone.
  train->add_flag("--worker", *worker)->group("");
  // E1's workers: the parent's plan and which of its batch files to train on.
  train->add_option("--plan", o->plan)->group("");
  train->add_option("--batches", o->batches)->group("");

  // `brisk bench precision`: fp32 vs bf16/fp16 training from one seed (precision_bench.h).
  auto* precision = bench->add_subcommand("precision", "Train fp32 and bf16 (or fp16) from one seed; compare final losses");
  auto po = std::make_shared<bench::PrecisionBenchOptions>();
  precision->add_option("--workload", po->workload, "W1 | W2 (configs/w1.toml, configs/w2.toml)")
      ->check(CLI::IsMember({"W1", "W2", "gpt2-tiny", "char-small"}))
      ->capture_default_str();
  precision->add_option("--precision", po->precision, "bf16 | fp16")
      ->check(CLI::IsMember({"bf16", "fp16"}))
      ->capture_default_str();
  precision->add_option("--steps", po->steps, "Training steps of each run")->capture_default_str();
  precision->add_option("--threads", po->threads, "CPU threads")->capture_default_str();
  precision->add_option("--tolerance", po->tolerance, "Max relative difference of the final losses")
      ->capture_default_str();
  precision->add_option("--tail", po->tail, "Final loss = mean of this many last steps")->capture_default_str();
  precision->add_option("--config", po->config, "Training config (default configs/<workload>.toml)");
  precision->add_option("--json", po->json_path, "Report path (default bench/results/precision_<W>_<precision>.json)");

  // `brisk bench generate`: KV-cache decoding against PyTorch (generate_bench.h).
  auto* gen = bench->add_subcommand("generate", "Decode I1 with brisk (fp32/int8/int4) and PyTorch; table + JSON");
  auto go = std::make_shared<bench::GenerateBenchOptions>();
  gen->add_option("--workload", go->workload, "I1")->check(CLI::IsMember({"I1"}))->capture_default_str();
  gen->add_option("--checkpoint", go->checkpoint, "W1 weights (default: newest in runs/w1, else random W1 weights)");
  gen->add_option("--data", go->data_dir, "Tokens for the prompt and perplexity (default data/kjv-gpt2)");
  gen->add_option("--prompt-tokens", go->prompt_tokens, "Prompt length")->capture_default_str();
  gen->add_option("--new", go->new_tokens, "New tokens per sequence")->capture_default_str();
  gen->add_option("--batch", go->batch, "Sequences of the batched rows")->capture_default_str();
  gen->add_option("--rounds", go->rounds, "Interleaved rounds; medians and ranges over them")->capture_default_str();
  gen->add_option("--threads", go->threads, "CPU threads for each side")->capture_default_str();
  gen->add_flag("--no-peer", [go](int64_t) { go->peer = false; }, "Run brisk only");
  gen->add_flag("--quality", go->quality, "Also validation perplexity and top-1 agreement of fp32/int8/int4/int4+AWQ");
  gen->add_option("--quality-windows", go->quality_windows, "Validation windows for --quality")->capture_default_str();
  gen->add_option("--python", go->python, "Python with torch for the peer")->capture_default_str();
  gen->add_option("--json", go->json_path, "Report path (default bench/results/generate_I1.json)");

  // `brisk bench serve`: a load generator against this binary's `brisk serve` (serve_bench.h).
  auto* srv = bench->add_subcommand("serve", "Streaming load (I2, I3) through `brisk serve`; latency table + JSON");
  auto so = std::make_shared<bench::ServeBenchOptions>();
  srv->add_option("--workload", so->workload, "I2 (16 streams) | I3 (64 streams)")
      ->check(CLI::IsMember({"I2", "I3"}))
      ->capture_default_str();
  srv->add_option("--checkpoint", so->checkpoint, "Model to serve (default: newest in runs/w1, else random W1 weights)");
  srv->add_option("--data", so->data_dir, "Tokens for the prompts (default data/kjv-gpt2, validation split)");
  srv->add_option("--concurrency", so->concurrency, "Streams in flight (default: 16 for I2, 64 for I3)");
  srv->add_option("--requests", so->requests, "Requests per round (default: 2 x concurrency; unbounded with --duration-s)");
  srv->add_option("--prompt-tokens", so->prompt_tokens, "Prompt length in tokens")->capture_default_str();
  srv->add_option("--new", so->new_tokens, "New tokens per request")->capture_default_str();
  srv->add_option("--temperature", so->temperature, "Requests' temperature (0 = greedy, as the workloads; > 0 samples)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  srv->add_option("--slots", so->slots, "Server --slots (default: the concurrency, at most 64)");
  srv->add_option("--threads", so->threads, "Server engine threads")->capture_default_str();
  auto* srv_rounds =
      srv->add_option("--rounds", so->rounds, "Rounds of single stream then load; medians and ranges over them")
          ->capture_default_str();
  srv->add_option("--single-requests", so->single_requests, "Requests of the single-stream baseline per round")
      ->capture_default_str();
  srv->add_option("--duration-s", so->duration_s, "Stop starting requests after this many seconds (one round)")
      ->excludes(srv_rounds);
  srv->add_option("--rss-every-s", so->rss_every_s, "Server RSS sampling period during the load")->capture_default_str();
  srv->add_option("--json", so->json_path, "Report path (default bench/results/serve_<workload>.json)");

  // `brisk bench dist`: one process against N under mpirun on the same global batch (dist_bench.h).
  auto* dist = bench->add_subcommand(
      "dist", "Train on 1 process and on --np processes (mpirun), same global batch, same cores; table + JSON");
  auto dso = std::make_shared<bench::DistBenchOptions>();
  dist->add_option("--workload", dso->workload, "W1 | W2 (configs/w1.toml, configs/w2.toml)")
      ->check(CLI::IsMember({"W1", "W2", "gpt2-tiny", "char-small"}))
      ->capture_default_str();
  dist->add_option("--rounds", dso->rounds, "Interleaved rounds (A B, B A, ...); medians and ranges over them")
      ->capture_default_str();
  dist->add_option("--steps", dso->steps, "Training steps of each run")->capture_default_str();
  dist->add_option("--warmup-steps", dso->warmup_steps, "First steps of each run not counted")->capture_default_str();
  dist->add_option("--np", dso->np, "Processes of the data-parallel run")->capture_default_str();
  dist->add_option("--threads", dso->threads, "Threads in all: the single process has them, each of --np has threads/np")
      ->capture_default_str();
  dist->add_option("--zero", dso->zero, "dist.zero of the data-parallel run (1: ZeRO-1)")
      ->check(CLI::IsMember({0, 1}))
      ->capture_default_str();
  dist->add_option("--config", dso->config, "Training config (default configs/<workload>.toml)");
  dist->add_option("--mpirun", dso->mpirun, "Open MPI's mpirun")->capture_default_str();
  dist->add_option("--json", dso->json_path, "Report path (default bench/results/dist_<workload>.json)");

  BenchCommand cmd;
  cmd.app = bench;
  cmd.run = [train, o, worker, precision, po, gen, go, srv, so, dist, dso]() -> int {
    if (*precision) return bench::run_precision_bench(*po);
    if (*dist) return bench::run_dist_bench(*dso);
    if (*gen) return bench::run_generate_bench(*go);
    if (*srv) return bench::run_serve_bench(*so);
    if (!*train) return 2;
    if (*worker) return bench::run_train_worker(*o);
    return o->ablation ? bench::run_ablation_bench(*o) : bench::run_train_bench(*o);
  };
  return cmd;
}

}  // namespace brisk::cli
