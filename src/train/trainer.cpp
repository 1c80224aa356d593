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

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <sstream>
#include <thread>

#include "brisk/core/backend_loader.h"
#include "brisk/core/error.h"
#include "brisk/core/safetensors.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/data/loader.h"
#include "brisk/data/shards.h"
#include "brisk/dist/data_parallel.h"
#include "brisk/dist/launch.h"
#include "brisk/models/prune.h"
#include "brisk/models/transformer_block.h"
#include "brisk/monitor/machine.h"
#include "brisk/optim/loss_scaler.h"
#include "brisk/train/checkpoint.h"
#include "brisk/train/hf_weights.h"
#include "brisk/train/tune.h"
#include "divergence.h"
#include "fresh_run.h"
#include "op_profile.h"
#include "resume_changes.h"
#include "run_log.h"
#include "run_record.h"
#include "step_trace.h"
#include "stop_signal.h"

namespace brisk::train {

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The median of the last kWindow step times, for the ETA: recent steps say
// more about the rest of the run than the first ones (warm-up, page faults),
// and a fixed window keeps the estimate O(1) and allocation-free.
class RecentSteps {
 public:
  void add(double s) { times_[size_t(count_++ % kWindow)] = s; }
  double median() const {
    const size_t n = size_t(std::min<int64_t>(count_, kWindow));
    if (n == 0) return 0;
    std::array<double, kWindow> sorted = times_;
    std::nth_element(sorted.begin(), sorted.begin() + long(n / 2), sorted.begin() + long(n));
    return sorted[n / 2];
  }

 private:
  static constexpr int64_t kWindow = 64;
  std::array<double, kWindow> times_{};
  int64_t count_ = 0;
};

void check_vocab(const data::TokenDataset& train_data, const TrainConfig& cfg) {
  if (train_data.vocab_size() > cfg.model.vocab_size)
    throw core::ConfigError("data '" + cfg.data_dir + "' has vocab " + std::to_string(train_data.vocab_size()) +
                            " but model.vocab_size is " + std::to_string(cfg.model.vocab_size));
}

// Each rank computes train.batch / world of the global batch.
int64_t local_batch(const TrainConfig& c, const TrainOptions& o) {
  if (!o.comm) return c.batch;
  const int w = o.comm->size();
  if (c.batch % w != 0)
    throw core::ConfigError("train.batch = " + std::to_string(c.batch) + " is the global batch and must divide evenly over " +
                            std::to_string(w) + " ranks");
  return c.batch / w;
}

// Every rank must train the same model on the same settings: rank 0's
// resolved config travels to all, and a rank whose own differs names the
// first differing line before every rank stops.
void check_same_config(dist::DataParallel& dp, core::Communicator& comm, const TrainConfig& cfg, int64_t num_params) {
  // Threads may differ: each machine gives its ranks its own core count.
  std::string mine;
  std::istringstream all(to_toml(cfg));
  for (std::string line; std::getline(all, line);)
    if (line.rfind("threads = ", 0) != 0) mine += line + "\n";
  mine += "# parameters = " + std::to_string(num_params) + "\n";
  std::string theirs = mine;
  uint64_t len = mine.size();
  dp.comm_thread().run([&] { comm.broadcast_host(&len, sizeof len, 0); }, "the start-up config check");
  theirs.resize(size_t(len));
  dp.comm_thread().run([&] { comm.broadcast_host(theirs.data(), theirs.size(), 0); }, "the start-up config check");
  std::string diff;
  if (theirs != mine) {
    std::istringstream a(mine), b(theirs);
    std::string la, lb, section;
    while (true) {
      const bool ga = bool(std::getline(a, la)), gb = bool(std::getline(b, lb));
      if (!ga && !gb) break;
      if (ga && !la.empty() && la[0] == '[') section = la.substr(1, la.size() - 2) + ".";
      if (la != lb || ga != gb) {
        diff = "rank " + std::to_string(comm.rank()) + " has '" + section + (ga ? la : "(nothing)") + "' where rank 0 has '" +
               section + (gb ? lb : "(nothing)") + "'";
        break;
      }
    }
  }
  if (dp.max(diff.empty() ? 0.0 : 1.0) > 0) {
    if (!diff.empty()) std::fprintf(stderr, "brisk: %s\n", diff.c_str());
    throw core::ConfigError("the ranks of this run do not have the same config and model" +
                            (diff.empty() ? std::string(" (another rank printed the difference)") : ": " + diff));
  }
}

}  // namespace

std::unique_ptr<core::Backend> make_backend(const TrainConfig& cfg, int device_index) {
  if (cfg.device == "cpu") return std::make_unique<cpu::CpuBackend>(cfg.threads);
  std::string why;
  std::unique_ptr<core::Backend> b = core::load_cuda_backend(&why, device_index);
  if (!b) throw core::ConfigError("train.device = \"cuda\" but the CUDA backend is unavailable: " + why);
  return b;
}

struct Trainer::Impl {
  const TrainConfig cfg;
  const TrainOptions options;
  core::Backend& backend;
  const bool on_gpu;
  data::TokenDataset train_data;
  // Opened only when the run evaluates: a dataset prepared with
  // --val-fraction 0 has no validation split and trains with eval_every 0.
  std::unique_ptr<data::TokenDataset> val_data;
  const PrecisionChoice precision;
  models::Gpt model;
  // Several processes (options.comm): the flat gradient buckets and their
  // collectives. Made before AdamW, which then sees the flat weights.
  const int64_t batch_local;  // this rank's share of train.batch
  std::unique_ptr<dist::DataParallel> dp;
  optim::AdamW adamw;
  std::optional<optim::LossScaler> scaler;
  // Training batches come from the prefetching loader: batch i is windows
  // [i*B, (i+1)*B) of the seed's window stream, the same as a WindowSampler
  // would draw, so data_position (windows) = loader position * B.
  data::TokenWindowSource train_source;
  data::Loader loader;
  TrainState state;
  Progress progress;
  std::optional<MetricsLog> metrics;
  std::optional<monitor::EventWriter> events;  // TensorBoard (train.tensorboard), rank 0
  std::optional<optim::ReduceOnPlateau> plateau;  // train.schedule = "plateau"
  std::unique_ptr<StepTrace> trace;              // --trace, rank 0
  core::Executor* train_exec = nullptr;
  // The checkpoint the weights came from (resume or train.init_from), "" for
  // random ones; and train.keep_mask's pruned weights, re-zeroed after every update.
  std::string start_checkpoint;
  std::optional<models::PruneMask> mask;

  // MFU against the peak of the precision the products run in
  // (docs/workloads.md): measured on a CPU, the card's datasheet figure on a
  // GPU (0 if unknown: no MFU then, rather than a made-up one).
  bool bf16_peak = false;
  double peak = 0;
  double flops_per_token = 0;
  int64_t tokens_per_step = 0;

  TrainResult result;
  std::vector<double> step_times;  // reserved for every step: no growth mid-run
  RecentSteps recent;
  std::vector<int32_t> eval_x, eval_y;
  double run_start = 0;
  bool stopped = false;
  bool stop_agreed = false;  // a stop signal reached some rank (all agree at the same step)

  Impl(const TrainConfig& c, core::Backend& b, const TrainOptions& o);
  void make_scaler();
  void resume();
  void init_from_checkpoint();
  void init_from_hf();
  void make_mask();
  void make_trace();
  void open_run_dir();
  void measure_peak();
  void print_header();
  // The planner's figures of this run: the train program's arena,
  // parameters, gradients and the optimizer state (this rank's share).
  core::MemoryReport planned_memory();
  double evaluate();
  void observe_plateau();
  void step();
  void after_step(StepRow row);
  void stop_if_diverged(const StepRow& row);
};

Trainer::Impl::Impl(const TrainConfig& c, core::Backend& b, const TrainOptions& o)
    : cfg(c),
      options(o),
      backend(b),
      on_gpu(!b.device().is_host()),
      train_data(c.data_dir, "train"),
      val_data(c.eval_every > 0 ? std::make_unique<data::TokenDataset>(c.data_dir, "val") : nullptr),
      // The model computes in the effective precision (fp32 master weights either way).
      precision(resolve_precision(c.precision, c.precision_fallback, c.device)),
      model([&] {
        check_vocab(train_data, c);  // before the model's memory is allocated
        models::GptConfig mc = c.model;
        mc.compute = compute_dtype(precision.effective);
        return mc;
      }(), b),
      batch_local(local_batch(c, o)),
      dp(o.comm ? std::make_unique<dist::DataParallel>(*o.comm, c.dist, model.params(), b,
                                                        model.train_graph(batch_local, c.seq))
                : nullptr),
      // ZeRO-1 over several ranks: no full moments for a fresh run (a resume
      // loads them whole, then each rank keeps its part).
      adamw(c.adamw, model.params(), b, /*allocate_state=*/!(o.comm && c.dist.zero == 1)),
      // Rank r of w reads global batches r, r + w, ... of the window stream
      // cut in batches of train.batch / w: together, at every step, exactly
      // the windows one process would read with train.batch.
      train_source(train_data, batch_local, c.seq, c.seed),
      loader(train_source,
             {.workers = c.loader_workers, .prefetch_factor = 2, .rank = o.comm ? o.comm->rank() : 0,
              .world_size = o.comm ? o.comm->size() : 1},
             b.staging_allocator()),
      progress(!o.quiet && (!o.comm || o.comm->rank() == 0), o.progress, c.steps, c.log_every) {
  if (on_gpu != (cfg.device == "cuda"))
    throw core::ConfigError(std::string("train.device = \"") + cfg.device + "\" but the trainer was given the " +
                            std::string(backend.name()) + " backend");
  if (dp) check_same_config(*dp, *options.comm, cfg, model.config().num_params());
  // A val split shorter than one window fails now, not at the first
  // evaluation, eval_every steps (maybe hours) into the run.
  if (val_data) data::WindowSampler(*val_data, cfg.batch, cfg.seq, cfg.seed + 1);
  model.init_weights(cfg.seed);
  make_scaler();
  if (cfg.schedule.kind == optim::Schedule::plateau) plateau.emplace(cfg.schedule);
  state.seed = cfg.seed;
  state.tokenizer = train_data.tokenizer();
  detail::check_creatable_dir(cfg.out_dir, "checkpoint.dir");
  if (!options.trace_path.empty())
    detail::check_creatable_dir(std::filesystem::path(options.trace_path).parent_path().string(), "--trace");
  if (options.resume) resume();
  else detail::refuse_earlier_checkpoints(cfg.out_dir);
  if (plateau) state.lr_plateau = plateau->state();
  else state.lr_plateau.reset();  // a plateau checkpoint resumed with another schedule: nothing to carry on
  if (start_checkpoint.empty() && !cfg.init_from.empty()) init_from_checkpoint();
  // dist.zero = 1: this rank's moments only, and a resume's full ones freed
  // before the step's arena is allocated (the two never coexist).
  if (dp) dp->shard_optimizer(adamw);
  if (cfg.keep_mask) make_mask();
  if (!dp || dp->rank() == 0) open_run_dir();
  measure_peak();
  train_exec = model.program(true, batch_local, cfg.seq).executor.get();
  train_exec->set_profiling(options.profile);
  if (!options.trace_path.empty() && (!dp || dp->rank() == 0)) make_trace();
  if (dp) {
    // Every rank resumes from the same checkpoint: one that finds none (a
    // checkpoint.dir not shared between hosts) would start over alone.
    const double s = double(state.step);
    if (dp->max(s) != -dp->max(-s))
      throw core::ConfigError("rank " + std::to_string(dp->rank()) + " is at step " + std::to_string(state.step) +
                              " after --resume but another rank is not: checkpoint.dir ('" + cfg.out_dir +
                              "') must hold the same checkpoints for every rank (a shared filesystem, or a copy on "
                              "each host)");
    dp->broadcast_weights();  // the same start everywhere, whatever each rank read
    dp->attach(*train_exec);
    result.rank = dp->rank();
    result.world = dp->world();
  }
  if (!options.quiet && (!dp || dp->rank() == 0)) print_header();

  result.precision = precision_name(precision.effective);
  result.precision_warning = precision.warning;
  result.precision_path = precision.path;
  result.losses.reserve(size_t(std::max<int64_t>(0, cfg.steps - state.step)));
  step_times.reserve(result.losses.capacity());
  eval_x.resize(size_t(cfg.batch * cfg.seq));
  eval_y.resize(eval_x.size());
  loader.start();  // prefetch the first batches while nothing else runs
  run_start = monitor::now_seconds();
}

void Trainer::Impl::make_scaler() {
  if (!cfg.loss_scaling.value_or(precision.effective == Precision::fp16)) return;
  optim::LossScalerConfig sc;
  sc.init_scale = cfg.loss_scale_init;
  sc.growth_interval = cfg.loss_scale_growth_interval;
  sc.max_scale = std::max(sc.max_scale, sc.init_scale);
  scaler.emplace(sc);
}

void Trainer::Impl::resume() {
  const std::string ckpt = latest_checkpoint(cfg.out_dir);
  if (ckpt.empty()) {
    progress.line("resume: no checkpoint in " + cfg.out_dir + ", starting fresh");
    return;
  }
  const std::string data_tokenizer = state.tokenizer;
  read_checkpoint_config(ckpt, &state);
  // Another tokenizer's ids would mean other things to the embedding, and
  // every later checkpoint would name the old one.
  if (!state.tokenizer.empty() && state.tokenizer != data_tokenizer)
    throw core::ConfigError("checkpoint " + ckpt + " was trained on tokenizer '" + state.tokenizer +
                            "' but data '" + cfg.data_dir + "' uses '" + data_tokenizer +
                            "'; resume on the run's own data (train.init_from starts a new run from weights)");
  // The data windows come from train.seed: another seed would draw other
  // batches from here on, so the resumed run would not be the one stopped.
  if (state.seed != cfg.seed)
    throw core::ConfigError("checkpoint " + ckpt + " was trained with train.seed = " + std::to_string(state.seed) +
                            ", this config has " + std::to_string(cfg.seed) +
                            ": a resume with another seed would not continue that run (set train.seed = " +
                            std::to_string(state.seed) + ", or start a new run from its weights with train.init_from)");
  adamw.allocate_full_state();  // ZeRO-1: transient, until shard() keeps this rank's part
  load_checkpoint(ckpt, model, &adamw);
  start_checkpoint = ckpt;
  // A scaled run continues at the scale it stopped at; a checkpoint
  // without scaler state (an fp32 run, an older file) starts at init.
  if (scaler && state.loss_scaler) scaler->restore(*state.loss_scaler);
  // The same for the plateau schedule's lr scale, best loss and count.
  if (plateau && state.lr_plateau) plateau->restore(*state.lr_plateau);
  if (state.data_position % uint64_t(cfg.batch) != 0)
    throw core::ConfigError("checkpoint " + ckpt + " stopped after " + std::to_string(state.data_position) +
                            " training windows, not a whole number of batches of train.batch = " +
                            std::to_string(cfg.batch) + " (was the batch size changed?)");
  // Every step reads one global batch: batch_local windows on each rank.
  loader.set_position(state.data_position / uint64_t(cfg.batch));
  progress.line("resumed from " + ckpt + " at step " + std::to_string(state.step));
  if (const std::string changed = detail::changed_settings_line(cfg.out_dir, to_toml(cfg), to_toml(TrainConfig{}));
      !changed.empty())
    progress.line(changed);
  // Nothing to train: say so, not a summary of zero steps at 0 tokens/s.
  if (state.step >= cfg.steps)
    throw core::ConfigError("checkpoint " + ckpt + " is at step " + std::to_string(state.step) +
                            " and train.steps is " + std::to_string(cfg.steps) +
                            ": the run is already done; raise train.steps to train further (e.g. --set train.steps=" +
                            std::to_string(state.step + cfg.steps) + ")");
}

// train.init_from: weights only. The run itself starts over (step 0, zero
// moments, the data stream from its start), which is what fine-tuning a
// pruned or otherwise changed model needs.
void Trainer::Impl::init_from_checkpoint() {
  const std::string ckpt = latest_checkpoint(cfg.init_from);
  if (ckpt.empty() && is_hf_gpt2_source(cfg.init_from)) {
    init_from_hf();
    return;
  }
  if (ckpt.empty())
    throw core::ConfigError("train.init_from: no checkpoint at '" + cfg.init_from +
                            "' (expected a checkpoint directory with state.json, a run directory with step_* "
                            "checkpoints, or Hugging Face GPT-2 weights: a .safetensors file or a directory with "
                            "model.safetensors)");
  TrainState from;
  read_checkpoint_config(ckpt, &from);
  // Another tokenizer's ids would mean other things to the embedding.
  if (!from.tokenizer.empty() && from.tokenizer != state.tokenizer)
    throw core::ConfigError("train.init_from: " + ckpt + " was trained on tokenizer '" + from.tokenizer +
                            "' but data '" + cfg.data_dir + "' uses '" + state.tokenizer + "'");
  try {
    load_checkpoint(ckpt, model, nullptr);
  } catch (const core::ConfigError& e) {  // another model shape: say which key brought it
    throw core::ConfigError(std::string("train.init_from: ") + e.what());
  }
  start_checkpoint = ckpt;
  progress.line("initialized from " + ckpt + " (weights only: step 0, fresh optimizer)");
}

// Hugging Face GPT-2 weights (hf_weights.h). The released GPT-2 files use
// GPT-2's BPE (50257 tokens): on other data their token rows would mean
// other things. Smaller vocabularies are some other model's: not checked.
void Trainer::Impl::init_from_hf() {
  constexpr int64_t kGpt2Vocab = 50257;
  HfLoadReport r;
  try {
    r = load_hf_gpt2(cfg.init_from, model);
  } catch (const core::Error& e) {
    throw core::ConfigError(std::string("train.init_from: ") + e.what());
  }
  if (r.file_vocab >= kGpt2Vocab && state.tokenizer != "gpt2")
    throw core::ConfigError("train.init_from: " + r.file + " has " + std::to_string(r.file_vocab) +
                            " token embeddings, GPT-2's BPE vocabulary, but data '" + cfg.data_dir + "' uses tokenizer '" +
                            state.tokenizer + "'");
  start_checkpoint = r.file;
  std::string how = std::to_string(r.file_vocab) + " token rows";
  if (r.file_vocab < model.config().vocab_size)
    how += " (rows " + std::to_string(r.file_vocab) + "-" + std::to_string(model.config().vocab_size - 1) +
           " the mean of the file's rows)";
  how += ", " + std::to_string(r.file_positions) + " positions";
  if (r.file_positions > model.config().block_size) how += " (the first " + std::to_string(model.config().block_size) + " used)";
  if (!r.config_checked) how += "; no config.json beside it, so n_head was not checked";
  progress.line("initialized from Hugging Face GPT-2 weights " + r.file + ": " + how +
                " (weights only: step 0, fresh optimizer)");
}

void Trainer::Impl::make_mask() {
  if (start_checkpoint.empty())
    throw core::ConfigError("train.keep_mask = true but the run starts from random weights, which have nothing "
                            "pruned to keep: set train.init_from to a pruned checkpoint (brisk prune), or --resume "
                            "a run that has a checkpoint");
  mask.emplace(models::PruneMask::from_zeros(model.params()));
  char buf[192];
  const double share = double(mask->masked()) / double(std::max<int64_t>(1, mask->prunable()));
  std::snprintf(buf, sizeof buf, "keep_mask: %lld of %lld block weights (%.2f%%) held at 0",
                (long long)mask->masked(), (long long)mask->prunable(), 100.0 * share);
  progress.line(buf);
  if (mask->masked() == 0)
    progress.line("warning: train.keep_mask: no block weight of " + start_checkpoint +
                  " is 0, so nothing is held (not a pruned checkpoint?)");
}

// --trace: the chosen steps must be steps this run computes.
void Trainer::Impl::make_trace() {
  std::vector<int64_t> steps =
      options.trace_steps.empty() ? StepTrace::default_steps(state.step, cfg.steps) : options.trace_steps;
  for (const int64_t s : steps)
    if (s <= state.step || s > cfg.steps)
      throw core::ConfigError("--trace-steps: step " + std::to_string(s) + " is not a step of this run, which computes steps " +
                              std::to_string(state.step + 1) + " to " + std::to_string(cfg.steps));
  trace = std::make_unique<StepTrace>(options.trace_path, std::move(steps));
}

void Trainer::Impl::open_run_dir() {
  namespace fs = std::filesystem;
  fs::create_directories(cfg.out_dir);
  core::write_file_atomic((fs::path(cfg.out_dir) / "config.toml").string(), to_toml(cfg));
  metrics.emplace((fs::path(cfg.out_dir) / "metrics.jsonl").string(), state.step);
  if (cfg.tensorboard) {
    // A new file per run. Like metrics.jsonl, the run directory then describes
    // the steps its weights went through: the START event makes TensorBoard
    // drop what earlier files logged for the steps this run computes (again).
    events.emplace(cfg.out_dir);
    events->session_start(state.step + 1);
  }
}

void Trainer::Impl::measure_peak() {
  if (on_gpu) {
    bf16_peak = precision.effective != Precision::fp32;
    peak = monitor::gpu_peak_gflops(backend.description(), bf16_peak) * 1e9;
  } else {
    const int threads = static_cast<cpu::CpuBackend&>(backend).num_threads();
    bf16_peak = precision.path == "bf16-native" && monitor::peak_bf16_gflops(threads) > 0;
    peak = (bf16_peak ? monitor::peak_bf16_gflops(threads) : monitor::peak_fp32_gflops(threads)) * 1e9;
  }
  if (dp) peak *= dp->world();  // MFU of the whole job, every rank on the same kind of machine
  flops_per_token = cfg.model.flops_per_token(cfg.seq);
  tokens_per_step = cfg.batch * cfg.seq * cfg.grad_accum;
}

core::MemoryReport Trainer::Impl::planned_memory() {
  core::MemoryReport m = model.program(true, batch_local, cfg.seq).executor->plan().report;
  m.optimizer_state = adamw.sharded() ? adamw.shard_exp_avg().bytes() + adamw.shard_exp_avg_sq().bytes()
                                      : model.params().state_bytes();
  return m;
}

void Trainer::Impl::print_header() {
  const std::string where =
      on_gpu ? "cuda: " + backend.description()
             : std::to_string(static_cast<cpu::CpuBackend&>(backend).num_threads()) + " threads";
  std::fprintf(stderr,
               "brisk train: %lld params | %lld layers, %lld embd, %lld heads, vocab %lld | batch %lld x seq %lld x "
               "accum %lld | %s | peak %.0f GFLOP/s %s\n",
               (long long)cfg.model.num_params(), (long long)cfg.model.n_layer, (long long)cfg.model.n_embd,
               (long long)cfg.model.n_head, (long long)cfg.model.vocab_size, (long long)cfg.batch, (long long)cfg.seq,
               (long long)cfg.grad_accum, where.c_str(), peak / 1e9, bf16_peak ? "bf16" : "fp32");
  if (!precision.warning.empty()) std::fprintf(stderr, "%s\n", precision.warning.c_str());
  if (cfg.schedule.warmup_steps >= cfg.steps)
    std::fprintf(stderr,
                 "warning: train.warmup (%lld) is not below train.steps (%lld): the whole run is warm-up (the lr "
                 "reaches train.lr at most at the last step) and nothing decays\n",
                 (long long)cfg.schedule.warmup_steps, (long long)cfg.steps);
  if (!precision.note.empty()) std::fprintf(stderr, "%s\n", precision.note.c_str());
  if (scaler)
    std::fprintf(stderr, "precision %s (%s: %s) | dynamic loss scaling from %g, x2 after %lld clean steps\n",
                 precision_name(precision.effective), precision.path.c_str(), precision.reason.c_str(),
                 double(scaler->scale()), (long long)scaler->config().growth_interval);
  else
    std::fprintf(stderr, "precision %s (%s: %s)\n", precision_name(precision.effective), precision.path.c_str(),
                 precision.reason.c_str());
  if (cfg.model.dropout > 0.f)
    std::fprintf(stderr, "dropout %g on the embeddings and each block's residual branches (train steps only)\n",
                 double(cfg.model.dropout));
  if (cfg.model.attention_dropout > 0.f)
    std::fprintf(stderr, "attention dropout %g on each block's attention probabilities (train steps only)\n",
                 double(cfg.model.attention_dropout));
  // The graph fusions as this device resolves "auto" (GptConfig::with_fusions_for).
  const models::GptConfig fused = cfg.model.with_fusions_for(on_gpu);
  std::fprintf(stderr,
               "fusions: bias+GELU %s | residual+LayerNorm %s | LayerNorm backward %s | GELU backward %s | bias "
               "gradient %s | weight casts %s | classifier %s\n",
               fused.fuse_bias_gelu ? "on" : "off", fused.fuse_residual_layernorm.c_str(),
               fused.fuse_layernorm_backward.c_str(), fused.fuse_gelu_backward.c_str(),
               fused.fuse_bias_backward.c_str(),
               fused.recompute == "none" ? fused.fuse_weight_casts.c_str() : "off (recompute)",
               fused.fused_classifier ? "on" : "off");
  const core::MemoryReport full = planned_memory();
  if (dp)
    std::fprintf(stderr,
                 "data parallel: %d ranks (%s) x batch %lld | %zu gradient buckets of <= %g MiB | ZeRO-%d | %.1f MiB over "
                 "the wire per rank per step\n",
                 dp->world(), options.comm->name().c_str(), (long long)batch_local, dp->layout().buckets.size(),
                 cfg.dist.bucket_mb, cfg.dist.zero, dp->wire_bytes_per_step() / (1 << 20));
  std::fprintf(stderr, "recompute %s | %s%s", cfg.model.recompute.c_str(), dp ? "per rank: " : "", full.str().c_str());
}

// The mean loss over eval_batches validation batches of train.batch windows.
// With several ranks each evaluates its batch_local windows of every batch
// (the same split as training) and the means are averaged across ranks:
// the same figure as one process's, in 1/N of the time and memory.
double Trainer::Impl::evaluate() {
  data::WindowSampler val_sampler(*val_data, cfg.batch, cfg.seq, cfg.seed + 1);
  const size_t mine = dp ? size_t(dp->rank() * batch_local * cfg.seq) : 0;
  double sum = 0;
  for (int64_t i = 0; i < cfg.eval_batches; ++i) {
    val_sampler.next(eval_x.data(), eval_y.data());
    sum += model.eval_loss(eval_x.data() + mine, eval_y.data() + mine, batch_local, cfg.seq);
  }
  if (dp) sum = dp->sum(sum) / double(dp->world());
  return sum / double(std::max<int64_t>(1, cfg.eval_batches));
}

// train.schedule = "plateau": the evaluation just made moves the lr scale;
// the state goes into the next checkpoint for an exact resume.
void Trainer::Impl::observe_plateau() {
  const double before = plateau->scale();
  if (plateau->observe(result.last_val_loss)) {
    char buf[192];
    std::snprintf(buf, sizeof buf,
                  "step %lld: no val loss below %.4f in %lld evaluation(s): lr x %g (scale %g -> %g)",
                  (long long)state.step, plateau->state().best, (long long)cfg.schedule.plateau_patience + 1,
                  double(cfg.schedule.plateau_factor), before, plateau->scale());
    progress.line(buf);
  }
  state.lr_plateau = plateau->state();
}

// One optimizer step: grad_accum micro-steps from the loader, then AdamW
// (through the loss scaler when it is on).
void Trainer::Impl::step() {
  const double t0 = monitor::now_seconds();
  // --trace: this step's kernels, data waits and optimizer step on a timeline.
  StepTrace* tr = trace && trace->wants(state.step + 1) ? trace.get() : nullptr;
  auto now = [tr] { return tr ? monitor::now_seconds() : 0.0; };
  if (tr) tr->begin(state.step + 1, *train_exec);
  model.params().zero_grads();
  double loss = 0, data_wait = 0;
  const float loss_scale = scaler ? scaler->scale() : 1.0f;
  // The seed averages over micro-steps and ranks at once: the all-reduced
  // sum of the gradients is then their mean.
  const double world = dp ? double(dp->world()) : 1.0;
  if (dp) dp->reset_times();
  for (int64_t micro = 0; micro < cfg.grad_accum; ++micro) {
    const double w0 = now();
    const data::Batch& b = loader.next();
    data_wait += loader.last_wait_seconds();
    if (dp) dp->arm(micro == cfg.grad_accum - 1);  // the last micro-step's backward sends the buckets
    const double m0 = now();
    loss += model.train_micro_step(b.inputs, b.targets, batch_local, cfg.seq,
                                   double(loss_scale) / (double(cfg.grad_accum) * world),
                                   models::dropout_key(cfg.seed, state.step, micro, dp ? dp->rank() : 0));
    if (tr) {
      tr->span("data_wait", "data", w0, m0, micro);
      tr->span("forward_backward", "micro_step", m0, now(), micro);
    }
  }
  loss /= double(cfg.grad_accum);
  const double c0 = now();
  if (dp) dp->finish_gradients(state.step + 1);
  if (tr && dp) tr->span("finish_gradients", "comm", c0, now());
  const float lr = plateau ? plateau->lr(cfg.schedule, state.step) : cfg.schedule.at(state.step);
  const double o0 = now();
  optim::StepStats st;
  bool skipped = false;
  if (scaler) {
    const optim::ScaledStep r = optim::scaled_step(adamw, *scaler, lr);
    st = r.stats;
    skipped = !r.applied;
  } else {
    st = adamw.step(lr);
  }
  if (tr) {
    backend.synchronize();  // a GPU update's time, not its launch
    tr->span("optimizer_step", "optimizer", o0, now());
  }
  if (dp) dp->gather_weights();  // ZeRO-1: each rank updated its chunks
  if (mask) mask->apply(model.params());  // the update moved pruned weights: back to 0
  double comm_ms = 0, exposed_ms = 0;
  if (dp) {
    comm_ms = dp->comm_seconds() * 1e3;
    exposed_ms = dp->exposed_seconds() * 1e3;
    result.comm_s += comm_ms / 1e3;
    result.comm_exposed_s += exposed_ms / 1e3;
    // The step's loss is the mean over ranks; a stop signal on any rank stops all at this step.
    double v[2] = {loss, detail::stop_signal() != 0 ? 1.0 : 0.0};
    dp->sum(v, 2);
    loss = v[0] / world;
    stop_agreed = v[1] > 0;
  } else {
    stop_agreed = detail::stop_signal() != 0;
  }
  ++state.step;
  // --profile leaves out the first step of a run of several: it pays for
  // one-time work (a GPU's module loading and cuBLASLt plans, first touches
  // of the arena) that no later step repeats, and on a GPU it was half of a
  // 6-step profile's time.
  if (options.profile && !result.profile_skips_first && state.step < cfg.steps) {
    train_exec->reset_op_times();
    result.profile_skips_first = true;
  }
  state.data_position = loader.position() * uint64_t(batch_local) * uint64_t(world);
  if (scaler) state.loss_scaler = scaler->state();
  const double dt = monitor::now_seconds() - t0;
  if (tr) {
    tr->end(t0, t0 + dt);  // the step's span is the time metrics.jsonl reports
    if (tr->written()) result.trace = tr->path();
  }
  step_times.push_back(dt);
  recent.add(dt);
  result.data_wait_s += data_wait;
  result.step_time_s += dt;
  result.losses.push_back(loss);
  if (result.losses.size() == 1) result.first_loss = loss;
  result.last_loss = loss;

  StepRow row;
  row.step = state.step;
  row.loss = loss;
  row.lr = lr;
  row.grad_norm = st.grad_norm;
  row.ms_per_step = dt * 1e3;
  row.tokens_per_s = double(tokens_per_step) / dt;
  row.mfu = peak > 0 ? row.tokens_per_s * flops_per_token / peak : 0.0;
  row.data_wait_ms = data_wait * 1e3;
  row.precision = result.precision.c_str();
  row.precision_path = result.precision_path.c_str();
  row.scaled = scaler.has_value();
  row.loss_scale = loss_scale;
  row.skipped = skipped;
  row.world = int(world);
  row.comm_ms = comm_ms;
  row.comm_exposed_ms = exposed_ms;
  if (const size_t rss = monitor::current_rss_bytes(); rss > 0) row.rss_mib = double(rss) / double(1 << 20);
  if (skipped) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "step %lld: gradients overflowed at loss scale %g: update skipped, scale now %g",
                  (long long)state.step, double(loss_scale), double(scaler->scale()));
    progress.line(buf);
  }
  after_step(row);
}

// A loss or gradient norm that is not finite, in a step the loss scaler did
// not skip, ends the run with an error (divergence.h); the checkpoints
// already written stay as they are. A skipped step put nothing into the
// weights and the scaler backs off, except at its floor, where nothing is
// left to try: that ends the run too.
void Trainer::Impl::stop_if_diverged(const StepRow& row) {
  const bool at_floor = row.skipped && scaler && row.loss_scale <= scaler->config().min_scale;
  if (row.skipped ? !at_floor : !detail::diverged(row.loss, row.grad_norm)) return;
  progress.finish();
  // The steps traced so far are kept, as a stop signal keeps them: the run
  // ends with this error and never reaches finish().
  if (trace && !trace->written() && trace->write())
    std::fprintf(stderr, "trace of the steps traced before the divergence: %s\n", trace->path().c_str());
  const std::string newest = latest_checkpoint(cfg.out_dir);
  const std::string kept = newest.empty() ? "none was written before" : "the newest is " + newest;
  if (at_floor) throw detail::overflow_at_floor_error(row.step, row.loss, row.loss_scale, row.lr, kept);
  throw detail::diverged_error(row.step, row.loss, row.grad_norm, row.lr, kept);
}

// What follows an update: progress, evaluation and the metrics row when due,
// then a checkpoint when due or when a stop signal arrived.
void Trainer::Impl::after_step(StepRow row) {
  // The ETA: the steps left at the recent median step time, plus what this
  // run has spent per step outside the steps (evaluations, checkpoints,
  // logging), which the step times leave out.
  const double outside_per_step =
      step_times.empty() ? 0.0
                         : std::max(0.0, monitor::now_seconds() - run_start - result.step_time_s) / double(step_times.size());
  progress.step(row, double(cfg.steps - state.step) * (recent.median() + outside_per_step));
  const bool rank0 = !dp || dp->rank() == 0;
  if (cfg.eval_every > 0 && (state.step % cfg.eval_every == 0 || state.step == cfg.steps)) {
    result.last_val_loss = evaluate();
    row.has_val_loss = true;
    row.val_loss = result.last_val_loss;
    char buf[96];
    std::snprintf(buf, sizeof buf, "step %lld: val loss %.4f", (long long)state.step, result.last_val_loss);
    progress.line(buf);
    if (plateau) observe_plateau();
  }
  row.time_s = monitor::now_seconds() - run_start;
  if (metrics) metrics->write(row);
  if (events) write_events(*events, row);
  stop_if_diverged(row);

  const bool stop = stop_agreed;
  if (stop || state.step == cfg.steps || (cfg.checkpoint_every > 0 && state.step % cfg.checkpoint_every == 0)) {
    // One ordinary checkpoint, written by rank 0. Under ZeRO-1 every rank
    // takes part in gathering the moments, a slab at a time, while rank 0
    // writes them into the file.
    if (dp && dp->sharded()) {
      const ShardedMoments gather = [&](const MomentPlace& place) { dp->stream_moments(adamw, &place); };
      if (rank0)
        result.last_checkpoint = save_checkpoint(cfg.out_dir, model, &adamw, state, cfg.keep_checkpoints, &gather);
      else
        dp->stream_moments(adamw, nullptr);
    } else if (rank0) {
      result.last_checkpoint = save_checkpoint(cfg.out_dir, model, &adamw, state, cfg.keep_checkpoints);
    }
  }
  if (stop) {
    const int sig = detail::stop_signal();
    const char* by = sig != 0 ? detail::stop_signal_name(sig) : "a stop signal on another rank";
    progress.line(std::string("stopped by ") + by + ": checkpoint saved to " + result.last_checkpoint);
    result.interrupted = true;
    stopped = true;
  }
}

namespace {
// train.memory_budget: the micro-batch, recompute level and classifier that
// fit it, chosen from the planner before any part of the run is built, so
// the search's transient model is gone before the run's own (tune.h).
TrainConfig with_memory_budget(const TrainConfig& cfg, core::Backend& backend, const TrainOptions& o) {
  if (cfg.memory_budget.empty()) return cfg;
  if (o.comm)
    throw core::ConfigError("train.memory_budget sizes a one-process run; over several ranks choose train.batch and "
                            "train.recompute with `brisk plan --ranks N`");
  std::string report;
  TrainConfig tuned = apply_memory_budget(cfg, backend, &report);
  if (!o.quiet) std::fprintf(stderr, "%s", report.c_str());
  return tuned;
}
}  // namespace

Trainer::Trainer(const TrainConfig& config, core::Backend& backend, const TrainOptions& options)
    : impl_(std::make_unique<Impl>(with_memory_budget(config, backend, options), backend, options)) {}

Trainer::~Trainer() = default;

bool Trainer::done() const { return impl_->stopped || impl_->state.step >= impl_->cfg.steps; }

void Trainer::step() {
  if (done()) throw core::ConfigError("Trainer::step() after the run ended");
  impl_->step();
}

TrainResult Trainer::finish() {
  Impl& t = *impl_;
  t.progress.finish();
  if (t.options.profile) t.result.profile = detail::op_time_table(t.train_exec->op_times());
  // A run that stopped before its last traced step still leaves the steps it traced.
  if (t.trace && !t.trace->written() && t.trace->write()) t.result.trace = t.trace->path();
  t.result.steps_done = t.state.step;
  if (t.scaler) {
    t.result.skipped_steps = t.scaler->skipped_steps();
    t.result.loss_scale = t.scaler->scale();
  }
  t.result.median_tokens_per_s = t.step_times.empty() ? 0 : double(t.tokens_per_step) / median(t.step_times);
  if (const auto mem = t.backend.device_memory()) {
    t.result.device_memory_used = mem->total - mem->free;
    t.result.device_memory_total = mem->total;
    t.result.device_memory_planned = t.planned_memory().total();
  }
  // Rank 0's run directory: run_summary.json and recommendations.json for
  // `brisk report` (run_record.h). A refused write costs the report, not the run.
  if (t.metrics) {
    try {
      write_run_record({&t.cfg, &t.precision, t.peak / 1e9, t.bf16_peak,
                        t.on_gpu ? 0 : static_cast<cpu::CpuBackend&>(t.backend).num_threads(), t.dp ? t.dp->world() : 1,
                        t.batch_local, t.on_gpu ? t.backend.description() : "", t.result.profile},
                       t.model, t.adamw);
    } catch (const core::Error& e) {
      t.progress.line(std::string("warning: no run record for brisk report: ") + e.what());
    }
  }
  return std::move(t.result);
}

TrainResult train(const TrainConfig& cfg, core::Backend& backend, const TrainOptions& options) {
  Trainer trainer(cfg, backend, options);
  detail::StopSignalGuard signals;
  while (!trainer.done()) trainer.step();
  return trainer.finish();
}

namespace {

// The part of train() after MPI is up (mpi null: one process): NCCL for GPU
// ranks, this machine's cores shared between its ranks unless
// train.threads says, the backend, the run.
TrainResult train_connected(TrainConfig cfg, TrainOptions opt, const dist::Launch& launch, core::Communicator* mpi,
                            std::unique_ptr<core::Communicator>& nccl) {
  int device_index = 0;
  if (mpi) {
    const bool use_nccl = cfg.dist.backend == "nccl" || (cfg.dist.backend == "auto" && cfg.device == "cuda");
    if (use_nccl && cfg.device != "cuda")
      throw core::ConfigError("dist.backend = \"nccl\" needs train.device = \"cuda\" (NCCL works on GPU memory)");
    if (cfg.device == "cuda") device_index = launch.local_rank;  // one GPU per rank on each machine
    if (use_nccl) {
      std::string why;
      nccl = core::load_nccl_communicator(*mpi, device_index, &why);
      if (!nccl) throw core::ConfigError("dist.backend: NCCL is unavailable: " + why);
      opt.comm = nccl.get();
    } else if (cfg.device == "cuda") {
      throw core::ConfigError("train.device = \"cuda\" over several processes needs dist.backend = \"nccl\" (or "
                              "\"auto\"): MPI here works on host memory");
    }
    if (cfg.threads == 0 && cfg.device == "cpu") {
      const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
      cfg.threads = std::max(1, cores / std::max(1, launch.local_size));
    }
  }
  std::unique_ptr<core::Backend> backend = make_backend(cfg, device_index);
  return train(cfg, *backend, opt);
}

}  // namespace

TrainResult train(const TrainConfig& config, const TrainOptions& options) {
  TrainOptions opt = options;
  // Started by mpirun / srun with more than one rank: connect. GPU ranks:
  // NCCL for the gradients, bootstrapped over (and keeping its host
  // collectives on) MPI, which must outlive it: declared first.
  std::unique_ptr<core::Communicator> mpi, nccl;
  const dist::Launch launch = dist::detect_launch();
  if (!opt.comm && launch.launched && launch.size > 1) {
    mpi = dist::connect_mpi();
    opt.comm = mpi.get();
  }
  try {
    return train_connected(config, opt, launch, mpi.get(), nccl);
  } catch (const std::exception& e) {
    if (!mpi) throw;
    // An error this rank met alone (its data, its disk, an option only rank
    // 0 checks): the other ranks would wait for it in their next collective
    // until dist.timeout_s, and MPI_Finalize while unwinding would wait for
    // them, so the error is said here, with the rank, and the job ends now.
    const bool users_error =
        dynamic_cast<const core::Error*>(&e) || dynamic_cast<const std::filesystem::filesystem_error*>(&e);
    std::fprintf(stderr, "\nbrisk: rank %d of %d: %serror: %s\n(ending every rank of the job)\n", mpi->rank(),
                 mpi->size(), users_error ? "" : "internal ", e.what());
    mpi->abort(users_error ? 2 : 3);  // main's exit codes
    throw;                            // not reached
  }
}

}  // namespace brisk::train
