// GEMM benchmark: the matrix products of one GPT-2 training step (workloads
// W1 and W2 of docs/workloads.md) through OpenBLAS and oneDNN, fp32 and bf16, next
// to this machine's measured peak (FMA FLOP/s, bf16 dot products, memory
// bandwidth).
//
// Why it exists: the CPU matrix-product library (OpenBLAS or oneDNN) is
// chosen on the workloads (docs/cpu-paths.md). This program answers
// that per shape and per step, so it deliberately calls both libraries
// directly (cblas_sgemm / cblas_sbgemm, dnnl::matmul) and nothing of brisk's
// own core: the numbers must not move when the engine's code does.
//
// How: each Linear y = x W^T (W stored (out, in), as in PyTorch and brisk's
// linear op) gives three products per step: forward X W^T, dX = dY W and
// dW = dY^T X, with the transposes expressed as strides rather than copies,
// as the engine will call them. The four variants of a shape (OpenBLAS and
// oneDNN, f32 and bf16) share inputs and their repeats are interleaved, so
// the load of other users of this 2-core machine hits them alike; the
// reported time is the median of repeats after a warm-up call. Peaks come
// from brisk/monitor/peak.h, measured in this process with the same threads.
#include <cblas.h>
#include <dlfcn.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <dnnl.hpp>

#include "brisk/cpu/cpu_features.h"
#include "brisk/monitor/peak.h"
#include "bench_cli.h"

namespace {

using namespace brisk::monitor;

struct Options {
  int threads = 0;
  bool quick = false;
  double target_s = 0.3;  // wall time spent timing one (shape, library, dtype)
  std::string json_path = "bench/results/gemm.json";
};

void usage() {
  std::puts(
      "usage: bench_gemm [--threads N] [--quick] [--target-s S] [--json PATH]\n"
      "  --threads N   threads for OpenBLAS and oneDNN (default: all cores)\n"
      "  --quick       few repeats per shape (smoke run)\n"
      "  --target-s S  seconds of timing per shape and variant (default 0.3)\n"
      "  --json PATH   output file (default bench/results/gemm.json)");
}

Options parse_args(int argc, char** argv) {
  Options o;
  o.threads = omp_get_num_procs();
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&] { return std::string(brisk::bench_cli::flag_value(argc, argv, i, "bench_gemm")); };
    if (a == "--threads") o.threads = int(brisk::bench_cli::int_value(value().c_str(), "--threads", "bench_gemm", 1));
    else if (a == "--quick") o.quick = true;
    else if (a == "--target-s") o.target_s = brisk::bench_cli::number_value(value().c_str(), "--target-s", "bench_gemm", 0);
    else if (a == "--json") o.json_path = value();
    else if (a == "-h" || a == "--help") { usage(); std::exit(0); }
    else { std::fprintf(stderr, "unknown argument %s\n", a.c_str()); usage(); std::exit(2); }
  }
  if (o.quick) o.target_s = std::min(o.target_s, 0.02);
  return o;
}

// ---- shapes ----------------------------------------------------------------------------
struct Workload {
  const char* id;
  int64_t vocab, layers, embd;
};
constexpr int64_t kRows = 8 * 256;  // micro-batch x sequence, both workloads
constexpr Workload kWorkloads[] = {{"W1", 50304, 4, 256}, {"W2", 256, 6, 384}};

// C (M x N) = op(A) op(B), row-major, op = transpose when the flag is set.
struct Shape {
  std::string workload, name;
  int64_t m, n, k;
  bool trans_a, trans_b;
  int64_t per_step;  // how many times one training step runs it
  double flops() const { return 2.0 * double(m) * double(n) * double(k); }
};

std::vector<Shape> make_shapes() {
  std::vector<Shape> shapes;
  for (const Workload& w : kWorkloads) {
    const int64_t c = w.embd;
    struct Lin {
      const char* name;
      int64_t in, out, count;
    };
    const Lin lins[] = {{"qkv", c, 3 * c, w.layers},
                        {"attn proj", c, c, w.layers},
                        {"fc", c, 4 * c, w.layers},
                        {"fc proj", 4 * c, c, w.layers},
                        {"lm head", c, w.vocab, 1}};
    for (const Lin& l : lins) {
      const std::string base = std::string(w.id) + " " + l.name;
      shapes.push_back({w.id, base + " fwd", kRows, l.out, l.in, false, true, l.count});
      shapes.push_back({w.id, base + " dX", kRows, l.in, l.out, false, false, l.count});
      shapes.push_back({w.id, base + " dW", l.out, l.in, kRows, true, false, l.count});
    }
  }
  return shapes;
}

// ---- data ------------------------------------------------------------------------------
uint16_t to_bf16(float f) {  // round to nearest even; inputs are finite
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

std::vector<float> random_matrix(int64_t n, uint64_t seed) {
  // Magnitudes in [0.1, 1) with random signs: never zero, so a kernel that
  // skips or drops a term cannot hide behind zeros.
  std::vector<float> v(n);
#pragma omp parallel
  {
    std::mt19937_64 rng(seed * 1000003u + omp_get_thread_num());
    std::uniform_real_distribution<float> mag(0.1f, 1.0f);
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i) v[i] = (rng() & 1 ? -1.f : 1.f) * mag(rng);
  }
  return v;
}

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < int64_t(v.size()); ++i) out[i] = to_bf16(v[i]);
  return out;
}

// max |x - ref| / max |ref|: scale-free, and one bad element is enough to fail.
double normalized_max_error(const std::vector<float>& x, const std::vector<float>& ref) {
  double err = 0, mag = 0;
#pragma omp parallel for reduction(max : err, mag) schedule(static)
  for (int64_t i = 0; i < int64_t(ref.size()); ++i) {
    const double d = std::fabs(double(x[i]) - ref[i]);
    err = std::max(err, std::isnan(d) ? INFINITY : d);
    mag = std::max(mag, double(std::fabs(ref[i])));
  }
  return mag > 0 ? err / mag : err;
}

// ---- runners ---------------------------------------------------------------------------
struct Variant {
  std::string lib, dtype;
};
const Variant kVariants[] = {{"openblas", "f32"}, {"onednn", "f32"}, {"openblas", "bf16"}, {"onednn", "bf16"}};

struct Result {
  const Shape* shape = nullptr;
  Variant variant;
  bool available = false;
  std::string impl;  // kernel the library picked, or why it is unavailable
  std::string note;
  int reps = 0;
  double median_ms = 0, min_ms = 0, gflops = 0, pct_peak = 0;
  double max_err = 0;  // vs OpenBLAS f32 (NaN for OpenBLAS f32 itself)
  bool check_ok = true;
  double others_busy = 0;  // share of all CPUs other processes used while it was timed
};

struct Inputs {
  std::vector<float> a, b;
  std::vector<uint16_t> a16, b16;
};

// One prepared variant of a shape: `fn` computes C once. Buffers it needs
// (widened operands, oneDNN handles) are owned by the closure.
struct Runner {
  bool available = false;
  std::string impl;  // kernel the library picked, or why it is unavailable
  std::string note;  // why a fallback path was taken, printed once under the table
  std::function<void()> fn;
};

// Debian's OpenBLAS is built without BUILD_BFLOAT16: the header declares
// cblas_sbgemm but the library lacks it. Looking it up at run time keeps one
// binary for both kinds of build.
using SbgemmFn = decltype(&cblas_sbgemm);
SbgemmFn find_sbgemm() { return reinterpret_cast<SbgemmFn>(dlsym(RTLD_DEFAULT, "cblas_sbgemm")); }

void widen(const std::vector<uint16_t>& src, std::vector<float>& dst) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < int64_t(src.size()); ++i) {
    const uint32_t u = uint32_t(src[i]) << 16;
    std::memcpy(&dst[i], &u, 4);
  }
}

Runner make_openblas(const Shape& s, const Inputs& in, bool bf16, std::vector<float>& c) {
  const auto ta = s.trans_a ? CblasTrans : CblasNoTrans, tb = s.trans_b ? CblasTrans : CblasNoTrans;
  const blasint lda = s.trans_a ? s.m : s.k, ldb = s.trans_b ? s.k : s.n;
  Runner r;
  r.available = true;
  if (!bf16) {
    r.impl = "cblas_sgemm";
    r.fn = [&s, &in, &c, ta, tb, lda, ldb] {
      cblas_sgemm(CblasRowMajor, ta, tb, s.m, s.n, s.k, 1.f, in.a.data(), lda, in.b.data(), ldb, 0.f, c.data(),
                  s.n);
    };
  } else if (const SbgemmFn sbgemm = find_sbgemm()) {
    r.impl = "cblas_sbgemm";
    r.fn = [&s, &in, &c, ta, tb, lda, ldb, sbgemm] {
      sbgemm(CblasRowMajor, ta, tb, s.m, s.n, s.k, 1.f, in.a16.data(), lda, in.b16.data(), ldb, 0.f, c.data(),
             s.n);
    };
  } else {
    // What a bf16 matmul costs through this OpenBLAS: widen both operands
    // to f32 (timed: it is part of the cost) and run sgemm.
    r.impl = "widen bf16->f32 + cblas_sgemm";
    r.note = "this OpenBLAS has no cblas_sbgemm (built without BUILD_BFLOAT16): bf16 timed as widen + sgemm";
    auto wa = std::make_shared<std::vector<float>>(in.a16.size());
    auto wb = std::make_shared<std::vector<float>>(in.b16.size());
    r.fn = [&s, &in, &c, ta, tb, lda, ldb, wa, wb] {
      widen(in.a16, *wa);
      widen(in.b16, *wb);
      cblas_sgemm(CblasRowMajor, ta, tb, s.m, s.n, s.k, 1.f, wa->data(), lda, wb->data(), ldb, 0.f, c.data(),
                  s.n);
    };
  }
  return r;
}

Runner make_onednn(const Shape& s, const Inputs& in, bool bf16, std::vector<float>& c, const dnnl::engine& eng,
                   dnnl::stream strm) {
  using dnnl::memory;
  using tag = memory::format_tag;
  // Transposes as layouts: a logical (M, K) operand stored (K, M) is tag ba.
  auto make_pd = [&](memory::data_type dt) {
    const memory::desc a_md({s.m, s.k}, dt, s.trans_a ? tag::ba : tag::ab);
    const memory::desc b_md({s.k, s.n}, dt, s.trans_b ? tag::ba : tag::ab);
    const memory::desc c_md({s.m, s.n}, memory::data_type::f32, tag::ab);
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), eng);
  };
  Runner r;
  std::optional<dnnl::matmul::primitive_desc> pd;
  bool widen_inputs = false;
  try {
    pd.emplace(make_pd(bf16 ? memory::data_type::bf16 : memory::data_type::f32));
    r.impl = pd->impl_info_str();
  } catch (const dnnl::error& e) {
    if (!bf16) {
      r.impl = std::string("unavailable: ") + e.what();
      return r;
    }
    // oneDNN 2.x has bf16 matmul only from avx512_core up; below that the
    // engine would have to widen to f32 itself, so that is what gets timed.
    pd.emplace(make_pd(memory::data_type::f32));
    widen_inputs = true;
    r.impl = std::string("widen bf16->f32 + ") + pd->impl_info_str();
    r.note = "this oneDNN has no bf16 matmul for this CPU (needs avx512_core): bf16 timed as widen + f32 matmul";
  }
  r.available = true;
  std::shared_ptr<std::vector<float>> wa, wb;
  if (widen_inputs) {
    wa = std::make_shared<std::vector<float>>(in.a16.size());
    wb = std::make_shared<std::vector<float>>(in.b16.size());
  }
  void* pa = widen_inputs ? (void*)wa->data() : bf16 ? (void*)in.a16.data() : (void*)in.a.data();
  void* pb = widen_inputs ? (void*)wb->data() : bf16 ? (void*)in.b16.data() : (void*)in.b.data();
  memory a_mem(pd->src_desc(), eng, pa), b_mem(pd->weights_desc(), eng, pb),
      c_mem(pd->dst_desc(), eng, c.data());
  dnnl::matmul prim(*pd);
  r.fn = [&in, prim, strm, a_mem, b_mem, c_mem, wa, wb]() mutable {
    if (wa) widen(in.a16, *wa), widen(in.b16, *wb);
    prim.execute(strm, {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, c_mem}});
    strm.wait();
  };
  return r;
}

// Times the variants of one shape. Each gets a warm-up call, then repeats
// filling ~target_s (at least min_reps: a median of 3 survives one disturbed
// run; a single run where that would take over ~5 s). The repeats are
// interleaved round-robin, so load from other processes on this shared
// machine lands on all variants alike and their ratios stay fair.
void time_variants(std::vector<Runner>& runners, std::vector<Result>& results, double target_s, int min_reps) {
  const size_t n = runners.size();
  std::vector<int> reps(n, 0);
  std::vector<std::vector<double>> t(n);
  for (size_t v = 0; v < n; ++v) {
    if (!runners[v].available) continue;
    const auto t0 = Clock::now();
    runners[v].fn();
    const double warm = seconds_since(t0);
    reps[v] = warm * min_reps > 5.0 ? 1 : std::clamp(int(target_s / std::max(warm, 1e-6)), min_reps, 2000);
  }
  for (int round = 0; round < *std::max_element(reps.begin(), reps.end()); ++round)
    for (size_t v = 0; v < n; ++v) {
      if (round >= reps[v]) continue;
      const auto t0 = Clock::now();
      runners[v].fn();
      t[v].push_back(seconds_since(t0));
    }
  for (size_t v = 0; v < n; ++v) {
    Result& r = results[v];
    r.available = runners[v].available;
    r.impl = runners[v].impl;
    r.note = runners[v].note;
    if (!r.available) continue;
    std::vector<double>& x = t[v];
    std::sort(x.begin(), x.end());
    const size_t k = x.size();
    r.reps = int(k);
    r.median_ms = 1e3 * (k % 2 ? x[k / 2] : 0.5 * (x[k / 2 - 1] + x[k / 2]));
    r.min_ms = 1e3 * x[0];
    r.gflops = r.shape->flops() / (r.median_ms * 1e-3) * 1e-9;
  }
}

// ---- output ----------------------------------------------------------------------------
std::string json_str(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\', out += ch;
    else if (ch == '\n') out += "\\n";
    else if (static_cast<unsigned char>(ch) < 0x20) out += ' ';
    else out += ch;
  }
  return out + "\"";
}
std::string json_num(double x) {
  if (!std::isfinite(x)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
}

struct Summary {
  std::string workload, dtype;
  double gflop = 0;                    // one step's GEMM work
  double openblas_ms = 0, onednn_ms = 0, best_ms = 0;  // NaN where a variant is unavailable
  std::string winner;
  double ratio = 0;  // slower / faster
};

}  // namespace

int main(int argc, char** argv) {
  const Options opt = parse_args(argc, argv);
  omp_set_num_threads(opt.threads);
  openblas_set_num_threads(opt.threads);
  const auto t_start = Clock::now();

  const dnnl_version_t* dv = dnnl_version();
  char dnnl_ver[96];
  std::snprintf(dnnl_ver, sizeof dnnl_ver, "%d.%d.%d (%s)", dv->major, dv->minor, dv->patch, dv->hash);
  const std::string cpu = cpu_model(), flags = cpu_flags(), blas_cfg = openblas_get_config();

  std::printf("== bench_gemm: GPT-2 step GEMMs, OpenBLAS vs oneDNN, fp32 and bf16 ==\n");
  std::printf("threads        %d (OpenBLAS %d, OpenMP %d), %d processors online\n", opt.threads,
              openblas_get_num_threads(), omp_get_max_threads(), omp_get_num_procs());
  std::printf("cpu            %s [%s]\n", cpu.c_str(), flags.c_str());
  std::printf("openblas       %s\n", blas_cfg.c_str());
  std::printf("onednn         %s\n", dnnl_ver);
  // The paths brisk's own kernels take on this machine (cpu_features.h).
  const brisk::cpu::CpuFeatures& feat = brisk::cpu::cpu_features();
  const std::string brisk_paths = std::string("bf16 ") + brisk::cpu::bf16_path_name(feat.bf16) + " (" +
                                  feat.bf16_reason + "); fp32 " + brisk::cpu::f32_gemm_name(feat.f32_gemm) + " (" +
                                  feat.f32_reason + ")";
  std::printf("brisk paths    %s\n", brisk_paths.c_str());
  std::printf("timing         median after 1 warm-up, ~%.2f s per shape and variant%s\n", opt.target_s,
              opt.quick ? " (--quick)" : "");

  // Others' work on this 2-core machine halves what we see; say so up front.
  const double busy = others_cpu_share(0.5);
  std::printf("machine load   %.0f%% of all CPUs busy before start%s\n", 100 * busy,
              busy > 0.15 ? "  WARNING: machine busy, numbers will be low and noisy" : "");

  // Peaks: best of samples taken at the start, after every shape and at the
  // end (see brisk/monitor/peak.h: a disturbed sample must not set the peak).
  PeakMeter fp32_meter(fma_loop, opt.threads, 0.05);
  std::optional<PeakMeter> bf16_meter;
  if (have_bf16_peak()) bf16_meter.emplace(bf16_loop, opt.threads, 0.05);
  TriadMeter triad_meter(opt.threads);
  std::vector<double> fp32_samples;
  auto sample_peaks = [&](int n) {
    for (int i = 0; i < n; ++i) {
      fp32_samples.push_back(fp32_meter.sample());
      if (bf16_meter) bf16_meter->sample();
      triad_meter.sample();
    }
  };
  sample_peaks(5);

  const std::vector<Shape> shapes = make_shapes();
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  std::vector<Result> results;
  std::vector<std::string> failures;
  const bool tty = isatty(fileno(stderr));

  for (size_t si = 0; si < shapes.size(); ++si) {
    const Shape& s = shapes[si];
    if (tty) std::fprintf(stderr, "\r[%zu/%zu] %-24s", si + 1, shapes.size(), s.name.c_str());
    Inputs in;
    const uint64_t seed = std::hash<std::string>{}(s.name);
    in.a = random_matrix(s.m * s.k, seed);
    in.b = random_matrix(s.k * s.n, seed + 1);
    in.a16 = to_bf16(in.a);
    in.b16 = to_bf16(in.b);
    // Fresh output per variant, pre-faulted (NaN-filled) so warm-ups time only the product.
    std::vector<std::vector<float>> outs(std::size(kVariants));
    std::vector<Runner> runners;
    std::vector<Result> rs(std::size(kVariants));
    for (size_t v = 0; v < std::size(kVariants); ++v) {
      const Variant& var = kVariants[v];
      outs[v].assign(s.m * s.n, NAN);
      const bool bf16 = var.dtype == "bf16";
      runners.push_back(var.lib == "openblas" ? make_openblas(s, in, bf16, outs[v])
                                              : make_onednn(s, in, bf16, outs[v], eng, strm));
      rs[v].shape = &s, rs[v].variant = var;
    }
    const CpuSnapshot before = CpuSnapshot::now();
    time_variants(runners, rs, opt.target_s, opt.quick ? 1 : 3);
    const double others = others_cpu_share(before, CpuSnapshot::now());
    for (Result& r : rs) r.others_busy = others;
    runners.clear();  // drops widened copies before the checks
    // Everything is checked against OpenBLAS f32 (variant 0).
    const std::vector<float>& ref = outs[0];
    for (size_t v = 0; v < rs.size(); ++v) {
      Result& r = rs[v];
      r.max_err = NAN;
      if (v > 0 && r.available) {
        // fp32 libraries differ only in summation order; bf16 inputs carry
        // 2^-9 relative rounding each, which over random signs stays well
        // under 1% of the largest output.
        const bool bf16 = r.variant.dtype == "bf16";
        const double tol = bf16 ? 1e-2 : 1e-4;
        r.max_err = normalized_max_error(outs[v], ref);
        r.check_ok = r.max_err < tol;
        if (!r.check_ok) {
          char buf[256];
          std::snprintf(buf, sizeof buf, "FAIL: %s %s %s: normalized max error %.3g vs OpenBLAS f32 (tolerance %.0e)",
                        s.name.c_str(), r.variant.lib.c_str(), r.variant.dtype.c_str(), r.max_err, tol);
          failures.push_back(buf);
        }
      }
      results.push_back(std::move(r));
    }
    sample_peaks(1);
  }
  if (tty) std::fprintf(stderr, "\r%40s\r", "");

  sample_peaks(5);
  const double fp32_peak = fp32_meter.best();
  const double bf16_peak = bf16_meter ? bf16_meter->best() : NAN;
  const double triad = triad_meter.best();
  const double fp32_median = brisk::bench_cli::median(fp32_samples);
  std::printf("peak fp32      %.1f GFLOP/s  (%s, %d chains/thread, %d threads; best of %d samples, median %.1f)%s\n",
              fp32_peak, kFmaIsa, kChains, opt.threads, fp32_meter.samples(), fp32_median,
              fp32_median < 0.8 * fp32_peak ? "  WARNING: unsteady, machine busy" : "");
  if (bf16_meter)
    std::printf("peak bf16      %.1f GFLOP/s  (avx512_bf16 vdpbf16ps, best of %d samples)\n", bf16_peak,
                bf16_meter->samples());
  else
    std::printf("peak bf16      n/a (no avx512_bf16): bf16 GEMMs run through emulation (bf16 widened to f32), "
                "their %% is of the fp32 peak (marked *)\n");
  std::printf("memory         %.1f GB/s  (STREAM triad, 3 arrays, 512 MB in all, best of %d samples)\n\n", triad,
              triad_meter.samples());

  std::printf("%-20s %6s %6s %6s  %-8s %-5s %9s %9s %7s  %-5s %6s  %s\n", "shape", "M", "N", "K", "lib", "dtype",
              "ms(med)", "GFLOP/s", "%peak", "check", "others", "kernel");
  std::vector<std::string> notes;
  int disturbed = 0;
  for (Result& r : results) {
    if (!r.note.empty() && std::find(notes.begin(), notes.end(), r.note) == notes.end()) notes.push_back(r.note);
    disturbed += r.others_busy > 0.1;
    const Shape& s = *r.shape;
    const bool bf16 = r.variant.dtype == "bf16";
    r.pct_peak = 100.0 * r.gflops / (bf16 && have_bf16_peak() ? bf16_peak : fp32_peak);
    const char* check = !r.available ? "-" : std::isnan(r.max_err) ? "ref" : r.check_ok ? "ok" : "FAIL";
    if (r.available)
      std::printf("%-20s %6ld %6ld %6ld  %-8s %-5s %9.3f %9.1f %6.1f%s  %-5s %5.0f%%  %s\n", s.name.c_str(),
                  long(s.m), long(s.n), long(s.k), r.variant.lib.c_str(), r.variant.dtype.c_str(), r.median_ms,
                  r.gflops, r.pct_peak, bf16 && !have_bf16_peak() ? "*" : " ", check, 100 * r.others_busy,
                  r.impl.c_str());
    else
      std::printf("%-20s %6ld %6ld %6ld  %-8s %-5s %9s %9s %7s  %-5s %5.0f%%  %s\n", s.name.c_str(), long(s.m),
                  long(s.n), long(s.k), r.variant.lib.c_str(), r.variant.dtype.c_str(), "n/a", "n/a", "n/a", check,
                  100 * r.others_busy, r.impl.c_str());
  }
  std::printf("others = share of all CPUs used by other processes while that shape was timed\n");
  for (const std::string& n : notes) std::printf("note: %s\n", n.c_str());
  if (disturbed)
    std::printf("WARNING: %d of %zu rows were timed while other processes used >10%% of the CPUs: rerun on an "
                "idle machine\n",
                disturbed, results.size());
  for (const std::string& f : failures) std::printf("%s\n", f.c_str());
  const bool all_ok = failures.empty();

  // One step's GEMMs = every shape times how often the step runs it.
  std::vector<Summary> summaries;
  std::printf("\nper training step (all Linear GEMMs: fwd + dX + dW, x layers; attention score products "
              "not included)\n");
  for (const Workload& w : kWorkloads) {
    for (const char* dtype : {"f32", "bf16"}) {
      Summary sm;
      sm.workload = w.id, sm.dtype = dtype;
      for (const Shape& s : shapes) {
        if (s.workload != w.id) continue;
        sm.gflop += s.per_step * s.flops() * 1e-9;
        double ob = NAN, od = NAN;
        for (const Result& r : results) {
          if (r.shape != &s || r.variant.dtype != dtype) continue;
          const double ms = r.available ? r.median_ms : NAN;
          (r.variant.lib == "openblas" ? ob : od) = ms;
        }
        sm.openblas_ms += s.per_step * ob;
        sm.onednn_ms += s.per_step * od;
        sm.best_ms += s.per_step * (std::isnan(ob) ? od : std::isnan(od) ? ob : std::min(ob, od));
      }
      const double peak = std::string(dtype) == "bf16" && have_bf16_peak() ? bf16_peak : fp32_peak;
      auto rate = [&](double ms) { return sm.gflop / (ms * 1e-3); };
      std::printf("%s %-4s %6.1f GFLOP: openblas %8.1f ms (%6.1f GFLOP/s, %4.1f%%)  onednn %8.1f ms (%6.1f GFLOP/s, "
                  "%4.1f%%)  ",
                  w.id, dtype, sm.gflop, sm.openblas_ms, rate(sm.openblas_ms), 100 * rate(sm.openblas_ms) / peak,
                  sm.onednn_ms, rate(sm.onednn_ms), 100 * rate(sm.onednn_ms) / peak);
      if (std::isnan(sm.openblas_ms) || std::isnan(sm.onednn_ms)) {
        sm.winner = std::isnan(sm.onednn_ms) ? "openblas" : "onednn";
        sm.ratio = NAN;
        std::printf("-> %s (other unavailable)", sm.winner.c_str());
      } else {
        sm.winner = sm.openblas_ms <= sm.onednn_ms ? "openblas" : "onednn";
        sm.ratio = std::max(sm.openblas_ms, sm.onednn_ms) / std::min(sm.openblas_ms, sm.onednn_ms);
        std::printf("-> %s wins x%.2f", sm.winner.c_str(), sm.ratio);
      }
      std::printf("; best per shape %.1f ms\n", sm.best_ms);
      summaries.push_back(sm);
    }
  }

  // JSON: written through bench_cli::write_json (a temporary name renamed
  // into place; a failure exits 1 naming the path).
  namespace fs = std::filesystem;
  const fs::path out_path(opt.json_path);
  {
    std::ostringstream f;
    f << "{\n  \"benchmark\": \"gemm\",\n  \"config\": {\"threads\": " << opt.threads
      << ", \"cpu\": " << json_str(cpu) << ", \"cpu_flags\": " << json_str(flags)
      << ", \"openblas\": " << json_str(blas_cfg) << ", \"onednn\": " << json_str(dnnl_ver)
      << ", \"brisk_bf16_path\": " << json_str(brisk::cpu::bf16_path_name(feat.bf16))
      << ", \"brisk_fp32_gemm\": " << json_str(brisk::cpu::f32_gemm_name(feat.f32_gemm))
      << ", \"brisk_paths\": " << json_str(brisk_paths)
      << ", \"quick\": " << (opt.quick ? "true" : "false") << ", \"target_s\": " << json_num(opt.target_s)
      << ", \"rows\": " << kRows << ", \"machine_busy_before\": " << json_num(busy) << "},\n";
    f << "  \"peak\": {\"fp32_gflops\": " << json_num(fp32_peak) << ", \"fp32_isa\": " << json_str(kFmaIsa)
      << ", \"fp32_gflops_median\": " << json_num(fp32_median) << ", \"samples\": " << fp32_meter.samples()
      << ", \"bf16_gflops\": " << json_num(bf16_peak) << ", \"bf16_note\": "
      << json_str(have_bf16_peak() ? "avx512_bf16 vdpbf16ps"
                                : "n/a (no avx512_bf16): bf16 GEMMs run through emulation; pct_peak is of fp32")
      << ", \"triad_gbps\": " << json_num(triad) << "},\n  \"results\": [\n";
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      const Shape& s = *r.shape;
      f << "    {\"workload\": " << json_str(s.workload) << ", \"shape\": " << json_str(s.name) << ", \"m\": " << s.m
        << ", \"n\": " << s.n << ", \"k\": " << s.k << ", \"trans_a\": " << (s.trans_a ? "true" : "false")
        << ", \"trans_b\": " << (s.trans_b ? "true" : "false") << ", \"per_step\": " << s.per_step
        << ", \"lib\": " << json_str(r.variant.lib) << ", \"dtype\": " << json_str(r.variant.dtype)
        << ", \"available\": " << (r.available ? "true" : "false") << ", \"impl\": " << json_str(r.impl)
        << ", \"reps\": " << r.reps << ", \"median_ms\": " << json_num(r.available ? r.median_ms : NAN)
        << ", \"min_ms\": " << json_num(r.available ? r.min_ms : NAN)
        << ", \"gflops\": " << json_num(r.available ? r.gflops : NAN)
        << ", \"pct_peak\": " << json_num(r.available ? r.pct_peak : NAN)
        << ", \"max_norm_err\": " << json_num(r.max_err) << ", \"others_busy\": " << json_num(r.others_busy)
        << ", \"note\": " << json_str(r.note) << "}" << (i + 1 < results.size() ? "," : "") << "\n";
    }
    f << "  ],\n  \"step_summary\": [\n";
    for (size_t i = 0; i < summaries.size(); ++i) {
      const Summary& sm = summaries[i];
      f << "    {\"workload\": " << json_str(sm.workload) << ", \"dtype\": " << json_str(sm.dtype)
        << ", \"gflop\": " << json_num(sm.gflop) << ", \"openblas_ms\": " << json_num(sm.openblas_ms)
        << ", \"onednn_ms\": " << json_num(sm.onednn_ms) << ", \"best_per_shape_ms\": " << json_num(sm.best_ms)
        << ", \"winner\": " << json_str(sm.winner) << ", \"ratio\": " << json_num(sm.ratio) << "}"
        << (i + 1 < summaries.size() ? "," : "") << "\n";
    }
    f << "  ],\n  \"checks_passed\": " << (all_ok ? "true" : "false")
      << ",\n  \"wall_s\": " << json_num(seconds_since(t_start)) << "\n}\n";
    brisk::bench_cli::write_json(opt.json_path, f.str(), "bench_gemm");
  }
  std::printf("\nwrote %s (%.0f s)\n", fs::absolute(out_path).c_str(), seconds_since(t_start));
  if (!all_ok) {
    std::printf("FAIL: some results disagree with OpenBLAS f32\n");
    return 1;
  }
  return 0;
}
