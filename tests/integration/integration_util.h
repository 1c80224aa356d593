// Helpers for the integration tests: a temporary directory per test, running
// the built `brisk` CLI as a child process (exit status, signal, stdout and
// stderr captured, with a watchdog so a hung child fails the test instead of
// hanging it), a tiny byte-level corpus prepared through `brisk data prepare`,
// and a tiny GPT config. Everything is sized so one step takes milliseconds:
// the tests check behaviour (exact resume, clean stops, clear errors), not
// learning, so a 2-layer, 32-wide model on a few kilobytes of text is enough.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "brisk/train/config.h"
#include "brisk/train/trainer.h"

namespace brisk::itest {

namespace fs = std::filesystem;

inline const char* cli_path() { return BRISK_CLI_PATH; }

class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ = fs::temp_directory_path() /
            ("brisk_itest_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

struct CliResult {
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;      // the signal that ended it, 0 if it exited
  bool timed_out = false;
  std::string out, err;
};

// Hooks for tests that need to act while the child runs.
struct CliHooks {
  // Called with each complete stderr line; may signal the child (pid given).
  std::function<void(const std::string& line, pid_t pid)> on_err_line;
  // Runs in the child between fork and exec (e.g. setrlimit).
  std::function<void()> in_child;
  double timeout_s = 90;
};

// Runs `program <args>` and waits for it. stdout and stderr are read through
// pipes with poll() so neither can fill up and block the child.
inline CliResult run_program(const std::string& program, const std::vector<std::string>& args,
                             const CliHooks& hooks = {}) {
  CliResult r;
  int out_pipe[2], err_pipe[2];
  if (::pipe(out_pipe) != 0 || ::pipe(err_pipe) != 0) return r;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out_pipe[1], STDOUT_FILENO);
    ::dup2(err_pipe[1], STDERR_FILENO);
    for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) ::close(fd);
    // The test harness may block or ignore signals; the child starts clean.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    if (hooks.in_child) hooks.in_child();
    std::vector<char*> argv{const_cast<char*>(program.c_str())};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(program.c_str(), argv.data());
    ::_exit(127);
  }
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(hooks.timeout_s);
  std::string err_partial;
  bool out_open = true, err_open = true;
  while (out_open || err_open) {
    pollfd fds[2] = {{out_pipe[0], short(out_open ? POLLIN : 0), 0}, {err_pipe[0], short(err_open ? POLLIN : 0), 0}};
    const int n = ::poll(fds, 2, 200);
    if (std::chrono::steady_clock::now() > deadline) {
      r.timed_out = true;
      ::kill(pid, SIGKILL);
      break;
    }
    if (n <= 0) continue;
    char buf[4096];
    if (fds[0].revents) {
      const ssize_t k = ::read(out_pipe[0], buf, sizeof buf);
      if (k <= 0) out_open = false;
      else r.out.append(buf, size_t(k));
    }
    if (fds[1].revents) {
      const ssize_t k = ::read(err_pipe[0], buf, sizeof buf);
      if (k <= 0) {
        err_open = false;
      } else {
        r.err.append(buf, size_t(k));
        err_partial.append(buf, size_t(k));
        for (size_t nl; (nl = err_partial.find('\n')) != std::string::npos;) {
          if (hooks.on_err_line) hooks.on_err_line(err_partial.substr(0, nl), pid);
          err_partial.erase(0, nl + 1);
        }
      }
    }
  }
  ::close(out_pipe[0]);
  ::close(err_pipe[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  return r;
}

// Open MPI unloads its plugins at MPI_Finalize, so LeakSanitizer can neither
// name nor be told to ignore what they keep for the life of the process
// (reports from "<unknown module>"). Processes that mpirun starts therefore
// run the sanitized build with leak checks off; address and undefined-
// behaviour checks stay on, and the same data-parallel code runs in-process
// with leak checks in tests/unit/dist_test.cpp. "" when ASAN_OPTIONS is unset.
inline std::string asan_options_for_mpi_ranks() {
  const char* cur = std::getenv("ASAN_OPTIONS");
  if (!cur) return "";
  return std::string(cur) + (*cur ? ":" : "") + "detect_leaks=0";
}

// A port nothing listens on now (the kernel's pick for a socket bound to 0
// and closed again): for servers the tests start on a port of their choice.
// A loopback port that binds now (`want` 0: any the kernel picks, from its
// ephemeral range), or 0.
inline int bindable_port(int want = 0) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(uint16_t(want));
  socklen_t len = sizeof a;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

inline int free_port() { return bindable_port(); }

// A free port below the kernel's ephemeral range, for a listener that starts
// only after other processes have taken ports of their own (HAProxy in front
// of replicas that listen on --port 0): none of theirs, nor any other port
// the kernel hands out, can then be this one. free_port() where the range
// leaves no room below it.
inline int free_port_below_ephemeral() {
  int lo = 32768, hi = 60999;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> lo >> hi;
  const int first = 10000;
  if (lo - first < 1000) return free_port();
  const int span = lo - first, start = int(::getpid() % span);
  for (int k = 0; k < span; ++k)
    if (const int port = bindable_port(first + (start + k) % span)) return port;
  return free_port();
}

// Runs `brisk <args>`.
inline CliResult run_cli(const std::vector<std::string>& args, const CliHooks& hooks = {}) {
  return run_program(cli_path(), args, hooks);
}

// Reads a running child's output from `fd` into `out` until it holds
// `marker` (true), the child closes it, or `timeout_s` passes (false): how a
// test waits for a server's "listening" or "ready" line.
inline bool read_until(int fd, const std::string& marker, std::string& out, double timeout_s = 60) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (out.find(marker) == std::string::npos && std::chrono::steady_clock::now() < deadline) {
    pollfd pf{fd, POLLIN, 0};
    if (::poll(&pf, 1, 200) <= 0) continue;
    char buf[512];
    const ssize_t k = ::read(fd, buf, sizeof buf);
    if (k <= 0) break;
    out.append(buf, size_t(k));
  }
  return out.find(marker) != std::string::npos;
}

// A few kilobytes of varied English-like text: enough windows for batches of
// 4 x 32 tokens in both splits.
inline std::string tiny_corpus() {
  const char* words[] = {"the", "king", "spake", "unto", "his", "servants", "and", "said", "behold", "a", "light",
                         "came", "over", "water", "land", "of", "river", "stone", "bread", "they", "went", "forth"};
  std::string text;
  uint32_t s = 12345;
  for (int line = 0; line < 400; ++line) {
    for (int w = 0; w < 10; ++w) {
      s = s * 1664525u + 1013904223u;
      text += words[(s >> 16) % (sizeof words / sizeof words[0])];
      text += w == 9 ? ".\n" : " ";
    }
  }
  return text;
}

// Writes the corpus under dir/corpus.txt and prepares dir/data with the CLI.
// Returns the dataset directory, or "" (with the CLI's stderr in *err).
inline std::string prepare_tiny_dataset(const fs::path& dir, std::string* err = nullptr,
                                        const std::string& corpus = tiny_corpus()) {
  fs::create_directories(dir);
  write_text((dir / "corpus.txt").string(), corpus);
  const std::string data = (dir / "data").string();
  const CliResult r = run_cli({"data", "prepare", "--input", (dir / "corpus.txt").string(), "--tokenizer", "bytes",
                               "--out", data, "--val-fraction", "0.1", "--threads", "1"});
  if (r.exit_code != 0) {
    if (err) *err = r.out + r.err;
    return "";
  }
  return data;
}

// A tiny model and run: `steps` steps, constant or cosine LR, checkpoints
// every `every` steps (all kept), eval every 4 steps so evaluation runs in
// the middle of resumed runs too.
inline std::string tiny_config_toml(const std::string& data_dir, const std::string& out_dir, int steps, int every,
                                    const std::string& schedule = "cosine", int threads = 2) {
  return "[model]\nvocab_size = 256\nn_layer = 2\nn_embd = 32\nn_head = 2\nblock_size = 32\n\n"
         "[data]\ndir = \"" + data_dir + "\"\n\n"
         "[train]\nbatch = 4\nseq = 32\nsteps = " + std::to_string(steps) +
         "\nlr = 3e-3\nwarmup = 2\nschedule = \"" + schedule + "\"\nmin_lr_ratio = 0.1\nseed = 7\nthreads = " +
         std::to_string(threads) + "\neval_every = 4\neval_batches = 2\nlog_every = 1\n\n"
         "[checkpoint]\ndir = \"" + out_dir + "\"\nevery = " + std::to_string(every) + "\nkeep = 0\n";
}

// A suite's starting point: the tiny dataset under dir/corpus and a model
// trained `steps` steps on it into dir/<run> (one thread, quiet). Returns the
// run's last checkpoint; `data` gets the dataset directory ("" and an empty
// result, with the CLI's output in *err, when preparing it failed).
inline std::string train_tiny_base(const fs::path& dir, const std::string& run, int steps, std::string& data,
                                   std::string* err = nullptr) {
  data = prepare_tiny_dataset(dir / "corpus", err);
  if (data.empty()) return "";
  const std::string cfg = (dir / (run + ".toml")).string();
  write_text(cfg, tiny_config_toml(data, (dir / run).string(), steps, 0, "cosine", 1));
  train::TrainOptions o;
  o.quiet = true;
  return train::train(train::load_train_config(cfg, {}), o).last_checkpoint;
}

// Per-step losses from a run directory's metrics.jsonl, keyed by step order
// in the file (a resumed run appends).
struct MetricRow {
  int64_t step;
  double loss;
};
inline std::vector<MetricRow> read_metrics(const std::string& out_dir) {
  std::vector<MetricRow> rows;
  std::ifstream in(fs::path(out_dir) / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line);
    rows.push_back({j.at("step").get<int64_t>(), j.at("loss").get<double>()});
  }
  return rows;
}

}  // namespace brisk::itest
