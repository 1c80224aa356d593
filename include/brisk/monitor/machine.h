// Facts about the machine that metrics are measured against: the peak fp32
// FLOP/s (a register-blocked FMA loop, one thread's best times the thread
// count) and the process's peak resident memory.
#pragma once

#include <cstddef>
#include <string>

namespace brisk::monitor {

// Measures for about `seconds`; the figure is cached for the process.
double peak_fp32_gflops(int threads, double seconds = 0.2);
// bf16 dot-product peak (avx512_bf16 vdpbf16ps), 0 where the CPU has none.
double peak_bf16_gflops(int threads, double seconds = 0.2);
size_t peak_rss_bytes();     // VmHWM of this process
std::string cpu_model();     // from /proc/cpuinfo
// Wall-clock seconds since an arbitrary fixed point (steady clock).
double now_seconds();

}  // namespace brisk::monitor
