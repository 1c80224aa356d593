// The training benchmark (train_bench.h): brisk against PyTorch on W1 / W2.
//
// Why it is built this way:
// - One process per side. Peak RSS is a per-process number; measuring both
//   sides in one process would charge PyTorch's allocations to brisk or vice
//   versa. The sides are started with posix_spawn (vfork semantics), so a
//   child's high-water mark is its own and never includes a copy of ours.
// - The sides run one after the other, never together: on a 2-core machine
//   two trainings at once would measure the scheduler, not the engines.
// - Both sides time the same thing: one full optimizer step (zero grads,
//   forward + backward, grad-norm clip, AdamW), with the batch sampled before
//   the clock starts, and the parent computes every derived figure (tokens/s,
//   GFLOP/s, % of peak, median) from the raw step times of both sides with one
//   formula, so the two rows cannot disagree on a definition.
// - The peer reads brisk's token shards and replays brisk's WindowSampler, so
//   both sides train on the same windows in the same order.
#include "brisk/bench/train_bench.h"

#include <cstdlib>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "brisk/core/error.h"
#include "brisk/core/safetensors.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/cpu/cpu_features.h"
#include "brisk/data/shards.h"
#include "brisk/models/gpt.h"
#include "brisk/models/transformer_block.h"
#include "brisk/monitor/machine.h"
#include "brisk/monitor/peak.h"
#include "brisk/optim/optimizer.h"
#include "bench_util.h"
#include "train_common.h"
// OpenBLAS's own description of itself (version, build options, core kernel).
extern "C" char* openblas_get_config();
extern "C" char* openblas_get_corename();

namespace brisk::bench {

namespace fs = std::filesystem;
using nlohmann::json;

Workload workload_of(const std::string& id) {
  if (id == "W1" || id == "gpt2-tiny") return {"W1", "gpt2-tiny", "gpt2", "data/kjv-gpt2"};
  if (id == "W2" || id == "char-small") return {"W2", "char-small", "bytes", "data/kjv-bytes"};
  throw core::ConfigError("unknown training workload '" + id +
                          "' (allowed on CPU: W1 / gpt2-tiny, W2 / char-small, E1 / spam-encoder; see "
                          "docs/workloads.md)");
}

TrainBenchOptions resolve_options(TrainBenchOptions o) {
  const Workload w = workload_of(o.workload);
  o.workload = w.id;
  const fs::path root = repo_root();
  if (o.data_dir.empty()) o.data_dir = shown(root / w.data_dir);
  if (o.json_path.empty()) o.json_path = shown(root / "bench" / "results" / ("train_" + w.id + ".json"));
  if (o.peer_script.empty()) o.peer_script = shown(root / "bench" / "torch_peer.py");
  if (o.steps < 1) throw core::ConfigError("--steps must be at least 1, got " + std::to_string(o.steps));
  if (o.warmup < 0) throw core::ConfigError("--warmup must be 0 or more, got " + std::to_string(o.warmup));
  if (o.threads < 1) throw core::ConfigError("--threads must be at least 1, got " + std::to_string(o.threads));
  if (o.rounds < 1) throw core::ConfigError("--rounds must be at least 1, got " + std::to_string(o.rounds));
  if (!o.config.empty())
    throw core::ConfigError("--config is for the E1 workload (its classifier config); " + w.id +
                            " runs its preset, so the option would be ignored");
  return o;
}

void require_data(const TrainBenchOptions& o) {
  if (fs::exists(fs::path(o.data_dir) / "meta.json")) return;
  const Workload w = workload_of(o.workload);
  const fs::path root = repo_root();
  std::string msg = "workload " + w.id + " trains on " + o.data_dir + ", which does not exist yet. Create it with:\n";
  if (!fs::exists(root / "data" / "raw" / "kjv.txt"))
    msg += "  bash " + shown(root / "scripts" / "fetch_data.sh") + "    # writes data/raw/kjv.txt\n";
  msg += "  " + self_exe() + " data prepare --input " + shown(root / "data" / "raw" / "kjv.txt") + " --tokenizer " +
         w.tokenizer + " --out " + o.data_dir;
  throw core::IoError(msg);
}

namespace {

// The BLAS library this process has mapped, from /proc/self/maps: what the
// loader actually picked, whatever the link line or the alternatives say.
std::string mapped_blas() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    const auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string path = line.substr(slash);
    const std::string base = fs::path(path).filename().string();
    if (base.find("openblas") != std::string::npos || base.rfind("libblas", 0) == 0 ||
        base.rfind("libblis", 0) == 0 || base.rfind("libmkl", 0) == 0)
      return path;
  }
  return "";
}

}  // namespace

// ---- the table ------------------------------------------------------------------

Row make_row(const std::string& name, const ChildResult& c, const TrainBenchOptions& o, int64_t tokens_per_step,
             double flops_per_token, double peak_gflops) {
  Row row;
  row.name = name;
  row.others_pct = c.others_pct;
  auto rep = report_of(c.out);
  if (rep) row.report = *rep;
  if (rep && rep->contains("error")) {
    row.error = (*rep)["error"].get<std::string>();
  } else if (c.exit_code != 0 || !rep) {
    row.error = !c.signal.empty() ? "killed by " + c.signal
                                  : "exited with code " + std::to_string(c.exit_code) + (rep ? "" : " and no report");
  }
  if (!row.ok()) return row;
  const auto step_ms = row.report.at("step_ms").get<std::vector<double>>();
  const auto losses = row.report.at("losses").get<std::vector<double>>();
  row.ms_per_step = median(step_ms);
  row.tokens_per_s = double(tokens_per_step) / (row.ms_per_step / 1e3);
  row.gflops = row.tokens_per_s * flops_per_token / 1e9;
  row.pct_peak = 100.0 * row.gflops / peak_gflops;
  // The side's own reading of its peak (VmHWM / ru_maxrss); the kernel's
  // wait4 figure is the fallback and the same number in practice. The
  // figure compared is the growth over the side's baseline (its process
  // before the run built anything: PyTorch's import alone is ~230 MiB).
  const double self_rss = row.report.value("peak_rss_bytes", 0.0) / double(1 << 20);
  row.peak_rss_mib = self_rss > 0 ? self_rss : c.maxrss_mib;
  row.baseline_rss_mib = row.report.value("baseline_rss_bytes", 0.0) / double(1 << 20);
  row.rss_mib = row.peak_rss_mib - row.baseline_rss_mib;
  if (!losses.empty()) {
    row.loss_first = losses.front();
    row.loss_last = losses.back();
  }
  if (int(step_ms.size()) != o.steps) row.error = "reported " + std::to_string(step_ms.size()) + " timed steps";
  return row;
}

std::string gemm_description(core::DType compute) {
  const cpu::CpuFeatures& feat = cpu::cpu_features();
  if (compute == core::DType::bf16)
    return feat.bf16 == cpu::Bf16Path::native ? "oneDNN bf16 (" + feat.bf16_reason + ")"
                                              : "widen to fp32, then " + std::string(cpu::f32_gemm_name(feat.f32_gemm));
  return std::string(cpu::f32_gemm_name(feat.f32_gemm)) + " fp32 (" + feat.f32_reason + ")";
}

json row_json(const Row& r) {
  json j = {{"name", r.name}, {"ok", r.ok()}, {"other_cpu_load_pct", r.others_pct}};
  if (!r.ok()) j["error"] = r.error;
  if (r.ok()) {
    j["tokens_per_s"] = r.tokens_per_s;
    j["ms_per_step"] = r.ms_per_step;
    j["gflops"] = r.gflops;
    j["pct_peak"] = r.pct_peak;  // of the peak pct_peak_of names (fp32, or bf16 for bf16 rows)
    j["rss_growth_mib"] = r.rss_mib;
    j["peak_rss_mib"] = r.peak_rss_mib;
    j["baseline_rss_mib"] = r.baseline_rss_mib;
    j["loss_first"] = r.loss_first;
    j["loss_last"] = r.loss_last;
    j["loss_fell"] = r.loss_last < r.loss_first;
  }
  if (!r.report.is_null()) j["report"] = r.report;
  return j;
}

namespace {

std::string peer_blas_line(const json& rep) {
  if (!rep.contains("blas")) return "?";
  const json& b = rep["blas"];
  std::string s = b.value("name", std::string("?"));
  if (b.contains("config") && !b["config"].get<std::string>().empty()) s += " [" + b["config"].get<std::string>() + "]";
  if (b.contains("mapped")) s += ", " + b["mapped"].get<std::string>();
  return s;
}

}  // namespace

// ---- the brisk side ---------------------------------------------------------------

void apply_variant(const std::string& variant, models::GptConfig& model, optim::AdamWConfig& adamw) {
  size_t pos = 0;
  while (pos < variant.size()) {
    size_t end = variant.find(',', pos);
    if (end == std::string::npos) end = variant.size();
    const std::string item = variant.substr(pos, end - pos);
    pos = end + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq), value = eq == std::string::npos ? "" : item.substr(eq + 1);
    auto flag = [&]() {
      if (value == "1" || value == "true") return true;
      if (value == "0" || value == "false") return false;
      throw core::ConfigError("variant: " + key + " takes 0 or 1, got '" + value + "'");
    };
    // A fusion mode (auto | on | off, checked by validate() below); 0 / 1 mean off / on.
    auto mode = [&]() -> std::string { return value == "1" ? "on" : value == "0" ? "off" : value; };
    if (key == "attention") model.attention = value;
    else if (key == "fused_classifier") model.fused_classifier = flag();
    else if (key == "fuse_bias_gelu") model.fuse_bias_gelu = flag();
    else if (key == "fuse_residual_layernorm") model.fuse_residual_layernorm = mode();
    else if (key == "fuse_layernorm_backward") model.fuse_layernorm_backward = mode();
    else if (key == "fuse_gelu_backward") model.fuse_gelu_backward = mode();
    else if (key == "fuse_bias_backward") model.fuse_bias_backward = mode();
    else if (key == "fuse_weight_casts") model.fuse_weight_casts = mode();
    else if (key == "fused_adamw") adamw.fused = flag();
    else if (key == "recompute") model.recompute = value;
    else if (key == "dropout" || key == "attention_dropout") {
      char* end = nullptr;
      (key == "dropout" ? model.dropout : model.attention_dropout) = std::strtof(value.c_str(), &end);
      if (value.empty() || *end != '\0')
        throw core::ConfigError("variant: " + key + " takes a number, got '" + value + "'");
    } else if (key == "precision") {
      if (value != "fp32" && value != "bf16")
        throw core::ConfigError("variant: precision takes fp32 or bf16, got '" + value + "'");
      model.compute = value == "bf16" ? core::DType::bf16 : core::DType::f32;
    } else {
      throw core::ConfigError("variant: unknown key '" + key +
                              "' (allowed: attention, fused_classifier, fuse_bias_gelu, fuse_residual_layernorm, "
                              "fuse_layernorm_backward, fuse_gelu_backward, fuse_bias_backward, fuse_weight_casts, fused_adamw, "
                              "recompute, dropout, attention_dropout, precision)");
    }
  }
  model.validate();
}

int run_train_worker(const TrainBenchOptions& options) {
  if (is_encoder_workload(options.workload)) return run_e1_worker(options);
  // Memory is reported as growth over this figure: the process before it
  // builds anything (the peer takes its own after importing torch).
  const size_t baseline_rss = monitor::current_rss_bytes();
  const TrainBenchOptions o = resolve_options(options);
  require_data(o);
  const models::GptConfig cfg = models::GptConfig::preset(o.workload);
  const int64_t B = o.batch, T = cfg.block_size;
  cpu::CpuBackend backend(o.threads);
  data::TokenDataset train_data(o.data_dir, "train");
  if (train_data.vocab_size() > cfg.vocab_size)
    throw core::ConfigError("data " + o.data_dir + " has vocab " + std::to_string(train_data.vocab_size()) +
                            " but workload " + o.workload + " has " + std::to_string(cfg.vocab_size) +
                            " (W1 wants --tokenizer gpt2 data, W2 --tokenizer bytes)");
  models::GptConfig mcfg = cfg;
  optim::AdamWConfig ac;  // docs/workloads.md: lr 6e-4, betas (0.9, 0.95), eps 1e-8, wd 0.1, clip 1.0
  apply_variant(o.variant, mcfg, ac);
  models::Gpt model(mcfg, backend);
  model.init_weights(o.seed);
  optim::AdamW adamw(ac, model.params(), backend);
  data::WindowSampler sampler(train_data, B, T, o.seed);
  // Build and plan outside the first step; the plan is the memory the run needs.
  core::MemoryReport planned = model.program(true, B, T).executor->plan().report;
  planned.optimizer_state = model.params().state_bytes();
  const std::string precision = mcfg.compute == core::DType::bf16 ? "bf16" : "fp32";

  const bool tty = isatty(STDERR_FILENO);
  const int total = o.warmup + o.steps;
  std::vector<int32_t> x(size_t(B * T)), y(x.size());
  std::vector<double> losses, step_ms;
  uint64_t data_hash = 0;  // the peer hashes its batches the same way: same data, same order
  for (int s = 0; s < total; ++s) {
    sampler.next(x.data(), y.data());
    uint64_t h = 0;
    for (size_t i = 0; i < x.size(); ++i) h += uint64_t(x[i]) * (i + 1);
    data_hash = data_hash * 1000003u + h;
    const double t0 = monitor::now_seconds();
    model.params().zero_grads();
    const double loss = model.train_micro_step(x.data(), y.data(), B, T, 1.0, models::dropout_key(o.seed, s, 0, 0));
    adamw.step(ac.lr);
    const double ms = (monitor::now_seconds() - t0) * 1e3;
    losses.push_back(loss);
    if (s >= o.warmup) step_ms.push_back(ms);
    const bool warm = s < o.warmup;
    if (tty) std::fprintf(stderr, "\r  brisk %-7s step %2d/%d%s loss %.4f  %7.1f ms   ", precision.c_str(), s + 1, total, warm ? " (warm-up)" : "          ", loss, ms);
    else if (s == 0 || s + 1 == o.warmup || (s + 1) % 5 == 0 || s + 1 == total)
      std::fprintf(stderr, "  brisk %-7s step %2d/%d%s loss %.4f  %7.1f ms\n", precision.c_str(), s + 1, total, warm ? " (warm-up)" : "", loss, ms);
  }
  if (tty) std::fprintf(stderr, "\n");

  json blas = {{"name", "OpenBLAS"}, {"mapped", mapped_blas()}, {"config", std::string(openblas_get_config())},
               {"core", std::string(openblas_get_corename())},
               {"threading", "called single-threaded from brisk's OpenMP team"}};
  const cpu::CpuFeatures& feat = cpu::cpu_features();
  const std::string path = mcfg.compute == core::DType::bf16 ? cpu::bf16_path_name(feat.bf16) : "fp32";
  const std::string gemm = gemm_description(mcfg.compute);
  json rep = {{"engine", "brisk"},
              {"precision", precision},
              {"precision_path", path},
              {"gemm", gemm},
              {"variant", o.variant},
              {"planned_bytes",
               {{"params", planned.params},
                {"grads", planned.grads},
                {"optimizer_state", planned.optimizer_state},
                {"arena", planned.arena},
                {"total", planned.total()}}},
              {"workload", o.workload},
              {"params", cfg.num_params()},
              {"batch", B},
              {"seq", T},
              {"threads", backend.num_threads()},
              {"warmup", o.warmup},
              {"steps", o.steps},
              {"step_ms", step_ms},
              {"losses", losses},
              {"data_hash", data_hash},
              // A second reading of the machine's peak, in another process at
              // another moment: the parent keeps the higher one, since other
              // tenants' load only ever lowers it.
              {"peak_fp32_gflops", monitor::peak_fp32_gflops(backend.num_threads(), 0.5)},
              {"peak_bf16_gflops", monitor::peak_bf16_gflops(backend.num_threads(), 0.5)},
              {"peak_rss_bytes", monitor::peak_rss_bytes()},
              {"baseline_rss_bytes", baseline_rss},
              {"blas", blas}};
  std::printf("%s\n", rep.dump().c_str());
  std::fflush(stdout);
  return 0;
}

// ---- the whole benchmark -----------------------------------------------------------

int run_train_bench(const TrainBenchOptions& options) {
  if (is_encoder_workload(options.workload)) return run_e1_bench(options);
  const TrainBenchOptions o = resolve_options(options);
  require_data(o);
  if (o.peer && !fs::exists(o.peer_script))
    throw core::IoError("PyTorch peer " + o.peer_script + " not found (run from the brisk checkout, or --no-peer)");
  if (o.peer && ::access(o.python.c_str(), X_OK) != 0)
    throw core::IoError("the peer's Python " + o.python + " is missing; the PyTorch peer needs Debian's python3-torch "
                        "(apt-get install python3-torch python3-numpy), or pass --python PATH, or --no-peer");
  const models::GptConfig cfg = models::GptConfig::preset(o.workload);
  const Workload w = workload_of(o.workload);
  const int64_t B = o.batch, T = cfg.block_size, tokens_per_step = B * T;
  const double fpt = cfg.flops_per_token(T);
  data::TokenDataset train_data(o.data_dir, "train");

  double peak = monitor::peak_fp32_gflops(o.threads, 0.5);
  const double peak_parent = peak;
  std::printf("brisk bench train: %s (%s) | %.2fM params | vocab %lld, %lld layers, %lld embd, %lld heads | batch %lld x "
              "seq %lld | median of %d steps after %d warm-up | %d threads\n",
              w.id.c_str(), w.name.c_str(), double(cfg.num_params()) / 1e6, (long long)cfg.vocab_size,
              (long long)cfg.n_layer, (long long)cfg.n_embd, (long long)cfg.n_head, (long long)B, (long long)T, o.steps,
              o.warmup, o.threads);
  std::printf("data:    %s (%s tokenizer, %lld train tokens); %.1f GFLOP per step (6N + 12LTC per token)\n",
              o.data_dir.c_str(), train_data.tokenizer().c_str(), (long long)train_data.size(),
              fpt * double(tokens_per_step) / 1e9);
  std::printf("optim:   AdamW lr 6e-4, betas (0.9, 0.95), eps 1e-8, wd 0.1 on 2-D weights, clip 1.0; timed: zero grads "
              "+ fwd/bwd + clip + AdamW\n\n");

  std::fflush(stdout);
  const std::string exe = self_exe();
  const std::vector<std::string> common = {"--workload", o.workload, "--steps", std::to_string(o.steps), "--warmup",
                                           std::to_string(o.warmup), "--threads", std::to_string(o.threads),
                                           "--seed", std::to_string(o.seed), "--data", o.data_dir};
  // ---- the sides: brisk fp32 [bf16], PyTorch fp32 [bf16]
  struct Side {
    std::string name;
    std::vector<std::string> argv;
    bool bf16 = false, brisk = false;
  };
  std::vector<Side> sides;
  for (bool bf16 : {false, true}) {
    if (bf16 && !o.peer_bf16) continue;
    std::vector<std::string> argv = {exe, "bench", "train", "--worker"};
    argv.insert(argv.end(), common.begin(), common.end());
    const std::string variant = o.variant + (bf16 ? std::string(o.variant.empty() ? "" : ",") + "precision=bf16" : "");
    if (!variant.empty()) argv.insert(argv.end(), {"--variant", variant});
    // A --variant row is not the fixed headline configuration: its name says so.
    sides.push_back({std::string(bf16 ? "brisk bf16" : "brisk fp32") + (o.variant.empty() ? "" : " *"), argv, bf16, true});
  }
  if (o.peer) {
    for (bool bf16 : {false, true}) {
      if (bf16 && !o.peer_bf16) continue;
      std::vector<std::string> argv = {o.python, o.peer_script, "--batch", std::to_string(B)};
      argv.insert(argv.end(), common.begin(), common.end());
      if (bf16) argv.push_back("--bf16");
      if (o.fix_blas) argv.push_back("--fix-blas");
      sides.push_back({bf16 ? "pytorch bf16" : "pytorch fp32", argv, bf16, false});
    }
  }
  // Interleaved rounds (A B C D, A B C D, ...): a slow spell of the machine
  // lands on every side alike, and each ratio is formed within one round.
  double peak_bf16 = monitor::peak_bf16_gflops(o.threads, 0.5);
  std::vector<double> peak_readings = {peak_parent};  // the peak is the largest of these
  std::vector<std::vector<Row>> runs(sides.size());  // [side][round]
  for (int r = 0; r < o.rounds; ++r) {
    if (o.rounds > 1) std::fprintf(stderr, "round %d/%d\n", r + 1, o.rounds);
    for (size_t i = 0; i < sides.size(); ++i) {
      const ChildResult c = run_child(sides[i].argv);
      if (sides[i].brisk) {
        if (auto rep = report_of(c.out); rep && rep->contains("peak_fp32_gflops")) {
          peak_readings.push_back((*rep)["peak_fp32_gflops"].get<double>());
          peak = std::max(peak, peak_readings.back());
          peak_bf16 = std::max(peak_bf16, rep->value("peak_bf16_gflops", 0.0));
        }
      }
      runs[i].push_back(make_row(sides[i].name, c, o, tokens_per_step, fpt, peak));
    }
  }
  // One row per side: the median over rounds of each round's median step.
  std::vector<Row> rows;
  std::vector<std::pair<double, double>> spread;  // tokens/s min, max over rounds
  for (size_t i = 0; i < sides.size(); ++i) {
    std::vector<double> ms, tps;
    Row row = runs[i].front();
    for (const Row& x : runs[i]) {
      if (!x.ok()) {
        row = x;
        break;
      }
      ms.push_back(x.ms_per_step);
      tps.push_back(x.tokens_per_s);
      row.keep_largest_growth(x);
      row.others_pct = std::max(row.others_pct, x.others_pct);
    }
    if (row.ok()) {
      row.ms_per_step = median(ms);
      row.tokens_per_s = double(tokens_per_step) / (row.ms_per_step / 1e3);
      row.gflops = row.tokens_per_s * fpt / 1e9;
      row.pct_peak = 100.0 * row.gflops / peak;
      spread.emplace_back(*std::min_element(tps.begin(), tps.end()), *std::max_element(tps.begin(), tps.end()));
    } else {
      spread.emplace_back(0, 0);
    }
    rows.push_back(row);
  }

  // ---- configuration of each side
  std::printf("\nmachine: %s, %ld online cores, fp32 peak %.1f GFLOP/s on %d threads (FMA loop, best of several "
              "readings), bf16 peak %s; CPU flags: %s\n",
              monitor::cpu_model().c_str(), sysconf(_SC_NPROCESSORS_ONLN), peak, o.threads,
              peak_bf16 > 0 ? (std::to_string(int(peak_bf16 + 0.5)) + " GFLOP/s (vdpbf16ps loop)").c_str()
                            : "- (no avx512_bf16)",
              monitor::cpu_flags().c_str());
  for (const Row& r : rows) {
    if (r.report.is_null()) continue;
    if (r.report.value("engine", "") == "brisk") {
      std::printf("%-13s brisk, %d threads, path %s; matrix products: %s; BLAS %s [%s]\n", r.name.c_str(),
                  r.report.value("threads", 0), r.report.value("precision_path", "?").c_str(),
                  r.report.value("gemm", "?").c_str(), r.report["blas"].value("mapped", "?").c_str(),
                  r.report["blas"].value("config", "?").c_str());
    } else {
      std::printf("%-13s torch %s (%s), %d threads, CPU capability %s; BLAS %s\n", r.name.c_str(),
                  r.report.value("torch", "?").c_str(), r.report.value("python", "?").c_str(),
                  r.report.value("threads", 0), r.report.value("cpu_capability", "?").c_str(),
                  peer_blas_line(r.report).c_str());
      if (rows[0].report.contains("data_hash") && r.report.contains("data_hash"))
        std::printf("%-13s same batches as brisk: %s\n", "",
                    rows[0].report["data_hash"] == r.report["data_hash"] ? "yes" : "NO (the samplers differ)");
      if (r.report.contains("params") && r.report["params"].get<int64_t>() != cfg.num_params())
        std::printf("%-13s WARNING: %lld parameters, brisk has %lld: the models differ\n", "",
                    (long long)r.report["params"].get<int64_t>(), (long long)cfg.num_params());
    }
  }

  // ---- the table
  std::printf("\n%d round%s, interleaved; tokens/s is the median over rounds of each round's median step (min-max "
              "over rounds); RSS growth is each process's peak RSS over its own baseline (brisk: before building "
              "anything; PyTorch: after importing torch), the largest over rounds\n",
              o.rounds, o.rounds == 1 ? "" : "s");
  std::printf("%-13s %10s %15s %9s %8s %10s %15s %18s\n", "", "tokens/s", "min-max", "ms/step", "GFLOP/s",
              "% peak", "RSS growth MiB", "loss first->last");
  bool all_ok = true;
  for (size_t i = 0; i < rows.size(); ++i) {
    Row& r = rows[i];
    if (!r.ok()) {
      std::printf("%-13s FAILED: %s\n", r.name.c_str(), r.error.c_str());
      all_ok = false;
      continue;
    }
    // % of the peak of the precision the products ran in (bf16 dot products
    // for bf16 rows where the CPU has them).
    const double pk = sides[i].bf16 && peak_bf16 > 0 ? peak_bf16 : peak;
    r.pct_peak = 100.0 * r.gflops / pk;
    const bool fell = r.loss_last < r.loss_first;
    all_ok = all_ok && fell;
    char range[40];
    std::snprintf(range, sizeof range, "%.0f-%.0f", spread[i].first, spread[i].second);
    std::printf("%-13s %10.0f %15s %9.1f %8.1f %5.1f%% %-4s %15.0f %8.3f -> %.3f%s\n", r.name.c_str(), r.tokens_per_s,
                range, r.ms_per_step, r.gflops, r.pct_peak, sides[i].bf16 && peak_bf16 > 0 ? "bf16" : "fp32",
                r.rss_mib, r.loss_first, r.loss_last, fell ? "" : "  (did not fall!)");
  }
  if (!o.variant.empty()) std::printf("* brisk with --variant %s, not the default configuration\n", o.variant.c_str());
  // Others' work on the same cores during each side: the ratio is only as
  // good as this is small.
  std::string load;
  double worst = 0;
  for (const Row& r : rows) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s%s %.0f%%", load.empty() ? "" : ", ", r.name.c_str(), r.others_pct);
    load += buf;
    worst = std::max(worst, r.others_pct);
  }
  std::printf("CPU load from other processes while each side ran (worst round): %s%s\n", load.c_str(),
              worst > 10 ? "  (a busy machine: the timings are noisy, re-run when it is idle)" : "");
  // Ratios formed within each round, then their median and range.
  json ratios = json::object(), ratio_spread = json::object();
  for (size_t i = 0; i < sides.size(); ++i) {
    if (!sides[i].brisk || !rows[i].ok()) continue;
    for (size_t j = 0; j < sides.size(); ++j) {
      if (sides[j].brisk || !rows[j].ok()) continue;
      std::vector<double> per_round;
      for (int r = 0; r < o.rounds; ++r) per_round.push_back(runs[i][size_t(r)].tokens_per_s / runs[j][size_t(r)].tokens_per_s);
      const double med = median(per_round);
      const auto [lo, hi] = std::minmax_element(per_round.begin(), per_round.end());
      const std::string key = rows[i].name + "/" + rows[j].name;
      ratios[key] = med;
      ratio_spread[key] = {*lo, *hi};
      std::printf("ratio %-12s / %-12s (tokens/s): %.2fx (rounds %.2f-%.2f)\n", rows[i].name.c_str(),
                  rows[j].name.c_str(), med, *lo, *hi);
    }
  }

  // ---- the JSON report
  json out = {{"bench", "train"},
              {"workload", w.id},
              {"variant", o.variant},
              {"workload_name", w.name},
              {"time", now_iso()},
              {"model",
               {{"vocab_size", cfg.vocab_size},
                {"n_layer", cfg.n_layer},
                {"n_embd", cfg.n_embd},
                {"n_head", cfg.n_head},
                {"block_size", cfg.block_size},
                {"params", cfg.num_params()},
                {"flops_per_token", fpt}}},
              {"batch", B},
              {"seq", T},
              {"steps", o.steps},
              {"warmup", o.warmup},
              {"threads", o.threads},
              {"data", o.data_dir},
              {"machine",
               {{"cpu", monitor::cpu_model()},
                {"online_cores", sysconf(_SC_NPROCESSORS_ONLN)},
                {"peak_fp32_gflops", peak},
                {"peak_fp32_gflops_readings", peak_readings}}},
              {"rounds", o.rounds},
              {"ratio_tokens_per_s", ratios},
              {"ratio_tokens_per_s_range", ratio_spread}};
  out["machine"]["peak_bf16_gflops"] = peak_bf16;
  out["machine"]["cpu_flags"] = monitor::cpu_flags();
  for (size_t i = 0; i < rows.size(); ++i) {
    json j = row_json(rows[i]);
    j["tokens_per_s_range"] = {spread[i].first, spread[i].second};
    j["precision_path"] = rows[i].report.value("precision_path", sides[i].bf16 ? "bf16" : "fp32");
    j["pct_peak_of"] = sides[i].bf16 && peak_bf16 > 0 ? "bf16" : "fp32";
    j["rounds"] = json::array();
    for (const Row& x : runs[i]) j["rounds"].push_back({{"ok", x.ok()}, {"tokens_per_s", x.tokens_per_s},
                                                        {"ms_per_step", x.ms_per_step}, {"rss_growth_mib", x.rss_mib}});
    out["rows"].push_back(j);
  }
  const fs::path jp(o.json_path);
  if (jp.has_parent_path()) fs::create_directories(jp.parent_path());
  core::write_file_atomic(o.json_path, out.dump(2) + "\n");
  std::printf("\nwrote %s\n", o.json_path.c_str());
  return all_ok ? 0 : 1;
}

}  // namespace brisk::bench
