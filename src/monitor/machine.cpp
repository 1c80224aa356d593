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

double peak_fp32_gflops(int threads, double seconds) {
  static std::mutex mu;
  static double cached = 0;
  static int cached_threads = 0;
  std::lock_guard<std::mutex> lock(mu);
  if (cached > 0 && cached_threads == threads) return cached;
  // Best of short one-thread samples, times the thread count: on a shared
  // machine one thread still finds a free core where an all-thread sample
  // would be halved by a neighbour (and a low peak inflates every MFU).
  // FMA throughput scales with cores; on SMT siblings this overstates the
  // peak, which only makes the reported MFU conservative.
  PeakMeter meter(fma_loop, 1, 0.01);
  const double t_end = now_seconds() + seconds;
  do meter.sample();
  while (now_seconds() < t_end);
  cached = meter.best() * threads;
  cached_threads = threads;
  return cached;
}

double peak_bf16_gflops(int threads, double seconds) {
  if (!have_bf16_peak()) return 0.0;
  static std::mutex mu;
  static double cached = 0;
  static int cached_threads = 0;
  std::lock_guard<std::mutex> lock(mu);
  if (cached > 0 && cached_threads == threads) return cached;
  PeakMeter meter(bf16_loop, 1, 0.01);  // as peak_fp32_gflops: one-thread samples x threads
  const double t_end = now_seconds() + seconds;
  do meter.sample();
  while (now_seconds() < t_end);
  cached = meter.best() * threads;
  cached_threads = threads;
  return cached;
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
