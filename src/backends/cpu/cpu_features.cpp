// Run-time choice of the CPU matrix-product paths (cpu_features.h).
//
// bf16 is native only when both the CPU (avx512_bf16 or AMX-BF16 in cpuid)
// and oneDNN (its effective ISA, which honours ONEDNN_MAX_CPU_ISA) agree:
// oneDNN 2.x has no fast bf16 matmul below avx512_core_bf16, and its
// avx512_core bf16 emulation is slower than our widen + sgemm.
//
// fp32 goes through oneDNN where it has AVX-512 kernels. On a Zen 5 EPYC
// (2 threads, bench_gemm, the W1/W2 Linear shapes) oneDNN's brgemm ran the
// products of a W2 step at 79% of the fp32 peak against OpenBLAS 0.3.21's
// 41% (1.9x; W1 1.5x): that OpenBLAS picks its Haswell (AVX2) kernels on
// this CPU. On AVX2-only machines OpenBLAS stays, as measured there before.
#include "brisk/cpu/cpu_features.h"

#include <cpuid.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dnnl.hpp>
#include <initializer_list>
#include <mutex>

namespace brisk::cpu {
namespace {

bool has_isa(dnnl::cpu_isa effective, dnnl::cpu_isa want) {
  return (unsigned(effective) & unsigned(want)) == unsigned(want);
}

std::string isa_name(dnnl::cpu_isa isa) {
  using I = dnnl::cpu_isa;
  // Most capable first: the flags nest.
  const std::pair<I, const char*> names[] = {
      {I::avx512_core_amx, "avx512_core_amx"}, {I::avx512_core_bf16, "avx512_core_bf16"},
      {I::avx512_core_vnni, "avx512_core_vnni"}, {I::avx512_core, "avx512_core"},
      {I::avx2_vnni, "avx2_vnni"},             {I::avx2, "avx2"},
      {I::avx, "avx"},                         {I::sse41, "sse41"}};
  for (const auto& [i, n] : names)
    if (has_isa(isa, i)) return n;
  return "none";
}

// An override variable's value when it is one of `allowed`; another value
// is ignored with a warning (each time the features are detected), so a typo
// such as BRISK_BF16=emulate does not silently measure the default path.
const char* env(const char* name, std::initializer_list<const char*> allowed) {
  const char* v = std::getenv(name);
  if (!v || !*v) return nullptr;
  for (const char* a : allowed)
    if (std::strcmp(v, a) == 0) return v;
  std::string list;
  for (const char* a : allowed) list += std::string(list.empty() ? "" : ", ") + a;
  std::fprintf(stderr, "warning: %s=%s is not a known value (%s); ignored\n", name, v, list.c_str());
  return nullptr;
}

void detect_int8(CpuFeatures& f) {
  const bool avx512_vnni = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") &&
                           __builtin_cpu_supports("avx512vl");
  // AVX-VNNI (CPUID.(7,1):EAX[4]): the VEX-encoded 256-bit vpdpbusd.
  unsigned a = 0, b = 0, c = 0, d = 0;
  const bool avx2 = __builtin_cpu_supports("avx2");
  const bool avx_vnni = avx2 && __get_cpuid_count(7, 1, &a, &b, &c, &d) && ((a >> 4) & 1);
  f.int8_best = avx512_vnni ? Int8Dot::avx512_vnni : avx_vnni ? Int8Dot::avx_vnni : avx2 ? Int8Dot::avx2 : Int8Dot::scalar;
  f.avx_vnni = avx_vnni;
  f.int8 = f.int8_best;
  f.int8_reason = std::string("CPU has ") + int8_dot_name(f.int8_best);
  if (const char* forced = env("BRISK_INT8", {"avx512_vnni", "avx_vnni", "avx2", "scalar"})) {
    for (Int8Dot p : {Int8Dot::avx512_vnni, Int8Dot::avx_vnni, Int8Dot::avx2, Int8Dot::scalar})
      if (std::strcmp(forced, int8_dot_name(p)) == 0) {
        if (!int8_path_available(f, p)) {  // a faster path than the CPU has
          std::fprintf(stderr, "warning: BRISK_INT8=%s: this CPU has no such path (its best is %s); ignored\n",
                       forced, int8_dot_name(f.int8_best));
          continue;
        }
        f.int8 = p;
        f.int8_reason = std::string("BRISK_INT8=") + forced +
                        (p == Int8Dot::avx_vnni && !f.avx_vnni ? " (EVEX-encoded: no AVX-VNNI here)" : "");
      }
  }
}

CpuFeatures detect() {
  CpuFeatures f;
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512_bf16 = __builtin_cpu_supports("avx512bf16");
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) f.amx_bf16 = (d >> 22) & 1;  // CPUID.7.0:EDX[22]
  const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
  f.onednn_isa = isa_name(isa);
  const bool onednn_bf16 = has_isa(isa, dnnl::cpu_isa::avx512_core_bf16) || has_isa(isa, dnnl::cpu_isa::avx512_core_amx);

  // ---- bf16
  const char* forced = env("BRISK_BF16", {"emulated"});
  if (forced && std::strcmp(forced, "emulated") == 0) {
    f.bf16 = Bf16Path::emulated;
    f.bf16_reason = "BRISK_BF16=emulated";
  } else if ((f.avx512_bf16 || f.amx_bf16) && onednn_bf16) {
    f.bf16 = Bf16Path::native;
    f.bf16_reason = std::string("CPU has ") + (f.amx_bf16 ? "amx_bf16" : "avx512_bf16") + ", oneDNN " + f.onednn_isa;
  } else {
    f.bf16 = Bf16Path::emulated;
    f.bf16_reason = !(f.avx512_bf16 || f.amx_bf16)
                        ? "CPU has no avx512_bf16 or amx_bf16"
                        : "oneDNN's effective ISA " + f.onednn_isa + " has no bf16 matmul (ONEDNN_MAX_CPU_ISA?)";
  }

  // ---- fp32
  const char* gemm = env("BRISK_GEMM", {"openblas", "onednn"});
  if (gemm && std::strcmp(gemm, "openblas") == 0) {
    f.f32_gemm = F32Gemm::openblas;
    f.f32_reason = "BRISK_GEMM=openblas";
  } else if (gemm && std::strcmp(gemm, "onednn") == 0) {
    f.f32_gemm = F32Gemm::onednn;
    f.f32_reason = "BRISK_GEMM=onednn";
  } else if (has_isa(isa, dnnl::cpu_isa::avx512_core)) {
    f.f32_gemm = F32Gemm::onednn;
    f.f32_reason = "oneDNN " + f.onednn_isa;
  } else {
    f.f32_gemm = F32Gemm::openblas;
    f.f32_reason = "oneDNN " + f.onednn_isa + " (no AVX-512): OpenBLAS";
  }
  detect_int8(f);
  // "avx2": the AVX2 + FMA kernels on an AVX-512 CPU (tests run both there).
  const char* rows = env("BRISK_FEW_ROWS", {"portable", "avx2"});
  const bool portable = rows && std::strcmp(rows, "portable") == 0;
  const bool avx2_only = rows && std::strcmp(rows, "avx2") == 0;
  f.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  f.few_rows_avx512 = f.avx512f && __builtin_cpu_supports("avx512vl") && !portable && !avx2_only;
  using PackedPath = CpuFeatures::PackedPath;
  f.packed = portable                   ? PackedPath::portable
             : f.avx512f && !avx2_only ? PackedPath::avx512
             : f.avx2_fma              ? PackedPath::avx2
                                       : PackedPath::portable;
  const char* attention = env("BRISK_ATTENTION", {"blas", "tiles"});
  if (attention && std::strcmp(attention, "blas") == 0) f.attention_tiles = false;
  else if (attention && std::strcmp(attention, "tiles") == 0) f.attention_tiles = f.avx2_fma;
  else f.attention_tiles = f.avx2_fma && !f.avx512f;
  return f;
}

std::mutex g_mutex;
CpuFeatures* g_features = nullptr;

}  // namespace

const CpuFeatures& cpu_features() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_features) g_features = new CpuFeatures(detect());  // lives for the process
  return *g_features;
}

void reload_cpu_features() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_features) g_features = new CpuFeatures();
  *g_features = detect();
}

const char* bf16_path_name(Bf16Path p) { return p == Bf16Path::native ? "bf16-native" : "bf16-emulated"; }
const char* f32_gemm_name(F32Gemm g) { return g == F32Gemm::onednn ? "onednn" : "openblas"; }

bool int8_path_available(const CpuFeatures& f, Int8Dot p) {
  // Every path at or below the best: avx_vnni runs VEX-encoded on AVX-VNNI,
  // EVEX-encoded on AVX-512 VNNI + VL (dot_q8_for).
  return int(p) >= int(f.int8_best);
}

const char* int8_dot_name(Int8Dot d) {
  switch (d) {
    case Int8Dot::avx512_vnni: return "avx512_vnni";
    case Int8Dot::avx_vnni: return "avx_vnni";
    case Int8Dot::avx2: return "avx2";
    case Int8Dot::scalar: return "scalar";
  }
  return "?";
}

const char* packed_path_name(CpuFeatures::PackedPath p) {
  switch (p) {
    case CpuFeatures::PackedPath::avx512: return "avx512";
    case CpuFeatures::PackedPath::avx2: return "avx2";
    case CpuFeatures::PackedPath::portable: return "portable";
  }
  return "?";
}

}  // namespace brisk::cpu
