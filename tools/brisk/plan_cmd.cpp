// `brisk plan`: builds the train program a config would run, at its batch and
// sequence length, once per recomputation level (none, selective, full), and
// prints the planner's figures side by side: the arena (activations and
// workspace after buffer reuse), parameters, gradients, optimizer state and
// the total, plus the matrix-product FLOPs of one step, so the price of each
// level in compute sits next to what it saves. Nothing is run and no arena is
// allocated: the graphs are planned with core::plan_memory, which is the same
// figure the executor allocates (engine_test checks that they agree), so a
// run that would not fit is known before it starts. An encoder classifier or
// sequence autoencoder config gets the same table for its widest train step
// (train.batch x model.max_len), and the arena its evaluation programs add.
#include "plan_cmd.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>

#include "brisk/core/planner.h"
#include "brisk/core/error.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/dist/data_parallel.h"
#include "brisk/models/encoder.h"
#include "brisk/models/gpt.h"
#include "brisk/models/seq_autoencoder.h"
#include "brisk/optim/optimizer.h"
#include "brisk/train/autoencoder_trainer.h"
#include "brisk/train/classifier_trainer.h"
#include "brisk/train/config.h"
#include "brisk/train/tune.h"

namespace brisk::cli {

namespace {

// FLOPs of a graph's matrix products and attention: train::graph_matmul_flops
// (tune.h), which `brisk tune` ranks its candidates by. What recomputation
// adds to a step is the difference between two levels' counts.
double matmul_flops(const core::Graph& g) { return train::graph_matmul_flops(g); }

struct Row {
  std::string level;
  core::MemoryReport mem;
  double flops = 0;
};

// AdamW moment bytes of the rank with the largest shard under ZeRO-1 over
// `ranks` ranks: the trainer's flat layout, cut the trainer's way.
size_t zero1_state_bytes(const core::ParameterStore& params, const core::Graph& train_graph, double bucket_mb,
                         int ranks) {
  const dist::FlatLayout layout = dist::FlatLayout::for_graph(params, train_graph, bucket_mb, ranks);
  int64_t most = 0;
  for (int r = 0; r < ranks; ++r) {
    int64_t n = 0;
    for (const auto& piece : layout.shard_pieces(r, ranks)) n += piece.count;
    most = std::max(most, n);
  }
  return size_t(most) * 2 * sizeof(float);
}

// The three levels side by side, with what each costs in FLOPs.
void print_levels(const std::vector<Row>& rows) {
  auto mib = [](size_t b) { return double(b) / (1024.0 * 1024.0); };
  std::printf("memory of one train step in MiB, planned (nothing allocated or run); train.recompute picks the row\n\n");
  std::printf("%-10s %10s %12s %9s %9s %10s %10s %8s %13s %9s\n", "recompute", "arena", "activations", "params",
              "grads", "optimizer", "total", "vs none", "GFLOP/step", "recompute");
  const Row& base = rows.front();
  for (const Row& r : rows) {
    std::printf("%-10s %10.1f %12.1f %9.1f %9.1f %10.1f %10.1f %7.0f%% %13.1f %8.1f%%\n", r.level.c_str(),
                mib(r.mem.arena), mib(r.mem.activations), mib(r.mem.params), mib(r.mem.grads),
                mib(r.mem.optimizer_state), mib(r.mem.total()),
                100.0 * double(r.mem.total()) / double(base.mem.total()), r.flops * 1e-9,
                100.0 * (r.flops - base.flops) / base.flops);
  }
  std::printf("\narena: activations and workspace after buffer reuse (activations: their peak alone); GFLOP/step:\n"
              "matrix products and attention of one micro-step, forward and backward; recompute: the extra\n"
              "FLOPs of the level (selective redoes only elementwise work, not counted).\n");
}

int run_epoch_plan(const std::string& path, const std::vector<std::string>& sets, int ranks);

int run_plan(const std::string& path, const std::vector<std::string>& sets, int ranks) {
  if (train::is_autoencoder_config(path, sets) || train::is_encoder_config(path, sets))
    return run_epoch_plan(path, sets, ranks);
  train::TrainConfig cfg = train::load_train_config(path, sets);
  if (ranks < 1) throw core::ConfigError("brisk plan: --ranks must be at least 1");
  if (cfg.batch % ranks != 0)
    throw core::ConfigError("brisk plan: train.batch = " + std::to_string(cfg.batch) + " (the global batch) does not divide over " +
                            std::to_string(ranks) + " ranks");
  const int64_t global_batch = cfg.batch;
  cfg.batch /= ranks;  // what each rank's step holds
  // A CUDA run is planned as the GPU runs it (train::planned_model_config).
  const bool cuda = cfg.device == "cuda";
  const train::PrecisionChoice precision =
      train::resolve_precision(cfg.precision, cfg.precision_fallback, cfg.device);
  if (!precision.warning.empty()) std::fprintf(stderr, "%s\n", precision.warning.c_str());
  cpu::CpuBackend backend(cfg.threads);

  std::vector<Row> rows;
  size_t state_bytes = 0, zero1_bytes = 0;
  for (const char* level : {"none", "selective", "full"}) {
    const models::GptConfig mc = train::planned_model_config(cfg, level);  // as the trainer builds it
    models::Gpt model(mc, backend);
    const core::Graph g = model.train_graph(cfg.batch, cfg.seq);
    if (rows.empty()) {  // AdamW's moments, as the trainer allocates them (same for every level)
      optim::AdamW adamw(cfg.adamw, model.params(), backend);
      state_bytes = model.params().state_bytes();
      zero1_bytes = zero1_state_bytes(model.params(), g, cfg.dist.bucket_mb, ranks);
    }
    Row r{level, core::plan_memory(g).report, matmul_flops(g)};
    r.mem.optimizer_state = ranks > 1 && cfg.dist.zero == 1 ? zero1_bytes : state_bytes;
    rows.push_back(r);
  }

  std::printf("brisk plan: %s | %lld params | batch %lld x seq %lld (x accum %lld, same memory) | precision %s | %s\n",
              path.empty() ? "(defaults)" : path.c_str(), (long long)cfg.model.num_params(), (long long)cfg.batch,
              (long long)cfg.seq, (long long)cfg.grad_accum, train::precision_name(precision.effective),
              cuda ? "GPU memory (cuda)" : "host memory (cpu)");
  if (ranks > 1)
    std::printf("per rank of %d: batch %lld of the global %lld | ZeRO-%d (optimizer state %.1f MiB with dist.zero = 0, "
                "%.1f MiB with dist.zero = 1)\n",
                ranks, (long long)cfg.batch, (long long)global_batch, cfg.dist.zero, double(state_bytes) / (1 << 20),
                double(zero1_bytes) / (1 << 20));
  if (ranks > 1 && cfg.dist.zero == 1)
    std::printf("ZeRO-1 at a checkpoint: the moments are all-gathered a slab at a time while rank 0 writes them,\n"
                "%.1f MiB beside the totals below (never the full %.1f MiB)\n",
                double(2 * sizeof(float) * dist::DataParallel::moment_gather_floats(cfg.dist)) / (1 << 20),
                double(state_bytes) / (1 << 20));
  print_levels(rows);
  return 0;
}

// An encoder classifier or sequence autoencoder config (`Config`, `Model`):
// the train step at its widest batch, train.batch x model.max_len (the train
// programs of every width share one arena, sized for the widest), per
// level, and what evaluation adds beside it from the first validation on:
// each eval kind's widest program's arena (`eval_graphs`; not rewritten by
// the level) and `eval_host_bytes` of host buffers.
template <class Model, class Config, class TrainGraph, class EvalGraphs>
int plan_epoch_run(const std::string& path, const char* what, const Config& cfg, TrainGraph train_graph,
                   EvalGraphs eval_graphs, size_t eval_host_bytes) {
  const train::PrecisionChoice precision = train::resolve_precision(cfg.precision, cfg.precision_fallback, "cpu");
  if (!precision.warning.empty()) std::fprintf(stderr, "%s\n", precision.warning.c_str());
  if (!precision.note.empty()) std::fprintf(stderr, "%s\n", precision.note.c_str());
  cpu::CpuBackend backend(cfg.threads);
  std::vector<Row> rows;
  size_t state_bytes = 0, eval_arena = 0;
  for (const char* level : {"none", "selective", "full"}) {
    auto mc = cfg.model;  // as the trainer builds it
    mc.compute = train::compute_dtype(precision.effective);
    mc.recompute = level;
    Model model(mc, backend);
    const core::Graph g = train_graph(model, cfg.batch, mc.max_len);
    if (rows.empty()) {  // AdamW's moments and the eval arenas: the same at every level
      optim::AdamW adamw(cfg.adamw, model.params(), backend);
      state_bytes = model.params().state_bytes();
      for (const core::Graph& e : eval_graphs(model, mc.max_len)) eval_arena += core::plan_memory(e).report.arena;
    }
    Row r{level, core::plan_memory(g).report, matmul_flops(g)};
    r.mem.optimizer_state = state_bytes;
    rows.push_back(r);
  }
  std::printf("brisk plan: %s (%s) | %lld params | batch %lld x max_len %lld (the widest step) | precision %s | "
              "host memory (cpu)\n",
              path.c_str(), what, (long long)cfg.model.num_params(), (long long)cfg.batch,
              (long long)cfg.model.max_len, train::precision_name(precision.effective));
  std::printf("evaluation (val and test splits; the same at every level): at most %.1f MiB beside the totals below "
              "(its widest programs%s)\n",
              double(eval_arena + eval_host_bytes) / (1 << 20),
              eval_host_bytes ? " and greedy decoding's key/value cache" : "");
  print_levels(rows);
  return 0;
}

int run_epoch_plan(const std::string& path, const std::vector<std::string>& sets, int ranks) {
  if (ranks != 1)
    throw core::ConfigError("brisk plan: --ranks is for GPT configs; encoder and autoencoder runs train in one process");
  if (train::is_autoencoder_config(path, sets)) {
    using models::SeqAutoencoder;
    const train::AutoencoderConfig cfg_ae = train::load_autoencoder_config(path, sets);
    return plan_epoch_run<SeqAutoencoder>(
        path, "sequence autoencoder", cfg_ae,
        [](SeqAutoencoder& m, int64_t B, int64_t T) { return m.graph(SeqAutoencoder::Kind::train, B, T); },
        [](SeqAutoencoder& m, int64_t T) {  // teacher-forced logits and encoding (decoding runs on host buffers)
          std::vector<core::Graph> out;
          out.push_back(m.graph(SeqAutoencoder::Kind::reconstruct, train::kAutoencoderEvalBatch, T));
          out.push_back(m.graph(SeqAutoencoder::Kind::encode, train::kAutoencoderEvalBatch, T));
          return out;
        },
        // decode_cached's key and value blocks: every layer, every row, max_len positions, f32
        size_t(2 * cfg_ae.model.n_layer * train::kAutoencoderEvalBatch * cfg_ae.model.max_len * cfg_ae.model.n_embd) *
            sizeof(float));
  }
  using models::Encoder;
  return plan_epoch_run<Encoder>(
      path, "encoder classifier", train::load_classify_config(path, sets),
      [](Encoder& m, int64_t B, int64_t T) { return m.graph(true, B, T); },
      [](Encoder& m, int64_t T) {
        std::vector<core::Graph> out;
        out.push_back(m.graph(false, train::kClassifierEvalBatch, T));
        return out;
      },
      0);
}

}  // namespace

PlanCommand add_plan_command(CLI::App& parent) {
  auto* plan =
      parent.add_subcommand("plan", "Memory each recompute level needs for a training config, before running");
  auto path = std::make_shared<std::string>();
  auto sets = std::make_shared<std::vector<std::string>>();
  auto ranks = std::make_shared<int>(1);
  plan->add_option("config,-c,--config", *path, "TOML config (see configs/)")->check(CLI::ExistingFile)->required();
  plan->add_option("--set", *sets, "Override a key, e.g. --set train.batch=16 (repeatable)");
  plan->add_option("--ranks", *ranks,
                   "Memory per rank of a data-parallel run over this many processes (train.batch is the global "
                   "batch; dist.zero = 1 shards the optimizer state)");
  PlanCommand cmd;
  cmd.app = plan;
  cmd.run = [path, sets, ranks]() { return run_plan(*path, *sets, *ranks); };
  return cmd;
}

}  // namespace brisk::cli
