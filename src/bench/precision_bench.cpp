// The precision benchmark (precision_bench.h): fp32 and bf16/fp16 training of
// one workload from one seed, compared on their final loss.
//
// Why it is built this way:
// - Both runs go through train::train with the workload's own config file,
//   so what is checked is exactly what `brisk train` does (same data windows,
//   schedule, clipping, loss scaler), with only train.precision and
//   train.precision_fallback = false changed between them.
// - One process, one run after the other: the numbers are what matter here,
//   not peak RSS, and on a 2-core machine two trainings at once would only
//   slow each other down. ms/step is still reported (median over the run's
//   steps, as the trainer measures it) with the planned arena of each graph,
//   so the cost of emulating 16-bit numerics on a CPU without a fast path is
//   on record next to the answer.
// - The final loss is the mean of the last `tail` training losses: one step's
//   loss is noisy (its batch), ten steps' mean is what the curves converge to.
#include "brisk/bench/precision_bench.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>

#include "brisk/core/error.h"
#include "brisk/core/planner.h"
#include "brisk/core/safetensors.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/monitor/machine.h"
#include "brisk/train/config.h"
#include "brisk/train/trainer.h"
#include "bench_util.h"

namespace brisk::bench {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct Run {
  std::string precision;
  train::TrainResult result;
  double final_loss = 0, ms_per_step = 0, tokens_per_s = 0;
  size_t arena = 0, total = 0;
};

// The planned memory of the train program the run used (same config, same
// compute dtype), without building an executor.
void plan_of(const train::TrainConfig& cfg, Run& run) {
  const train::PrecisionChoice pc = train::resolve_precision(cfg.precision, cfg.precision_fallback);
  models::GptConfig mc = cfg.model;
  mc.compute = train::compute_dtype(pc.effective);
  cpu::CpuBackend backend(1);
  models::Gpt model(mc, backend);
  core::MemoryReport rep = core::plan_memory(model.train_graph(cfg.batch, cfg.seq)).report;
  rep.optimizer_state = model.params().state_bytes();
  run.arena = rep.arena;
  run.total = rep.total();
}

Run train_one(train::TrainConfig cfg, const std::string& precision, int tail) {
  cfg.precision = train::parse_precision(precision);
  cfg.precision_fallback = false;
  Run run;
  run.precision = precision;
  plan_of(cfg, run);
  std::fprintf(stderr, "\n--- %s ---\n", precision.c_str());
  run.result = train::train(cfg, {.progress = false});
  // A stop signal ends the run early and saves it; a comparison of a cut
  // run with a whole one would be written as a result.
  if (run.result.interrupted)
    throw core::Error("precision bench: the " + precision + " run was stopped by a signal; nothing written");
  const auto& l = run.result.losses;
  const size_t n = std::min(l.size(), size_t(std::max(tail, 1)));
  run.final_loss = n ? std::accumulate(l.end() - long(n), l.end(), 0.0) / double(n) : NAN;
  run.tokens_per_s = run.result.median_tokens_per_s;
  run.ms_per_step = run.tokens_per_s > 0 ? 1e3 * double(cfg.batch * cfg.seq * cfg.grad_accum) / run.tokens_per_s : 0;
  return run;
}

json run_json(const Run& r) {
  return {{"precision", r.precision},
          {"final_loss", r.final_loss},
          {"first_loss", r.result.first_loss},
          {"val_loss", r.result.last_val_loss},
          {"ms_per_step_median", r.ms_per_step},
          {"tokens_per_s_median", r.tokens_per_s},
          {"planned_arena_bytes", r.arena},
          {"planned_total_bytes", r.total},
          {"skipped_steps", r.result.skipped_steps},
          {"final_loss_scale", r.result.loss_scale},
          {"losses", r.result.losses}};
}

}  // namespace

int run_precision_bench(const PrecisionBenchOptions& options) {
  PrecisionBenchOptions o = options;
  if (o.workload == "gpt2-tiny") o.workload = "W1";
  if (o.workload == "char-small") o.workload = "W2";
  if (o.workload != "W1" && o.workload != "W2")
    throw core::ConfigError("--workload: unknown value '" + o.workload + "' (allowed: W1, W2)");
  if (o.precision != "bf16" && o.precision != "fp16")
    throw core::ConfigError("--precision: unknown value '" + o.precision + "' (allowed: bf16, fp16)");
  if (o.steps < 1) throw core::ConfigError("--steps must be at least 1, got " + std::to_string(o.steps));
  if (!(o.tolerance > 0)) throw core::ConfigError("--tolerance must be positive");
  if (o.tail < 1 || o.tail > o.steps)
    throw core::ConfigError("--tail must be in [1, --steps], got " + std::to_string(o.tail));
  const fs::path root = repo_root();
  const std::string lower = o.workload == "W1" ? "w1" : "w2";
  if (o.config.empty()) o.config = (root / "configs" / (lower + ".toml")).string();
  if (o.json_path.empty())
    o.json_path = (root / "bench" / "results" / ("precision_" + o.workload + "_" + o.precision + ".json")).string();

  const fs::path scratch = fs::temp_directory_path() / ("brisk_precision_" + std::to_string(::getpid()));
  train::TrainConfig cfg = train::load_train_config(
      o.config, {"train.steps=" + std::to_string(o.steps), "train.threads=" + std::to_string(o.threads),
                 "train.eval_every=" + std::to_string(o.steps), "checkpoint.every=0"});
  // The config's relative data path is relative to the checkout, wherever this runs from.
  if (fs::path(cfg.data_dir).is_relative() && !fs::exists(cfg.data_dir)) cfg.data_dir = (root / cfg.data_dir).string();
  if (!fs::exists(fs::path(cfg.data_dir) / "meta.json"))
    throw core::IoError("precision bench: dataset " + cfg.data_dir + " (from " + o.config +
                        ") does not exist; create it with `make datasets` in " + root.string());

  std::printf("brisk bench precision: %s (%s), %lld steps, seed %llu, batch %lld x seq %lld x accum %lld, %d threads\n"
              "fp32 vs %s (train.precision_fallback = false), final loss = mean of the last %d steps, limit %.1f%%\n"
              "cpu: %s\n",
              o.workload.c_str(), o.config.c_str(), (long long)o.steps, (unsigned long long)cfg.seed,
              (long long)cfg.batch, (long long)cfg.seq, (long long)cfg.grad_accum, o.threads, o.precision.c_str(),
              o.tail, 100 * o.tolerance, monitor::cpu_model().c_str());
  std::fflush(stdout);

  cfg.out_dir = (scratch / "fp32").string();
  const Run ref = train_one(cfg, "fp32", o.tail);
  cfg.out_dir = (scratch / o.precision).string();
  const Run low = train_one(cfg, o.precision, o.tail);
  std::error_code ec;
  fs::remove_all(scratch, ec);

  const double rel = std::abs(low.final_loss - ref.final_loss) / ref.final_loss;
  const bool pass = std::isfinite(rel) && rel <= o.tolerance;
  std::printf("\n%-9s %12s %10s %10s %10s %10s %14s %8s\n", "precision", "final loss", "first", "val loss",
              "ms/step", "tok/s", "planned arena", "skipped");
  for (const Run* r : {&ref, &low})
    std::printf("%-9s %12.4f %10.4f %10.4f %10.1f %10.0f %10.1f MiB %8lld\n", r->precision.c_str(), r->final_loss,
                r->result.first_loss, r->result.last_val_loss, r->ms_per_step, r->tokens_per_s,
                double(r->arena) / (1 << 20), (long long)r->result.skipped_steps);
  std::printf("relative difference of the final losses: %.3f%% (limit %.1f%%): %s\n", 100 * rel, 100 * o.tolerance,
              pass ? "PASS" : "FAIL");
  const train::PrecisionChoice path = train::resolve_precision(train::parse_precision(o.precision), false);
  std::printf("%s ms/step: %.2fx fp32's (one run each, not rounds: `brisk bench train --bf16` measures speed; path "
              "%s: %s)\n",
              o.precision.c_str(),
              ref.ms_per_step > 0 ? low.ms_per_step / ref.ms_per_step : 0.0, path.path.c_str(), path.reason.c_str());

  json out = {{"benchmark", "precision"},
              {"workload", o.workload},
              {"config", o.config},
              {"steps", o.steps},
              {"seed", cfg.seed},
              {"threads", o.threads},
              {"tail", o.tail},
              {"tolerance", o.tolerance},
              {"relative_difference", rel},
              {"pass", pass},
              {"cpu", monitor::cpu_model()},
              {"time", now_iso()},
              {"runs", json::array({run_json(ref), run_json(low)})}};
  fs::create_directories(fs::path(o.json_path).parent_path(), ec);
  core::write_file_atomic(o.json_path, out.dump(2) + "\n");
  std::printf("wrote %s\n", o.json_path.c_str());
  return pass ? 0 : 1;
}

}  // namespace brisk::bench
