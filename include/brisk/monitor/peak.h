// What this machine can do at most, measured rather than looked up: fp32
// FMA FLOP/s, bf16 dot-product FLOP/s (avx512_bf16), memory bandwidth, and
// how busy the machine is. Benchmarks report their results as fractions of
// these (docs/workloads.md: "The machine"), so every bench
// program measures them in its own process with its own thread count; the
// trainer's MFU uses the same meter (monitor::peak_fp32_gflops). The VM hides the CPU's clock, so a
// datasheet peak would not be this machine's.
#pragma once

#include <immintrin.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>

#include "brisk/monitor/machine.h"

namespace brisk::monitor {

using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}


// The ISA flags that decide which peak and which GEMM kernels apply.
inline std::string cpu_flags() {
  std::ifstream f("/proc/cpuinfo");
  std::string line, out;
  while (std::getline(f, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream ss(line.substr(line.find(':') + 1));
    for (std::string w; ss >> w;)
      if (w == "avx2" || w == "fma" || w == "avx512f" || w == "avx512_bf16" || w == "amx_bf16")
        out += (out.empty() ? "" : " ") + w;
    break;
  }
  return out;
}

// Share of all CPUs' time used by other processes between two snapshots:
// the load of other users, which this benchmark cannot control but reports,
// so disturbed numbers are marked as such. Both files count in USER_HZ ticks.
struct CpuSnapshot {
  double total = 0, busy = 0, self = 0;
  static CpuSnapshot now() {
    CpuSnapshot s;
    std::ifstream f("/proc/stat");
    std::string cpu;
    f >> cpu;
    double x;
    for (int i = 0; i < 8 && f >> x; ++i) {
      s.total += x;
      if (i != 3 && i != 4) s.busy += x;  // all but idle and iowait
    }
    std::ifstream g("/proc/self/stat");
    std::string stat;
    std::getline(g, stat);
    // Fields after the ")" closing the command name: utime and stime are the 12th and 13th.
    std::istringstream rest(stat.substr(stat.rfind(')') + 2));
    std::string field;
    for (int i = 1; i <= 13 && rest >> field; ++i)
      if (i >= 12) s.self += std::atof(field.c_str());
    return s;
  }
};
inline double others_cpu_share(const CpuSnapshot& a, const CpuSnapshot& b) {
  const double dt = b.total - a.total;
  return dt > 0 ? std::clamp((b.busy - a.busy - (b.self - a.self)) / dt, 0.0, 1.0) : 0.0;
}
inline double others_cpu_share(double seconds) {
  const CpuSnapshot a = CpuSnapshot::now();
  usleep(useconds_t(seconds * 1e6));
  return others_cpu_share(a, CpuSnapshot::now());
}

// ---- peak ------------------------------------------------------------------------------
// Independent accumulator chains hide the FMA latency (4 cycles x 2 ports on
// Zen3/Intel needs >= 8 chains); 12 leaves registers for the operands. The
// constants keep values bounded so no denormals or infinities slow it down.
constexpr int kChains = 12;

// Makes the accumulators observable so the loop cannot be dropped.
template <class V>
inline void keep(const V (&acc)[kChains]) {
  float lanes[sizeof(V) / sizeof(float)];
  float s = 0;
  for (const V& v : acc) {
    std::memcpy(lanes, &v, sizeof lanes);
    for (float x : lanes) s += x;
  }
  volatile float sink = s;
  (void)sink;
}

#if defined(__AVX512F__)
constexpr const char* kFmaIsa = "AVX-512 FMA (16 x f32)";
inline double fma_loop(int64_t iters) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(1.0f + c * 1e-3f);
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-6f);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], a, b);
  }
  keep(acc);
  return 2.0 * 16 * kChains * double(iters);
}
#elif defined(__AVX2__) && defined(__FMA__)
constexpr const char* kFmaIsa = "AVX2 FMA (8 x f32)";
inline double fma_loop(int64_t iters) {
  __m256 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(1.0f + c * 1e-3f);
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-6f);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
  }
  keep(acc);
  return 2.0 * 8 * kChains * double(iters);
}
#else
constexpr const char* kFmaIsa = "scalar (no AVX2/AVX-512 at compile time)";
inline double fma_loop(int64_t iters) {
  float acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = 1.0f + c * 1e-3f;
  for (int64_t i = 0; i < iters; ++i)
    for (int c = 0; c < kChains; ++c) acc[c] = std::fma(acc[c], 0.999999f, 1e-6f);
  float s = 0;
  for (float v : acc) s += v;
  volatile float sink = s;
  (void)sink;
  return 2.0 * kChains * double(iters);
}
#endif

// vdpbf16ps: 16 lanes x 2 bf16 products, each a multiply and an add. Built
// for avx512_bf16 whatever the build flags say, and run only where
// have_bf16_peak(): the same binary measures it where the CPU has it.
__attribute__((target("avx512f,avx512bf16"))) inline double bf16_loop_avx512(int64_t iters) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_setzero_ps();
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(-1e-3f));
  const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(1e-3f));
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
  }
  float sink = 0;
  for (int c = 0; c < kChains; ++c) sink += _mm512_reduce_add_ps(acc[c]);
  volatile float v = sink;
  (void)v;
  return 4.0 * 16 * kChains * double(iters);
}
inline bool have_bf16_peak() { return __builtin_cpu_supports("avx512bf16"); }
inline double bf16_loop(int64_t iters) { return have_bf16_peak() ? bf16_loop_avx512(iters) : 0.0; }

// On a machine shared with other users one measurement is easily disturbed
// (a busy core halves it), and a low peak inflates every "% of peak". So the
// meters below keep the best of many short samples, and callers sample them
// between their own work (e.g. after every benchmark case) as well as at the
// start and the end.

// All-thread rate of `loop` (fp32 FMA or bf16 dot products), in GFLOP/s.
// Every thread runs the same iteration count, so the slowest thread sets the
// time, as in a GEMM.
class PeakMeter {
 public:
  PeakMeter(double (*loop)(int64_t), int threads, double sample_s) : loop_(loop), threads_(threads) {
    // Calibrate on one thread: threads run on their own cores in parallel.
    for (;;) {
      const auto t0 = Clock::now();
      loop_(iters_);
      if (seconds_since(t0) > sample_s || iters_ > (int64_t(1) << 34)) break;
      iters_ *= 2;
    }
  }
  double sample() {
    double flops = 0;
    const auto t0 = Clock::now();
#pragma omp parallel num_threads(threads_) reduction(+ : flops)
    flops += loop_(iters_);
    const double g = flops / seconds_since(t0) * 1e-9;
    best_ = std::max(best_, g);
    ++samples_;
    return g;
  }
  double best() const { return best_; }
  int samples() const { return samples_; }

 private:
  double (*loop_)(int64_t);
  int threads_;
  int64_t iters_ = 1 << 12;
  double best_ = 0;
  int samples_ = 0;
};

// STREAM triad a = b + s*c over three arrays of 512 MB in total, in GB/s,
// counting 3 x 4 bytes per element as STREAM does (write-allocate traffic
// not counted). Holds its arrays so that sampling later costs one pass.
class TriadMeter {
 public:
  explicit TriadMeter(int threads) : threads_(threads), n_((int64_t(512) << 20) / (3 * sizeof(float))) {
    for (float*& p : arr_) p = static_cast<float*>(std::aligned_alloc(64, n_ * sizeof(float)));
    float *a = arr_[0], *b = arr_[1], *c = arr_[2];
    // First touch by the same threads and schedule that run the triad.
#pragma omp parallel for schedule(static) num_threads(threads_)
    for (int64_t i = 0; i < n_; ++i) a[i] = 0.f, b[i] = 1.f, c[i] = 2.f;
  }
  TriadMeter(const TriadMeter&) = delete;
  TriadMeter& operator=(const TriadMeter&) = delete;
  ~TriadMeter() {
    for (float* p : arr_) std::free(p);
  }
  double sample() {
    float *a = arr_[0], *b = arr_[1], *c = arr_[2];
    const float s = 0.5f + float(samples_ % 7);
    const auto t0 = Clock::now();
#pragma omp parallel for simd schedule(static) num_threads(threads_)
    for (int64_t i = 0; i < n_; ++i) a[i] = b[i] + s * c[i];
    const double g = 3.0 * double(n_) * sizeof(float) / seconds_since(t0) * 1e-9;
    volatile float sink = a[n_ / 2];
    (void)sink;
    best_ = std::max(best_, g);
    ++samples_;
    return g;
  }
  double best() const { return best_; }
  int samples() const { return samples_; }

 private:
  int threads_;
  int64_t n_;
  float* arr_[3] = {};
  double best_ = 0;
  int samples_ = 0;
};

}  // namespace brisk::monitor
