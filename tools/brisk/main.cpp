// The brisk command line: train, eval, generate and data preparation in one
// binary. Every user-facing failure (bad config, missing data, a checkpoint of
// another model size, a prompt the vocabulary cannot hold) ends with one line
// naming the problem and exit code 2, never a crash.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <cerrno>
#include <filesystem>
#include <iostream>
#include <new>

#include <csignal>
#include <unistd.h>

#include "brisk/core/error.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/data/shards.h"
#include "brisk/dist/launch.h"
#include "brisk/data/tokenizer.h"
#include "brisk/monitor/machine.h"
#include "brisk/train/autoencoder_trainer.h"
#include "brisk/train/checkpoint.h"
#include "brisk/train/classifier_trainer.h"
#include "brisk/train/trainer.h"
#include "bench_cmd.h"
#include "plan_cmd.h"
#include "tune_cmd.h"
#include "report_cmd.h"
#include "export_cmd.h"
#include "infer_cmds.h"
#include "cli_checks.h"
#include "prune_cmd.h"
#include "serve_cmd.h"
#include "autoencoder_cmds.h"
#include "classify_cmd.h"
#include "data_cmds.h"

using namespace brisk;

namespace {

int cmd_train(const std::string& config_path, const std::vector<std::string>& sets, bool resume, bool no_progress,
              bool profile, const std::string& trace, const std::vector<int64_t>& trace_steps) {
  // Encoder-family runs (a classifier, a sequence autoencoder) train for whole epochs.
  const bool encoder = train::is_encoder_config(config_path, sets);
  if (encoder || train::is_autoencoder_config(config_path, sets)) {
    const char* kind = encoder ? "an encoder classifier" : "a sequence autoencoder";
    if (!trace.empty()) throw core::ConfigError(std::string("--trace is for GPT runs, not ") + kind);
    // Each rank would train the whole model on its own, into the same
    // checkpoint.dir: refused on every rank alike, before any file is written.
    if (const dist::Launch launch = dist::detect_launch(); launch.launched && launch.size > 1)
      throw core::ConfigError(std::string("data-parallel training (") + std::to_string(launch.size) +
                              " processes under " + launch.launcher + ") is for GPT runs, not " + kind +
                              "; start it as one process");
    if (encoder)
      train::train_classifier(train::load_classify_config(config_path, sets), {.resume = resume, .profile = profile});
    else
      train::train_autoencoder(train::load_autoencoder_config(config_path, sets),
                               {.resume = resume, .profile = profile});
    return 0;
  }
  const train::TrainConfig cfg = train::load_train_config(config_path, sets);
  train::TrainOptions opt;
  opt.resume = resume;
  opt.progress = !no_progress;
  opt.profile = profile;
  opt.trace_path = trace;
  opt.trace_steps = trace_steps;
  const double t0 = monitor::now_seconds();
  const train::TrainResult r = train::train(cfg, opt);
  const double dt = monitor::now_seconds() - t0;
  if (r.rank != 0) return 0;  // several processes: rank 0 speaks for the run
  std::printf("\n== training summary ==\n");
  std::printf("steps          %lld%s\n", (long long)r.steps_done, r.interrupted ? " (interrupted)" : "");
  if (!r.losses.empty()) std::printf("loss           %.4f -> %.4f (this run's first and last step)\n", r.first_loss, r.last_loss);
  if (r.last_val_loss >= 0) std::printf("val loss       %.4f\n", r.last_val_loss);
  std::printf("precision      %s%s\n", r.precision.c_str(), r.precision_warning.empty() ? "" : " (fell back, see warning)");
  if (r.loss_scale > 0)
    std::printf("loss scaling   %lld steps skipped on overflow, final scale %g\n", (long long)r.skipped_steps, r.loss_scale);
  std::printf("throughput     %.0f tokens/s (median step)\n", r.median_tokens_per_s);
  if (r.steps_done > 0 && r.step_time_s > 0)
    std::printf("data wait      %.1f ms/step on average, %.2f%% of step time\n",
                1e3 * r.data_wait_s / double(r.losses.size()), 100 * r.data_wait_s / r.step_time_s);
  if (r.world > 1 && r.step_time_s > 0)
    std::printf("ranks          %d; gradient communication %.1f ms/step, %.0f%% of it hidden behind backward, %.1f%% of "
                "step time exposed\n",
                r.world, 1e3 * r.comm_s / double(std::max<size_t>(1, r.losses.size())),
                r.comm_s > 0 ? 100 * std::max(0.0, r.comm_s - r.comm_exposed_s) / r.comm_s : 0.0,
                100 * r.comm_exposed_s / r.step_time_s);
  std::printf("wall time      %.1f s, peak RSS %.0f MiB\n", dt, double(monitor::peak_rss_bytes()) / (1 << 20));
  if (r.device_memory_total > 0)  // what brisk tune's GPU estimate adds to the plan (train::kCudaProcessBytes)
    std::printf("GPU memory     %.0f of %.0f MiB in use at the end; the plan accounts for %.0f, the rest (CUDA context, "
                "cuBLASLt workspace, an eval arena, other processes) is %.0f\n",
                double(r.device_memory_used) / (1 << 20), double(r.device_memory_total) / (1 << 20),
                double(r.device_memory_planned) / (1 << 20),
                (double(r.device_memory_used) - double(r.device_memory_planned)) / (1 << 20));
  std::printf("checkpoint     %s\n", r.last_checkpoint.c_str());
  std::printf("metrics        %s/metrics.jsonl\n", cfg.out_dir.c_str());
  if (cfg.tensorboard) std::printf("tensorboard    tensorboard --logdir %s\n", cfg.out_dir.c_str());
  if (!r.trace.empty()) std::printf("trace          %s (open in https://ui.perfetto.dev)\n", r.trace.c_str());
  if (profile)
    std::printf("\n== time per op (train steps%s) ==\n%s", r.profile_skips_first ? ", the first left out" : "",
                r.profile.c_str());
  cli::print_run_advice(cfg.out_dir);  // recommendations and score (report_cmd.h)
  return 0;
}

struct LoadedModel {
  std::unique_ptr<cpu::CpuBackend> backend;
  std::unique_ptr<models::Gpt> model;
  train::TrainState state;
  std::string dir;
};

LoadedModel load_model(const std::string& checkpoint, int threads) {
  LoadedModel m;
  m.dir = train::require_checkpoint(checkpoint);
  const models::GptConfig cfg = train::read_checkpoint_config(m.dir, &m.state);
  m.backend = std::make_unique<cpu::CpuBackend>(threads);
  m.model = std::make_unique<models::Gpt>(cfg, *m.backend);
  train::load_checkpoint(m.dir, *m.model, nullptr);
  return m;
}

int cmd_eval(const std::string& checkpoint, const std::string& data_dir, int64_t batches, int64_t batch, int64_t seq,
             int threads) {
  LoadedModel m = load_model(checkpoint, threads);
  data::TokenDataset val(data_dir, "val");
  // Ids past the model's vocabulary have no embedding row: say which data and which model.
  if (val.vocab_size() > m.model->config().vocab_size)
    throw core::ConfigError("data '" + data_dir + "' has vocab " + std::to_string(val.vocab_size()) + " (tokenizer " +
                            val.tokenizer() + ") but the checkpoint " + m.dir + " is a model of vocab " +
                            std::to_string(m.model->config().vocab_size));
  // A GPT-2 model scored on byte ids (or the reverse within its vocabulary)
  // gives a loss, but a meaningless one.
  if (!m.state.tokenizer.empty() && m.state.tokenizer != val.tokenizer())
    throw core::ConfigError("data '" + data_dir + "' was tokenized with " + val.tokenizer() + " but the checkpoint " +
                            m.dir + " was trained on " + m.state.tokenizer + " tokens");
  if (seq <= 0) seq = m.model->config().block_size;
  // At most 2^31 tokens in one batch, as train.batch x train.seq: the
  // token buffers are sized and indexed from that product.
  const int64_t cells_limit = int64_t(1) << 31;
  if (batch > cells_limit / seq)
    throw core::ConfigError("--batch " + std::to_string(batch) + " x --seq " + std::to_string(seq) + " is over 2^31 " +
                            "tokens in one batch; lower --batch");
  data::WindowSampler sampler(val, batch, seq, 1);
  std::vector<int32_t> x(size_t(batch * seq)), y(x.size());
  double sum = 0;
  try {
    for (int64_t i = 0; i < batches; ++i) {
      sampler.next(x.data(), y.data());
      sum += m.model->eval_loss(x.data(), y.data(), batch, seq);
    }
  } catch (const std::bad_alloc&) {
    throw core::ConfigError("not enough memory to evaluate batches of " + std::to_string(batch) + " x " +
                            std::to_string(seq) + " tokens; lower --batch");
  }
  const double loss = sum / double(batches);
  std::printf("val loss %.4f (perplexity %.2f) over %lld batches of %lld x %lld tokens\n", loss, std::exp(loss),
              (long long)batches, (long long)batch, (long long)seq);
  return 0;
}

// Token shards, LMDB record stores and FASTA inputs are memory-mapped: a file cut short
// while a run reads it (`cp` of a dataset over itself) ends the process with
// SIGBUS, which the shell reports as a bare "Bus error". Say what it means,
// then die of the signal as before (exit status 135 for scripts).
void on_bus_error(int) {
  static const char kMessage[] =
      "brisk: bus error: a memory-mapped input (a token shard, an LMDB record store or a FASTA file) became shorter "
      "while it was read; was it rewritten in place? Restore it (brisk data prepare replaces files by renaming "
      "them) and resume from the last checkpoint\n";
  [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, kMessage, sizeof kMessage - 1);
  std::signal(SIGBUS, SIG_DFL);
  std::raise(SIGBUS);
}

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGBUS, on_bus_error);
  CLI::App app{"brisk: train and run sequence models fast on CPUs and GPUs"};
  app.require_subcommand(1);

  // ---- train
  auto* train_cmd = app.add_subcommand("train", "Train a GPT, an encoder classifier ([model] kind = \"encoder\") or a sequence autoencoder (kind = \"autoencoder\") from a TOML config");
  std::string config_path;
  std::vector<std::string> sets;
  bool resume = false, no_progress = false, profile = false;
  train_cmd->add_option("-c,--config", config_path, "TOML config (see configs/)")->check(CLI::ExistingFile);
  train_cmd->add_option("--set", sets, "Override a key, e.g. --set train.steps=100 (repeatable)");
  train_cmd->add_flag("--resume", resume, "Continue from the newest checkpoint in checkpoint.dir");
  train_cmd->add_flag("--no-progress", no_progress, "Plain log lines instead of a live bar");
  train_cmd->add_flag("--profile", profile, "Time every op and print where the step goes");
  // A run preset is train.preset put before every --set: keys of the file and --set win (run_presets.h).
  std::string run_preset;
  train_cmd->add_option("--preset", run_preset,
                        "Run preset: high-performance | memory-constrained | production (docs/tuning.md)");
  std::string trace;
  std::vector<int64_t> trace_steps;
  // Empty or a directory is refused here; a missing parent directory is
  // created by the trainer (which names a file in its way).
  auto* trace_opt =
      train_cmd->add_option("--trace", trace, "Write a Chrome trace of a few steps (every op) to this file")
          ->check(CLI::Validator(
              [](std::string& v) -> std::string {
                std::error_code ec;
                if (v.empty()) return "empty output path; give a file name";
                if (std::filesystem::is_directory(v, ec)) return v + ": is a directory; give a file name";
                return "";
              },
              "FILE"));
  train_cmd->add_option("--trace-steps", trace_steps, "Steps to trace, e.g. 5,6 (default: the 3rd to 5th of the run)")
      ->delimiter(',')
      ->needs(trace_opt);

  // ---- generate, quantize (infer_cmds.cpp)
  const cli::InferCommands infer_cmds = cli::add_infer_commands(app);
  std::string checkpoint;
  int threads = 0;

  // ---- eval
  auto* eval_cmd = app.add_subcommand("eval", "Validation loss of a checkpoint");
  std::string data_dir;
  int64_t eval_batches = 20, eval_batch = 8, eval_seq = 0;
  eval_cmd->add_option("--checkpoint", checkpoint, "Checkpoint or run directory")->required();
  eval_cmd->add_option("--data", data_dir, "Dataset directory (from `brisk data prepare`)")->required();
  eval_cmd->add_option("--batches", eval_batches, "Batches to average")->check(cli::positive())->capture_default_str();
  eval_cmd->add_option("--batch", eval_batch, "Batch size")->check(cli::positive())->capture_default_str();
  eval_cmd->add_option("--seq", eval_seq, "Sequence length (default: the model's block size)")
      ->check(cli::positive());
  eval_cmd->add_option("--threads", threads, "CPU threads (0 = all cores)")->check(cli::non_negative());

  // ---- data
  auto* data_cmd = app.add_subcommand("data", "Prepare datasets");
  data_cmd->require_subcommand(1);
  auto* prep_cmd = data_cmd->add_subcommand("prepare", "Tokenize text files into token shards");
  data::PrepareOptions po;
  prep_cmd->add_option("--input", po.inputs, "Files or directories")->required();
  prep_cmd->add_option("--tokenizer", po.tokenizer, "bytes | gpt2")->check(CLI::IsMember({"bytes", "gpt2"}))->capture_default_str();
  prep_cmd->add_option("--vocab-dir", po.vocab_dir, "GPT-2 vocabulary directory");
  prep_cmd->add_option("--out", po.out_dir, "Output directory")->required();
  prep_cmd->add_option("--val-fraction", po.val_fraction, "Share of tokens for validation")->capture_default_str();
  prep_cmd->add_option("--threads", po.threads, "Tokenizer threads (0 = all cores)")->check(cli::non_negative());
  prep_cmd->add_flag("--strict-utf8", po.strict_utf8, "Reject files that are not valid UTF-8");
  const cli::DataCommands record_cmds = cli::add_data_commands(*data_cmd);  // emails, fasta2lmdb (data_cmds.cpp)

  // ---- bench (bench_cmd.cpp)
  const cli::BenchCommand bench_cmd = cli::add_bench_command(app);

  // ---- plan (plan_cmd.cpp)
  const cli::PlanCommand plan_cmd = cli::add_plan_command(app);
  const cli::TuneCommand tune_cmd = cli::add_tune_command(app);  // tune_cmd.cpp
  const cli::ReportCommand report_cmd = cli::add_report_command(app);  // report_cmd.cpp
  const cli::ExportCommand export_cmd = cli::add_export_command(app);  // export onnx (export_cmd.cpp)
  const cli::PruneCommand prune_cmd = cli::add_prune_command(app);  // prune_cmd.cpp
  const cli::ServeCommand serve_cmd = cli::add_serve_command(app);  // serve_cmd.cpp
  const cli::ClassifyCommand classify_cmd = cli::add_classify_command(app);  // classify_cmd.cpp
  const cli::AutoencoderCommands ae_cmds = cli::add_autoencoder_commands(app);  // encode, decode (autoencoder_cmds.cpp)

  // A bad command line is a user error like any other: exit code 2 (CLI11's
  // own codes run from 100 up), but --help still exits 0.
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    const int rc = [&]() -> int {
      if (*train_cmd && !run_preset.empty()) sets.insert(sets.begin(), "train.preset=" + run_preset);
      if (*train_cmd) return cmd_train(config_path, sets, resume, no_progress, profile, trace, trace_steps);
      if (infer_cmds.parsed()) return infer_cmds.run();
      if (*eval_cmd) return cmd_eval(checkpoint, data_dir, eval_batches, eval_batch, eval_seq, threads);
      if (*bench_cmd.app) return bench_cmd.run();
      if (*plan_cmd.app) return plan_cmd.run();
      if (*tune_cmd.app) return tune_cmd.run();
      if (*report_cmd.app) return report_cmd.run();
      if (*export_cmd.app) return export_cmd.run();
      if (*prune_cmd.app) return prune_cmd.run();
      if (*serve_cmd.app) return serve_cmd.run();
      if (*classify_cmd.app) return classify_cmd.run();
      if (ae_cmds.parsed()) return ae_cmds.run();
      if (record_cmds.parsed()) return record_cmds.run();
      if (*prep_cmd) {
        const data::PrepareSummary s = data::prepare_dataset(po);
        std::printf("prepared %s: %lld files, %.1f MB, %lld train + %lld val tokens in %.1f s\n", po.out_dir.c_str(),
                    (long long)s.files, double(s.bytes) / 1e6, (long long)s.train_tokens, (long long)s.val_tokens,
                    s.seconds);
        return 0;
      }
      return 0;
    }();
    // What a command prints is its output (generated text, labels, FASTA):
    // one that could not all be written (a full disk behind stdout) is an
    // error, not the command's own exit code.
    if (std::fflush(stdout) != 0 || std::ferror(stdout))
      throw core::IoError(std::string("writing to stdout failed: ") + std::strerror(errno));
    return rc;
  } catch (const core::Error& e) {
    std::fprintf(stderr, "\nbrisk: error: %s\n", e.what());
    return 2;
  } catch (const std::filesystem::filesystem_error& e) {
    // The file system refused an operation on a path the user gave (a
    // symlink loop, a file where a directory belongs, no permission): the
    // user's to fix, and the message names the path.
    std::fprintf(stderr, "\nbrisk: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "\nbrisk: internal error: %s\n", e.what());
    return 3;
  }
  return 0;
}
