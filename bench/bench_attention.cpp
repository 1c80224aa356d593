// Plain vs flash (tiled, online-softmax) causal attention on the CPU, forward
// and backward, at a workload's attention shape (default W2: B 8, T 256,
// C 384, 6 heads) on 2 threads. This is the measurement behind GptConfig's
// default `attention`: flash is the default only if it is at least as fast.
// `--masked` times the encoder's bidirectional attention over a right-padded
// batch instead (masked_attention, masked_flash_attention), with sequence
// lengths spread evenly over [T/2, T] as a bucketed batch has them (E1's
// shape: --batch 16 --seq 512 --embd 256 --heads 4).
// `--bf16` times the ops in bf16 (q, k, v, y, dy and dqkv bf16; the
// probabilities and lse f32), on the path the CPU takes (bf16-native where it
// has avx512_bf16, bf16-emulated elsewhere; BRISK_BF16=emulated forces it).
// With --masked the plain op stays f32: it has no bf16 kernel.
// `--dropout P` drops the probabilities inside every op (AttentionParams's
// dropout, as model.attention_dropout trains), so a run with and one
// without it give the dropout's cost in these kernels.
// Times are medians over --reps runs after 3 warm-up runs; both ops run on
// the same random inputs, interleaved, so drift hits both alike. GFLOP/s
// counts the products only (4 T L hd per head forward, 8 T L hd backward).
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
#include "brisk/ops/ops.h"
#include "bench_cli.h"

using brisk::bench_cli::median;

using namespace brisk;
using core::DType;
using core::OpKind;
using core::Tensor;
using core::TensorView;

namespace {

struct Options {
  int64_t B = 8, T = 256, C = 384;
  int heads = 6, threads = 2, reps = 20;
  bool masked = false, bf16 = false;
  float dropout = 0.f;
  std::string json_path = "bench/results/attention.json";
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&] { return bench_cli::flag_value(argc, argv, i, "bench_attention"); };
    if (a == "--batch") o.B = bench_cli::int_value(value(), "--batch", "bench_attention", 1);
    else if (a == "--seq") o.T = bench_cli::int_value(value(), "--seq", "bench_attention", 1);
    else if (a == "--embd") o.C = bench_cli::int_value(value(), "--embd", "bench_attention", 1);
    else if (a == "--heads") o.heads = int(bench_cli::int_value(value(), "--heads", "bench_attention", 1));
    else if (a == "--threads") o.threads = int(bench_cli::int_value(value(), "--threads", "bench_attention", 1));
    else if (a == "--reps") o.reps = int(bench_cli::int_value(value(), "--reps", "bench_attention", 1));
    else if (a == "--json") o.json_path = value();
    else if (a == "--masked") o.masked = true;
    else if (a == "--bf16") o.bf16 = true;
    else if (a == "--dropout") o.dropout = float(bench_cli::number_value(value(), "--dropout", "bench_attention", 0.0, true));
    else {
      std::fprintf(stderr,
                   "usage: bench_attention [--batch 8] [--seq 256] [--embd 384] [--heads 6] [--threads 2] "
                   "[--reps 20] [--masked] [--bf16] [--dropout P] [--json PATH]\n");
      std::exit(a == "--help" ? 0 : 2);
    }
  }
  if (o.reps < 1 || o.B < 1 || o.T < 1 || o.C < 1 || o.heads < 1 || o.threads < 1) {
    std::fprintf(stderr, "bench_attention: --reps, --batch, --seq, --embd, --heads and --threads must be >= 1\n");
    std::exit(2);
  }
  if (!(o.dropout >= 0.f && o.dropout < 1.f)) {
    std::fprintf(stderr, "bench_attention: --dropout must be in [0, 1)\n");
    std::exit(2);
  }
  return o;
}

struct Call {
  OpKind kind;
  std::vector<TensorView> in, out;
  std::vector<unsigned char> ws;
};

Call make_call(OpKind k, const std::vector<const Tensor*>& in, const std::vector<const Tensor*>& out,
               const ops::AttentionParams& p) {
  Call c{k, {}, {}, {}};
  std::vector<core::TensorMeta> metas;
  for (const Tensor* t : in) c.in.push_back(t->as_view()), metas.push_back(t->meta());
  for (const Tensor* t : out) c.out.push_back(t->as_view());
  const core::OpDef& def = core::op_def(k);
  c.ws.resize(def.workspace_bytes ? def.workspace_bytes(metas, p) : 0);
  return c;
}

double seconds_of(core::Backend& be, Call& c, const ops::AttentionParams& p) {
  const auto t0 = std::chrono::steady_clock::now();
  core::run_op(be, c.kind, c.in, c.out, p, c.ws.data(), c.ws.size());
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  ops::register_ops();
  cpu::CpuBackend be(o.threads);
  const ops::AttentionParams p{o.heads, 0.f, o.dropout, 1};
  const int64_t B = o.B, T = o.T, C = o.C, H = o.heads;
  const DType dt = o.bf16 ? DType::bf16 : DType::f32;
  std::printf("bench_attention: B %lld, T %lld, C %lld, heads %d, threads %d, %s, dropout %g, median of %d after 3 "
              "warm-up\n",
              (long long)B, (long long)T, (long long)C, o.heads, o.threads,
              o.bf16 ? cpu::bf16_path_name(cpu::cpu_features().bf16) : "f32", double(o.dropout), o.reps);

  const Tensor qkv = Tensor::uniform({B, T, 3 * C}, dt, 1, -1.f, 1.f);
  const Tensor dy = Tensor::uniform({B, T, C}, dt, 2, -1.f, 1.f);
  // masked_attention has no bf16 kernel (a bf16 encoder runs it in f32
  // between casts): with --masked --bf16 the plain row is f32.
  const bool plain_f32 = o.masked && o.bf16;
  const DType dt_p = plain_f32 ? DType::f32 : dt;
  const Tensor qkv_p = plain_f32 ? Tensor::uniform({B, T, 3 * C}, dt_p, 1, -1.f, 1.f) : qkv;
  const Tensor dy_p = plain_f32 ? Tensor::uniform({B, T, C}, dt_p, 2, -1.f, 1.f) : dy;
  const Tensor y_p = Tensor::empty({B, T, C}, dt_p), probs = Tensor::empty({B, H, T, T}, DType::f32);
  const Tensor y_f = Tensor::empty({B, T, C}, dt), lse = Tensor::empty({B, H, T}, DType::f32);
  const Tensor dq_p = Tensor::empty(qkv.shape(), dt_p), dq_f = Tensor::empty(qkv.shape(), dt);
  // --masked: lengths spread evenly over [T/2, T], the first sequence full.
  const Tensor lengths = Tensor::empty({B}, DType::i32);
  double key_pairs = 0;  // sum over sequences of T x (keys each query sees)
  for (int64_t b = 0; b < B; ++b) {
    const int64_t L = o.masked ? T - (B > 1 ? b * (T / 2) / (B - 1) : 0) : T;
    lengths.data_as<int32_t>()[b] = int32_t(std::max<int64_t>(L, 1));
    key_pairs += o.masked ? double(T) * double(L) : double(T) * double(T + 1) / 2;
  }
  // With --dropout every op takes the key as its last input.
  const Tensor key = Tensor::empty({2}, DType::i32);
  key.data_as<int32_t>()[0] = 12345, key.data_as<int32_t>()[1] = -678;
  auto with_key = [&](std::vector<const Tensor*> in) {
    if (o.dropout > 0.f) in.push_back(&key);
    return in;
  };
  Call fwd_p, bwd_p, fwd_f, bwd_f;
  if (o.masked) {
    fwd_p = make_call(OpKind::masked_attention, with_key({&qkv_p, &lengths}), {&y_p, &probs}, p);
    bwd_p = make_call(OpKind::masked_attention_backward, with_key({&dy_p, &qkv_p, &probs, &lengths}), {&dq_p}, p);
    fwd_f = make_call(OpKind::masked_flash_attention, with_key({&qkv, &lengths}), {&y_f, &lse}, p);
    bwd_f = make_call(OpKind::masked_flash_attention_backward, with_key({&dy, &qkv, &y_f, &lse, &lengths}), {&dq_f}, p);
  } else {
    fwd_p = make_call(OpKind::attention, with_key({&qkv}), {&y_p, &probs}, p);
    bwd_p = make_call(OpKind::attention_backward, with_key({&dy, &qkv, &probs}), {&dq_p}, p);
    fwd_f = make_call(OpKind::flash_attention, with_key({&qkv}), {&y_f, &lse}, p);
    bwd_f = make_call(OpKind::flash_attention_backward, with_key({&dy, &qkv, &y_f, &lse}), {&dq_f}, p);
  }
  // Product flops: QK^T and PV forward, four products backward, 2 hd flops per (query, key) pair each.
  const double hd = double(C / H), fwd_flops = 4 * hd * key_pairs * H, bwd_flops = 2 * fwd_flops;

  std::vector<double> tp_f, tp_b, tf_f, tf_b;
  for (int r = 0; r < 3 + o.reps; ++r) {
    const double a = seconds_of(be, fwd_p, p), b = seconds_of(be, bwd_p, p);
    const double c = seconds_of(be, fwd_f, p), d = seconds_of(be, bwd_f, p);
    if (r < 3) continue;
    tp_f.push_back(a), tp_b.push_back(b), tf_f.push_back(c), tf_b.push_back(d);
  }
  std::vector<double> tp, tf;
  for (size_t i = 0; i < tp_f.size(); ++i) tp.push_back(tp_f[i] + tp_b[i]), tf.push_back(tf_f[i] + tf_b[i]);
  const double saved_p = double(B * H * T * T * 4), saved_f = double(B * H * T * 4);

  const auto gflops = [](double flops, double s) { return flops / s * 1e-9; };
  std::printf("\n%s attention\n%-8s %10s %10s %12s %14s %10s %10s\n", o.masked ? "masked (bidirectional)" : "causal",
              "kind", "fwd ms", "bwd ms", "fwd+bwd ms", "saved MiB", "fwd GF/s", "bwd GF/s");
  std::printf("%-8s %10.3f %10.3f %12.3f %14.3f %10.1f %10.1f\n", plain_f32 ? "plain f32" : "plain", 1e3 * median(tp_f), 1e3 * median(tp_b),
              1e3 * median(tp), saved_p / (1 << 20), gflops(fwd_flops, median(tp_f)), gflops(bwd_flops, median(tp_b)));
  std::printf("%-8s %10.3f %10.3f %12.3f %14.3f %10.1f %10.1f\n", "flash", 1e3 * median(tf_f), 1e3 * median(tf_b),
              1e3 * median(tf), saved_f / (1 << 20), gflops(fwd_flops, median(tf_f)), gflops(bwd_flops, median(tf_b)));
  std::printf("flash / plain fwd+bwd time: %.3f\n", median(tf) / median(tp));

  const nlohmann::json out = {
      {"config", {{"batch", B}, {"seq", T}, {"embd", C}, {"heads", H}, {"threads", o.threads}, {"reps", o.reps},
                  {"masked", o.masked}, {"dropout", o.dropout}, {"plain_dtype", core::dtype_name(dt_p)},
                  {"dtype", o.bf16 ? cpu::bf16_path_name(cpu::cpu_features().bf16) : "f32"}}},
      {"plain", {{"fwd_ms", 1e3 * median(tp_f)}, {"bwd_ms", 1e3 * median(tp_b)}, {"total_ms", 1e3 * median(tp)},
                 {"saved_bytes", saved_p}, {"fwd_gflops", gflops(fwd_flops, median(tp_f))},
                 {"bwd_gflops", gflops(bwd_flops, median(tp_b))}}},
      {"flash", {{"fwd_ms", 1e3 * median(tf_f)}, {"bwd_ms", 1e3 * median(tf_b)}, {"total_ms", 1e3 * median(tf)},
                 {"saved_bytes", saved_f}, {"fwd_gflops", gflops(fwd_flops, median(tf_f))},
                 {"bwd_gflops", gflops(bwd_flops, median(tf_b))}}},
      {"flash_over_plain", median(tf) / median(tp)}};
  const std::filesystem::path path(o.json_path);
  bench_cli::write_json(path.string(), out.dump(2) + "\n", "bench_attention");
  std::printf("wrote %s\n", o.json_path.c_str());
  return 0;
}
