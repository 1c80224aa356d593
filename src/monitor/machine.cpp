// Peak FLOP/s (the FMA meter of peak.h) and memory readings (machine.h).
#include "brisk/monitor/machine.h"

#include "brisk/monitor/peak.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>

namespace brisk::monitor {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

namespace {

// Best of short one-thread samples of `loop`, times the thread count: on a
// shared machine one thread still finds a free core where an all-thread
// sample would be halved by a neighbour (and a low peak inflates every MFU).
// Throughput scales with cores; on SMT siblings this overstates the peak,
// which only makes the reported MFU conservative. Cached per thread count.
struct CachedPeak {
  std::mutex mu;
  double value = 0;
  int threads = 0;

  double get(double (*loop)(int64_t), int n_threads, double seconds) {
    std::lock_guard<std::mutex> lock(mu);
    if (value > 0 && threads == n_threads) return value;
    PeakMeter meter(loop, 1, 0.01);
    const double t_end = now_seconds() + seconds;
    do meter.sample();
    while (now_seconds() < t_end);
    value = meter.best() * n_threads;
    threads = n_threads;
    return value;
  }
};

}  // namespace

double peak_fp32_gflops(int threads, double seconds) {
  static CachedPeak peak;
  return peak.get(fma_loop, threads, seconds);
}

double gpu_peak_gflops(const std::string& name, bool bf16) {
  struct Card {
    const char* a;
    const char* b;  // both substrings must appear ("" matches anything)
    double bf16_tflops, fp32_tflops;
  };
  // Dense (no sparsity) figures from NVIDIA's datasheets; the most specific first.
  static const Card cards[] = {
      {"H100", "PCIe", 756.0, 51.2}, {"H100", "NVL", 835.0, 60.0}, {"H100", "", 989.4, 66.9},
      {"H200", "", 989.4, 66.9},     {"H800", "", 989.4, 66.9},    {"GH200", "", 989.4, 66.9},
      {"A100", "", 312.0, 19.5},     {"A10G", "", 70.0, 31.2},     {"L40S", "", 362.0, 91.6},
      {"L4", "", 121.0, 30.3},
  };
  for (const Card& c : cards)
    if (name.find(c.a) != std::string::npos && name.find(c.b) != std::string::npos)
      return (bf16 ? c.bf16_tflops : c.fp32_tflops) * 1e3;
  return 0.0;
}

double peak_bf16_gflops(int threads, double seconds) {
  if (!have_bf16_peak()) return 0.0;
  static CachedPeak peak;
  return peak.get(bf16_loop, threads, seconds);
}

namespace {
// One "Vm...:  N kB" line of /proc/self/status, in bytes (0 if absent).
size_t status_kib_field(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const size_t n = std::strlen(key);
  while (std::getline(f, line))
    if (line.compare(0, n, key) == 0) return size_t(std::stoull(line.substr(n))) * 1024;
  return 0;
}
}  // namespace

size_t peak_rss_bytes() { return status_kib_field("VmHWM:"); }
// The second field of /proc/self/statm (resident pages, the same count as
// VmRSS), read into a stack buffer: no allocation, so a training step can
// report it without breaking the steady state's no-allocation guarantee.
size_t current_rss_bytes() {
  const int fd = ::open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[128];
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return 0;
  buf[n] = '\0';
  char* end = nullptr;
  std::strtoull(buf, &end, 10);  // total program size
  const unsigned long long resident = std::strtoull(end, nullptr, 10);
  return size_t(resident) * size_t(::sysconf(_SC_PAGESIZE));
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) {
      const auto p = line.find(':');
      return p == std::string::npos ? line : line.substr(p + 2);
    }
  return "unknown CPU";
}

}  // namespace brisk::monitor
