// `brisk tune`: plans every (recompute, fused_classifier) setting of a config
// at the largest micro-batch that fits a memory budget (host RSS, or GPU
// memory for train.device = "cuda"; train::tune_for_budget:
// the planner only, nothing allocated but one model's weights at a time),
// prints the candidates ranked by estimated throughput and the planned peak
// of the chosen one part by part, and writes the tuned config with to_toml
// through a temporary file and a rename, so a failed write never leaves half
// a config. --time-top N then trains each of the N best for a few steps in
// this process (a temporary run directory, no evaluation) and keeps the one
// measured fastest: FLOP counts cannot see kernel efficiency.
#include "tune_cmd.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "brisk/core/error.h"
#include "brisk/core/safetensors.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/train/config.h"
#include "brisk/train/trainer.h"
#include "brisk/train/tune.h"
#include "cli_checks.h"

namespace brisk::cli {

namespace {

namespace fs = std::filesystem;

struct TuneArgs {
  std::string config, budget, out, preset;
  std::vector<std::string> sets;
  int time_top = 0;
  int64_t time_steps = 5;
};

void print_breakdown(const char* title, const train::RunMemoryEstimate& m) {
  auto mib = [](uint64_t b) { return double(b) / double(1 << 20); };
  std::printf("%s\n", title);
  std::printf("  parameters %.1f + gradients %.1f + AdamW moments %.1f + train arena %.1f MiB (the planner)\n",
              mib(m.train.params), mib(m.train.grads), mib(m.train.optimizer_state), mib(m.train.arena));
  if (m.gpu) {
    std::printf("  + eval arena %.1f + CUDA context, cuBLASLt workspace and allocation rounding %.1f MiB\n",
                mib(m.eval_arena), mib(m.baseline));
    std::printf("  = planned GPU memory %.1f MiB (%llu bytes)\n", mib(m.total()), (unsigned long long)m.total());
    return;
  }
  std::printf("  + eval arena %.1f + loader and eval buffers %.1f + token shards %.1f + checkpoint staging %.1f + "
              "process baseline %.1f MiB\n",
              mib(m.eval_arena), mib(m.loader), mib(m.data), mib(m.checkpoint), mib(m.baseline));
  std::printf("  = planned peak RSS %.1f MiB (%llu bytes)\n", mib(m.total()), (unsigned long long)m.total());
}

// Median tokens/s of `steps` optimizer steps of `cfg`, trained here in a
// temporary run directory (removed after) without evaluation.
double time_candidate(train::TrainConfig cfg, int64_t steps, core::Backend& backend, const fs::path& dir) {
  cfg.steps = steps;
  cfg.schedule.total_steps = steps;
  cfg.eval_every = 0;
  cfg.checkpoint_every = 0;
  cfg.out_dir = dir.string();
  train::TrainOptions opt;
  opt.quiet = true;
  opt.progress = false;
  const train::TrainResult r = train::train(cfg, backend, opt);
  std::error_code ec;
  fs::remove_all(dir, ec);
  return r.median_tokens_per_s;
}

int run_tune(const TuneArgs& a) {
  std::vector<std::string> sets = a.sets;
  if (!a.preset.empty()) sets.insert(sets.begin(), "train.preset=" + a.preset);
  train::TrainConfig cfg = train::load_train_config(a.config, sets);
  cpu::CpuBackend backend(cfg.threads);
  std::string how;
  const uint64_t budget = train::resolve_memory_budget(a.budget, "--memory-budget", cfg, backend, &how);
  if (a.time_top < 0) throw core::ConfigError("--time-top must be >= 0, got " + std::to_string(a.time_top));
  if (a.time_steps < 2) throw core::ConfigError("--time-steps must be at least 2, got " + std::to_string(a.time_steps));
  const bool gpu = cfg.device == "cuda";
  if (gpu && a.time_top > 0)
    throw core::ConfigError("--time-top trains on this machine's CPU; with train.device = \"cuda\" time the "
                            "candidates with brisk train on the GPU");
  cfg.memory_budget.clear();  // the budget on the command line is the one searched for
  if (!gpu && !fs::is_directory(cfg.data_dir))
    std::fprintf(stderr, "note: data.dir '%s' not found: its token shards (mapped, part of a run's RSS) are not in the "
                 "estimate\n", cfg.data_dir.c_str());
  train::TuneResult r = train::search_budget(cfg, budget, backend);
  std::printf("brisk tune: %s | %s budget %s | global batch %lld x seq %lld = %lld tokens per optimizer step (kept)\n",
              a.config.c_str(), gpu ? "GPU memory (cuda)" : "host memory (peak RSS)",
              train::format_bytes(budget).c_str(), (long long)r.global_batch, (long long)cfg.seq,
              (long long)(r.global_batch * cfg.seq));
  if (!how.empty()) std::printf("%s\n", how.c_str());
  print_breakdown(("as given: " + std::to_string(cfg.batch) + " x accum " + std::to_string(cfg.grad_accum) +
                   ", recompute " + cfg.model.recompute + ", fused classifier " +
                   (cfg.model.fused_classifier ? "on" : "off"))
                      .c_str(),
                  r.original);
  std::printf("\ncandidates (planned, nothing run); fixed: everything but the two arenas\n%s",
              train::candidates_table(r).c_str());
  if (!r.fits()) throw core::ConfigError(r.summary);

  train::TrainConfig chosen = r.chosen;
  std::string why = r.summary;
  if (a.time_top > 0) {
    std::printf("\ntiming the best %d for %lld steps each (no evaluation)\n", a.time_top, (long long)a.time_steps);
    std::printf("%-4s %-10s %-6s %6s %6s %12s\n", "rank", "recompute", "fused", "batch", "accum", "tokens/s");
    double best = -1;
    int best_rank = 0;
    const fs::path base = fs::temp_directory_path() / ("brisk_tune_" + std::to_string(::getpid()));
    for (int i = 0; i < a.time_top && i < int(r.candidates.size()) && r.candidates[size_t(i)].fits(); ++i) {
      const train::TuneCandidate& c = r.candidates[size_t(i)];
      const train::TrainConfig t = train::config_for(cfg, c);
      const double tps = time_candidate(t, a.time_steps, backend, base / std::to_string(i));
      std::printf("%-4d %-10s %-6s %6lld %6lld %12.0f\n", i + 1, c.recompute.c_str(), c.fused_classifier ? "on" : "off",
                  (long long)c.batch, (long long)c.grad_accum, tps);
      std::fflush(stdout);
      if (tps > best) {
        best = tps;
        best_rank = i;
        chosen = t;
      }
    }
    std::error_code ec;
    fs::remove_all(base, ec);
    if (best_rank != 0)
      why += " Timed: rank " + std::to_string(best_rank + 1) + " ran fastest (" + std::to_string(int64_t(best)) +
             " tokens/s) and is chosen instead of the FLOP estimate's first.";
  }

  std::printf("\n%s\n", why.c_str());
  for (const train::TuneCandidate& c : r.candidates)
    if (c.batch == chosen.batch && c.recompute == chosen.model.recompute &&
        c.fused_classifier == chosen.model.fused_classifier)
      print_breakdown("chosen:", c.memory);
  if (!a.out.empty()) {
    const std::string text = "# brisk tune " + a.config + " --memory-budget " + a.budget + "\n# " +
                             train::format_bytes(budget) + " budget: micro-batch " + std::to_string(chosen.batch) +
                             " x grad_accum " + std::to_string(chosen.grad_accum) + ", recompute " +
                             chosen.model.recompute + ", fused classifier " +
                             (chosen.model.fused_classifier ? "on" : "off") + "\n" + train::to_toml(chosen);
    core::write_file_atomic(a.out, text);
    std::printf("tuned config written to %s\n", a.out.c_str());
  }
  return 0;
}

}  // namespace

TuneCommand add_tune_command(CLI::App& parent) {
  auto* tune = parent.add_subcommand(
      "tune", "Largest micro-batch, cheapest recompute level and classifier setting that fit a memory budget");
  auto args = std::make_shared<TuneArgs>();
  tune->add_option("config,-c,--config", args->config, "TOML config (see configs/)")->check(CLI::ExistingFile)->required();
  tune->add_option("--memory-budget,-m", args->budget,
                   "Peak RSS to fit (GPU memory with train.device = \"cuda\"): 4GiB, 512MiB, 1.5GB, bytes, or auto "
                   "(90% of MemAvailable)")
      ->required();
  tune->add_option("--set", args->sets, "Override a key, e.g. --set train.seq=128 (repeatable)");
  tune->add_option("--preset", args->preset, "Run preset: high-performance | memory-constrained | production");
  tune->add_option("--time-top", args->time_top, "Train the N best candidates for a few steps and keep the fastest")
      ->capture_default_str();
  tune->add_option("--time-steps", args->time_steps, "Steps per timed candidate")->capture_default_str();
  tune->add_option("--out,-o", args->out, "Write the tuned config (TOML) here")->check(output_file());
  TuneCommand cmd;
  cmd.app = tune;
  cmd.run = [args]() { return run_tune(*args); };
  return cmd;
}

}  // namespace brisk::cli
