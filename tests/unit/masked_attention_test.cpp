// The encoder ops over right-padded batches (masked_attention,
// masked_flash_attention, masked_mean) on the CPU backend, beyond what the op
// harness checks against the reference: (a) padding invariance, the reason
// the ops exist: the same sequences padded to two lengths, with different
// garbage in the padding, give the same outputs and gradients at real
// positions and exactly zero gradient at padded ones; (b) the flash op
// against the plain one, forward and backward, each backward fed its own
// forward's saved outputs; (c) a length outside [1, T] is a ShapeError naming
// the op and the batch row, on the CPU and reference backends and through an
// executor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "brisk/core/autograd.h"
#include "brisk/core/error.h"
#include "brisk/core/executor.h"
#include "brisk/ops/ops.h"
#include "brisk/ops/reference_backend.h"
#include "test_util.h"

using namespace brisk;
using core::DType;
using core::OpKind;
using core::Tensor;
using core::TensorView;
using core::ValueId;

namespace {

using testing_util::backend;
using testing_util::normalized_error;

Tensor lengths_tensor(const std::vector<int32_t>& lengths) {
  Tensor t = Tensor::empty({int64_t(lengths.size())}, DType::i32);
  std::copy(lengths.begin(), lengths.end(), t.data_as<int32_t>());
  return t;
}

// Runs one op outside a graph with a workspace sized by its OpDef.
void run(core::Backend& be, OpKind k, const std::vector<Tensor>& in, const std::vector<Tensor>& out,
         const core::OpParams& p) {
  std::vector<TensorView> iv, ov;
  std::vector<core::TensorMeta> metas;
  for (const Tensor& t : in) iv.push_back(t.as_view()), metas.push_back(t.meta());
  for (const Tensor& t : out) ov.push_back(t.as_view());
  const core::OpDef& def = core::op_def(k);
  std::vector<unsigned char> ws(def.workspace_bytes ? def.workspace_bytes(metas, p) : 0);
  core::run_op(be, k, iv, ov, p, ws.data(), ws.size());
}

// ---- (a) padding invariance ----------------------------------------------------------

constexpr int64_t kB = 3, kC = 12;
constexpr int kHeads = 3;  // head size 4
const std::vector<int32_t> kLengths = {19, 11, 1};

// The three sequences' qkv rows padded to T; padding drawn from `pad_seed`,
// real rows the same for every T.
Tensor padded_qkv(int64_t T, uint64_t pad_seed) {
  const Tensor real = Tensor::uniform({kB, 19, 3 * kC}, DType::f32, 7, -1.f, 1.f);
  Tensor out = Tensor::uniform({kB, T, 3 * kC}, DType::f32, pad_seed, -2.f, 2.f);
  for (int64_t b = 0; b < kB; ++b)
    for (int64_t t = 0; t < kLengths[size_t(b)]; ++t)
      std::copy_n(real.data_as<float>() + (b * 19 + t) * 3 * kC, 3 * kC, out.data_as<float>() + (b * T + t) * 3 * kC);
  return out;
}

struct EncoderResult {
  Tensor att;     // (B, T, C)
  Tensor pooled;  // (B, C)
  Tensor dqkv;    // (B, T, 3C)
};

// pooled = masked_mean(attention(qkv)), loss = sum(pooled * w), through a
// graph, its backward and an executor, as a model would run it.
EncoderResult run_encoder(bool flash, const Tensor& qkv) {
  const int64_t T = qkv.shape()[1];
  core::Graph g;
  const ValueId x = g.input("qkv", qkv.shape(), DType::f32, true);
  const ValueId len = g.input("lengths", {kB}, DType::i32);
  const ValueId w = g.input("w", {kB, kC}, DType::f32);
  const ValueId att =
      flash ? ops::masked_flash_attention(g, x, len, kHeads) : ops::masked_attention(g, x, len, kHeads);
  const ValueId pooled = ops::masked_mean(g, att, len);
  const ValueId loss = ops::sum(g, ops::mul(g, pooled, w));
  g.mark_output(att);
  g.mark_output(pooled);
  core::backward(g, loss);
  core::Executor ex(g, backend());
  const Tensor lengths = lengths_tensor(kLengths);
  const Tensor wv = Tensor::uniform({kB, kC}, DType::f32, 99, -1.f, 1.f);
  ex.write(x, qkv.data(), qkv.bytes());
  ex.write(len, lengths.data(), lengths.bytes());
  ex.write(w, wv.data(), wv.bytes());
  ex.run();
  EncoderResult r{Tensor::empty({kB, T, kC}, DType::f32), Tensor::empty({kB, kC}, DType::f32),
                  Tensor::empty(qkv.shape(), DType::f32)};
  ex.read(att, r.att.data(), r.att.bytes());
  ex.read(pooled, r.pooled.data(), r.pooled.bytes());
  ex.read(g.grad_of(x), r.dqkv.data(), r.dqkv.bytes());
  return r;
}

// max |a - b| over the real rows of two (B, T, width) tensors padded differently.
double real_rows_diff(const Tensor& a, const Tensor& b) {
  const int64_t Ta = a.shape()[1], Tb = b.shape()[1], width = a.shape()[2];
  double diff = 0;
  for (int64_t s = 0; s < kB; ++s)
    for (int64_t t = 0; t < kLengths[size_t(s)]; ++t)
      for (int64_t i = 0; i < width; ++i)
        diff = std::max(diff, std::abs(a.item((s * Ta + t) * width + i) - b.item((s * Tb + t) * width + i)));
  return diff;
}

// Padded rows of dqkv that are not exactly zero.
int64_t nonzero_padding(const Tensor& dqkv) {
  const int64_t T = dqkv.shape()[1], width = dqkv.shape()[2];
  int64_t n = 0;
  for (int64_t s = 0; s < kB; ++s)
    for (int64_t t = kLengths[size_t(s)]; t < T; ++t)
      for (int64_t i = 0; i < width; ++i) n += dqkv.item((s * T + t) * width + i) != 0.0;
  return n;
}

}  // namespace

TEST(MaskedAttention, PaddingDoesNotChangeRealPositions) {
  for (bool flash : {false, true}) {
    SCOPED_TRACE(flash ? "masked_flash_attention" : "masked_attention");
    const EncoderResult r19 = run_encoder(flash, padded_qkv(19, 1));
    const EncoderResult r32 = run_encoder(flash, padded_qkv(32, 2));
    EXPECT_LE(real_rows_diff(r19.att, r32.att), 1e-5) << "attention output at real positions";
    double pooled_diff = 0;
    for (int64_t i = 0; i < r19.pooled.numel(); ++i)
      pooled_diff = std::max(pooled_diff, std::abs(r19.pooled.item(i) - r32.pooled.item(i)));
    EXPECT_LE(pooled_diff, 1e-5) << "pooled output";
    EXPECT_LE(real_rows_diff(r19.dqkv, r32.dqkv), 1e-5) << "dqkv at real positions";
    EXPECT_EQ(nonzero_padding(r19.dqkv), 0) << "dqkv at padded positions, T = 19";
    EXPECT_EQ(nonzero_padding(r32.dqkv), 0) << "dqkv at padded positions, T = 32";
    // The test means something only if real gradients are not zero too.
    double real_norm = 0;
    for (int64_t i = 0; i < r19.dqkv.numel(); ++i) real_norm = std::max(real_norm, std::abs(r19.dqkv.item(i)));
    EXPECT_GT(real_norm, 1e-3);
    // Padded query rows attend over the valid keys: finite outputs.
    for (int64_t i = 0; i < r32.att.numel(); ++i) ASSERT_TRUE(std::isfinite(r32.att.item(i))) << "att element " << i;
  }
}

TEST(MaskedAttention, PlainAndFlashAgreeThroughAGraph) {
  const EncoderResult plain = run_encoder(false, padded_qkv(32, 3));
  const EncoderResult flash = run_encoder(true, padded_qkv(32, 3));
  EXPECT_LE(normalized_error(plain.att, flash.att), 1e-5);
  EXPECT_LE(normalized_error(plain.pooled, flash.pooled), 1e-5);
  EXPECT_LE(normalized_error(plain.dqkv, flash.dqkv), 1e-5);
}

// ---- (b) flash == plain on the ops ------------------------------------------------------

TEST(MaskedAttention, FlashMatchesPlainForwardAndBackward) {
  ops::register_ops();
  struct Case {
    int64_t T, C;
    int n_head;
    std::vector<int32_t> lengths;
  };
  // One tile, ragged tiles, several query tiles (64) and key tiles (256), and
  // lengths on tile edges (64, 65, 256, 257).
  const Case cases[] = {{7, 12, 3, {7, 1, 4}},
                        {33, 18, 3, {33, 1, 17}},
                        {130, 32, 2, {1, 130, 64, 65}},
                        {300, 48, 3, {300, 1, 257, 256}},
                        {257, 64, 1, {200, 257}},
                        {256, 96, 2, {256, 100, 1, 255}}};
  uint64_t seed = 21;
  for (const Case& k : cases) {
    const int64_t B = int64_t(k.lengths.size());
    SCOPED_TRACE("B" + std::to_string(B) + " T" + std::to_string(k.T) + " C" + std::to_string(k.C) + " nh" +
                 std::to_string(k.n_head));
    const ops::AttentionParams p{k.n_head, 0.f};
    const Tensor qkv = Tensor::uniform({B, k.T, 3 * k.C}, DType::f32, seed++, -1.f, 1.f);
    const Tensor dy = Tensor::uniform({B, k.T, k.C}, DType::f32, seed++, -1.f, 1.f);
    const Tensor len = lengths_tensor(k.lengths);

    const Tensor y_plain = Tensor::empty({B, k.T, k.C}, DType::f32);
    const Tensor probs = Tensor::empty({B, k.n_head, k.T, k.T}, DType::f32);
    run(backend(), OpKind::masked_attention, {qkv, len}, {y_plain, probs}, p);
    const Tensor y_flash = Tensor::empty({B, k.T, k.C}, DType::f32);
    const Tensor lse = Tensor::empty({B, k.n_head, k.T}, DType::f32);
    run(backend(), OpKind::masked_flash_attention, {qkv, len}, {y_flash, lse}, p);
    EXPECT_LE(normalized_error(y_plain, y_flash), 1e-5) << "y";

    // probs is zero at masked keys and each row sums to one over the valid ones.
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < k.n_head; ++h)
        for (int64_t t = 0; t < k.T; ++t) {
          const int64_t row = ((b * k.n_head + h) * k.T + t) * k.T;
          double sum = 0;
          for (int64_t u = 0; u < k.T; ++u) {
            const double v = probs.item(row + u);
            if (u >= k.lengths[size_t(b)]) {
              ASSERT_EQ(v, 0.0) << "masked probability b" << b << " t" << t << " u" << u;
            }
            sum += v;
          }
          ASSERT_NEAR(sum, 1.0, 1e-5);
        }

    const Tensor dqkv_plain = Tensor::empty(qkv.shape(), DType::f32);
    run(backend(), OpKind::masked_attention_backward, {dy, qkv, probs, len}, {dqkv_plain}, p);
    const Tensor dqkv_flash = Tensor::empty(qkv.shape(), DType::f32);
    run(backend(), OpKind::masked_flash_attention_backward, {dy, qkv, y_flash, lse, len}, {dqkv_flash}, p);
    EXPECT_LE(normalized_error(dqkv_plain, dqkv_flash), 1e-5) << "dqkv";
  }
}

// ---- (c) lengths outside [1, T] ------------------------------------------------------------

TEST(MaskedAttention, LengthOutsideOneToTIsAShapeErrorNamingTheOp) {
  ops::register_ops();
  ops::ReferenceBackend reference;
  constexpr int64_t B = 3, T = 7, C = 6;
  const ops::AttentionParams ap{2, 0.f};
  const core::OpParams mean_bwd = ops::ExpandParams{core::Shape{B, T, C}, 1};
  auto f32 = [](core::Shape s) { return Tensor::uniform(s, DType::f32, 5, -1.f, 1.f); };
  for (int32_t bad : {0, int32_t(T + 1)}) {
    const Tensor len = lengths_tensor({T, bad, 3});
    struct OpCase {
      OpKind kind;
      std::vector<Tensor> in, out;
      core::OpParams params;
    };
    const std::vector<OpCase> cases = {
        {OpKind::masked_attention, {f32({B, T, 3 * C}), len}, {f32({B, T, C}), f32({B, 2, T, T})}, ap},
        {OpKind::masked_attention_backward,
         {f32({B, T, C}), f32({B, T, 3 * C}), f32({B, 2, T, T}), len},
         {f32({B, T, 3 * C})},
         ap},
        {OpKind::masked_flash_attention, {f32({B, T, 3 * C}), len}, {f32({B, T, C}), f32({B, 2, T})}, ap},
        {OpKind::masked_flash_attention_backward,
         {f32({B, T, C}), f32({B, T, 3 * C}), f32({B, T, C}), f32({B, 2, T}), len},
         {f32({B, T, 3 * C})},
         ap},
        {OpKind::masked_mean, {f32({B, T, C}), len}, {f32({B, C})}, core::NoParams{}},
        {OpKind::masked_mean_backward, {f32({B, C}), len}, {f32({B, T, C})}, mean_bwd},
    };
    for (const OpCase& oc : cases)
      for (core::Backend* be : {static_cast<core::Backend*>(&backend()), static_cast<core::Backend*>(&reference)}) {
        const std::string op(core::op_name(oc.kind));
        SCOPED_TRACE(op + " on " + std::string(be->name()) + ", length " + std::to_string(bad));
        try {
          run(*be, oc.kind, oc.in, oc.out, oc.params);
          ADD_FAILURE() << "no error for length " << bad;
        } catch (const core::ShapeError& e) {
          const std::string m = e.what();
          EXPECT_EQ(m.rfind(op + ":", 0), 0u) << m;  // names the op first
          EXPECT_NE(m.find("lengths[1] = " + std::to_string(bad)), std::string::npos) << m;
          EXPECT_NE(m.find("batch row 1"), std::string::npos) << m;
        }
      }
  }

  // And through an executor, where a batcher's bad lengths would arrive.
  core::Graph g;
  const ValueId x = g.input("x", {B, T, C}, DType::f32);
  const ValueId len = g.input("lengths", {B}, DType::i32);
  g.mark_output(ops::masked_mean(g, x, len));
  core::Executor ex(g, backend());
  const Tensor xv = f32({B, T, C}), lv = lengths_tensor({1, T, 0});
  ex.write(x, xv.data(), xv.bytes());
  ex.write(len, lv.data(), lv.bytes());
  try {
    ex.run();
    ADD_FAILURE() << "no error for length 0";
  } catch (const core::ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("masked_mean: lengths[2] = 0"), std::string::npos) << e.what();
  }
}

TEST(MaskedAttention, RejectsBadShapesWhenTheGraphIsBuilt) {
  core::Graph g;
  const ValueId qkv = g.input("qkv", {2, 5, 36}, DType::f32);
  const ValueId len_f32 = g.input("len_f32", {2}, DType::f32);
  const ValueId len_3 = g.input("len_3", {3}, DType::i32);
  EXPECT_THROW(ops::masked_attention(g, qkv, len_f32, 3), core::DTypeError);
  EXPECT_THROW(ops::masked_flash_attention(g, qkv, len_3, 3), core::ShapeError);
  EXPECT_THROW(ops::masked_mean(g, g.input("x2", {2, 5}, DType::f32), g.input("len", {2}, DType::i32)),
               core::ShapeError);
  const ValueId bf = g.input("qkv_bf16", {2, 5, 36}, DType::bf16);
  EXPECT_THROW(ops::masked_attention(g, bf, g.input("len2", {2}, DType::i32), 3), core::DTypeError);
}
