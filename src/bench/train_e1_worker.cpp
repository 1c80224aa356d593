// The brisk side of `brisk bench train --workload E1` (train_e1_bench.cpp):
// this executable started again with --worker --plan P --batches V trains E1
// on the plan's batch file V from init_weights(seed), the same bytes the
// parent wrote for the peer, and prints one JSON line (step times, losses,
// data hash, memory) for the parent to turn into figures.
#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "brisk/core/error.h"
#include "brisk/core/safetensors.h"  // core::read_file
#include "brisk/cpu/cpu_backend.h"
#include "brisk/models/encoder.h"
#include "brisk/monitor/machine.h"
#include "brisk/monitor/peak.h"
#include "brisk/optim/optimizer.h"
#include "brisk/train/config.h"
#include "e1_batches.h"
#include "train_common.h"

extern "C" char* openblas_get_config();

namespace brisk::bench {

using nlohmann::json;

int run_e1_worker(const TrainBenchOptions& o) {
  const size_t baseline_rss = monitor::current_rss_bytes();
  const json plan = json::parse(core::read_file(o.plan));
  const json& pm = plan.at("model");
  models::EncoderConfig mc;
  mc.vocab_size = pm.at("vocab_size"), mc.n_layer = pm.at("n_layer"), mc.n_embd = pm.at("n_embd");
  mc.n_head = pm.at("n_head"), mc.max_len = pm.at("max_len"), mc.n_classes = pm.at("n_classes");
  mc.attention = pm.at("attention").get<std::string>();
  const json& po = plan.at("optimizer");
  optim::AdamWConfig ac;
  ac.lr = po.at("lr"), ac.beta1 = po.at("beta1"), ac.beta2 = po.at("beta2"), ac.eps = po.at("eps");
  ac.weight_decay = po.at("weight_decay"), ac.grad_clip = po.at("grad_clip");
  const uint64_t seed = plan.at("seed");
  if (!plan.at("batches").contains(o.batches))
    throw core::ConfigError("--batches: the plan has no variant '" + o.batches + "'");
  const std::vector<E1Batch> batches = read_e1_batches(plan["batches"][o.batches].get<std::string>());
  const int total = o.warmup + o.steps;
  if (int(batches.size()) < total)
    throw core::ConfigError("the plan holds " + std::to_string(batches.size()) + " batches, the run needs " +
                            std::to_string(total));

  // The parent passes --variant precision=bf16 to the bf16 sides: the
  // blocks in bf16 (native or emulated, whatever this CPU has: never fp32).
  if (!o.variant.empty() && o.variant != "precision=bf16")
    throw core::ConfigError("--variant: an E1 worker takes only precision=bf16, got '" + o.variant + "'");
  const bool bf16 = !o.variant.empty();
  const train::PrecisionChoice precision =
      train::resolve_precision(bf16 ? train::Precision::bf16 : train::Precision::fp32, /*fallback=*/false);
  mc.compute = train::compute_dtype(precision.effective);
  cpu::CpuBackend backend(o.threads);
  models::Encoder model(mc, backend);
  model.init_weights(seed);  // the trainer's init; the peer loads what this wrote in the parent
  optim::AdamW adamw(ac, model.params(), backend);
  // Every width's program is built before the clock starts: the trainer
  // builds each once per run (a handful), which is no per-step cost.
  const double t_build = monitor::now_seconds();
  std::set<std::pair<int64_t, int64_t>> shapes;
  core::MemoryReport widest{};
  for (int s = 0; s < total; ++s) {
    const E1Batch& b = batches[size_t(s)];
    if (!shapes.insert({b.rows, b.cols}).second) continue;
    const core::MemoryReport r = model.program(true, b.rows, b.cols).executor->plan().report;
    if (r.total() > widest.total()) widest = r;
  }
  const double build_s = monitor::now_seconds() - t_build;
  widest.optimizer_state = model.params().state_bytes();

  const std::string name = "brisk " + o.batches + (bf16 ? " bf16" : "");
  const bool tty = isatty(STDERR_FILENO);
  std::vector<double> losses, step_ms;
  uint64_t data_hash = 0;
  for (int s = 0; s < total; ++s) {
    const E1Batch& b = batches[size_t(s)];
    data_hash = data_hash * 1000003u + e1_batch_hash(b);
    const double t0 = monitor::now_seconds();
    model.params().zero_grads();
    const double loss = model.train_micro_step(b.ids.data(), b.lengths.data(), b.labels.data(), b.rows, b.cols);
    adamw.step(ac.lr);
    const double ms = (monitor::now_seconds() - t0) * 1e3;
    losses.push_back(loss);
    if (s >= o.warmup) step_ms.push_back(ms);
    const bool warm = s < o.warmup;
    if (tty)
      std::fprintf(stderr, "\r  %-16s step %2d/%d%s width %3lld loss %.4f  %7.1f ms   ", name.c_str(), s + 1, total,
                   warm ? " (warm-up)" : "          ", (long long)b.cols, loss, ms);
    else if (s == 0 || s + 1 == o.warmup || (s + 1) % 5 == 0 || s + 1 == total)
      std::fprintf(stderr, "  %-16s step %2d/%d%s width %3lld loss %.4f  %7.1f ms\n", name.c_str(), s + 1, total,
                   warm ? " (warm-up)" : "", (long long)b.cols, loss, ms);
  }
  if (tty) std::fprintf(stderr, "\n");

  json rep = {{"engine", "brisk"},
              {"workload", "E1"},
              {"variant", o.batches},
              {"attention", mc.attention},
              {"precision", train::precision_name(precision.effective)},
              {"precision_path", precision.path},
              {"gemm", gemm_description(mc.compute)},
              {"blas", {{"name", "OpenBLAS"}, {"config", std::string(openblas_get_config())}}},
              {"params", mc.num_params()},
              {"threads", backend.num_threads()},
              {"warmup", o.warmup},
              {"steps", o.steps},
              {"programs", shapes.size()},
              {"program_build_s", build_s},
              {"planned_bytes_widest",
               {{"params", widest.params},
                {"grads", widest.grads},
                {"optimizer_state", widest.optimizer_state},
                {"arena", widest.arena},
                {"total", widest.total()}}},
              {"step_ms", step_ms},
              {"losses", losses},
              {"data_hash", data_hash},
              {"peak_fp32_gflops", monitor::peak_fp32_gflops(backend.num_threads(), 0.5)},
              {"peak_bf16_gflops", monitor::peak_bf16_gflops(backend.num_threads(), 0.5)},
              {"peak_rss_bytes", monitor::peak_rss_bytes()},
              {"baseline_rss_bytes", baseline_rss}};
  std::printf("%s\n", rep.dump().c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace brisk::bench
