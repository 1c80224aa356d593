// Peak FLOP/s and memory readings (machine.h). The FMA loop keeps 12
// independent accumulators so the FMA units' latency is hidden: that is what a
// well-blocked GEMM inner kernel achieves at best.
#include "brisk/monitor/machine.h"

#include <immintrin.h>
#include <omp.h>

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

// Returns FLOPs done.
double fma_loop(int64_t iters) {
#if defined(__AVX512F__)
  using V = __m512;
  constexpr int kLanes = 16;
  auto fma = [](V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); };
  V a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1.0001f);
  V acc[12];
  for (auto& x : acc) x = _mm512_set1_ps(0.5f);
#elif defined(__FMA__)
  using V = __m256;
  constexpr int kLanes = 8;
  auto fma = [](V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); };
  V a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(1.0001f);
  V acc[12];
  for (auto& x : acc) x = _mm256_set1_ps(0.5f);
#else
  using V = float;
  constexpr int kLanes = 1;
  auto fma = [](V a, V b, V c) { return a * b + c; };
  V a = 0.999f, b = 1.0001f;
  V acc[12];
  for (auto& x : acc) x = 0.5f;
#endif
  for (int64_t i = 0; i < iters; ++i)
    for (auto& x : acc) x = fma(x, a, b);
  // Keep the result alive.
  volatile float sink;
  std::memcpy((void*)&sink, &acc[0], sizeof(float));
  (void)sink;
  return double(iters) * 12 * kLanes * 2;
}

}  // namespace

double peak_fp32_gflops(int threads, double seconds) {
  static std::mutex mu;
  static double cached = 0;
  static int cached_threads = 0;
  std::lock_guard<std::mutex> lock(mu);
  if (cached > 0 && cached_threads == threads) return cached;
  fma_loop(100000);  // warm up clocks
  int64_t iters = 1 << 20;
  double best = 0;
  const double t_end = now_seconds() + seconds;
  while (now_seconds() < t_end) {
    double flops = 0;
    const double t0 = now_seconds();
#pragma omp parallel num_threads(threads) reduction(+ : flops)
    flops += fma_loop(iters);
    const double dt = now_seconds() - t0;
    best = std::max(best, flops / dt / 1e9);
    if (dt < 0.02) iters *= 2;
  }
  cached = best;
  cached_threads = threads;
  return best;
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
