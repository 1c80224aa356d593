// Attention-probability dropout (AttentionParams::dropout,
// model.attention_dropout). The op harness holds every kernel (plain and
// flash, causal and padding-masked, f32 and bf16, register tiles and BLAS)
// to the reference, and the reference's backward to finite differences.
// What must hold beyond that: (1) the probabilities are dropped as a fair
// coin, kept ones scaled by 1 / (1 - p), and the plain and flash kernels drop
// the same entries (one element index for every tiling); (2) in the models:
// only train programs drop, the key picks the masks, plain and flash
// attention train alike, recomputation remakes the masks; (3) the config's
// checks. Whole-model agreement with PyTorch under the same masks is
// gpt_torch_crosscheck_attention_dropout; exact resume is in the trainer's tests.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "brisk/core/error.h"
#include "brisk/core/executor.h"
#include "brisk/core/graph.h"
#include "brisk/models/encoder.h"
#include "brisk/models/gpt.h"
#include "brisk/models/transformer_block.h"
#include "brisk/ops/ops.h"
#include "brisk/train/config.h"
#include "dropout_test_util.h"
#include "test_util.h"

using namespace brisk;
using core::DType;
using core::Tensor;
using core::ValueId;

namespace {

using testing_util::backend;
using testing_util::EncoderBatch;
using Batch = testing_util::GptBatch;

// One head as wide as the sequence, with v_u the u-th unit vector: y_t is
// then row t of the dropped probabilities, y_tu = P_tu Z_tu. Runs the op
// (causal, or padding-masked when `lengths` is given) and returns y, with
// the plain ops' saved (undropped) probabilities in `probs`.
struct Identity {
  int64_t B, T;
  std::vector<float> qkv;
  Identity(int64_t B_, int64_t T_) : B(B_), T(T_), qkv(size_t(B_ * T_ * 3 * T_)) {
    const Tensor r = Tensor::uniform({B * T * 3 * T}, DType::f32, 17, -2.f, 2.f);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        float* row = qkv.data() + (b * T + t) * 3 * T;
        for (int64_t i = 0; i < 2 * T; ++i) row[i] = r.data_as<float>()[(b * T + t) * 3 * T + i];
        for (int64_t i = 0; i < T; ++i) row[2 * T + i] = i == t ? 1.f : 0.f;
      }
  }

  std::vector<float> run(bool flash, const std::vector<int32_t>* lengths, float p, std::array<int32_t, 2> key,
                         std::vector<float>* probs = nullptr) const {
    core::Graph g;
    const ValueId x = g.input("qkv", {B, T, 3 * T}, DType::f32);
    const ValueId k = g.input("key", {2}, DType::i32);
    const ValueId len = lengths ? g.input("lengths", {B}, DType::i32) : core::kNoValue;
    const ops::AttentionDropout drop{p, k, 9};
    const ValueId y = lengths ? (flash ? ops::masked_flash_attention(g, x, len, 1, drop)
                                       : ops::masked_attention(g, x, len, 1, drop))
                              : (flash ? ops::flash_attention(g, x, 1, drop) : ops::attention(g, x, 1, drop));
    g.mark_output(y);
    const ValueId saved = g.nodes().back().outputs[1];  // probs (plain) or lse (flash)
    if (probs) g.mark_output(saved);
    core::Executor ex(g, backend());
    ex.write(x, qkv.data(), qkv.size() * sizeof(float));
    ex.write(k, key.data(), sizeof key);
    if (lengths) ex.write(len, lengths->data(), lengths->size() * sizeof(int32_t));
    ex.run();
    std::vector<float> out(size_t(B * T * T));
    ex.read(y, out.data(), out.size() * sizeof(float));
    if (probs) {
      probs->resize(size_t(B * T * T));
      ex.read(saved, probs->data(), probs->size() * sizeof(float));
    }
    return out;
  }
};

}  // namespace

TEST(AttentionDropout, ProbabilitiesAreDroppedAsAFairCoinAndFlashDropsThePlainKernelsEntries) {
  const int64_t B = 4, T = 96;
  const Identity id(B, T);
  const std::vector<int32_t> lengths = {96, 1, 50, 77};
  for (const bool masked : {false, true}) {
    for (const float p : {0.1f, 0.5f}) {
      SCOPED_TRACE(std::string(masked ? "masked" : "causal") + " p " + std::to_string(p));
      const std::vector<int32_t>* len = masked ? &lengths : nullptr;
      std::vector<float> P;
      const std::vector<float> y = id.run(false, len, p, {4242, -17}, &P);
      const float scale = float(1.0 / (1.0 - double(p)));
      int64_t seen = 0, kept = 0;
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < T; ++t)
          for (int64_t u = 0; u < T; ++u) {
            const size_t i = size_t((b * T + t) * T + u);
            const bool visible = masked ? u < lengths[size_t(b)] : u <= t;
            if (!visible) {
              ASSERT_EQ(y[i], 0.f) << "a masked key contributes nothing";
              continue;
            }
            ++seen;
            if (y[i] == 0.f) continue;
            ++kept;
            ASSERT_NEAR(y[i], P[i] * scale, 2e-6f * scale) << "a kept probability is P / (1 - p)";
          }
      // Binomial over ~20k entries: the share's standard deviation is below 0.004.
      EXPECT_NEAR(double(kept) / double(seen), 1.0 - p, 0.02);
      // The flash kernels drop the same entries (their tiles differ, the index does not).
      const std::vector<float> yf = id.run(true, len, p, {4242, -17});
      for (size_t i = 0; i < y.size(); ++i) {
        ASSERT_EQ(yf[i] == 0.f, y[i] == 0.f) << "entry " << i;
        ASSERT_NEAR(yf[i], y[i], 1e-5f * scale) << "entry " << i;
      }
      // Another key, another mask; p 0 drops nothing.
      EXPECT_NE(id.run(false, len, p, {4243, -17}), y);
    }
    std::vector<float> P;
    const std::vector<float> none = id.run(false, masked ? &lengths : nullptr, 0.f, {1, 2}, &P);
    for (size_t i = 0; i < none.size(); ++i) ASSERT_NEAR(none[i], P[i], 1e-6f);
  }
}

namespace {

models::GptConfig small_gpt(float attention_dropout, const std::string& attention = "flash",
                            const std::string& recompute = "none") {
  return testing_util::small_dropout_gpt(0.f, attention_dropout, attention, recompute);
}

// Attention nodes (forward and backward, every kind) that drop probabilities.
int dropping_attention_nodes(const core::Graph& g) {
  int n = 0;
  for (const core::Node& node : g.nodes())
    if (const auto* p = std::get_if<core::AttentionParams>(&node.params); p && p->dropout > 0.f) ++n;
  return n;
}

template <class Model>
void expect_same_grads(Model& a, Model& b, double tol) {
  for (const auto& [name, e] : a.params().entries()) {
    SCOPED_TRACE(name);
    EXPECT_LE(testing_util::normalized_error(e.grad, b.params().entries().at(name).grad), tol);
  }
}

}  // namespace

TEST(AttentionDropout, TheGptDropsProbabilitiesOnlyInTrainPrograms) {
  const int64_t B = 2, T = 48;
  models::Gpt off(small_gpt(0.f), backend());
  EXPECT_EQ(dropping_attention_nodes(off.train_graph(B, T)), 0);
  models::Gpt on(small_gpt(0.25f), backend());
  const core::Graph train = on.train_graph(B, T);
  EXPECT_EQ(dropping_attention_nodes(train), 2 * 2) << "each block's attention and its backward";
  EXPECT_EQ(testing_util::count_ops(train, core::OpKind::dropout), 0) << "model.dropout stays off";
  EXPECT_EQ(dropping_attention_nodes(on.eval_graph(B, T)), 0);
  on.init_weights(3);
  off.init_weights(3);
  const Batch b(B, T);
  EXPECT_EQ(on.eval_loss(b.x.data(), b.y.data(), B, T), off.eval_loss(b.x.data(), b.y.data(), B, T))
      << "evaluation drops nothing";
  const uint64_t key = models::dropout_key(21, 4, 0, 0);
  const double a = on.train_micro_step(b.x.data(), b.y.data(), B, T, 1.0, key);
  on.params().zero_grads();
  EXPECT_EQ(on.train_micro_step(b.x.data(), b.y.data(), B, T, 1.0, key), a) << "the same key, the same masks";
  EXPECT_NE(on.train_micro_step(b.x.data(), b.y.data(), B, T, 1.0, key + 1), a);
  EXPECT_NE(off.train_micro_step(b.x.data(), b.y.data(), B, T, 1.0, key), a);
}

// Plain and flash attention drop the same probabilities, and a recomputed
// block remakes its masks from the key: every run has the same loss and
// gradients as the plain, activation-keeping one.
TEST(AttentionDropout, PlainFlashAndRecomputedRunsTrainAlike) {
  const int64_t B = 2, T = 48;
  const Batch b(B, T);
  const uint64_t key = models::dropout_key(9, 1, 0, 0);
  models::Gpt plain(small_gpt(0.3f, "plain"), backend());
  plain.init_weights(11);
  const double loss = plain.train_micro_step(b.x.data(), b.y.data(), B, T, 1.0, key);
  for (const char* attention : {"plain", "flash"})
    for (const char* level : {"none", "selective", "full"}) {
      if (std::string(attention) == "plain" && std::string(level) == "none") continue;
      SCOPED_TRACE(std::string(attention) + " " + level);
      models::Gpt m(small_gpt(0.3f, attention, level), backend());
      m.init_weights(11);
      EXPECT_NEAR(m.train_micro_step(b.x.data(), b.y.data(), B, T, 1.0, key), loss, 1e-5 * std::abs(loss));
      expect_same_grads(plain, m, 2e-5);
    }
}

TEST(AttentionDropout, TheEncoderDropsProbabilitiesInTrainProgramsPlainAndFlashAlike) {
  const EncoderBatch eb;
  const int64_t B = eb.B, T = eb.T;
  auto config = [](float p, const char* attention) { return testing_util::small_dropout_encoder(0.f, p, attention); };
  models::Encoder flash(config(0.3f, "flash"), backend()), plain(config(0.3f, "plain"), backend());
  models::Encoder off(config(0.f, "flash"), backend());
  for (models::Encoder* m : {&flash, &plain, &off}) m->init_weights(4);
  EXPECT_EQ(dropping_attention_nodes(flash.program(true, B, T).graph), 2 * 2);
  EXPECT_EQ(dropping_attention_nodes(flash.program(false, B, T).graph), 0);
  const uint64_t key = models::dropout_key(3, 7, 0, 0);
  const double a = eb.step(flash, key);
  EXPECT_NEAR(eb.step(plain, key), a, 1e-5 * std::abs(a));
  expect_same_grads(plain, flash, 2e-5);
  EXPECT_NE(eb.step(off, key), a);
  flash.params().zero_grads();
  EXPECT_NE(eb.step(flash, key + 1), a);
  const float* lo = flash.logits(eb.ids.data(), eb.lengths.data(), B, T);
  const std::vector<float> logits(lo, lo + B * 2);
  EXPECT_TRUE(std::equal(logits.begin(), logits.end(), off.logits(eb.ids.data(), eb.lengths.data(), B, T)))
      << "classifying drops nothing";
}

TEST(AttentionDropout, TheConfigReadsWritesAndRefusesIt) {
  const train::TrainConfig c = train::load_train_config("", {"model.attention_dropout=0.1"});
  EXPECT_EQ(c.model.attention_dropout, 0.1f);
  EXPECT_EQ(c.model.dropout, 0.f);
  EXPECT_NE(train::to_toml(c).find("attention_dropout = 0.1"), std::string::npos);
  const auto refused = testing_util::expect_config_refused;
  refused({"model.attention_dropout=0.1", "train.device=\"cuda\""},
          "model.attention_dropout > 0 is supported with train.device = \"cpu\" only");
  refused({"model.attention_dropout=1"}, "model.attention_dropout must be in [0, 1)");
  refused({"model.attention_dropout=0.99999999"}, "as a 32-bit float), got 0.99999999");
  models::GptConfig g = small_gpt(-0.1f);
  try {
    g.validate();
    ADD_FAILURE() << "accepted attention dropout -0.1";
  } catch (const core::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.attention_dropout must be in [0, 1)"), std::string::npos) << e.what();
  }
}
