// Attention over a block-paged key/value cache, for inference (src/infer/):
//
//   kv_attention(qkv (N, 3C), k_cache (B, T, C), v_cache (B, T, C),
//                rows i32 (N, 2), block_table i32 (S, M))
//     -> y (N, C), k_cache, v_cache (updated in place)
//
// Each of the N rows is one token of some sequence: rows[r] = (sequence slot
// s, position p). The cache holds B blocks of T positions; sequence s keeps
// position p in block block_table[s][p / T], slot p % T. The op first stores
// every row's key and value (the k and v thirds of its qkv, laid out as in
// the `attention` op) at its position, then each row attends with its query
// to positions 0..p of its own sequence: causal, and a prefill of many rows
// of one sequence sees its own earlier rows. Rows of different sequences, at
// different positions, mix freely in one call: that is what lets one step
// serve prefills and decodes of many sequences together.
//
// The caches are f32 or bf16 (both the same): a bf16 cache stores each key
// and value rounded to nearest even, and the products read them back
// widened, in f32 (half the memory and half the bytes a decoding step
// reads). The kernel is keyed on qkv, f32 either way.
//
// A row whose slot, position or block is out of range is an error (the
// engine never makes one; a wrong table would otherwise write anywhere).
// Inference only: no backward.
#include <cmath>

#include "op_util.h"

namespace brisk::ops {
using namespace detail;

namespace {

constexpr std::string_view kOp = "kv_attention";

std::vector<TensorMeta> infer_kv_attention(std::span<const TensorMeta> in, const core::OpParams& params) {
  check_count(kOp, in, 5);
  check_dtype(kOp, in[0], DType::f32, "qkv");
  if (in[1].dtype != DType::f32 && in[1].dtype != DType::bf16)
    throw core::DTypeError(std::string(kOp) + ": k_cache must be f32 or bf16, got " +
                           std::string(core::dtype_name(in[1].dtype)));
  check_dtype(kOp, in[2], in[1].dtype, "v_cache (the dtype of k_cache)");
  check_dtype(kOp, in[3], DType::i32, "rows");
  check_dtype(kOp, in[4], DType::i32, "block_table");
  const Shape &qkv = in[0].shape, &kc = in[1].shape;
  check_shape(qkv.rank() == 2 && qkv[1] % 3 == 0, kOp, "qkv must be (N, 3C)", in);
  const int64_t c = qkv[1] / 3;
  check_shape(kc.rank() == 3 && kc[2] == c && in[2].shape == kc, kOp, "caches must both be (blocks, T, C)", in);
  check_shape(in[3].shape == Shape{qkv[0], 2}, kOp, "rows must be (N, 2): (sequence slot, position)", in);
  check_shape(in[4].shape.rank() == 2, kOp, "block_table must be (sequences, blocks per sequence)", in);
  const int heads = std::get<core::AttentionParams>(params).n_head;
  check_shape(heads > 0 && c % heads == 0, kOp, "C must be a multiple of n_head", in);
  return {TensorMeta{Shape{qkv[0], c}, DType::f32}, in[1], in[2]};
}

void kv_attention_reference(const KernelCall& call) {
  const auto& p = call.p<core::AttentionParams>();
  const TensorView &qkv = call.in(0), &rows = call.in(3), &table = call.in(4);
  const TensorView &kc = call.out(1), &vc = call.out(2);
  const int64_t n = qkv.shape()[0], c = qkv.shape()[1] / 3, t = kc.shape()[1], blocks = kc.shape()[0];
  const int64_t max_blocks = table.shape()[1], heads = p.n_head, d = c / heads;
  const double scale = p.scale > 0 ? p.scale : 1.0 / std::sqrt(double(d));
  auto where = [&](int64_t seq, int64_t pos) {  // cache row of (sequence, position)
    if (seq < 0 || seq >= table.shape()[0] || pos < 0 || pos / t >= max_blocks)
      throw core::Error("kv_attention: sequence slot " + std::to_string(seq) + " / position " + std::to_string(pos) +
                        " outside the block table");
    const int64_t b = table.as<int32_t>()[seq * max_blocks + pos / t];
    if (b < 0 || b >= blocks) throw core::Error("kv_attention: block " + std::to_string(b) + " outside the cache");
    return b * t + pos % t;
  };
  for (int64_t r = 0; r < n; ++r) {
    const int64_t at = where(rows.as<int32_t>()[2 * r], rows.as<int32_t>()[2 * r + 1]);
    for (int64_t i = 0; i < c; ++i) {
      st(kc, at * c + i, ld(qkv, r * 3 * c + c + i));
      st(vc, at * c + i, ld(qkv, r * 3 * c + 2 * c + i));
    }
  }
  std::vector<double> s;
  for (int64_t r = 0; r < n; ++r) {
    const int64_t seq = rows.as<int32_t>()[2 * r], pos = rows.as<int32_t>()[2 * r + 1];
    for (int64_t h = 0; h < heads; ++h) {
      s.assign(size_t(pos + 1), 0.0);
      double top = -INFINITY;
      for (int64_t j = 0; j <= pos; ++j) {
        const int64_t at = where(seq, j);
        double dot = 0;
        for (int64_t e = 0; e < d; ++e) dot += ld(qkv, r * 3 * c + h * d + e) * ld(kc, at * c + h * d + e);
        s[size_t(j)] = dot * scale;
        top = std::max(top, s[size_t(j)]);
      }
      double total = 0;
      for (double& v : s) total += v = std::exp(v - top);
      for (int64_t e = 0; e < d; ++e) {
        double y = 0;
        for (int64_t j = 0; j <= pos; ++j) y += s[size_t(j)] * ld(vc, where(seq, j) * c + h * d + e);
        st(call.out(0), r * c + h * d + e, y / total);
      }
    }
  }
}

// Two sequences in scattered blocks of 4 positions: one continues a prefill
// (rows 5..7 after cached 0..4), one decodes at position 9; random cache
// contents stand for the earlier tokens. Then a single long row, and a
// prefill from position 0 of 16 rows with 2 heads of 32, and GPT-2's heads of 64.
std::vector<TestCase> kv_attention_cases() {
  auto ints = [](Shape s, std::vector<double> v) {
    return InputSpec{TensorMeta{s, DType::i32}, 0, 0, false, std::move(v)};
  };
  std::vector<TestCase> cases;
  cases.push_back({"prefill + decode, 2 heads of 8",
                   {no_grad(spec({4, 48}, DType::f32, -2, 2)), no_grad(spec({8, 4, 16})), no_grad(spec({8, 4, 16})),
                    ints({4, 2}, {0, 5, 0, 6, 0, 7, 1, 9}), ints({2, 3}, {3, 0, 5, 1, 6, 2})},
                   core::AttentionParams{2, 0.f}});
  cases.push_back({"one row at position 40, 4 heads of 16",
                   {no_grad(spec({1, 192}, DType::f32, -2, 2)), no_grad(spec({12, 8, 64})), no_grad(spec({12, 8, 64})),
                    ints({1, 2}, {1, 40}), ints({2, 6}, {0, 1, 2, 3, 4, 5, 11, 10, 9, 8, 7, 6})},
                   core::AttentionParams{4, 0.f}});
  std::vector<double> prefill_rows;
  for (int i = 0; i < 16; ++i) prefill_rows.insert(prefill_rows.end(), {0, double(i)});
  cases.push_back({"prefill of 16 from 0, scale 0.2",
                   {no_grad(spec({16, 192}, DType::f32, -2, 2)), no_grad(spec({4, 16, 64})), no_grad(spec({4, 16, 64})),
                    ints({16, 2}, prefill_rows), ints({1, 2}, {2, 0})},
                   core::AttentionParams{2, 0.2f}});
  // GPT-2's head size: three sequences decoding at once, at the end of a
  // block, at the start of one, and mid-block after several whole blocks.
  cases.push_back({"3 decodes, 4 heads of 64, blocks of 16",
                   {no_grad(spec({3, 768}, DType::f32, -2, 2)), no_grad(spec({12, 16, 256})), no_grad(spec({12, 16, 256})),
                    ints({3, 2}, {0, 40, 1, 15, 2, 16}), ints({3, 4}, {7, 2, 9, 0, 4, 1, 3, 5, 11, 6, 8, 10})},
                   core::AttentionParams{4, 0.f}});
  // Heads of 128 (the widest the SIMD paths take), a decode mid-block and a
  // partial last group of 16 positions.
  cases.push_back({"2 decodes, 2 heads of 128",
                   {no_grad(spec({2, 768}, DType::f32, -2, 2)), no_grad(spec({6, 16, 256})), no_grad(spec({6, 16, 256})),
                    ints({2, 2}, {0, 40, 1, 9}), ints({2, 3}, {4, 0, 2, 5, 1, 3})},
                   core::AttentionParams{2, 0.f}});
  // A bf16 cache: the same mixes. The reference rounds what it stores as the
  // kernels do and reads the rounded values back, so every output, the
  // caches' bf16 values too, must match at f32's tolerance (a store that
  // truncated instead of rounding would not).
  const DType bf = DType::bf16;
  cases.push_back({"bf16 cache: prefill + decode, 2 heads of 8",
                   {no_grad(spec({4, 48}, DType::f32, -2, 2)), no_grad(spec({8, 4, 16}, bf)), no_grad(spec({8, 4, 16}, bf)),
                    ints({4, 2}, {0, 5, 0, 6, 0, 7, 1, 9}), ints({2, 3}, {3, 0, 5, 1, 6, 2})},
                   core::AttentionParams{2, 0.f}});
  cases.push_back({"bf16 cache: one row at position 40, 4 heads of 16",
                   {no_grad(spec({1, 192}, DType::f32, -2, 2)), no_grad(spec({12, 8, 64}, bf)), no_grad(spec({12, 8, 64}, bf)),
                    ints({1, 2}, {1, 40}), ints({2, 6}, {0, 1, 2, 3, 4, 5, 11, 10, 9, 8, 7, 6})},
                   core::AttentionParams{4, 0.f}});
  cases.push_back({"bf16 cache: 3 decodes, 4 heads of 64, blocks of 16",
                   {no_grad(spec({3, 768}, DType::f32, -2, 2)), no_grad(spec({12, 16, 256}, bf)), no_grad(spec({12, 16, 256}, bf)),
                    ints({3, 2}, {0, 40, 1, 15, 2, 16}), ints({3, 4}, {7, 2, 9, 0, 4, 1, 3, 5, 11, 6, 8, 10})},
                   core::AttentionParams{4, 0.f}});
  cases.push_back({"bf16 cache: prefill of 16 from 0, scale 0.2",
                   {no_grad(spec({16, 192}, DType::f32, -2, 2)), no_grad(spec({4, 16, 64}, bf)), no_grad(spec({4, 16, 64}, bf)),
                    ints({16, 2}, prefill_rows), ints({1, 2}, {2, 0})},
                   core::AttentionParams{2, 0.2f}});
  cases.push_back({"bf16 cache: 2 decodes, 2 heads of 128",
                   {no_grad(spec({2, 768}, DType::f32, -2, 2)), no_grad(spec({6, 16, 256}, bf)), no_grad(spec({6, 16, 256}, bf)),
                    ints({2, 2}, {0, 40, 1, 9}), ints({2, 3}, {4, 0, 2, 5, 1, 3})},
                   core::AttentionParams{2, 0.f}});
  for (TestCase& tc : cases)
    if (tc.inputs[1].meta.dtype == bf) tc.forward_tolerance = 2e-5;
  return cases;
}

size_t kv_attention_workspace(std::span<const TensorMeta> in, const core::OpParams& params) {
  // The CPU kernel's scores: one row of the longest context per (row, head).
  const int64_t n = in[0].shape[0], context = in[4].shape[1] * in[1].shape[1];
  return size_t(n * std::get<core::AttentionParams>(params).n_head * context) * sizeof(float);
}

}  // namespace

core::OpDef kv_attention_def() {
  OpDef d;
  d.kind = OpKind::kv_attention;
  d.name = kOp;
  d.infer = infer_kv_attention;
  d.reference = kv_attention_reference;
  d.test_cases = kv_attention_cases;
  d.workspace_bytes = kv_attention_workspace;
  d.output_aliases = {-1, 1, 2};
  return d;
}

}  // namespace brisk::ops
