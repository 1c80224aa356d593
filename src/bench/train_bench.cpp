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

#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
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
#include "brisk/data/shards.h"
#include "brisk/models/gpt.h"
#include "brisk/monitor/machine.h"
#include "brisk/optim/optimizer.h"

extern char** environ;
// OpenBLAS's own description of itself (version, build options, core kernel).
extern "C" char* openblas_get_config();
extern "C" char* openblas_get_corename();

namespace brisk::bench {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string self_exe() {
  std::error_code ec;
  fs::path p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("brisk") : p.string();
}

// The checkout this binary belongs to: the first directory, walking up from
// the working directory and then from the executable, that holds
// bench/torch_peer.py. Defaults (data, peer script, results) hang off it, so
// `brisk bench` works from the repository root and from build/<dir> alike.
fs::path repo_root() {
  auto walk = [](fs::path p) -> std::optional<fs::path> {
    for (; !p.empty(); p = p.parent_path()) {
      if (fs::exists(p / "bench" / "torch_peer.py")) return p;
      if (p == p.parent_path()) break;
    }
    return std::nullopt;
  };
  std::error_code ec;
  if (auto r = walk(fs::current_path(ec)); r) return *r;
  if (auto r = walk(fs::path(self_exe()).parent_path()); r) return *r;
  return fs::current_path(ec);
}

// Shows a path relative to the working directory when it lies below it.
std::string shown(const fs::path& p) {
  std::error_code ec;
  fs::path rel = fs::relative(p, fs::current_path(ec), ec);
  if (ec || rel.empty() || *rel.begin() == "..") return p.string();
  return rel.string();
}

struct Workload {
  std::string id, name, tokenizer, data_dir;
};

Workload workload_of(const std::string& id) {
  if (id == "W1" || id == "gpt2-tiny") return {"W1", "gpt2-tiny", "gpt2", "data/kjv-gpt2"};
  if (id == "W2" || id == "char-small") return {"W2", "char-small", "bytes", "data/kjv-bytes"};
  throw core::ConfigError("unknown training workload '" + id +
                          "' (allowed on CPU: W1 / gpt2-tiny, W2 / char-small; see WORKLOADS.md)");
}

// The options with every default filled in.
TrainBenchOptions resolved(TrainBenchOptions o) {
  const Workload w = workload_of(o.workload);
  o.workload = w.id;
  const fs::path root = repo_root();
  if (o.data_dir.empty()) o.data_dir = shown(root / w.data_dir);
  if (o.json_path.empty()) o.json_path = shown(root / "bench" / "results" / ("train_" + w.id + ".json"));
  if (o.peer_script.empty()) o.peer_script = shown(root / "bench" / "torch_peer.py");
  if (o.steps < 1) throw core::ConfigError("--steps must be at least 1, got " + std::to_string(o.steps));
  if (o.warmup < 0) throw core::ConfigError("--warmup must be 0 or more, got " + std::to_string(o.warmup));
  if (o.threads < 1) throw core::ConfigError("--threads must be at least 1, got " + std::to_string(o.threads));
  return o;
}

// Missing data is the one failure every first run meets: name the commands.
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

// ---- child processes ------------------------------------------------------------

struct ChildResult {
  int exit_code = -1;     // -1: did not exit normally
  std::string signal;     // set when killed by a signal
  std::string out;        // everything it wrote on stdout
  double maxrss_mib = 0;  // the kernel's high-water mark for it
  double others_pct = -1; // share of the machine's CPU time others used meanwhile
};

// The machine's CPU time so far, busy and total, in clock ticks (/proc/stat's
// first line). In a VM or container it counts everyone's work, which is the
// point: other tenants on our two cores are the main source of noise.
std::pair<double, double> machine_cpu_ticks() {
  std::ifstream f("/proc/stat");
  std::string cpu;
  double user = 0, nice = 0, sys = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  f >> cpu >> user >> nice >> sys >> idle >> iowait >> irq >> softirq >> steal;
  const double busy = user + nice + sys + irq + softirq + steal;
  return {busy, busy + idle + iowait};
}

// Runs argv[0] with stdout captured and stderr passed through (progress).
ChildResult run_child(const std::vector<std::string>& argv) {
  int fds[2];
  if (::pipe(fds) != 0) throw core::Error(std::string("pipe: ") + std::strerror(errno));
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  posix_spawn_file_actions_addclose(&fa, fds[1]);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  const auto [busy0, total0] = machine_cpu_ticks();
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, argv[0].c_str(), &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    throw core::Error("cannot start " + argv[0] + ": " + std::strerror(rc));
  }
  ChildResult r;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n > 0) r.out.append(buf, size_t(n));
    else if (n < 0 && errno == EINTR) continue;
    else break;
  }
  ::close(fds[0]);
  int status = 0;
  struct rusage ru {};
  while (::wait4(pid, &status, 0, &ru) < 0 && errno == EINTR) {
  }
  r.maxrss_mib = double(ru.ru_maxrss) / 1024.0;  // KiB on Linux
  const auto [busy1, total1] = machine_cpu_ticks();
  const double child_ticks = (double(ru.ru_utime.tv_sec) + double(ru.ru_utime.tv_usec) * 1e-6 +
                              double(ru.ru_stime.tv_sec) + double(ru.ru_stime.tv_usec) * 1e-6) *
                             double(sysconf(_SC_CLK_TCK));
  if (total1 > total0) r.others_pct = std::max(0.0, 100.0 * (busy1 - busy0 - child_ticks) / (total1 - total0));
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  else if (WIFSIGNALED(status)) r.signal = strsignal(WTERMSIG(status));
  return r;
}

// The last stdout line that parses as a JSON object: the child's report.
std::optional<json> report_of(const std::string& out) {
  size_t end = out.size();
  while (end > 0) {
    size_t begin = out.rfind('\n', end - 1);
    begin = begin == std::string::npos ? 0 : begin + 1;
    const std::string line = out.substr(begin, end - begin);
    if (!line.empty() && line[0] == '{') {
      json j = json::parse(line, nullptr, false);
      if (!j.is_discarded() && j.is_object()) return j;
    }
    if (begin == 0) break;
    end = begin - 1;
  }
  return std::nullopt;
}

// ---- the table ------------------------------------------------------------------

struct Row {
  std::string name;
  json report;        // the side's own JSON (empty when it failed)
  std::string error;  // why there are no numbers
  double tokens_per_s = 0, ms_per_step = 0, gflops = 0, pct_peak = 0, rss_mib = 0;
  double loss_first = 0, loss_last = 0;
  double others_pct = -1;
  bool ok() const { return error.empty(); }
};

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
  // wait4 figure is the fallback and the same number in practice.
  const double self_rss = row.report.value("peak_rss_bytes", 0.0) / double(1 << 20);
  row.rss_mib = self_rss > 0 ? self_rss : c.maxrss_mib;
  if (!losses.empty()) {
    row.loss_first = losses.front();
    row.loss_last = losses.back();
  }
  if (int(step_ms.size()) != o.steps) row.error = "reported " + std::to_string(step_ms.size()) + " timed steps";
  return row;
}

json row_json(const Row& r) {
  json j = {{"name", r.name}, {"ok", r.ok()}, {"other_cpu_load_pct", r.others_pct}};
  if (!r.ok()) j["error"] = r.error;
  if (r.ok()) {
    j["tokens_per_s"] = r.tokens_per_s;
    j["ms_per_step"] = r.ms_per_step;
    j["gflops"] = r.gflops;
    j["pct_fp32_peak"] = r.pct_peak;
    j["peak_rss_mib"] = r.rss_mib;
    j["loss_first"] = r.loss_first;
    j["loss_last"] = r.loss_last;
    j["loss_fell"] = r.loss_last < r.loss_first;
  }
  if (!r.report.is_null()) j["report"] = r.report;
  return j;
}

std::string now_iso() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

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

int run_train_worker(const TrainBenchOptions& options) {
  const TrainBenchOptions o = resolved(options);
  require_data(o);
  const models::GptConfig cfg = models::GptConfig::preset(o.workload);
  const int64_t B = o.batch, T = cfg.block_size;
  cpu::CpuBackend backend(o.threads);
  data::TokenDataset train_data(o.data_dir, "train");
  if (train_data.vocab_size() > cfg.vocab_size)
    throw core::ConfigError("data " + o.data_dir + " has vocab " + std::to_string(train_data.vocab_size()) +
                            " but workload " + o.workload + " has " + std::to_string(cfg.vocab_size) +
                            " (W1 wants --tokenizer gpt2 data, W2 --tokenizer bytes)");
  models::Gpt model(cfg, backend);
  model.init_weights(o.seed);
  const optim::AdamWConfig ac;  // WORKLOADS.md: lr 6e-4, betas (0.9, 0.95), eps 1e-8, wd 0.1, clip 1.0
  optim::AdamW adamw(ac, model.params(), backend);
  data::WindowSampler sampler(train_data, B, T, o.seed);
  model.program(true, B, T);  // build and plan outside the first step

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
    const double loss = model.train_micro_step(x.data(), y.data(), B, T);
    adamw.step(ac.lr);
    const double ms = (monitor::now_seconds() - t0) * 1e3;
    losses.push_back(loss);
    if (s >= o.warmup) step_ms.push_back(ms);
    const bool warm = s < o.warmup;
    if (tty) std::fprintf(stderr, "\r  brisk fp32    step %2d/%d%s loss %.4f  %7.1f ms   ", s + 1, total, warm ? " (warm-up)" : "          ", loss, ms);
    else if (s == 0 || s + 1 == o.warmup || (s + 1) % 5 == 0 || s + 1 == total)
      std::fprintf(stderr, "  brisk fp32    step %2d/%d%s loss %.4f  %7.1f ms\n", s + 1, total, warm ? " (warm-up)" : "", loss, ms);
  }
  if (tty) std::fprintf(stderr, "\n");

  json blas = {{"name", "OpenBLAS"}, {"mapped", mapped_blas()}, {"config", std::string(openblas_get_config())},
               {"core", std::string(openblas_get_corename())},
               {"threading", "called single-threaded from brisk's OpenMP team"}};
  json rep = {{"engine", "brisk"},
              {"precision", "fp32"},
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
              {"peak_rss_bytes", monitor::peak_rss_bytes()},
              {"blas", blas}};
  std::printf("%s\n", rep.dump().c_str());
  std::fflush(stdout);
  return 0;
}

// ---- the whole benchmark -----------------------------------------------------------

int run_train_bench(const TrainBenchOptions& options) {
  const TrainBenchOptions o = resolved(options);
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
  std::vector<Row> rows;
  {
    std::vector<std::string> argv = {exe, "bench", "train", "--worker"};
    argv.insert(argv.end(), common.begin(), common.end());
    const ChildResult c = run_child(argv);
    if (auto rep = report_of(c.out); rep && rep->contains("peak_fp32_gflops"))
      peak = std::max(peak, (*rep)["peak_fp32_gflops"].get<double>());
    rows.push_back(make_row("brisk fp32", c, o, tokens_per_step, fpt, peak));
  }
  if (o.peer) {
    for (bool bf16 : {false, true}) {
      if (bf16 && !o.peer_bf16) continue;
      std::vector<std::string> argv = {o.python, o.peer_script, "--batch", std::to_string(B)};
      argv.insert(argv.end(), common.begin(), common.end());
      if (bf16) argv.push_back("--bf16");
      if (o.fix_blas) argv.push_back("--fix-blas");
      rows.push_back(make_row(bf16 ? "pytorch bf16" : "pytorch fp32", run_child(argv), o, tokens_per_step, fpt, peak));
    }
  }

  // ---- configuration of each side
  std::printf("\nmachine: %s, %ld online cores, fp32 peak %.1f GFLOP/s on %d threads (FMA loop, best of two "
              "readings: %.1f and %.1f)\n",
              monitor::cpu_model().c_str(), sysconf(_SC_NPROCESSORS_ONLN), peak, o.threads, peak_parent,
              rows[0].report.value("peak_fp32_gflops", 0.0));
  for (const Row& r : rows) {
    if (r.report.is_null()) continue;
    if (r.report.value("engine", "") == "brisk") {
      std::printf("%-13s brisk, %d threads; BLAS %s [%s], %s\n", r.name.c_str(), r.report.value("threads", 0),
                  r.report["blas"].value("mapped", "?").c_str(), r.report["blas"].value("config", "?").c_str(),
                  r.report["blas"].value("threading", "").c_str());
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
  std::printf("\n%-13s %10s %9s %8s %12s %13s %18s\n", "", "tokens/s", "ms/step", "GFLOP/s", "% fp32 peak",
              "peak RSS MiB", "loss first->last");
  bool all_ok = true;
  for (const Row& r : rows) {
    if (!r.ok()) {
      std::printf("%-13s FAILED: %s\n", r.name.c_str(), r.error.c_str());
      all_ok = false;
      continue;
    }
    const bool fell = r.loss_last < r.loss_first;
    all_ok = all_ok && fell;
    std::printf("%-13s %10.0f %9.1f %8.1f %11.1f%% %13.0f %8.3f -> %.3f%s\n", r.name.c_str(), r.tokens_per_s,
                r.ms_per_step, r.gflops, r.pct_peak, r.rss_mib, r.loss_first, r.loss_last, fell ? "" : "  (did not fall!)");
  }
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
  std::printf("CPU load from other processes while each side ran: %s%s\n", load.c_str(),
              worst > 10 ? "  (a busy machine: the timings are noisy, re-run when it is idle)" : "");
  json ratios = json::object();
  if (rows[0].ok()) {
    for (size_t i = 1; i < rows.size(); ++i) {
      if (!rows[i].ok()) continue;
      const double ratio = rows[0].tokens_per_s / rows[i].tokens_per_s;
      ratios["brisk/" + rows[i].name] = ratio;
      std::printf("ratio brisk fp32 / %-12s (tokens/s): %.2fx\n", rows[i].name.c_str(), ratio);
    }
  }

  // ---- the JSON report
  json out = {{"bench", "train"},
              {"workload", w.id},
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
                {"peak_fp32_gflops_readings", {peak_parent, rows[0].report.value("peak_fp32_gflops", 0.0)}}}},
              {"ratio_tokens_per_s", ratios}};
  for (const Row& r : rows) out["rows"].push_back(row_json(r));
  const fs::path jp(o.json_path);
  if (jp.has_parent_path()) fs::create_directories(jp.parent_path());
  core::write_file_atomic(o.json_path, out.dump(2) + "\n");
  std::printf("\nwrote %s\n", o.json_path.c_str());
  return all_ok ? 0 : 1;
}

}  // namespace brisk::bench
