// Peak FLOP/s (the FMA meter of peak.h) and memory readings (machine.h).
#include "brisk/monitor/machine.h"

#include "brisk/monitor/peak.h"

#include <chrono>
#include <cstdio>
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

double peak_bf16_gflops(int threads, double seconds) {
  if (!have_bf16_peak()) return 0.0;
  static CachedPeak peak;
  return peak.get(bf16_loop, threads, seconds);
}

size_t peak_rss_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return size_t(std::stoull(line.substr(6))) * 1024;
  return 0;
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
