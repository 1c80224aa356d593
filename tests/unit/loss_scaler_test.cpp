// Dynamic loss scaling and the precision choice.
//
// The scaler's state machine on its own (growth after N clean steps, backoff
// and skip on overflow, counters, floor and ceiling), then the
// end-to-end check on a real GPT: a forced overflow (a scale so
// large that the scaled gradients' norm overflows fp32, and separately one
// gradient poisoned with inf) skips the step -- weights, moments and AdamW's
// step count unchanged -- and backs the scale off; the next clean step applies
// and gives the same weights bit for bit as an unscaled step (power-of-two
// scaling is exact in fp32). Last, `train.precision` parsing and the fp32
// fallback with its warning on a machine without a fast path.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "brisk/core/error.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/cpu/cpu_features.h"
#include "brisk/models/gpt.h"
#include "brisk/optim/loss_scaler.h"
#include "brisk/optim/optimizer.h"
#include "brisk/train/config.h"
#include "test_util.h"

using namespace brisk;
using optim::LossScaler;
using optim::LossScalerConfig;

namespace {

constexpr float k2to16 = 65536.0f;

// ---- the state machine ------------------------------------------------------------------

TEST(LossScaler, DefaultsFollowTheIssue) {
  LossScaler s;
  EXPECT_EQ(s.scale(), k2to16);
  EXPECT_EQ(s.config().growth_interval, 2000);
  EXPECT_EQ(s.steps(), 0);
  EXPECT_EQ(s.skipped_steps(), 0);
  EXPECT_EQ(s.scale_changes(), 0);
}

TEST(LossScaler, DoublesAfter2000CleanSteps) {
  LossScaler s;
  for (int i = 0; i < 1999; ++i) ASSERT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), k2to16) << "grew before 2000 clean steps";
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 2 * k2to16);
  EXPECT_EQ(s.growths(), 1);
  EXPECT_EQ(s.scale_changes(), 1);
  EXPECT_EQ(s.clean_streak(), 0);
  EXPECT_EQ(s.steps(), 2000);
}

TEST(LossScaler, GrowthIntervalIsConfigurable) {
  LossScaler s({.growth_interval = 3});
  std::vector<float> scales;
  for (int i = 0; i < 7; ++i) {
    s.update(true);
    scales.push_back(s.scale());
  }
  const float a = k2to16, b = 2 * a, c = 4 * a;
  EXPECT_EQ(scales, (std::vector<float>{a, a, b, b, b, c, c}));
  EXPECT_EQ(s.growths(), 2);
}

TEST(LossScaler, OverflowSkipsHalvesAndRestartsTheCleanCount) {
  LossScaler s({.growth_interval = 3});
  EXPECT_TRUE(s.update(true));
  EXPECT_TRUE(s.update(true));
  EXPECT_FALSE(s.update(false)) << "an overflow must skip the step";
  EXPECT_EQ(s.scale(), k2to16 / 2);
  EXPECT_EQ(s.skipped_steps(), 1);
  EXPECT_EQ(s.backoffs(), 1);
  EXPECT_EQ(s.clean_streak(), 0);
  // The two clean steps before the overflow do not count towards growth.
  EXPECT_TRUE(s.update(true));
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), k2to16 / 2);
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), k2to16);
  EXPECT_EQ(s.scale_changes(), 2);
  EXPECT_EQ(s.skipped_steps(), 1);
  EXPECT_EQ(s.steps(), 6);
}

TEST(LossScaler, FloorStopsBackoffButStillSkips) {
  LossScaler s({.init_scale = 8, .min_scale = 4});
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 4);
  EXPECT_FALSE(s.update(false));
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 4) << "went below min_scale";
  EXPECT_EQ(s.skipped_steps(), 3);
  EXPECT_EQ(s.backoffs(), 1) << "a backoff at the floor is not a scale change";
  EXPECT_EQ(s.scale_changes(), 1);
}

TEST(LossScaler, CeilingStopsGrowth) {
  LossScaler s({.init_scale = 8, .growth_interval = 1, .max_scale = 16});
  s.update(true);
  s.update(true);
  EXPECT_EQ(s.scale(), 16);
  EXPECT_EQ(s.growths(), 1);
}

TEST(LossScaler, ImpossibleConfigsAreRejected) {
  EXPECT_THROW(LossScaler({.init_scale = 0}), core::ConfigError);
  EXPECT_THROW(LossScaler({.init_scale = std::numeric_limits<float>::infinity()}), core::ConfigError);
  EXPECT_THROW(LossScaler({.growth_factor = 1}), core::ConfigError);
  EXPECT_THROW(LossScaler({.backoff_factor = 1}), core::ConfigError);
  EXPECT_THROW(LossScaler({.growth_interval = 0}), core::ConfigError);
  EXPECT_THROW(LossScaler({.init_scale = 2, .min_scale = 4}), core::ConfigError);
}

TEST(LossScaler, FiniteCheckOnTheGradNorm) {
  EXPECT_TRUE(LossScaler::grads_finite(3.5));
  EXPECT_TRUE(LossScaler::grads_finite(0));
  EXPECT_FALSE(LossScaler::grads_finite(std::numeric_limits<double>::infinity()));
  EXPECT_FALSE(LossScaler::grads_finite(std::numeric_limits<double>::quiet_NaN()));
}

// ---- end to end on a tiny GPT -----------------------------------------------------------

using testing_util::backend;

const models::GptConfig kTiny{64, 1, 16, 2, 8};  // vocab, n_layer, n_embd, n_head, block
constexpr int64_t kB = 2, kT = 8;
constexpr float kLr = 1e-2f;

struct Batch {
  std::vector<int32_t> x, y;
};
Batch batch() {
  Batch b;
  for (int64_t i = 0; i < kB * kT; ++i) {
    b.x.push_back(int32_t((i * 13 + 5) % kTiny.vocab_size));
    b.y.push_back(int32_t((i * 29 + 3) % kTiny.vocab_size));
  }
  return b;
}

// Weights and both AdamW moments, by name.
using Snapshot = std::map<std::string, std::vector<std::vector<char>>>;
Snapshot snapshot(const models::Gpt& m) {
  Snapshot s;
  for (const auto& [name, e] : m.params().entries()) {
    auto& v = s[name];
    const core::Tensor* ts[] = {&e.value, &e.state.at(0), &e.state.at(1)};
    for (const core::Tensor* t : ts) {
      const char* p = t->data_as<char>();
      v.emplace_back(p, p + t->bytes());
    }
  }
  return s;
}

bool any_grad_nonfinite(const models::Gpt& m) {
  for (const auto& [name, e] : m.params().entries()) {
    const float* g = e.grad.data_as<float>();
    for (int64_t i = 0; i < e.grad.numel(); ++i)
      if (!std::isfinite(g[i])) return true;
  }
  return false;
}

void backward(models::Gpt& m, float seed) {
  const Batch b = batch();
  m.params().zero_grads();
  m.train_micro_step(b.x.data(), b.y.data(), kB, kT, seed);
}

// The check with a real overflow. In fp32 compute this model's
// gradients stay below the seed (at most ~seed/4), so no representable scale
// makes a single element inf; but the largest float as the scale makes the
// scaled gradients' global norm (1.5x the seed here) overflow, and that norm
// is exactly what the finite check reads. Each overflow skips the step and
// halves the scale until the gradients fit; only then does an update happen.
TEST(LossScalingGpt, HugeScaleOverflowsSkipsAndBacksOffUntilTheStepApplies) {
  models::Gpt model(kTiny, backend());
  model.init_weights(3);
  optim::AdamW adamw({}, model.params(), backend());
  const float huge = std::numeric_limits<float>::max();
  LossScaler scaler({.init_scale = huge, .max_scale = huge});
  const Snapshot before = snapshot(model);

  backward(model, scaler.scale());
  ASSERT_FALSE(std::isfinite(adamw.grad_norm())) << "the scaled gradients' norm should overflow fp32";
  const optim::ScaledStep first = optim::scaled_step(adamw, scaler, kLr);
  EXPECT_FALSE(first.applied);
  EXPECT_FALSE(std::isfinite(first.stats.grad_norm));
  EXPECT_EQ(first.scale_used, huge);
  EXPECT_EQ(scaler.scale(), huge / 2) << "the scale did not back off";
  EXPECT_EQ(scaler.skipped_steps(), 1);
  EXPECT_EQ(scaler.backoffs(), 1);
  EXPECT_EQ(adamw.steps_taken(), 0) << "AdamW's step counter advanced on a skipped step";
  EXPECT_TRUE(snapshot(model) == before) << "weights or moments changed on a skipped step";

  // Keep going: every overflow halves the scale, weights stay put, until a
  // scale small enough applies.
  int skips = 1;
  optim::ScaledStep r;
  for (; skips < 200; ++skips) {
    const float s = scaler.scale();
    backward(model, s);
    r = optim::scaled_step(adamw, scaler, kLr);
    if (r.applied) break;
    ASSERT_EQ(scaler.scale(), s / 2);
    ASSERT_EQ(adamw.steps_taken(), 0);
    ASSERT_TRUE(snapshot(model) == before) << "weights changed on skip " << skips;
  }
  ASSERT_TRUE(r.applied) << "never recovered from the overflow";
  EXPECT_EQ(scaler.skipped_steps(), skips);
  EXPECT_LT(scaler.scale(), huge);
  EXPECT_TRUE(std::isfinite(r.stats.grad_norm));
  EXPECT_EQ(adamw.steps_taken(), 1);
  EXPECT_FALSE(snapshot(model) == before) << "the clean step did not update the weights";
  std::printf("[ info ] scale %g: %d skipped step(s), applied at scale %g, grad norm %.4g\n", double(huge), skips,
              double(r.scale_used), r.stats.grad_norm);
}

// One gradient poisoned with inf at the default 2^16 scale: skip and back off;
// the next clean step applies, and since power-of-two scaling is exact in
// fp32 its weights equal an unscaled AdamW step's bit for bit.
TEST(LossScalingGpt, PoisonedGradientSkipsThenCleanStepMatchesUnscaledExactly) {
  models::Gpt model(kTiny, backend()), reference(kTiny, backend());
  model.init_weights(5);
  reference.init_weights(5);
  optim::AdamW adamw({}, model.params(), backend()), ref_adamw({}, reference.params(), backend());
  LossScaler scaler;
  const Snapshot before = snapshot(model);

  backward(model, scaler.scale());
  ASSERT_FALSE(any_grad_nonfinite(model));
  model.params().at("h.0.mlp.c_fc.weight").grad.data_as<float>()[7] = std::numeric_limits<float>::infinity();
  const optim::ScaledStep skipped = optim::scaled_step(adamw, scaler, kLr);
  EXPECT_FALSE(skipped.applied);
  EXPECT_EQ(scaler.scale(), k2to16 / 2);
  EXPECT_EQ(scaler.skipped_steps(), 1);
  EXPECT_EQ(adamw.steps_taken(), 0);
  EXPECT_TRUE(snapshot(model) == before);

  backward(model, scaler.scale());
  const optim::ScaledStep applied = optim::scaled_step(adamw, scaler, kLr);
  EXPECT_TRUE(applied.applied);
  EXPECT_EQ(applied.scale_used, k2to16 / 2);
  EXPECT_EQ(scaler.skipped_steps(), 1);
  EXPECT_EQ(adamw.steps_taken(), 1);

  backward(reference, 1.0f);
  const optim::StepStats ref = ref_adamw.step(kLr);
  EXPECT_EQ(applied.stats.grad_norm, ref.grad_norm) << "the scale was not divided out of the grad norm";
  EXPECT_TRUE(snapshot(model) == snapshot(reference)) << "a loss-scaled step differs from the unscaled one";
}

// ---- train.precision --------------------------------------------------------------------

TEST(Precision, ParsedFromConfigWithAllowedValuesOnError) {
  EXPECT_EQ(train::load_train_config("", {}).precision, train::Precision::fp32);
  EXPECT_EQ(train::load_train_config("", {"train.precision=bf16"}).precision, train::Precision::bf16);
  EXPECT_EQ(train::load_train_config("", {"train.precision=fp16"}).precision, train::Precision::fp16);
  try {
    train::load_train_config("", {"train.precision=fp8"});
    FAIL() << "fp8 accepted";
  } catch (const core::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("allowed: fp32, bf16, fp16"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(train::load_train_config("", {}).loss_scaling.has_value());
  EXPECT_EQ(train::load_train_config("", {"train.loss_scaling=true"}).loss_scaling, true);
  EXPECT_THROW(train::load_train_config("", {"train.loss_scaling=3"}), core::ConfigError);
  const auto c = train::load_train_config("", {"train.precision=fp16", "train.loss_scale_growth_interval=50"});
  EXPECT_EQ(c.loss_scale_growth_interval, 50);
  EXPECT_NE(train::to_toml(c).find("precision = \"fp16\""), std::string::npos);
}

TEST(Precision, Fp32NeedsNoFallback) {
  const auto c = train::resolve_precision(train::Precision::fp32);
  EXPECT_EQ(c.effective, train::Precision::fp32);
  EXPECT_TRUE(c.warning.empty());
}

// Without bf16 dot products, bf16 and fp16 fall back to fp32 with a warning
// that names the CPU's features.
using Bf16Override = testing_util::ScopedBf16Path;

TEST(Precision, Bf16FallsBackToFp32WithAWarningWithoutTheNativePath) {
  Bf16Override emulated("emulated");  // what an AVX2-only CPU gets
  const auto cfg = train::load_train_config("", {"train.precision=bf16"});
  const auto c = train::resolve_precision(cfg.precision);
  EXPECT_EQ(c.requested, train::Precision::bf16);
  EXPECT_EQ(c.effective, train::Precision::fp32);
  EXPECT_EQ(c.path, "fp32");
  EXPECT_NE(c.warning.find("precision bf16 requested but no fast path on this machine"), std::string::npos) << c.warning;
  EXPECT_NE(c.warning.find("training in fp32"), std::string::npos) << c.warning;
  EXPECT_NE(c.warning.find("BRISK_BF16=emulated"), std::string::npos) << c.warning;
  std::printf("[ info ] %s\n", c.warning.c_str());
}

TEST(Precision, Bf16RunsNativeWhereTheCpuHasBf16DotProducts) {
  Bf16Override none(nullptr);
  const bool has_bf16 = __builtin_cpu_supports("avx512bf16");
  const auto c = train::resolve_precision(train::Precision::bf16);
  if (!has_bf16) {
    EXPECT_EQ(c.effective, train::Precision::fp32);
    EXPECT_NE(c.warning.find("CPU has no avx512_bf16"), std::string::npos) << c.warning;
    GTEST_SKIP() << "no avx512_bf16 on this CPU: the bf16-native path is not available (" << c.warning << ")";
  }
  EXPECT_EQ(c.effective, train::Precision::bf16);
  EXPECT_EQ(c.path, "bf16-native");
  EXPECT_FALSE(c.emulated);
  EXPECT_TRUE(c.warning.empty()) << c.warning;
  EXPECT_NE(c.reason.find("CPU has avx512_bf16"), std::string::npos) << c.reason;
  std::printf("[ info ] bf16-native: %s\n", c.reason.c_str());
}

TEST(Precision, Fp16FallsBackToFp32WithAWarning) {
  const auto c = train::resolve_precision(train::Precision::fp16);
  EXPECT_EQ(c.effective, train::Precision::fp32);
  EXPECT_NE(c.warning.find("precision fp16 requested but no fast path on this machine"), std::string::npos) << c.warning;
  std::printf("[ info ] %s\n", c.warning.c_str());
}

}  // namespace
