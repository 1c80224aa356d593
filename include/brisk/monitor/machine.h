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
// A GPU's dense peak in GFLOP/s from its name as the driver reports it
// (cudaGetDeviceProperties, nvidia-smi): the datasheet figure of tensor-core
// bf16 (bf16 = true) or of plain fp32 FMA. 0 for a GPU not in the table (MFU
// is then not reported). "H100 ... HBM3" is the SXM card (989 TFLOP/s bf16),
// "H100 PCIe" 756, "H100 NVL" 835, "H200" 989, "A100" 312.
double gpu_peak_gflops(const std::string& device_name, bool bf16);
size_t peak_rss_bytes();     // VmHWM of this process
size_t current_rss_bytes();  // VmRSS of this process: a benchmark's baseline before it builds anything
std::string cpu_model();     // from /proc/cpuinfo
// Wall-clock seconds since an arbitrary fixed point (steady clock).
double now_seconds();

}  // namespace brisk::monitor
