// Dropout (ops::dropout, model.dropout). What must hold beyond the op
// harness (kernel = reference, backward = finite differences): (1) the mask
// is a fair coin: the share kept is 1 - p, kept values are x / (1 - p), and
// masks of other sites or keys are independent of it while the same site
// and key give the same mask; (2) in the GPT: p = 0 builds nothing, p > 0
// only in train programs (1 + 2 n_layer sites), the same key gives the same
// step and another key another one, evaluation never drops, and
// recomputation remakes the masks (the same gradients at every level);
// (3) the encoder classifier: the same, and model.classifier_dropout on the
// pooled features.
// Whole-model agreement with PyTorch under the same masks is
// gpt_torch_crosscheck_dropout and encoder_torch_crosscheck_dropout; exact
// resume is in the trainer's tests.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "brisk/core/error.h"
#include "brisk/core/executor.h"
#include "brisk/core/graph.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/models/encoder.h"
#include "brisk/models/gpt.h"
#include "brisk/models/transformer_block.h"
#include "brisk/ops/ops.h"
#include "brisk/train/classify_config.h"
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
using testing_util::expect_config_refused;
using Batch = testing_util::GptBatch;

// dropout(x) for x all ones (f32 or bf16), read back as floats.
std::vector<float> drop_ones(int64_t n, float p, uint32_t site, std::array<int32_t, 2> key, DType t = DType::f32) {
  core::Graph g;
  const ValueId x = g.input("x", {n}, t);
  const ValueId k = g.input("key", {2}, DType::i32);
  ValueId y = ops::dropout(g, x, k, p, site);
  if (t != DType::f32) y = ops::cast(g, y, DType::f32);
  g.mark_output(y);
  core::Executor ex(g, backend());
  const Tensor ones = Tensor::uniform({n}, t, 1, 1.f, 1.f);  // all ones
  ex.write(x, ones.data(), ones.bytes());
  ex.write(k, key.data(), sizeof key);
  ex.run();
  std::vector<float> out(static_cast<size_t>(n));
  ex.read(y, out.data(), out.size() * sizeof(float));
  return out;
}

double kept_share(const std::vector<float>& y) {
  return double(std::count_if(y.begin(), y.end(), [](float v) { return v != 0.f; })) / double(y.size());
}

// The share of elements two masks agree on.
double agreement(const std::vector<float>& a, const std::vector<float>& b) {
  int64_t same = 0;
  for (size_t i = 0; i < a.size(); ++i) same += (a[i] != 0.f) == (b[i] != 0.f);
  return double(same) / double(a.size());
}

constexpr int64_t kN = 1 << 20;

}  // namespace

TEST(Dropout, KeepsOneMinusPScaledAndIsAFairCoin) {
  for (const float p : {0.1f, 0.5f, 0.9f}) {
    SCOPED_TRACE(p);
    const std::vector<float> y = drop_ones(kN, p, 3, {12345, -678});
    // Binomial: the standard deviation of the share is below 0.0005 at 2^20.
    EXPECT_NEAR(kept_share(y), 1.0 - p, 0.003);
    const float scale = float(1.0 / (1.0 - double(p)));
    for (float v : y) ASSERT_TRUE(v == 0.f || v == scale) << v;
    // Neighbours are independent: a kept element's successor is kept 1 - p of the time.
    int64_t kept = 0, both = 0;
    for (size_t i = 0; i + 1 < y.size(); ++i)
      if (y[i] != 0.f) ++kept, both += y[i + 1] != 0.f;
    EXPECT_NEAR(double(both) / double(kept), 1.0 - p, 0.006);
  }
  const std::vector<float> none = drop_ones(4096, 0.f, 0, {1, 2});
  EXPECT_TRUE(std::all_of(none.begin(), none.end(), [](float v) { return v == 1.f; })) << "p 0 drops nothing";
}

TEST(Dropout, TheSameSiteAndKeyGiveTheSameMaskAndOthersIndependentOnes) {
  const float p = 0.3f;
  const std::vector<float> a = drop_ones(kN, p, 5, {7, 9});
  EXPECT_EQ(a, drop_ones(kN, p, 5, {7, 9}));
  // Independent masks agree on p^2 + (1-p)^2 of the elements.
  const double independent = p * p + (1 - p) * (1 - p);
  for (const auto& other : {drop_ones(kN, p, 6, {7, 9}), drop_ones(kN, p, 5, {8, 9}), drop_ones(kN, p, 5, {7, 10})})
    EXPECT_NEAR(agreement(a, other), independent, 0.003);
  // bf16 drops the same elements as f32.
  EXPECT_EQ(agreement(a, drop_ones(kN, p, 5, {7, 9}, DType::bf16)), 1.0);
}

namespace {

models::GptConfig small_gpt(float dropout, const std::string& recompute = "none") {
  return testing_util::small_dropout_gpt(dropout, 0.f, "plain", recompute);
}

int count_dropouts(const core::Graph& g) { return testing_util::count_ops(g, core::OpKind::dropout); }

}  // namespace

TEST(Dropout, TheGptDropsOnlyInTrainProgramsAtEachSite) {
  const int64_t B = 2, T = 32;
  models::Gpt off(small_gpt(0.f), backend());
  EXPECT_EQ(count_dropouts(off.train_graph(B, T)), 0) << "p 0 builds no dropout";
  models::Gpt on(small_gpt(0.1f), backend());
  // The embeddings, then each block's attention and MLP branches; and the
  // backward's one per site.
  EXPECT_EQ(count_dropouts(on.train_graph(B, T)), 2 * (1 + 2 * 2));
  EXPECT_EQ(count_dropouts(on.eval_graph(B, T)), 0);
  on.init_weights(3);
  off.init_weights(3);
  const Batch b(B, T);
  EXPECT_EQ(on.eval_loss(b.x.data(), b.y.data(), B, T), off.eval_loss(b.x.data(), b.y.data(), B, T))
      << "evaluation drops nothing";
  const float* lo = on.logits(b.x.data(), B, T);
  const std::vector<float> logits_on(lo, lo + B * T * 64);
  const float* lf = off.logits(b.x.data(), B, T);
  EXPECT_TRUE(std::equal(logits_on.begin(), logits_on.end(), lf));

  const uint64_t k1 = models::dropout_key(1337, 5, 0, 0);
  EXPECT_NE(k1, models::dropout_key(1337, 6, 0, 0));
  EXPECT_NE(k1, models::dropout_key(1337, 5, 1, 0));
  EXPECT_NE(k1, models::dropout_key(1337, 5, 0, 1));
  EXPECT_NE(k1, models::dropout_key(1338, 5, 0, 0));
  const double a = on.train_micro_step(b.x.data(), b.y.data(), B, T, 1.0, k1);
  const double again = on.train_micro_step(b.x.data(), b.y.data(), B, T, 1.0, k1);
  const double other = on.train_micro_step(b.x.data(), b.y.data(), B, T, 1.0, k1 + 1);
  const double plain = off.train_micro_step(b.x.data(), b.y.data(), B, T, 1.0, k1);
  EXPECT_EQ(a, again) << "the same key, the same masks";
  EXPECT_NE(a, other);
  EXPECT_NE(a, plain);
}

// A recomputed block remakes its masks from the key: the gradients are those
// of the run that kept its activations.
TEST(Dropout, RecomputationRemakesTheSameMasks) {
  const int64_t B = 2, T = 32;
  const Batch b(B, T);
  const uint64_t key = models::dropout_key(9, 1, 0, 0);
  std::vector<std::unique_ptr<models::Gpt>> m;
  std::vector<double> loss;
  for (const char* level : {"none", "selective", "full"}) {
    m.push_back(std::make_unique<models::Gpt>(small_gpt(0.2f, level), backend()));
    m.back()->init_weights(11);
    loss.push_back(m.back()->train_micro_step(b.x.data(), b.y.data(), B, T, 1.0, key));
  }
  for (size_t i = 1; i < m.size(); ++i) {
    EXPECT_EQ(loss[i], loss[0]);
    for (const auto& [name, e] : m[0]->params().entries()) {
      SCOPED_TRACE(name);
      EXPECT_LE(testing_util::normalized_error(e.grad, m[i]->params().entries().at(name).grad), 1e-6);
    }
  }
}

// fp16 compute: the CPU has no f16 dropout kernel, so the branches' dropouts
// run in f32 between casts (Lowp::run), as other ops without one do.
TEST(Dropout, Fp16TrainsWithTheBranchDropoutsInF32) {
  const int64_t B = 2, T = 32;
  const Batch b(B, T);
  models::GptConfig c = small_gpt(0.2f);
  c.compute = DType::f16;
  models::Gpt m(c, backend());
  m.init_weights(5);
  const double loss = m.train_micro_step(b.x.data(), b.y.data(), B, T, 1.0, models::dropout_key(1, 0, 0, 0));
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_EQ(count_dropouts(m.train_graph(B, T)), 2 * (1 + 2 * 2));
  models::GptConfig plain = c;
  plain.dropout = 0.f;
  models::Gpt p(plain, backend());
  p.init_weights(5);
  EXPECT_NE(loss, p.train_micro_step(b.x.data(), b.y.data(), B, T));
}

// A config asking for dropout on a GPU is refused when it is read (before
// any run directory is written), and one whose value rounds to 1 in a
// float too.
TEST(Dropout, TheConfigRefusesItOnAGpuAndOutOfRange) {
  EXPECT_EQ(train::load_train_config("", {"model.dropout=0.1"}).model.dropout, 0.1f);
  const auto refused = expect_config_refused;
  refused({"model.dropout=0.1", "train.device=\"cuda\""}, "model.dropout > 0 is supported with train.device = \"cpu\" only");
  refused({"model.dropout=0.99999999"}, "as a 32-bit float), got 0.99999999");
  refused({"model.dropout=1"}, "model.dropout must be in [0, 1)");
  refused({"model.dropout=-0.5"}, "model.dropout must be in [0, 1)");
  refused({"model.dropout=1e-50"}, "not round to 0 or 1 as a 32-bit float");
}

// The encoder classifier takes the same dropout: train programs only, the
// same sites, the key picks the masks, recomputation remakes them.
TEST(Dropout, TheEncoderDropsOnlyInTrainProgramsAndRecomputesTheSameMasks) {
  const EncoderBatch eb;
  const int64_t B = eb.B, T = eb.T;
  auto config = [](float p, const char* recompute) {
    return testing_util::small_dropout_encoder(p, 0.f, "flash", recompute);
  };
  models::Encoder on(config(0.2f, "none"), backend()), off(config(0.f, "none"), backend());
  models::Encoder full(config(0.2f, "full"), backend());
  for (models::Encoder* m : {&on, &off, &full}) m->init_weights(4);
  EXPECT_EQ(count_dropouts(on.program(true, B, T).graph), 2 * (1 + 2 * 2));
  EXPECT_EQ(count_dropouts(on.program(false, B, T).graph), 0);
  EXPECT_EQ(count_dropouts(off.program(true, B, T).graph), 0);
  const uint64_t key = models::dropout_key(3, 7, 0, 0);
  const double a = eb.step(on, key);
  on.params().zero_grads();
  EXPECT_EQ(eb.step(on, key), a);
  EXPECT_NE(eb.step(on, key + 1), a);
  EXPECT_NE(eb.step(off, key), a);
  const float* lo = on.logits(eb.ids.data(), eb.lengths.data(), B, T);
  const std::vector<float> logits_on(lo, lo + B * 2);
  EXPECT_TRUE(std::equal(logits_on.begin(), logits_on.end(), off.logits(eb.ids.data(), eb.lengths.data(), B, T)))
      << "classifying drops nothing";
  on.params().zero_grads();
  EXPECT_EQ(eb.step(on, key), a);
  EXPECT_EQ(eb.step(full, key), a);
  for (const auto& [name, e] : on.params().entries()) {
    SCOPED_TRACE(name);
    EXPECT_LE(testing_util::normalized_error(e.grad, full.params().entries().at(name).grad), 1e-6);
  }
}

// model.classifier_dropout drops the pooled features (B, C) before the head,
// alone or with the others: one more site, train programs only, and the key
// picks its mask.
TEST(Dropout, TheEncoderClassifierDropsThePooledFeatures) {
  const EncoderBatch eb;
  const int64_t B = eb.B, T = eb.T;
  models::EncoderConfig head_only = testing_util::small_dropout_encoder(0.f);
  head_only.classifier_dropout = 0.5f;
  models::EncoderConfig all = testing_util::small_dropout_encoder(0.2f);
  all.classifier_dropout = 0.5f;
  models::Encoder on(head_only, backend()), both(all, backend());
  models::Encoder off(testing_util::small_dropout_encoder(0.f), backend());
  for (models::Encoder* m : {&on, &both, &off}) m->init_weights(4);
  EXPECT_EQ(count_dropouts(on.program(true, B, T).graph), 2) << "the pooled features' forward and backward";
  EXPECT_EQ(count_dropouts(on.program(false, B, T).graph), 0);
  EXPECT_EQ(count_dropouts(both.program(true, B, T).graph), 2 * (1 + 2 * 2 + 1));
  const uint64_t key = models::dropout_key(3, 7, 0, 0);
  const double a = eb.step(on, key);
  EXPECT_EQ(eb.step(on, key), a);
  EXPECT_NE(eb.step(on, key + 1), a);
  EXPECT_NE(eb.step(off, key), a);
  // With p 0.5 over 3 x 32 features some of the head's input columns are
  // dropped for every row: their weight gradients are exactly zero only here.
  on.params().zero_grads();
  eb.step(on, key);
  off.params().zero_grads();
  eb.step(off, key);
  const auto zero_columns = [](models::Encoder& m) {
    const core::Tensor g = m.params().download(m.params().entries().at("head.weight").grad);
    const int64_t C = g.shape()[1];
    int64_t zero = 0;
    for (int64_t c = 0; c < C; ++c)
      zero += g.data_as<float>()[c] == 0.f && g.data_as<float>()[C + c] == 0.f;
    return zero;
  };
  EXPECT_GT(zero_columns(on), 0);
  EXPECT_EQ(zero_columns(off), 0);
}

// Unset, model.classifier_dropout follows model.dropout (Hugging Face's
// rule); set, it stands alone; written configs carry it.
TEST(Dropout, TheClassifierDropoutKeyDefaultsToModelDropout) {
  const std::string head = "[model]\nkind = \"encoder\"\n";
  const train::ClassifyConfig follows = train::parse_classify_config(head + "dropout = 0.2\n", "a.toml");
  EXPECT_FLOAT_EQ(follows.model.classifier_dropout, 0.2f);
  const train::ClassifyConfig own =
      train::parse_classify_config(head + "dropout = 0.2\nclassifier_dropout = 0\n", "b.toml");
  EXPECT_EQ(own.model.classifier_dropout, 0.f);
  EXPECT_EQ(train::parse_classify_config(train::to_toml(own), "c.toml").model.classifier_dropout, 0.f);
  const train::ClassifyConfig alone = train::parse_classify_config(head + "classifier_dropout = 0.3\n", "d.toml");
  EXPECT_EQ(alone.model.dropout, 0.f);
  EXPECT_FLOAT_EQ(train::parse_classify_config(train::to_toml(alone), "e.toml").model.classifier_dropout, 0.3f);
  try {
    train::parse_classify_config(head + "classifier_dropout = 1.0\n", "f.toml");
    ADD_FAILURE() << "accepted classifier_dropout 1";
  } catch (const core::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.classifier_dropout must be in [0, 1)"), std::string::npos) << e.what();
  }
}

TEST(Dropout, AProbabilityOutsideZeroToOneIsRefused) {
  for (const float p : {-0.1f, 1.f, 1.5f, std::nanf("")}) {
    models::GptConfig c = small_gpt(p);
    try {
      c.validate();
      ADD_FAILURE() << "accepted dropout " << p;
    } catch (const core::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("model.dropout must be in [0, 1)"), std::string::npos) << e.what();
    }
  }
}
