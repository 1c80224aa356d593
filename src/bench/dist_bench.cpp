// The data-parallel benchmark (dist_bench.h): one process against --np
// processes under mpirun, the same workload on the same global batch.
//
// Why it is built this way:
// - Each run is a real `brisk train` child (this executable), A started
//   directly and B through mpirun, with only train.steps, train.threads,
//   checkpoint.dir, checkpoint.every = 0 and train.eval_every = 0 set on top
//   of the workload's config (and dist.zero for B): what is measured is what
//   a user runs. checkpoint.every = 0 still writes the final checkpoint after
//   the last step; it lies outside the timed steps, as does evaluation, which
//   eval_every = 0 turns off.
// - The numbers come from rank 0's metrics.jsonl, not from wall time: process
//   start-up, MPI wire-up and the first --warmup-steps steps (page faults,
//   buffer growth) are not training speed. Per run: the median ms_per_step of
//   the counted steps; tokens/s = the global tokens of a step / that median;
//   for B the medians of comm_ms, comm_exposed_ms and comm_hidden_ms.
// - Rounds interleave the configurations and alternate which goes first
//   (A B, B A, ...), so a slow phase of the machine (other tenants on its
//   cores) lands on both and neither always runs on a cold or warm machine.
//   The ratio B/A is formed within each round, then its median and range.
// - Both configurations use the same number of threads in all: on one
//   machine B splits the cores between ranks and pays for the collectives on
//   top, so what this shows is the overhead and how well backward hides it,
//   not a scaling gain.
#include "brisk/bench/dist_bench.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "brisk/core/error.h"
#include "brisk/core/safetensors.h"
#include "brisk/monitor/machine.h"
#include "brisk/train/config.h"
#include "bench_util.h"

extern char** environ;

namespace brisk::bench {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The mpirun to use: a path as given, or a bare name looked up on PATH.
std::string find_mpirun(const std::string& given) {
  auto usable = [](const std::string& p) { return ::access(p.c_str(), X_OK) == 0 && !fs::is_directory(p); };
  if (given.find('/') != std::string::npos) return usable(given) ? given : "";
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "";
  for (size_t at = 0; at <= dirs.size();) {
    size_t end = dirs.find(':', at);
    if (end == std::string::npos) end = dirs.size();
    const std::string dir = dirs.substr(at, end - at);
    if (!dir.empty() && usable(dir + "/" + given)) return dir + "/" + given;
    at = end + 1;
  }
  return "";
}

// The last `n` lines of a file.
std::string tail_lines(const std::string& path, int n) {
  std::ifstream in(path, std::ios::binary);
  std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  size_t at = text.size();
  for (int i = 0; i < n && at != std::string::npos && at > 0; ++i) at = text.rfind('\n', at - 1);
  return at == std::string::npos ? text : text.substr(at + 1);
}

std::string command_line(const std::vector<std::string>& argv) {
  std::string s;
  for (const auto& a : argv) s += (s.empty() ? "" : " ") + a;
  return s;
}

struct Exit {
  int code = -1;       // -1: did not exit normally
  std::string signal;  // set when killed by a signal
  double others_pct = -1;  // others' share of the machine's CPU time meanwhile
};

// Runs argv with stdout and stderr into files (nothing to drain, however
// much a child says), stdin from /dev/null.
Exit spawn_and_wait(const std::vector<std::string>& argv, const std::string& out_path, const std::string& err_path) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  const auto [busy0, total0] = machine_cpu_ticks();
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, argv[0].c_str(), &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) throw core::Error("bench dist: cannot start " + argv[0] + ": " + std::strerror(rc));
  int status = 0;
  struct rusage ru {};
  while (::wait4(pid, &status, 0, &ru) < 0 && errno == EINTR) {
  }
  Exit e;
  // wait4's usage includes the child's waited-for descendants: mpirun's ranks.
  const auto [busy1, total1] = machine_cpu_ticks();
  const double child_ticks = (double(ru.ru_utime.tv_sec) + double(ru.ru_utime.tv_usec) * 1e-6 +
                              double(ru.ru_stime.tv_sec) + double(ru.ru_stime.tv_usec) * 1e-6) *
                             double(sysconf(_SC_CLK_TCK));
  if (total1 > total0) e.others_pct = std::max(0.0, 100.0 * (busy1 - busy0 - child_ticks) / (total1 - total0));
  if (WIFEXITED(status)) e.code = WEXITSTATUS(status);
  else if (WIFSIGNALED(status)) e.signal = strsignal(WTERMSIG(status));
  return e;
}

// One configuration of the comparison.
struct Setup {
  std::string key;   // "single" | "multi"
  std::string name;  // "1 process x 2 threads"
  int processes = 1, threads_each = 1;
};

// One run's figures (medians over its counted steps).
struct Run {
  int64_t counted_steps = 0;
  double ms_per_step = 0, tokens_per_s = 0, last_loss = 0, wall_s = 0, others_pct = -1;
  int world = 1;
  double comm_ms = 0, exposed_ms = 0, hidden_ms = 0;  // medians; 0 for one process
  double comm_share() const { return ms_per_step > 0 ? comm_ms / ms_per_step : 0; }
  double exposed_share() const { return ms_per_step > 0 ? exposed_ms / ms_per_step : 0; }
  double hidden_fraction() const { return comm_ms > 0 ? std::clamp(hidden_ms / comm_ms, 0.0, 1.0) : 0; }
};

json run_json(const Run& r, const Setup& s) {
  json j = {{"name", s.name},
            {"processes", s.processes},
            {"threads_per_process", s.threads_each},
            {"counted_steps", r.counted_steps},
            {"ms_per_step", r.ms_per_step},
            {"tokens_per_s", r.tokens_per_s},
            {"last_loss", r.last_loss},
            {"wall_s", r.wall_s},
            {"others_cpu_pct", r.others_pct}};
  if (s.processes > 1) {
    j["world"] = r.world;
    j["comm_ms"] = r.comm_ms;
    j["comm_exposed_ms"] = r.exposed_ms;
    j["comm_hidden_ms"] = r.hidden_ms;
    j["comm_share"] = r.comm_share();
    j["exposed_share"] = r.exposed_share();
    j["hidden_fraction"] = r.hidden_fraction();
  }
  return j;
}

// Reads rank 0's metrics.jsonl of a finished run.
Run figures_of(const std::string& metrics_path, const Setup& s, int64_t warmup, int64_t tokens_per_step,
               const std::string& what) {
  std::ifstream in(metrics_path);
  if (!in) throw core::IoError("bench dist: " + what + " wrote no " + metrics_path);
  std::vector<double> ms, comm, exposed, hidden;
  Run r;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    const json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("step") || !j.contains("ms_per_step"))
      throw core::IoError("bench dist: " + metrics_path + ": a row that is not a metrics object: " + line.substr(0, 200));
    if (j.at("step").get<int64_t>() <= warmup) continue;
    ms.push_back(j.at("ms_per_step").get<double>());
    r.last_loss = j.value("loss", 0.0);
    if (s.processes > 1) {
      if (!j.contains("comm_ms") || !j.contains("comm_exposed_ms"))
        throw core::IoError("bench dist: " + what + " wrote no comm_ms / comm_exposed_ms in " + metrics_path +
                            ": it did not train as " + std::to_string(s.processes) +
                            " ranks (does mpirun start brisk as an MPI job here?)");
      r.world = j.value("world", 1);
      comm.push_back(j.at("comm_ms").get<double>());
      exposed.push_back(j.at("comm_exposed_ms").get<double>());
      hidden.push_back(j.value("comm_hidden_ms", std::max(0.0, comm.back() - exposed.back())));
    }
  }
  if (ms.empty())
    throw core::IoError("bench dist: " + what + ": " + metrics_path + " has no step after the " +
                        std::to_string(warmup) + " warm-up steps");
  if (s.processes > 1 && r.world != s.processes)
    throw core::IoError("bench dist: " + what + " trained as " + std::to_string(r.world) + " ranks, not " +
                        std::to_string(s.processes));
  r.counted_steps = int64_t(ms.size());
  r.ms_per_step = median(ms);
  r.tokens_per_s = r.ms_per_step > 0 ? 1e3 * double(tokens_per_step) / r.ms_per_step : 0;
  r.comm_ms = median(comm);
  r.exposed_ms = median(exposed);
  r.hidden_ms = median(hidden);
  return r;
}

// Removes the run directories however the benchmark ends.
struct Scratch {
  fs::path dir;
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

std::string range(const std::vector<double>& v, const char* fmt) {
  if (v.empty()) return "-";
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  char m[32], a[32], b[32], buf[112];
  std::snprintf(m, sizeof m, fmt, median(v));
  std::snprintf(a, sizeof a, fmt, *lo);
  std::snprintf(b, sizeof b, fmt, *hi);
  std::snprintf(buf, sizeof buf, "%s [%s-%s]", m, a, b);
  return buf;
}

json spread_json(const std::vector<double>& v) {
  if (v.empty()) return nullptr;
  return {{"median", median(v)},
          {"min", *std::min_element(v.begin(), v.end())},
          {"max", *std::max_element(v.begin(), v.end())}};
}

std::vector<double> scaled(std::vector<double> v, double k) {
  for (double& x : v) x *= k;
  return v;
}

}  // namespace

int run_dist_bench(const DistBenchOptions& options) {
  DistBenchOptions o = options;
  if (o.workload == "gpt2-tiny") o.workload = "W1";
  if (o.workload == "char-small") o.workload = "W2";
  if (o.workload != "W1" && o.workload != "W2")
    throw core::ConfigError("--workload: unknown value '" + o.workload + "' (allowed: W1, W2)");
  if (o.rounds < 1) throw core::ConfigError("--rounds must be at least 1, got " + std::to_string(o.rounds));
  if (o.warmup_steps < 0) throw core::ConfigError("--warmup-steps must be 0 or more");
  if (o.steps <= o.warmup_steps)
    throw core::ConfigError("--steps (" + std::to_string(o.steps) + ") must exceed --warmup-steps (" +
                            std::to_string(o.warmup_steps) + "): the steps after the warm-up are the ones measured");
  if (o.np < 2) throw core::ConfigError("--np must be at least 2, got " + std::to_string(o.np));
  if (o.threads < 1) throw core::ConfigError("--threads must be at least 1");
  if (o.threads % o.np != 0)
    throw core::ConfigError("--threads (" + std::to_string(o.threads) + ") must be a multiple of --np (" +
                            std::to_string(o.np) + "): both configurations use the same threads in all, the " +
                            std::to_string(o.np) + " processes --threads / --np each");
  if (o.zero != 0 && o.zero != 1) throw core::ConfigError("--zero must be 0 or 1, got " + std::to_string(o.zero));

  const std::string mpirun = find_mpirun(o.mpirun);
  if (mpirun.empty())
    throw core::Error("bench dist: no mpirun at " + o.mpirun +
                      ": install Open MPI (apt-get install openmpi-bin, which `bash scripts/install_deps.sh` does), "
                      "or point --mpirun at one");

  const fs::path root = repo_root();
  const std::string lower = o.workload == "W1" ? "w1" : "w2";
  if (o.config.empty()) o.config = (root / "configs" / (lower + ".toml")).string();
  if (!fs::exists(o.config)) throw core::IoError("bench dist: no config " + o.config + " (--config)");
  if (o.json_path.empty()) o.json_path = (root / "bench" / "results" / ("dist_" + o.workload + ".json")).string();

  // The config as the runs will see it: the global batch, and the data the
  // children must find wherever they run from.
  train::TrainConfig cfg = train::load_train_config(
      o.config, {"train.steps=" + std::to_string(o.steps), "train.threads=" + std::to_string(o.threads),
                 "train.eval_every=0", "checkpoint.every=0"});
  if (fs::path(cfg.data_dir).is_relative() && !fs::exists(cfg.data_dir)) cfg.data_dir = (root / cfg.data_dir).string();
  if (!fs::exists(fs::path(cfg.data_dir) / "meta.json")) {
    std::string msg = "bench dist: dataset " + cfg.data_dir + " (from " + o.config + ") does not exist. ";
    if (!fs::exists(root / "data" / "raw" / "kjv.txt"))
      msg += "Run `make data` (bash scripts/fetch_data.sh writes data/raw/kjv.txt), then ";
    else
      msg += "Create it with ";
    msg += "`" + self_exe() + " data prepare --input " + shown(root / "data" / "raw" / "kjv.txt") + " --tokenizer " +
           (cfg.model.vocab_size <= 256 ? "bytes" : "gpt2") + " --out " + cfg.data_dir + "` (or `make datasets`)";
    throw core::IoError(msg);
  }
  const std::string data_dir = fs::absolute(cfg.data_dir).string();
  if (cfg.batch % o.np != 0)
    throw core::ConfigError("bench dist: train.batch = " + std::to_string(cfg.batch) + " (from " + o.config +
                            ") does not split over " + std::to_string(o.np) +
                            " processes: the global batch must be a multiple of --np");
  const int64_t tokens_per_step = cfg.batch * cfg.seq * cfg.grad_accum;
  const int per_rank = o.threads / o.np;

  // mpirun as this machine needs it: shared memory between the ranks, as
  // root too (containers), more ranks than cores allowed, no pinning (the
  // ranks' threads share the cores as the single process's do).
  ::setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
  ::setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  const std::vector<std::string> mpi_args = {"-np", std::to_string(o.np), "--oversubscribe", "--bind-to", "none",
                                             "--mca", "btl", "self,vader", "--mca",
                                             "btl_vader_single_copy_mechanism", "none"};

  const Setup setups[2] = {
      {"single", "1 process x " + std::to_string(o.threads) + " thread" + (o.threads == 1 ? "" : "s"), 1, o.threads},
      {"multi", std::to_string(o.np) + " processes x " + std::to_string(per_rank) + " thread" + (per_rank == 1 ? "" : "s"),
       o.np, per_rank}};

  Scratch scratch{fs::temp_directory_path() / ("brisk_dist_bench_" + std::to_string(::getpid()))};
  fs::remove_all(scratch.dir);
  fs::create_directories(scratch.dir);

  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  std::printf("brisk bench dist: %s (%s), global batch %lld x seq %lld x accum %lld = %lld tokens/step, %lld steps "
              "per run (the first %lld not counted), %d round%s, ZeRO-%d\n"
              "machine: %s, %ld online cores; the %d-process run shares these same cores (%s vs %s)\n",
              o.workload.c_str(), shown(o.config).c_str(), (long long)cfg.batch, (long long)cfg.seq,
              (long long)cfg.grad_accum, (long long)tokens_per_step, (long long)o.steps, (long long)o.warmup_steps,
              o.rounds, o.rounds == 1 ? "" : "s", o.zero, monitor::cpu_model().c_str(), cores, o.np, setups[1].name.c_str(),
              setups[0].name.c_str());
  std::printf("mpirun: %s %s\n", mpirun.c_str(), command_line(mpi_args).c_str());
  std::fflush(stdout);

  const std::string exe = self_exe();
  std::vector<Run> runs[2];
  json rounds = json::array();
  std::vector<double> ratio;
  for (int r = 0; r < o.rounds; ++r) {
    const int order[2] = {r % 2 == 0 ? 0 : 1, r % 2 == 0 ? 1 : 0};
    Run got[2];
    for (int i : order) {
      const Setup& s = setups[i];
      const std::string tag = "r" + std::to_string(r + 1) + "_" + s.key;
      const fs::path dir = scratch.dir / tag;
      std::vector<std::string> argv;
      if (s.processes > 1) {
        argv.push_back(mpirun);
        argv.insert(argv.end(), mpi_args.begin(), mpi_args.end());
      }
      argv.insert(argv.end(), {exe, "train", "--config", o.config, "--no-progress", "--set",
                               "train.steps=" + std::to_string(o.steps), "--set",
                               "train.threads=" + std::to_string(s.threads_each), "--set",
                               "checkpoint.dir=" + train::toml_string(dir.string()), "--set", "checkpoint.every=0", "--set",
                               "train.eval_every=0", "--set", "data.dir=" + train::toml_string(data_dir)});
      if (s.processes > 1) argv.insert(argv.end(), {"--set", "dist.zero=" + std::to_string(o.zero)});
      const std::string what = s.name + " (round " + std::to_string(r + 1) + ")";
      std::fprintf(stderr, "round %d/%d: %s ... ", r + 1, o.rounds, s.name.c_str());
      const std::string out_log = (scratch.dir / (tag + ".out")).string(), err_log = (scratch.dir / (tag + ".err")).string();
      const double t0 = monitor::now_seconds();
      const Exit e = spawn_and_wait(argv, out_log, err_log);
      const double wall = monitor::now_seconds() - t0;
      if (e.code != 0) {
        std::fprintf(stderr, "failed\n");
        std::string tail = tail_lines(err_log, 15);
        if (tail.empty()) tail = tail_lines(out_log, 15);
        throw core::Error("bench dist: " + what + " failed: " +
                          (e.signal.empty() ? "exit status " + std::to_string(e.code) : "killed by " + e.signal) +
                          "\ncommand: " + command_line(argv) + "\nits last lines:\n" + tail);
      }
      got[i] = figures_of((dir / "metrics.jsonl").string(), s, o.warmup_steps, tokens_per_step, what);
      got[i].wall_s = wall;
      got[i].others_pct = e.others_pct;
      if (s.processes > 1)
        std::fprintf(stderr, "%.0f tokens/s, %.1f ms/step, comm %.1f ms (%.0f%% hidden), %.1f s\n",
                     got[i].tokens_per_s, got[i].ms_per_step, got[i].comm_ms, 100 * got[i].hidden_fraction(), wall);
      else
        std::fprintf(stderr, "%.0f tokens/s, %.1f ms/step, %.1f s\n", got[i].tokens_per_s, got[i].ms_per_step, wall);
    }
    const double rr = got[0].tokens_per_s > 0 ? got[1].tokens_per_s / got[0].tokens_per_s : 0;
    ratio.push_back(rr);
    rounds.push_back({{"round", r + 1},
                      {"order", {setups[order[0]].key, setups[order[1]].key}},
                      {"single", run_json(got[0], setups[0])},
                      {"multi", run_json(got[1], setups[1])},
                      {"ratio_tokens_per_s", rr}});
    for (int i = 0; i < 2; ++i) runs[i].push_back(got[i]);
  }

  auto column = [&](int i, auto f) {
    std::vector<double> v;
    for (const Run& r : runs[i]) v.push_back(f(r));
    return v;
  };
  auto tps = [](const Run& r) { return r.tokens_per_s; };
  auto msps = [](const Run& r) { return r.ms_per_step; };
  auto comm = [](const Run& r) { return r.comm_ms; };
  auto exposed = [](const Run& r) { return r.exposed_ms; };
  auto hidden = [](const Run& r) { return r.hidden_ms; };
  auto share = [](const Run& r) { return r.comm_share(); };
  auto eshare = [](const Run& r) { return r.exposed_share(); };
  auto hfrac = [](const Run& r) { return r.hidden_fraction(); };
  auto others = [](const Run& r) { return r.others_pct; };

  std::printf("\nmedian [min-max] over %d round%s of each run's median step (steps %lld-%lld)\n", o.rounds,
              o.rounds == 1 ? "" : "s", (long long)o.warmup_steps + 1, (long long)o.steps);
  std::printf("%-24s %22s %22s %18s %20s %20s %16s %14s\n", "configuration", "tokens/s", "ms/step", "comm ms",
              "comm share of step", "exposed share", "hidden %", "others' CPU %");
  for (int i = 0; i < 2; ++i) {
    const bool multi = setups[i].processes > 1;
    std::printf("%-24s %22s %22s %18s %20s %20s %16s %14s\n", setups[i].name.c_str(),
                range(column(i, tps), "%.0f").c_str(), range(column(i, msps), "%.1f").c_str(),
                multi ? range(column(i, comm), "%.1f").c_str() : "-",
                multi ? range(scaled(column(i, share), 100), "%.1f%%").c_str() : "-",
                multi ? range(scaled(column(i, eshare), 100), "%.1f%%").c_str() : "-",
                multi ? range(scaled(column(i, hfrac), 100), "%.0f%%").c_str() : "-",
                range(column(i, others), "%.0f").c_str());
  }
  std::string per_round;
  for (double x : ratio) {
    char b[16];
    std::snprintf(b, sizeof b, " %.2f", x);
    per_round += b;
  }
  std::printf("tokens/s of %d processes / 1 process, formed per round: %s (rounds:%s)\n", o.np,
              range(ratio, "%.2f").c_str(), per_round.c_str());
  std::printf("final loss (last step): %.4f vs %.4f (same global batch, same data: they should agree closely)\n",
              runs[0].back().last_loss, runs[1].back().last_loss);
  std::printf("comm ms: the gradient collectives of a step (ZeRO-%d%s); exposed: the step waited for them after "
              "backward; hidden %% = (comm - exposed) / comm; others' CPU %%: the machine's CPU time used by other "
              "processes during the run (noise)\n",
              o.zero, o.zero ? ": reduce-scatter + all-gather of weights" : ": all-reduce");

  json summary = json::object();
  for (int i = 0; i < 2; ++i) {
    json s = {{"name", setups[i].name},
              {"processes", setups[i].processes},
              {"threads_per_process", setups[i].threads_each},
              {"tokens_per_s", spread_json(column(i, tps))},
              {"ms_per_step", spread_json(column(i, msps))}};
    if (setups[i].processes > 1) {
      s["comm_ms"] = spread_json(column(i, comm));
      s["comm_exposed_ms"] = spread_json(column(i, exposed));
      s["comm_hidden_ms"] = spread_json(column(i, hidden));
      s["comm_share"] = spread_json(column(i, share));
      s["exposed_share"] = spread_json(column(i, eshare));
      s["hidden_fraction"] = spread_json(column(i, hfrac));
    }
    summary[setups[i].key] = s;
  }
  const json out = {{"benchmark", "dist"},
                    {"workload", o.workload},
                    {"config", o.config},
                    {"options",
                     {{"rounds", o.rounds},
                      {"steps", o.steps},
                      {"warmup_steps", o.warmup_steps},
                      {"np", o.np},
                      {"threads", o.threads},
                      {"threads_per_rank", per_rank},
                      {"zero", o.zero},
                      {"mpirun", mpirun},
                      {"mpirun_args", mpi_args}}},
                    {"global_batch", cfg.batch},
                    {"seq", cfg.seq},
                    {"grad_accum", cfg.grad_accum},
                    {"tokens_per_step", tokens_per_step},
                    {"cpu", monitor::cpu_model()},
                    {"online_cores", cores},
                    {"same_cores", true},
                    {"time", now_iso()},
                    {"rounds", rounds},
                    {"summary", summary},
                    {"ratio_tokens_per_s", spread_json(ratio)}};
  std::error_code ec;
  if (fs::path(o.json_path).has_parent_path()) fs::create_directories(fs::path(o.json_path).parent_path(), ec);
  core::write_file_atomic(o.json_path, out.dump(2) + "\n");
  std::printf("wrote %s\n", shown(o.json_path).c_str());
  return 0;
}

}  // namespace brisk::bench
