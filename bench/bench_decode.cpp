// The Linears of one decoding step (W1: qkv, attention projection, MLP in
// and out, the LM head) at 1 to 16 rows: fp32 as training stores it
// (`linear`, "fp32"), fp32 in the engine's panels (`linear_packed`,
// "packed"), int8 (`linear_q8`), int8 in the engine's panels
// (`linear_q8_packed`, "int8p"), int4 (`linear_q4`, random codes) and int4
// in the engine's panels (`linear_q4_packed`, "int4p"), through the CPU
// backend's kernels, next to this machine's
// measured FMA peak and memory bandwidth: how close batched decoding's
// products come to what the cores and memory can do, and so how much
// batching can gain over one row.
//
// Times are medians over --reps calls after 3 warm-up calls; the row counts
// of one shape run interleaved on the same weights, so drift hits them
// alike. GFLOP/s counts 2 x rows x out x in; GB/s counts the weight's bytes
// once per call (what one row must read).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "brisk/core/op.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/cpu/cpu_features.h"
#include "brisk/monitor/peak.h"
#include "brisk/ops/ops.h"
#include "brisk/ops/packed_linear.h"
#include "brisk/ops/quant.h"
#include "bench_cli.h"

using brisk::bench_cli::median;

using namespace brisk;
using core::DType;
using core::OpKind;
using core::Tensor;
using core::TensorView;

namespace {

struct Options {
  int threads = 2, reps = 30;
  std::string json_path = "bench/results/decode.json";
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&] { return std::string(bench_cli::flag_value(argc, argv, i, "bench_decode")); };
    if (a == "--threads") o.threads = int(bench_cli::int_value(value().c_str(), "--threads", "bench_decode", 1));
    else if (a == "--reps") o.reps = int(bench_cli::int_value(value().c_str(), "--reps", "bench_decode", 1));
    else if (a == "--json") o.json_path = value();
    else {
      std::fprintf(stderr, "usage: bench_decode [--threads 2] [--reps 30] [--json PATH]\n");
      std::exit(a == "--help" ? 0 : 2);
    }
  }
  if (o.threads < 1 || o.reps < 1) {
    std::fprintf(stderr, "bench_decode: --threads and --reps must be at least 1\n");
    std::exit(2);
  }
  return o;
}

struct Shape {
  const char* name;
  int64_t out, in;
};

// One op call with its buffers, ready to repeat.
struct Call {
  OpKind kind;
  std::vector<TensorView> in, out;
  std::vector<unsigned char> ws;
  core::OpParams params;
  double run(core::Backend& be) {
    const auto t0 = std::chrono::steady_clock::now();
    core::run_op(be, kind, in, out, params, ws.data(), ws.size());
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
};

Call make_call(OpKind k, const std::vector<const Tensor*>& in, const Tensor& y, core::OpParams params = {}) {
  Call c{k, {}, {y.as_view()}, {}, params};
  std::vector<core::TensorMeta> metas;
  for (const Tensor* t : in) c.in.push_back(t->as_view()), metas.push_back(t->meta());
  const core::OpDef& def = core::op_def(k);
  c.ws.resize(def.workspace_bytes ? def.workspace_bytes(metas, {}) : 0);
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  ops::register_ops();
  cpu::CpuBackend be(o.threads);
  const auto& f = cpu::cpu_features();

  monitor::PeakMeter fma(monitor::fma_loop, o.threads, 0.05);
  monitor::TriadMeter triad(o.threads);
  for (int i = 0; i < 3; ++i) fma.sample(), triad.sample();
  const double peak_gflops = fma.best(), peak_gbs = triad.best();
  std::printf("bench_decode: W1 Linears, %d threads, median of %d after 3 warm-up; int8 path %s, few-row f32 %s, "
              "packed f32 %s tiles\n",
              o.threads, o.reps, cpu::int8_dot_name(f.int8), f.few_rows_avx512 ? "avx512 tiles" : "portable",
              cpu::packed_path_name(f.packed));
  std::printf("machine: fp32 FMA peak %.1f GFLOP/s, STREAM triad %.1f GB/s (best of 3, this process)\n\n", peak_gflops,
              peak_gbs);

  const std::vector<Shape> shapes = {{"qkv", 768, 256}, {"attn.proj", 256, 256}, {"mlp.fc", 1024, 256},
                                     {"mlp.proj", 256, 1024}, {"lm_head", 50304, 256}};
  const std::vector<int64_t> row_counts = {1, 2, 4, 8, 16};
  std::printf("%-10s %-6s %5s %10s %10s %8s %9s %8s %12s\n", "linear", "dtype", "rows", "us", "GFLOP/s", "% peak",
              "weight GB/s", "% triad", "us/row vs 1");
  nlohmann::json rows_json = nlohmann::json::array();
  uint64_t seed = 1;
  for (const Shape& s : shapes) {
    const Tensor w = Tensor::uniform({s.out, s.in}, DType::f32, seed++, -0.05f, 0.05f);
    const Tensor bias = Tensor::uniform({s.out}, DType::f32, seed++, -0.1f, 0.1f);
    // int8 weights with a scale per output row, as `brisk quantize` writes them.
    Tensor wq = Tensor::empty({s.out, s.in}, DType::i8), wscale = Tensor::empty({s.out}, DType::f32);
    for (int64_t r = 0; r < s.out; ++r)
      wscale.data_as<float>()[r] = ops::quant::quantize_int8(w.data_as<float>() + r * s.in, s.in, wq.data_as<int8_t>() + r * s.in);
    // int4 weights as llama.cpp's Q4_0 (brisk/ops/quant.h): random codes, a scale per group of 32.
    const Tensor w4 = Tensor::uniform({s.out, s.in / 2}, DType::u8, seed++, 0, 256);
    const Tensor w4scale = Tensor::uniform({s.out, s.in / ops::quant::kQ4Group}, DType::f32, seed++, 0.001f, 0.01f);
    Tensor wp = Tensor::empty(ops::packed::packed_shape(s.out, s.in), DType::f32);
    ops::packed::pack(w.data_as<float>(), s.out, s.in, wp.data_as<float>());
    Tensor wq_packed = Tensor::empty(ops::packed::q8_packed_shape(s.out, s.in), DType::u8);
    ops::packed::pack_q8(wq.data_as<int8_t>(), s.out, s.in, wq_packed.data_as<uint8_t>());
    Tensor w4_packed = Tensor::empty(ops::packed::q4_packed_shape(s.out, s.in), DType::u8);
    Tensor w4scale_packed = Tensor::empty(ops::packed::q4_packed_scale_shape(s.out, s.in), DType::f32);
    ops::packed::pack_q4(w4.data_as<uint8_t>(), w4scale.data_as<float>(), s.out, s.in, w4_packed.data_as<uint8_t>(),
                         w4scale_packed.data_as<float>());
    for (const char* kind : {"fp32", "packed", "int8", "int8p", "int4", "int4p"}) {
      const bool q8p = std::string(kind) == "int8p", q8 = std::string(kind) == "int8" || q8p,
                 q4p = std::string(kind) == "int4p", q4 = std::string(kind) == "int4" || q4p,
                 packed = std::string(kind) == "packed";
      std::vector<Tensor> xs, ys;
      std::vector<Call> calls;
      for (int64_t n : row_counts) {
        xs.push_back(Tensor::uniform({n, s.in}, DType::f32, seed++, -1.f, 1.f));
        ys.push_back(Tensor::empty({n, s.out}, DType::f32));
      }
      for (size_t i = 0; i < row_counts.size(); ++i)
        calls.push_back(q8p      ? make_call(OpKind::linear_q8_packed, {&xs[i], &wq_packed, &wscale, &bias}, ys[i],
                                             core::PackedLinearParams{s.out})
                        : q4p    ? make_call(OpKind::linear_q4_packed, {&xs[i], &w4_packed, &w4scale_packed, &bias},
                                             ys[i], core::PackedLinearParams{s.out})
                        : q8     ? make_call(OpKind::linear_q8, {&xs[i], &wq, &wscale, &bias}, ys[i])
                        : q4     ? make_call(OpKind::linear_q4, {&xs[i], &w4, &w4scale, &bias}, ys[i])
                        : packed ? make_call(OpKind::linear_packed, {&xs[i], &wp, &bias}, ys[i],
                                             core::PackedLinearParams{s.out})
                                 : make_call(OpKind::linear, {&xs[i], &w, &bias}, ys[i]));
      std::vector<std::vector<double>> times(calls.size());
      for (int rep = 0; rep < o.reps + 3; ++rep)
        for (size_t i = 0; i < calls.size(); ++i) {
          const double dt = calls[i].run(be);
          if (rep >= 3) times[i].push_back(dt);
        }
      const double one_row = median(times[0]);
      // Bytes of weights (and int4's scales) that one call reads.
      const double weight_bytes = q4 ? double(s.out * s.in) * (0.5 + 4.0 / double(ops::quant::kQ4Group))
                                     : double(s.out * s.in) * (q8 ? 1 : 4);
      for (size_t i = 0; i < calls.size(); ++i) {
        const double sec = median(times[i]), n = double(row_counts[i]);
        const double gflops = 2 * n * double(s.out * s.in) / sec * 1e-9, gbs = weight_bytes / sec * 1e-9;
        std::printf("%-10s %-6s %5lld %10.1f %10.1f %7.1f%% %9.1f %7.1f%% %12.3f\n", s.name, kind,
                    static_cast<long long>(row_counts[i]), 1e6 * sec, gflops, 100 * gflops / peak_gflops, gbs,
                    100 * gbs / peak_gbs, sec / n / one_row);
        rows_json.push_back({{"linear", s.name}, {"out", s.out}, {"in", s.in}, {"dtype", kind},
                             {"rows", row_counts[i]}, {"us", 1e6 * sec}, {"gflops", gflops},
                             {"weight_gbs", gbs}, {"time_per_row_vs_one_row", sec / n / one_row}});
      }
    }
  }
  const nlohmann::json out = {{"benchmark", "bench_decode"},
                              {"threads", o.threads},
                              {"reps", o.reps},
                              {"int8_path", cpu::int8_dot_name(f.int8)},
                              {"few_rows_f32", f.few_rows_avx512 ? "avx512" : "portable"},
                              {"packed_f32", cpu::packed_path_name(f.packed)},
                              {"peak_fp32_gflops", peak_gflops},
                              {"triad_gbs", peak_gbs},
                              {"rows", rows_json}};
  const std::filesystem::path path(o.json_path);
  bench_cli::write_json(path.string(), out.dump(2) + "\n", "bench_decode");
  std::printf("\nwrote %s\n", o.json_path.c_str());
  return 0;
}
