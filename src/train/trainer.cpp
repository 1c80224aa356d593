// The training loop (trainer.h). One optimizer step = grad_accum micro-steps
// through the cached train program, a global grad-norm, an AdamW update with
// the clip factor folded in. Everything that decides the numbers (weights,
// moments, step, data position) is in the checkpoint, so a resumed run
// produces the same losses bit for bit as one that never stopped.
//
// Mixed precision: the requested precision is resolved against what this
// machine and engine can do (resolve_precision); without a fast path the run
// warns once and computes in fp32, unless train.precision_fallback = false
// asks for the low-precision graph anyway (emulated, noted once). The model
// is built with the effective compute dtype; master weights, grads and AdamW
// state are fp32 whatever it is. With loss scaling on, the backward is
// seeded with the scaler's scale, AdamW divides it back out, and a step whose
// gradients overflowed is skipped (weights, moments and AdamW's step count
// untouched) while the run's step, data position and lr schedule move on,
// like PyTorch's GradScaler. The scaler's state (scale, streak, counters) is
// checkpointed, so a resumed run continues exactly where it stopped.
#include "brisk/train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "brisk/core/backend_loader.h"
#include "brisk/core/error.h"
#include "brisk/core/safetensors.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/data/loader.h"
#include "brisk/data/shards.h"
#include "brisk/monitor/machine.h"
#include "brisk/optim/loss_scaler.h"
#include "brisk/train/checkpoint.h"

namespace brisk::train {

namespace {

std::atomic<int> g_stop_signal{0};
extern "C" void on_stop_signal(int sig) { g_stop_signal = sig; }

// Installs SIGINT/SIGTERM handlers for the life of a run, restores the old ones.
struct SignalGuard {
  struct sigaction old_int {}, old_term {};
  SignalGuard() {
    g_stop_signal = 0;
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    // Restart interrupted system calls: a signal landing in a write to a pipe
    // (the log) or a file must not turn a clean stop into a failed write.
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
  }
  ~SignalGuard() {
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGTERM, &old_term, nullptr);
  }
};

std::string format_duration(double s) {
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%dh%02dm", int(s / 3600), int(s / 60) % 60);
  else if (s >= 60) std::snprintf(buf, sizeof buf, "%dm%02ds", int(s / 60), int(s) % 60);
  else std::snprintf(buf, sizeof buf, "%.0fs", s);
  return buf;
}

// A live bar on a terminal (one line redrawn with \r), plain lines otherwise.
class Progress {
 public:
  Progress(bool enabled, bool live, int64_t total, int64_t log_every)
      : enabled_(enabled), tty_(enabled && live && isatty(STDERR_FILENO)), total_(total), log_every_(log_every) {}

  void step(const StepMetrics& m, double eta_s) {
    if (!enabled_) return;
    if (tty_) {
      const int width = 24;
      const int filled = int(double(width) * double(m.step) / double(total_));
      std::string bar(size_t(filled), '#');
      bar.append(size_t(width - filled), '.');
      std::fprintf(stderr, "\r[%s] step %lld/%lld | loss %.4f | lr %.2e | %.0f tok/s | %.0f ms/step | MFU %.1f%% | ETA %s   ",
                   bar.c_str(), (long long)m.step, (long long)total_, m.loss, m.lr, m.tokens_per_s, m.ms_per_step,
                   100 * m.mfu, format_duration(eta_s).c_str());
      std::fflush(stderr);
    } else if (m.step % log_every_ == 0 || m.step == total_ || m.step == 1) {
      std::fprintf(stderr, "step %lld/%lld | loss %.4f | lr %.2e | grad norm %.3f | %.0f tok/s | %.0f ms/step | MFU %.1f%% | ETA %s\n",
                   (long long)m.step, (long long)total_, m.loss, m.lr, m.grad_norm, m.tokens_per_s, m.ms_per_step,
                   100 * m.mfu, format_duration(eta_s).c_str());
    }
  }
  void line(const std::string& s) {
    if (!enabled_) return;
    std::fprintf(stderr, "%s%s\n", tty_ ? "\r\033[K" : "", s.c_str());
  }
  void finish() {
    if (enabled_ && tty_) std::fprintf(stderr, "\n");
  }

 private:
  bool enabled_, tty_;
  int64_t total_, log_every_;
};

// Per-op share of the train step, largest first.
std::string profile_table(const core::Executor& ex) {
  std::vector<std::pair<double, int>> rows;
  double total = 0;
  for (int op = 0; op < core::kNumOps; ++op) {
    const auto& t = ex.op_times()[size_t(op)];
    if (t.calls == 0) continue;
    rows.emplace_back(t.seconds, op);
    total += t.seconds;
  }
  std::sort(rows.rbegin(), rows.rend());
  std::string out = "op                       calls    seconds   share\n";
  char buf[128];
  for (const auto& [sec, op] : rows) {
    std::snprintf(buf, sizeof buf, "%-24s %6lld %10.3f %6.1f%%\n", std::string(core::op_name(core::OpKind(op))).c_str(),
                  (long long)ex.op_times()[size_t(op)].calls, sec, 100 * sec / std::max(total, 1e-12));
    out += buf;
  }
  return out;
}

// metrics.jsonl describes the steps the weights in this directory went
// through: a resumed run drops the rows logged after its checkpoint (a crash
// or a stop between checkpoints would otherwise leave those steps twice), a
// fresh run starts the file anew.
void trim_metrics(const std::string& path, int64_t last_step) {
  if (!std::filesystem::exists(path)) return;
  std::ifstream in(path);
  std::string kept, line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("step") && j["step"].is_number_integer() && j["step"].get<int64_t>() <= last_step)
      kept += line + "\n";
  }
  core::write_file_atomic(path, kept);
}

// train.device: the CPU backend, or the CUDA one (loaded at run time); no
// usable GPU is a configuration error that says why, never a quiet CPU run.
std::unique_ptr<core::Backend> make_backend(const TrainConfig& cfg) {
  if (cfg.device == "cpu") return std::make_unique<cpu::CpuBackend>(cfg.threads);
  std::string why;
  std::unique_ptr<core::Backend> b = core::load_cuda_backend(&why);
  if (!b) throw core::ConfigError("train.device = \"cuda\" but the CUDA backend is unavailable: " + why);
  return b;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

TrainResult train(const TrainConfig& cfg, const TrainOptions& options) {
  namespace fs = std::filesystem;
  const bool show = !options.quiet;
  std::unique_ptr<core::Backend> backend_owner = make_backend(cfg);
  core::Backend& backend = *backend_owner;
  const bool on_gpu = !backend.device().is_host();
  data::TokenDataset train_data(cfg.data_dir, "train");
  data::TokenDataset val_data(cfg.data_dir, "val");
  if (train_data.vocab_size() > cfg.model.vocab_size)
    throw core::ConfigError("data '" + cfg.data_dir + "' has vocab " + std::to_string(train_data.vocab_size()) +
                            " but model.vocab_size is " + std::to_string(cfg.model.vocab_size));

  // The model computes in the effective precision (fp32 master weights either way).
  const PrecisionChoice precision = resolve_precision(cfg.precision, cfg.precision_fallback, cfg.device);
  models::GptConfig model_config = cfg.model;
  model_config.compute = compute_dtype(precision.effective);
  models::Gpt model(model_config, backend);
  model.init_weights(cfg.seed);
  optim::AdamW adamw(cfg.adamw, model.params(), backend);
  std::optional<optim::LossScaler> scaler;
  if (cfg.loss_scaling.value_or(precision.effective == Precision::fp16)) {
    optim::LossScalerConfig sc;
    sc.init_scale = cfg.loss_scale_init;
    sc.growth_interval = cfg.loss_scale_growth_interval;
    sc.max_scale = std::max(sc.max_scale, sc.init_scale);
    scaler.emplace(sc);
  }
  // Training batches come from the prefetching loader: batch i is windows
  // [i*B, (i+1)*B) of the seed's window stream, the same as a WindowSampler
  // would draw, so data_position (windows) = loader position * B.
  data::TokenWindowSource train_source(train_data, cfg.batch, cfg.seq, cfg.seed);
  data::Loader loader(train_source, {.workers = cfg.loader_workers, .prefetch_factor = 2},
                      backend.staging_allocator());

  TrainState state;
  state.seed = cfg.seed;
  state.tokenizer = train_data.tokenizer();
  Progress progress(show, options.progress, cfg.steps, cfg.log_every);
  if (options.resume) {
    const std::string ckpt = latest_checkpoint(cfg.out_dir);
    if (ckpt.empty()) {
      progress.line("resume: no checkpoint in " + cfg.out_dir + ", starting fresh");
    } else {
      read_checkpoint_config(ckpt, &state);
      load_checkpoint(ckpt, model, &adamw);
      // A scaled run continues at the scale it stopped at; a checkpoint
      // without scaler state (an fp32 run, an older file) starts at init.
      if (scaler && state.loss_scaler) scaler->restore(*state.loss_scaler);
      if (state.data_position % uint64_t(cfg.batch) != 0)
        throw core::ConfigError("checkpoint " + ckpt + " stopped after " + std::to_string(state.data_position) +
                                " training windows, not a whole number of batches of train.batch = " +
                                std::to_string(cfg.batch) + " (was the batch size changed?)");
      loader.set_position(state.data_position / uint64_t(cfg.batch));
      progress.line("resumed from " + ckpt + " at step " + std::to_string(state.step));
    }
  }

  fs::create_directories(cfg.out_dir);
  core::write_file_atomic((fs::path(cfg.out_dir) / "config.toml").string(), to_toml(cfg));
  const std::string metrics_path = (fs::path(cfg.out_dir) / "metrics.jsonl").string();
  trim_metrics(metrics_path, state.step);
  std::ofstream metrics_log(metrics_path, std::ios::app);

  // MFU against the peak of the precision the products run in (WORKLOADS.md):
  // measured on a CPU, the card's datasheet figure on a GPU (0 if unknown:
  // no MFU then, rather than a made-up one).
  const int threads = on_gpu ? 0 : static_cast<cpu::CpuBackend&>(backend).num_threads();
  bool bf16_peak = false;
  double peak = 0;
  if (on_gpu) {
    bf16_peak = precision.effective != Precision::fp32;
    peak = monitor::gpu_peak_gflops(backend.description(), bf16_peak) * 1e9;
  } else {
    bf16_peak = precision.path == "bf16-native" && monitor::peak_bf16_gflops(threads) > 0;
    peak = (bf16_peak ? monitor::peak_bf16_gflops(threads) : monitor::peak_fp32_gflops(threads)) * 1e9;
  }
  const double flops_per_token = cfg.model.flops_per_token(cfg.seq);
  const int64_t tokens_per_step = cfg.batch * cfg.seq * cfg.grad_accum;
  if (show) {
    std::fprintf(stderr,
                 "brisk train: %lld params | %lld layers, %lld embd, %lld heads, vocab %lld | batch %lld x seq %lld x "
                 "accum %lld | %s | peak %.0f GFLOP/s %s\n",
                 (long long)cfg.model.num_params(), (long long)cfg.model.n_layer, (long long)cfg.model.n_embd,
                 (long long)cfg.model.n_head, (long long)cfg.model.vocab_size, (long long)cfg.batch,
                 (long long)cfg.seq, (long long)cfg.grad_accum,
                 on_gpu ? ("cuda: " + backend.description()).c_str() : (std::to_string(threads) + " threads").c_str(),
                 peak / 1e9, bf16_peak ? "bf16" : "fp32");
    if (!precision.warning.empty()) std::fprintf(stderr, "%s\n", precision.warning.c_str());
    if (!precision.note.empty()) std::fprintf(stderr, "%s\n", precision.note.c_str());
    if (scaler)
      std::fprintf(stderr, "precision %s (%s: %s) | dynamic loss scaling from %g, x2 after %lld clean steps\n",
                   precision_name(precision.effective), precision.path.c_str(), precision.reason.c_str(),
                   double(scaler->scale()),
                   (long long)scaler->config().growth_interval);
    else
      std::fprintf(stderr, "precision %s (%s: %s)\n", precision_name(precision.effective), precision.path.c_str(),
                   precision.reason.c_str());
    const auto& rep = model.program(true, cfg.batch, cfg.seq).executor->plan().report;
    core::MemoryReport full = rep;
    full.optimizer_state = model.params().state_bytes();
    std::fprintf(stderr, "recompute %s | %s", cfg.model.recompute.c_str(), full.str().c_str());
  }

  std::vector<int32_t> x(size_t(cfg.batch * cfg.seq)), y(x.size());
  auto evaluate = [&]() {
    data::WindowSampler val_sampler(val_data, cfg.batch, cfg.seq, cfg.seed + 1);
    double sum = 0;
    for (int64_t i = 0; i < cfg.eval_batches; ++i) {
      val_sampler.next(x.data(), y.data());
      sum += model.eval_loss(x.data(), y.data(), cfg.batch, cfg.seq);
    }
    return sum / double(std::max<int64_t>(1, cfg.eval_batches));
  };

  core::Executor& train_exec = *model.program(true, cfg.batch, cfg.seq).executor;
  train_exec.set_profiling(options.profile);

  SignalGuard signals;
  TrainResult result;
  result.precision = precision_name(precision.effective);
  result.precision_warning = precision.warning;
  result.precision_path = precision.path;
  loader.start();  // prefetch the first batches while nothing else runs
  std::vector<double> step_times;
  const double run_start = monitor::now_seconds();
  while (state.step < cfg.steps) {
    const double t0 = monitor::now_seconds();
    model.params().zero_grads();
    double loss = 0, data_wait = 0;
    const float loss_scale = scaler ? scaler->scale() : 1.0f;
    for (int64_t micro = 0; micro < cfg.grad_accum; ++micro) {
      const data::Batch& b = loader.next();
      data_wait += loader.last_wait_seconds();
      loss += model.train_micro_step(b.inputs, b.targets, cfg.batch, cfg.seq, double(loss_scale) / double(cfg.grad_accum));
    }
    loss /= double(cfg.grad_accum);
    const float lr = cfg.schedule.at(state.step);
    optim::StepStats st;
    bool skipped = false;
    if (scaler) {
      const optim::ScaledStep r = optim::scaled_step(adamw, *scaler, lr);
      st = r.stats;
      skipped = !r.applied;
    } else {
      st = adamw.step(lr);
    }
    ++state.step;
    state.data_position = loader.position() * uint64_t(cfg.batch);
    if (scaler) state.loss_scaler = scaler->state();
    const double dt = monitor::now_seconds() - t0;
    step_times.push_back(dt);
    result.data_wait_s += data_wait;
    result.step_time_s += dt;

    StepMetrics m;
    m.step = state.step;
    m.loss = loss;
    m.lr = lr;
    m.grad_norm = st.grad_norm;
    m.ms_per_step = dt * 1e3;
    m.tokens_per_s = double(tokens_per_step) / dt;
    m.mfu = peak > 0 ? m.tokens_per_s * flops_per_token / peak : 0.0;
    result.losses.push_back(loss);
    if (result.losses.size() == 1) result.first_loss = loss;
    result.last_loss = loss;

    const double remaining = double(cfg.steps - state.step) * median(step_times);
    progress.step(m, remaining);
    nlohmann::json j = {{"step", m.step}, {"loss", m.loss}, {"lr", m.lr}, {"grad_norm", m.grad_norm},
                        {"tokens_per_s", m.tokens_per_s}, {"ms_per_step", m.ms_per_step}, {"mfu", m.mfu},
                        {"data_wait_ms", data_wait * 1e3}, {"precision", result.precision},
                        {"precision_path", result.precision_path},
                        {"time_s", monitor::now_seconds() - run_start}};

    if (scaler) {
      j["loss_scale"] = loss_scale;
      j["skipped"] = skipped;
    }
    if (skipped) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "step %lld: gradients overflowed at loss scale %g: update skipped, scale now %g",
                    (long long)state.step, double(loss_scale), double(scaler->scale()));
      progress.line(buf);
    }

    if (cfg.eval_every > 0 && (state.step % cfg.eval_every == 0 || state.step == cfg.steps)) {
      result.last_val_loss = evaluate();
      j["val_loss"] = result.last_val_loss;
      char buf[96];
      std::snprintf(buf, sizeof buf, "step %lld: val loss %.4f", (long long)state.step, result.last_val_loss);
      progress.line(buf);
    }
    metrics_log << j.dump() << "\n";
    metrics_log.flush();

    const bool stop = g_stop_signal != 0;
    if (stop || state.step == cfg.steps || (cfg.checkpoint_every > 0 && state.step % cfg.checkpoint_every == 0)) {
      result.last_checkpoint = save_checkpoint(cfg.out_dir, model, &adamw, state, cfg.keep_checkpoints);
    }
    if (stop) {
      progress.line(std::string("stopped by ") + (g_stop_signal == SIGINT ? "SIGINT" : "SIGTERM") +
                    ": checkpoint saved to " + result.last_checkpoint);
      result.interrupted = true;
      break;
    }
  }
  progress.finish();
  if (options.profile) result.profile = profile_table(train_exec);
  result.steps_done = state.step;
  if (scaler) {
    result.skipped_steps = scaler->skipped_steps();
    result.loss_scale = scaler->scale();
  }
  result.median_tokens_per_s = step_times.empty() ? 0 : double(tokens_per_step) / median(step_times);
  return result;
}

}  // namespace brisk::train
