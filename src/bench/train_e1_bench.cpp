// `brisk bench train --workload E1`: the spam encoder (E1) against the same
// encoder in PyTorch, with length-bucketed and with plain shuffled (padded)
// batches side by side, in one interleaved run (docs/workloads.md).
//
// It follows the W1/W2 benchmark (train_bench.cpp) in everything that makes a
// figure comparable -- one process per side and round, sides one after the
// other in interleaved rounds, warm-up then timed full optimizer steps, every
// derived figure computed here by one formula, medians with min-max over
// rounds, ratios formed within a round, peak RSS over each process's own
// baseline, the loss must fall -- and differs where an encoder must:
// - The batches vary in width, so a step time has no fixed token count: a
//   round's tokens/s is the real (unpadded) tokens of its timed steps over
//   their summed time, and padded cells/s and padding waste stand beside it.
// - Both sides train on the same batches AND the same weights: this process
//   rebuilds the classifier trainer's batch stream (e1_batches.h) and writes
//   it with the initial weights into a scratch directory, plus a plan (JSON)
//   that the brisk worker (train_e1_worker.cpp) and
//   bench/torch_encoder_peer.py both read. The first
//   step's losses of the two engines must then agree; the run fails if not.
// - With --bf16, every kind of batch also gets a brisk side whose blocks
//   compute in bf16 (train.precision = "bf16"'s graph) and a PyTorch side
//   under torch.autocast bf16, paired with each other as the fp32 sides are.
// - The data, batch and optimizer come from the classifier config
//   (configs/spam.toml by default), at the constant lr train.lr: the bench
//   times the trainer's own workload without its schedule, as W1/W2 do.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "bench_util.h"
#include "brisk/core/error.h"
#include "brisk/core/safetensors.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/models/encoder.h"
#include "brisk/models/transformer_block.h"
#include "brisk/monitor/machine.h"
#include "brisk/monitor/peak.h"
#include "brisk/optim/optimizer.h"
#include "brisk/train/classify_config.h"
#include "e1_batches.h"
#include "train_common.h"

namespace brisk::bench {

namespace fs = std::filesystem;
using nlohmann::json;

bool is_encoder_workload(const std::string& id) { return id == "E1" || id == "spam-encoder"; }

namespace {

const char* const kVariants[] = {"bucketed", "padded"};


TrainBenchOptions resolve_e1_options(TrainBenchOptions o) {
  o.workload = "E1";
  const fs::path root = repo_root();
  if (o.config.empty()) o.config = shown(root / "configs" / "spam.toml");
  if (o.json_path.empty()) o.json_path = shown(root / "bench" / "results" / "train_E1.json");
  if (o.peer_script.empty()) o.peer_script = shown(root / "bench" / "torch_encoder_peer.py");
  if (o.steps < 1) throw core::ConfigError("--steps must be at least 1, got " + std::to_string(o.steps));
  if (o.warmup < 0) throw core::ConfigError("--warmup must be 0 or more, got " + std::to_string(o.warmup));
  if (o.threads < 1) throw core::ConfigError("--threads must be at least 1, got " + std::to_string(o.threads));
  if (o.rounds < 1) throw core::ConfigError("--rounds must be at least 1, got " + std::to_string(o.rounds));
  // What E1 has no counterpart for is refused rather than silently ignored.
  if (o.ablation) throw core::ConfigError("--ablation is for W1/W2; E1 has one technique (attention)");
  if (!o.data_dir.empty())
    throw core::ConfigError("--data: E1 reads data.store of --config (" + o.config + "); point that at the store");
  return o;
}

// E1's variant: only the attention kernel can change.
std::string e1_attention(const std::string& variant, const std::string& from_config) {
  std::string attention = from_config;
  size_t pos = 0;
  while (pos < variant.size()) {
    size_t end = variant.find(',', pos);
    if (end == std::string::npos) end = variant.size();
    const std::string item = variant.substr(pos, end - pos);
    pos = end + 1;
    if (item.empty()) continue;
    if (item.rfind("attention=", 0) != 0)
      throw core::ConfigError("variant: E1 takes only attention=plain|flash, got '" + item + "'");
    attention = item.substr(10);
  }
  return attention;
}

// ---- the figures: one formula for every side and round ------------------------------

// The timed steps' totals, known here from the stream both sides were given.
struct Work {
  double real = 0, cells = 0, flops = 0;
};

Work timed_work(const E1Stream& s, const models::EncoderConfig& m, const TrainBenchOptions& o) {
  Work w;
  for (int k = o.warmup; k < o.warmup + o.steps; ++k) {
    const E1Batch& b = s.batches[size_t(k)];
    w.real += double(b.real_tokens());
    w.cells += double(b.cells());
    // Useful FLOPs: each real token at its own row's real length (the
    // attention of a real token spans its row's real keys, not the padding).
    for (int32_t len : b.lengths) w.flops += double(len) * m.flops_per_token(len);
  }
  return w;
}

// "The loss fell" compares the first step's loss (at the initial weights
// every batch scores about ln 2) with the mean of the last few: one batch of a
// classifier swings with its mix of labels and lengths (a late batch of short
// spam can score 0.2, the next 1.1), which an LM's next-token loss over 2,048
// tokens does not. A quarter of the steps, at most 5, at least 1.
size_t loss_tail(size_t n) { return std::clamp<size_t>(n / 4, 1, 5); }

struct Run {  // one side in one round
  Row row;    // tokens_per_s = real tokens/s; ms_per_step = mean timed step
  double cells_per_s = 0, median_step_ms = 0;
  std::vector<double> losses;
  uint64_t data_hash = 0;
};

Run make_run(const std::string& name, const ChildResult& c, const TrainBenchOptions& o, const Work& w, double peak) {
  Run run;
  Row& row = run.row;
  row.name = name;
  row.others_pct = c.others_pct;
  auto rep = report_of(c.out);
  if (rep) row.report = *rep;
  if (rep && rep->contains("error")) row.error = (*rep)["error"].get<std::string>();
  else if (c.exit_code != 0 || !rep)
    row.error = !c.signal.empty() ? "killed by " + c.signal
                                  : "exited with code " + std::to_string(c.exit_code) + (rep ? "" : " and no report");
  if (!row.ok()) return run;
  const auto step_ms = row.report.at("step_ms").get<std::vector<double>>();
  run.losses = row.report.at("losses").get<std::vector<double>>();
  run.data_hash = row.report.value("data_hash", uint64_t(0));
  if (int(step_ms.size()) != o.steps) {
    row.error = "reported " + std::to_string(step_ms.size()) + " timed steps";
    return run;
  }
  double sec = 0;
  for (double ms : step_ms) sec += ms / 1e3;
  // A sum, not a median: the steps differ in width, so only the whole timed
  // stretch has a definite token count.
  row.tokens_per_s = w.real / sec;
  run.cells_per_s = w.cells / sec;
  row.ms_per_step = sec * 1e3 / double(o.steps);
  run.median_step_ms = median(step_ms);
  row.gflops = w.flops / sec / 1e9;
  row.pct_peak = 100.0 * row.gflops / peak;
  const double self_rss = row.report.value("peak_rss_bytes", 0.0) / double(1 << 20);
  row.peak_rss_mib = self_rss > 0 ? self_rss : c.maxrss_mib;
  row.baseline_rss_mib = row.report.value("baseline_rss_bytes", 0.0) / double(1 << 20);
  row.rss_mib = row.peak_rss_mib - row.baseline_rss_mib;
  if (!run.losses.empty()) {
    row.loss_first = run.losses.front();
    const size_t k = loss_tail(run.losses.size());
    double tail = 0;
    for (size_t i = run.losses.size() - k; i < run.losses.size(); ++i) tail += run.losses[i];
    row.loss_last = tail / double(k);
  }
  return run;
}

std::string pct(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f%%", 100.0 * x);
  return b;
}

std::string fixed1(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", x);
  return b;
}

std::string widths_of(const E1Stream& s, const TrainBenchOptions& o) {
  std::map<int64_t, int> n;
  for (int k = o.warmup; k < o.warmup + o.steps; ++k) ++n[s.batches[size_t(k)].cols];
  std::string out;
  for (const auto& [w, c] : n) out += (out.empty() ? "" : " ") + std::to_string(w) + "x" + std::to_string(c);
  return out;
}

// The scratch directory for the plan, batches and weights; removed on every exit.
struct Scratch {
  fs::path dir;
  Scratch() {
    dir = fs::temp_directory_path() / ("brisk_bench_e1_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

}  // namespace

// ---- the whole benchmark -------------------------------------------------------------------

int run_e1_bench(const TrainBenchOptions& options) {
  const TrainBenchOptions o = resolve_e1_options(options);
  if (o.peer && !fs::exists(o.peer_script))
    throw core::IoError("PyTorch peer " + o.peer_script + " not found (run from the brisk checkout, or --no-peer)");
  if (o.peer && ::access(o.python.c_str(), X_OK) != 0)
    throw core::IoError("the peer's Python " + o.python + " is missing; the PyTorch peer needs Debian's python3-torch "
                        "(apt-get install python3-torch python3-numpy), or pass --python PATH, or --no-peer");
  train::ClassifyConfig cfg = train::load_classify_config(o.config, {});
  // The config's store is relative to the working directory, as for `brisk
  // train`; from elsewhere (a build directory) the checkout's copy is meant.
  if (fs::path(cfg.store).is_relative() && !fs::exists(cfg.store) && fs::exists(repo_root() / cfg.store))
    cfg.store = shown(repo_root() / cfg.store);
  const models::EncoderConfig e1 = models::EncoderConfig::preset("E1");
  if (!cfg.model.same_shape(e1))
    throw core::ConfigError(o.config + ": the model is not E1's shape (preset \"E1\": vocab 50304, 4 layers, 256 "
                            "embd, 4 heads, max_len 512, 2 classes); the E1 benchmark times that model only");
  cfg.model.attention = e1_attention(o.variant, cfg.model.attention);
  cfg.model.validate();
  const models::EncoderConfig& mc = cfg.model;
  const int total = o.warmup + o.steps;

  // ---- the batches, the weights and the plan both sides read
  const E1Corpus corpus = load_e1_corpus(cfg);
  std::vector<E1Stream> streams;
  for (const char* v : kVariants) streams.push_back(e1_stream(corpus, cfg, std::string(v) == "bucketed", total));
  Scratch scratch;
  json plan = {{"workload", "E1"},
               {"model",
                {{"vocab_size", mc.vocab_size}, {"n_layer", mc.n_layer}, {"n_embd", mc.n_embd},
                 {"n_head", mc.n_head}, {"max_len", mc.max_len}, {"n_classes", mc.n_classes},
                 {"attention", mc.attention}}},
               {"optimizer",
                {{"lr", cfg.adamw.lr}, {"beta1", cfg.adamw.beta1}, {"beta2", cfg.adamw.beta2},
                 {"eps", cfg.adamw.eps}, {"weight_decay", cfg.adamw.weight_decay},
                 {"grad_clip", cfg.adamw.grad_clip}}},
               {"seed", cfg.seed},
               {"weights", (scratch.dir / "init.safetensors").string()}};
  for (size_t v = 0; v < streams.size(); ++v) {
    const std::string path = (scratch.dir / (std::string(kVariants[v]) + ".batches")).string();
    write_e1_batches(path, streams[v].batches);
    plan["batches"][kVariants[v]] = path;
  }
  {
    // The brisk worker calls the same init_weights(seed); these are its bytes.
    cpu::CpuBackend backend(1);
    models::Encoder model(mc, backend);
    model.init_weights(cfg.seed);
    std::vector<core::Tensor> keep;
    keep.reserve(model.params().entries().size());
    std::vector<core::NamedTensor> tensors;
    for (const auto& [name, e] : model.params().entries()) {
      keep.push_back(model.params().download(e.value));
      tensors.push_back({name, keep.back().as_view()});
    }
    core::save_safetensors(plan["weights"].get<std::string>(), tensors);
  }
  const std::string plan_path = (scratch.dir / "plan.json").string();
  core::write_file_atomic(plan_path, plan.dump(2) + "\n");

  // Expected data hashes: what each side must report having consumed.
  std::vector<uint64_t> expect_hash(streams.size(), 0);
  std::vector<Work> work;
  for (size_t v = 0; v < streams.size(); ++v) {
    for (const E1Batch& b : streams[v].batches) expect_hash[v] = expect_hash[v] * 1000003u + e1_batch_hash(b);
    work.push_back(timed_work(streams[v], mc, o));
  }

  double peak = monitor::peak_fp32_gflops(o.threads, 0.5);
  const double peak_parent = peak;
  // bf16 rows are measured against the bf16 peak where the CPU has bf16 dot
  // products (0 elsewhere: those rows use the fp32 peak), as W1/W2's are; a
  // brisk row only when it ran bf16-native (BRISK_BF16=emulated widens).
  double peak_bf16 = o.peer_bf16 ? monitor::peak_bf16_gflops(o.threads, 0.5) : 0.0;
  std::printf("brisk bench train: E1 (spam-encoder) | %.2fM params | vocab %lld, %lld layers, %lld embd, %lld heads, "
              "%lld classes, %s attention | batch %lld x width <= %lld (each batch's width rounded up to %lld) | %d "
              "timed steps after %d warm-up | %d threads\n",
              double(mc.num_params()) / 1e6, (long long)mc.vocab_size, (long long)mc.n_layer, (long long)mc.n_embd,
              (long long)mc.n_head, (long long)mc.n_classes, mc.attention.c_str(), (long long)cfg.batch,
              (long long)mc.max_len, (long long)models::kSeqMultiple, o.steps, o.warmup, o.threads);
  std::printf("data:    %s (%s, %lld records, %lld empty left out, train split %zu at split seed %llu) from %s; the "
              "trainer's first %d batches (seed %llu)\n",
              cfg.store.c_str(), corpus.tokenizer.c_str(), (long long)corpus.records, (long long)corpus.empty,
              corpus.train.size(), (unsigned long long)cfg.split_seed, o.config.c_str(), total,
              (unsigned long long)cfg.seed);
  for (size_t v = 0; v < streams.size(); ++v)
    std::printf("%-8s %s batches: padding waste %s over the timed steps (epoch 0: %s, %s before rounding); timed "
                "widths %s\n",
                v == 0 ? "batches:" : "", kVariants[v], pct(1.0 - work[v].real / work[v].cells).c_str(),
                pct(streams[v].epoch_padding_waste).c_str(), pct(streams[v].epoch_padding_waste_unrounded).c_str(),
                widths_of(streams[v], o).c_str());
  std::printf("optim:   AdamW lr %g (constant), betas (%g, %g), eps %g, wd %g on 2-D weights, clip %g; timed: zero "
              "grads + fwd/bwd + clip + AdamW; same initial weights on both sides\n\n",
              double(cfg.adamw.lr), double(cfg.adamw.beta1), double(cfg.adamw.beta2), double(cfg.adamw.eps),
              double(cfg.adamw.weight_decay), double(cfg.adamw.grad_clip));
  std::fflush(stdout);

  // ---- the sides: brisk and PyTorch on each kind of batch
  struct Side {
    std::string name;
    size_t variant;
    bool brisk;
    std::vector<std::string> argv;
    bool bf16 = false;
  };
  const std::vector<std::string> common = {"--workload", "E1", "--steps", std::to_string(o.steps), "--warmup",
                                           std::to_string(o.warmup), "--threads", std::to_string(o.threads),
                                           "--plan", plan_path};
  // Per kind of batch: brisk and PyTorch in fp32, then (--bf16) brisk's bf16
  // blocks and PyTorch under torch.autocast bf16.
  std::vector<Side> sides;
  for (size_t v = 0; v < streams.size(); ++v)
    for (bool bf16 : {false, true}) {
      if (bf16 && !o.peer_bf16) continue;
      const std::string suffix = bf16 ? " bf16" : "";
      std::vector<std::string> argv = {self_exe(), "bench", "train", "--worker", "--batches", kVariants[v]};
      argv.insert(argv.end(), common.begin(), common.end());
      if (bf16) argv.insert(argv.end(), {"--variant", "precision=bf16"});
      sides.push_back({std::string("brisk ") + kVariants[v] + suffix, v, true, argv, bf16});
      if (!o.peer) continue;
      argv = {o.python, o.peer_script, "--batches", kVariants[v]};
      argv.insert(argv.end(), common.begin(), common.end());
      if (bf16) argv.push_back("--bf16");
      if (o.fix_blas) argv.push_back("--fix-blas");
      sides.push_back({std::string("pytorch ") + kVariants[v] + suffix, v, false, argv, bf16});
    }
  auto bf16_peak = [&](size_t side, const json& report) {
    return sides[side].bf16 && peak_bf16 > 0 &&
           (!sides[side].brisk || (report.is_object() && report.value("precision_path", "") == "bf16-native"));
  };
  auto peak_of = [&](size_t side, const json& report) { return bf16_peak(side, report) ? peak_bf16 : peak; };
  // Interleaved rounds (A B C D, A B C D, ...), as for W1/W2.
  std::vector<std::vector<Run>> runs(sides.size());  // [side][round]
  for (int r = 0; r < o.rounds; ++r) {
    if (o.rounds > 1) std::fprintf(stderr, "round %d/%d\n", r + 1, o.rounds);
    for (size_t i = 0; i < sides.size(); ++i) {
      const ChildResult c = run_child(sides[i].argv);
      const json rep = report_of(c.out).value_or(json());
      if (sides[i].brisk && rep.contains("peak_fp32_gflops")) {
        peak = std::max(peak, rep["peak_fp32_gflops"].get<double>());
        if (o.peer_bf16) peak_bf16 = std::max(peak_bf16, rep.value("peak_bf16_gflops", 0.0));
      }
      runs[i].push_back(make_run(sides[i].name, c, o, work[sides[i].variant], peak_of(i, rep)));
    }
  }

  // Checks per run: the batches consumed, the loss falling, and the two
  // engines starting from the same point (same weights, same first batch).
  for (size_t i = 0; i < sides.size(); ++i)
    for (Run& run : runs[i]) {
      if (!run.row.ok()) continue;
      if (run.data_hash != expect_hash[sides[i].variant])
        run.row.error = "trained on other batches than the plan's (data hash differs)";
      else if (!(run.row.loss_last < run.row.loss_first))
        run.row.error = "the loss did not fall (first step " + std::to_string(run.row.loss_first) +
                        ", mean of the last " + std::to_string(loss_tail(run.losses.size())) + " " +
                        std::to_string(run.row.loss_last) + ")";
    }
  json agreement = json::object();
  bool same_start = true;
  for (size_t i = 0; i < sides.size(); ++i) {
    if (!sides[i].brisk) continue;
    for (size_t j = 0; j < sides.size(); ++j) {
      if (sides[j].brisk || sides[j].variant != sides[i].variant || sides[j].bf16 != sides[i].bf16) continue;
      double first = 0, any = 0;
      for (int r = 0; r < o.rounds; ++r) {
        const Run &a = runs[i][size_t(r)], &b = runs[j][size_t(r)];
        if (a.losses.empty() || b.losses.empty()) continue;
        first = std::max(first, std::fabs(a.losses.front() - b.losses.front()));
        for (size_t k = 0; k < std::min(a.losses.size(), b.losses.size()); ++k)
          any = std::max(any, std::fabs(a.losses[k] - b.losses[k]));
      }
      // fp32 rounding alone differs in the 6th digit, bf16's in the 5th
      // (below 1e-4 on E1: at the initial weights the logits are small, and
      // the loss is near ln 2 whatever rounds them); a different weight or
      // batch moves the first loss by far more.
      const bool ok = first <= 1e-3;
      same_start = same_start && ok;
      agreement[std::string(kVariants[sides[i].variant]) + (sides[i].bf16 ? " bf16" : "")] = {
          {"first_loss_max_abs_diff", first}, {"any_step_loss_max_abs_diff", any}, {"same_start", ok}};
    }
  }

  // One row per side: medians over rounds.
  std::vector<Run> rows;
  std::vector<std::pair<double, double>> spread;
  for (size_t i = 0; i < sides.size(); ++i) {
    Run row = runs[i].front();
    std::vector<double> tps, ms;
    for (const Run& x : runs[i]) {
      if (!x.row.ok()) {
        row = x;
        break;
      }
      tps.push_back(x.row.tokens_per_s);
      row.row.keep_largest_growth(x.row);
      row.row.others_pct = std::max(row.row.others_pct, x.row.others_pct);
    }
    if (row.row.ok()) {
      // Every round did the same work, so the median tokens/s fixes the rest.
      const Work& w = work[sides[i].variant];
      const double sec = w.real / median(tps);
      row.row.tokens_per_s = w.real / sec;
      row.cells_per_s = w.cells / sec;
      row.row.ms_per_step = sec * 1e3 / double(o.steps);
      row.row.gflops = w.flops / sec / 1e9;
      row.row.pct_peak = 100.0 * row.row.gflops / peak_of(i, row.row.report);
      spread.emplace_back(*std::min_element(tps.begin(), tps.end()), *std::max_element(tps.begin(), tps.end()));
    } else {
      spread.emplace_back(0, 0);
    }
    rows.push_back(row);
  }

  // ---- configuration of each side
  std::printf("\nmachine: %s, %ld online cores, fp32 peak %.1f GFLOP/s on %d threads (FMA loop, best of several "
              "readings)%s; CPU flags: %s\n",
              monitor::cpu_model().c_str(), sysconf(_SC_NPROCESSORS_ONLN), peak, o.threads,
              peak_bf16 > 0 ? (", bf16 peak " + fixed1(peak_bf16) + " GFLOP/s (vdpbf16ps loop)").c_str() : "",
              monitor::cpu_flags().c_str());
  for (size_t i = 0; i < rows.size(); ++i) {
    const json& rep = rows[i].row.report;
    if (rep.is_null() || (sides[i].variant != 0 && rows.size() > 1)) continue;  // one line per engine and precision
    if (sides[i].brisk)
      std::printf("%-9s %s: %d threads, %s attention; matrix products: %s; %lld programs built before timing (%.1f "
                  "s)\n",
                  "brisk", rep.value("precision_path", "?").c_str(), rep.value("threads", 0),
                  rep.value("attention", "?").c_str(), rep.value("gemm", "?").c_str(),
                  (long long)rep.value("programs", 0), rep.value("program_build_s", 0.0));
    else
      std::printf("%-9s %s: torch %s (%s), %d threads, CPU capability %s; attention: %s; optimizer: %s; BLAS %s\n",
                  "pytorch", sides[i].bf16 ? "autocast bf16" : "fp32", rep.value("torch", "?").c_str(), rep.value("python", "?").c_str(), rep.value("threads", 0),
                  rep.value("cpu_capability", "?").c_str(), rep.value("attention", "?").c_str(),
                  rep.value("optimizer", "?").c_str(),
                  rep.contains("blas") ? rep["blas"].value("mapped", "?").c_str() : "?");
  }
  for (const auto& [variant, a] : agreement.items())
    std::printf("%-13s same batches (data hash) and same start: first-step loss differs by %.1e (must be <= 1e-3), "
                "at most %.1e over all steps%s\n",
                variant.c_str(), a["first_loss_max_abs_diff"].get<double>(),
                a["any_step_loss_max_abs_diff"].get<double>(),
                a["same_start"].get<bool>() ? "" : "  (NOT the same weights or batches)");

  // ---- the table
  std::printf("\n%d round%s, interleaved; tokens/s counts real (unpadded) tokens: the timed steps' real tokens over "
              "their summed time, median over rounds (min-max over rounds); cells/s counts padded cells; RSS growth "
              "is each process's peak RSS over its own baseline (brisk: before building anything; PyTorch: after "
              "importing torch), the largest over rounds\n",
              o.rounds, o.rounds == 1 ? "" : "s");
  const size_t tail = loss_tail(size_t(total));
  std::printf("%-22s %10s %15s %10s %8s %9s %8s %7s %15s %20s\n", "", "tokens/s", "min-max", "cells/s", "padding",
              "ms/step", "GFLOP/s", "% peak", "RSS growth MiB",
              ("loss first->last " + std::to_string(tail)).c_str());
  bool all_ok = same_start;
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i].row;
    if (!r.ok()) {
      std::printf("%-22s FAILED: %s\n", r.name.c_str(), r.error.c_str());
      all_ok = false;
      continue;
    }
    const Work& w = work[sides[i].variant];
    char range[40];
    std::snprintf(range, sizeof range, "%.0f-%.0f", spread[i].first, spread[i].second);
    std::printf("%-22s %10.0f %15s %10.0f %8s %9.1f %8.1f %6.1f%% %15.0f %8.3f -> %.3f\n", r.name.c_str(),
                r.tokens_per_s, range, rows[i].cells_per_s, pct(1.0 - w.real / w.cells).c_str(), r.ms_per_step,
                r.gflops, r.pct_peak, r.rss_mib, r.loss_first, r.loss_last);
  }
  std::string load;
  double worst = 0;
  for (const Run& r : rows) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s%s %.0f%%", load.empty() ? "" : ", ", r.row.name.c_str(), r.row.others_pct);
    load += buf;
    worst = std::max(worst, r.row.others_pct);
  }
  std::printf("CPU load from other processes while each side ran (worst round): %s%s\n", load.c_str(),
              worst > 10 ? "  (a busy machine: the timings are noisy, re-run when it is idle)" : "");

  // Ratios formed within each round: brisk / PyTorch per kind of batch, and
  // bucketed / padded per engine (what bucketing buys each).
  json ratios = json::object(), ratio_spread = json::object();
  auto ratio = [&](size_t i, size_t j, const std::string& label) {
    if (!rows[i].row.ok() || !rows[j].row.ok()) return;
    std::vector<double> per_round;
    for (int r = 0; r < o.rounds; ++r)
      per_round.push_back(runs[i][size_t(r)].row.tokens_per_s / runs[j][size_t(r)].row.tokens_per_s);
    const double med = median(per_round);
    const auto [lo, hi] = std::minmax_element(per_round.begin(), per_round.end());
    const std::string key = rows[i].row.name + "/" + rows[j].row.name;
    ratios[key] = med;
    ratio_spread[key] = {*lo, *hi};
    std::printf("%-52s %.2fx (rounds %.2f-%.2f)\n", (label + ":").c_str(), med, *lo, *hi);
  };
  for (size_t i = 0; i < sides.size(); ++i)
    for (size_t j = 0; j < sides.size(); ++j)
      if (sides[i].brisk && !sides[j].brisk && sides[i].variant == sides[j].variant && sides[i].bf16 == sides[j].bf16)
        ratio(i, j, "ratio " + rows[i].row.name + " / " + rows[j].row.name);
  for (size_t i = 0; i < sides.size(); ++i)
    for (size_t j = 0; j < sides.size(); ++j)
      if (sides[i].brisk == sides[j].brisk && sides[i].bf16 == sides[j].bf16 && sides[i].variant == 0 &&
          sides[j].variant == 1)
        ratio(i, j, std::string("bucketing speed-up, ") + (sides[i].brisk ? "brisk" : "pytorch") +
                        (sides[i].bf16 ? " bf16" : "") + " (real tokens/s)");
  for (size_t i = 0; i < sides.size(); ++i)
    for (size_t j = 0; j < sides.size(); ++j)
      if (sides[i].brisk == sides[j].brisk && sides[i].variant == sides[j].variant && sides[i].bf16 && !sides[j].bf16)
        ratio(i, j, std::string("bf16 speed-up, ") + (sides[i].brisk ? "brisk " : "pytorch ") +
                        kVariants[sides[i].variant]);

  // ---- the JSON report (train_<W>.json's layout, with E1's additions)
  json out = {{"bench", "train"},
              {"workload", "E1"},
              {"workload_name", "spam-encoder"},
              {"time", now_iso()},
              {"model",
               {{"vocab_size", mc.vocab_size}, {"n_layer", mc.n_layer}, {"n_embd", mc.n_embd}, {"n_head", mc.n_head},
                {"max_len", mc.max_len}, {"n_classes", mc.n_classes}, {"attention", mc.attention},
                {"params", mc.num_params()}}},
              {"batch", cfg.batch},
              {"width_multiple", models::kSeqMultiple},
              {"steps", o.steps},
              {"warmup", o.warmup},
              {"threads", o.threads},
              {"config", o.config},
              {"data", cfg.store},
              {"store",
               {{"path", cfg.store}, {"tokenizer", corpus.tokenizer}, {"records", corpus.records},
                {"empty_left_out", corpus.empty}, {"train_records", corpus.train.size()},
                {"split_seed", cfg.split_seed}, {"seed", cfg.seed}}},
              {"optimizer", plan["optimizer"]},
              {"lr_schedule", "constant"},
              {"machine",
               {{"cpu", monitor::cpu_model()},
                {"online_cores", sysconf(_SC_NPROCESSORS_ONLN)},
                {"peak_fp32_gflops", peak},
                {"peak_bf16_gflops", peak_bf16},
                {"peak_fp32_gflops_readings",
                 {peak_parent, rows[0].row.report.is_object() ? rows[0].row.report.value("peak_fp32_gflops", 0.0)
                                                               : 0.0}},
                {"cpu_flags", monitor::cpu_flags()}}},
              {"rounds", o.rounds},
              {"tokens_per_s_counts", "real (unpadded) tokens; cells_per_s counts padded cells"},
              {"loss_last_is", "the mean of the last " + std::to_string(loss_tail(size_t(total))) +
                                   " steps' losses (loss_fell: below the first step's)"},
              {"same_start", agreement},
              {"ratio_tokens_per_s", ratios},
              {"ratio_tokens_per_s_range", ratio_spread}};
  for (size_t v = 0; v < streams.size(); ++v) {
    const Work& w = work[v];
    std::vector<int64_t> widths;
    for (int k = o.warmup; k < total; ++k) widths.push_back(streams[v].batches[size_t(k)].cols);
    out["variants"][kVariants[v]] = {{"bucket", streams[v].bucket},
                                     {"timed_real_tokens", w.real},
                                     {"timed_cells", w.cells},
                                     {"timed_useful_flops", w.flops},
                                     {"padding_waste", 1.0 - w.real / w.cells},
                                     {"epoch_padding_waste", streams[v].epoch_padding_waste},
                                     {"epoch_padding_waste_unrounded", streams[v].epoch_padding_waste_unrounded},
                                     {"batches_per_epoch", streams[v].batches_per_epoch},
                                     {"timed_widths", widths}};
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    json j = row_json(rows[i].row);
    j["variant"] = kVariants[sides[i].variant];
    j["engine"] = sides[i].brisk ? "brisk" : "pytorch";
    j["tokens_per_s_range"] = {spread[i].first, spread[i].second};
    j["precision"] = sides[i].bf16 ? "bf16" : "fp32";
    j["precision_path"] = sides[i].brisk && rows[i].row.report.is_object()
                              ? rows[i].row.report.value("precision_path", "?")
                              : (sides[i].bf16 ? "autocast bf16" : "fp32");
    j["pct_peak_of"] = bf16_peak(i, rows[i].row.report) ? "bf16" : "fp32";
    if (rows[i].row.ok()) {
      j["cells_per_s"] = rows[i].cells_per_s;
      j["padding_waste"] = 1.0 - work[sides[i].variant].real / work[sides[i].variant].cells;
    }
    j["rounds"] = json::array();
    for (const Run& x : runs[i]) {
      json jr = {{"ok", x.row.ok()}, {"tokens_per_s", x.row.tokens_per_s}, {"cells_per_s", x.cells_per_s},
                 {"ms_per_step", x.row.ms_per_step}, {"median_step_ms", x.median_step_ms},
                 {"rss_growth_mib", x.row.rss_mib}, {"loss_first", x.row.loss_first},
                 {"loss_last", x.row.loss_last}, {"loss_last_step", x.losses.empty() ? 0.0 : x.losses.back()},
                 {"losses", x.losses}};
      if (!x.row.ok()) jr["error"] = x.row.error;
      j["rounds"].push_back(jr);
    }
    out["rows"].push_back(j);
  }
  const fs::path jp(o.json_path);
  if (jp.has_parent_path()) fs::create_directories(jp.parent_path());
  core::write_file_atomic(o.json_path, out.dump(2) + "\n");
  std::printf("\nwrote %s\n", o.json_path.c_str());
  return all_ok ? 0 : 1;
}

}  // namespace brisk::bench
