// What this CPU offers the matrix products, read once at start-up, and the
// paths brisk takes because of it. The same binary runs on AVX2-only
// machines and on ones with AVX-512 and bf16 dot products (avx512_bf16,
// AMX): every choice is made here at run time, never at compile time, and is
// printed by `brisk train` and written by the benchmarks.
//
// Environment overrides (for tests and for measuring one path against the
// other on the same machine):
//   BRISK_BF16=emulated    take the widen-to-fp32 path even where bf16
//                          dot products exist
//   BRISK_GEMM=openblas    fp32 products through OpenBLAS even where oneDNN's
//                          AVX-512 kernels are available (BRISK_GEMM=onednn
//                          forces oneDNN)
//   BRISK_ATTENTION=blas|tiles
//                          the plain attention kernels' products through
//                          BLAS calls, or through AVX2 + FMA register tiles,
//                          whatever the CPU's default (tiles need AVX2 + FMA)
//   BRISK_INT8=avx_vnni|avx2|scalar
//                          a slower int8 dot-product path than the best the
//                          CPU has (a faster one is refused)
#pragma once

#include <string>

namespace brisk::cpu {

enum class Bf16Path {
  native,    // bf16 operands straight into bf16 dot products (oneDNN), fp32 accumulation
  emulated,  // bf16 storage, operands widened to fp32 for the products
};

enum class F32Gemm { onednn, openblas };

// How the int8 kernels (linear_q8, linear_q4) multiply int8 by int8, best first.
enum class Int8Dot {
  avx512_vnni,  // vpdpbusd on 512-bit registers (AVX-512 VNNI)
  avx_vnni,     // vpdpbusd on 256-bit registers: VEX-encoded with AVX-VNNI, EVEX on AVX-512 VNNI without it
  avx2,         // widening: vpmaddubsw to 16 bits, vpmaddwd to 32 (no VNNI)
  scalar,       // plain loops (no AVX2)
};

struct CpuFeatures {
  bool avx512f = false, avx512_bf16 = false, amx_bf16 = false;
  std::string onednn_isa;  // oneDNN's effective ISA, e.g. "avx512_core_bf16"
  Bf16Path bf16 = Bf16Path::emulated;
  std::string bf16_reason;  // why this path, in words
  F32Gemm f32_gemm = F32Gemm::openblas;
  std::string f32_reason;
  Int8Dot int8 = Int8Dot::scalar;
  Int8Dot int8_best = Int8Dot::scalar;  // what the CPU has, whatever BRISK_INT8 says
  bool avx_vnni = false;                 // CPUID.(7,1):EAX[4]: the avx_vnni path's VEX-encoded vpdpbusd
  std::string int8_reason;
  // Decoding's f32 kernels, Linear over <= 16 rows (4x4 tiles) and
  // kv_attention: AVX-512 where the CPU has it, compiler-vectorised loops
  // otherwise or under BRISK_FEW_ROWS=portable (tests run both).
  // kv_attention without AVX-512 takes the AVX2 path where `packed` does.
  // BRISK_FEW_ROWS=avx2 turns this off on an AVX-512 CPU too (and `packed`
  // to avx2): these kernels and the sampler's compaction run as on an AVX2
  // machine, everything else (oneDNN, int8, attention) as on this one.
  bool few_rows_avx512 = false;
  // linear_packed (the engine's fp32 Linear): broadcast tiles on 512-bit
  // registers where the CPU has AVX-512, on 256-bit ones with AVX2 + FMA;
  // plain loops otherwise or under BRISK_FEW_ROWS=portable (tests run all
  // the CPU has).
  enum class PackedPath { avx512, avx2, portable };
  PackedPath packed = PackedPath::portable;
  bool avx2_fma = false;  // the CPU has AVX2 and FMA
  // The attention kernels' f32 products (attention, masked_attention, their
  // flash versions and the backwards): register tiles (attention_tiles.h,
  // flash_tiles.h) on AVX2 + FMA
  // CPUs without AVX-512, where they measured faster than OpenBLAS; BLAS
  // calls elsewhere (on AVX-512 CPUs the tiles are unmeasured against
  // oneDNN's kernels). BRISK_ATTENTION overrides.
  bool attention_tiles = false;
};

// Read once (thread-safe) from cpuid, oneDNN and the environment.
const CpuFeatures& cpu_features();

// "bf16-native" / "bf16-emulated"; "fp32" for the fp32 path.
const char* bf16_path_name(Bf16Path p);
const char* f32_gemm_name(F32Gemm g);
const char* int8_dot_name(Int8Dot d);
// Whether a CPU with features `f` has path p's instructions: the paths at or
// below int8_best (avx_vnni on an AVX-512 VNNI CPU without AVX-VNNI runs
// the same kernel EVEX-encoded).
bool int8_path_available(const CpuFeatures& f, Int8Dot p);
const char* packed_path_name(CpuFeatures::PackedPath p);  // "avx512", "avx2", "portable"  // "avx512_vnni", "avx_vnni", "avx2", "scalar"

// Re-reads the environment overrides (tests switch paths within one process).
// Not thread-safe against running kernels: call between runs.
void reload_cpu_features();

}  // namespace brisk::cpu
