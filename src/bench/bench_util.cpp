// Shared benchmark helpers (bench_util.h).
#include "bench_util.h"

#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>

#include "brisk/core/error.h"

extern char** environ;

namespace brisk::bench {

namespace fs = std::filesystem;
using nlohmann::json;

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

std::string shown(const fs::path& p) {
  std::error_code ec;
  fs::path rel = fs::relative(p, fs::current_path(ec), ec);
  if (ec || rel.empty() || *rel.begin() == "..") return p.string();
  return rel.string();
}


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

std::string now_iso() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

}  // namespace brisk::bench
