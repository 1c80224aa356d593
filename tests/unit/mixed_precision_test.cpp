// Mixed precision training: the bf16/f16 GPT graph
// (models::GptConfig::compute) against the fp32 one from the same weights.
//
// What could go wrong, and the test that would see it:
// - the low-precision graph silently computes in fp32 (or in 16 bits where
//   it must not: LayerNorm, the residual stream, the loss) -> the graph's
//   dtypes are checked node by node;
// - casts lose or misroute gradients (the cast's backward must bring them
//   back to fp32 and add the tied embedding's two uses) -> one forward loss
//   within 1% of fp32 and every parameter's gradient with cosine > 0.99, for
//   bf16 and f16, plain and flash attention, unfused and fused classifier;
// - rounding drifts over training -> a 60-step run through the trainer whose
//   bf16 loss ends within 2% of fp32's (the 300-step W2 version of this is
//   `brisk bench precision`);
// - fp16 overflow goes unseen -> a loss scale of 2^30 makes the fp16
//   gradients overflow to inf; the inf must reach the fp32 grads, the step be
//   skipped with the weights untouched and the scale halved, until training
//   proceeds with a finite, falling loss;
// - config typos -> ConfigErrors naming train.precision / precision_fallback.
#include <gtest/gtest.h>

#include <cstdlib>

#include "brisk/cpu/cpu_features.h"
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "brisk/core/error.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/data/shards.h"
#include "brisk/models/gpt.h"
#include "brisk/optim/loss_scaler.h"
#include "brisk/optim/optimizer.h"
#include "brisk/train/config.h"
#include "brisk/train/trainer.h"
#include "test_corpus.h"
#include "test_util.h"

using namespace brisk;
using core::DType;

namespace {

models::GptConfig tiny(DType compute) {
  models::GptConfig c;
  c.vocab_size = 64;
  c.n_layer = 2;
  c.n_embd = 64;
  c.n_head = 4;
  c.block_size = 32;
  c.compute = compute;
  return c;
}

constexpr int64_t kB = 4, kT = 32;

// Token windows with structure (a noisy counter mod V), so that gradients are
// not just noise.
void batch_of(uint64_t seed, int64_t vocab, std::vector<int32_t>& x, std::vector<int32_t>& y) {
  std::mt19937 rng{uint32_t(seed)};
  x.resize(size_t(kB * kT));
  y.resize(x.size());
  for (int64_t b = 0; b < kB; ++b) {
    int32_t v = int32_t(rng() % uint32_t(vocab));
    for (int64_t t = 0; t <= kT; ++t) {
      const int32_t next = (v + 1 + int32_t(rng() % 3 == 0)) % int32_t(vocab);
      if (t < kT) x[size_t(b * kT + t)] = v;
      if (t > 0) y[size_t(b * kT + t - 1)] = v;
      v = next;
    }
  }
}

double cosine(const core::Tensor& a, const core::Tensor& b) {
  double ab = 0, aa = 0, bb = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.item(i), y = b.item(i);
    ab += x * y;
    aa += x * x;
    bb += y * y;
  }
  if (aa == 0 && bb == 0) return 1.0;
  return ab / std::sqrt(aa * bb);
}

// ---- the graph ------------------------------------------------------------------------

TEST(MixedPrecision, Bf16GraphComputesInBf16WithFp32ResidualLayerNormAndLoss) {
  cpu::CpuBackend backend(2);
  models::Gpt lowp(tiny(DType::bf16), backend);
  const core::Graph g = lowp.train_graph(kB, kT);
  std::map<std::string, int> by_dtype;
  int casts = 0, narrowed_layernorms = 0;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const core::Node& n = g.nodes()[i];
    const DType out = g.meta(n.outputs[0]).dtype;
    const std::string op(core::op_name(n.op));
    if (n.op == core::OpKind::cast) ++casts;
    if (i < g.backward_start()) by_dtype[op + ":" + std::string(core::dtype_name(out))]++;
    if (n.op == core::OpKind::layernorm_backward || n.op == core::OpKind::embedding ||
        n.op == core::OpKind::embedding_backward) {
      EXPECT_EQ(out, DType::f32) << op << " must stay fp32";
    }
    if (n.op == core::OpKind::layernorm) {
      // Normalises the fp32 residual with fp32 statistics, and writes its
      // output in bf16 for the Linear that reads it: no cast in between.
      EXPECT_EQ(g.meta(n.inputs[0]).dtype, DType::f32) << "layernorm reads the fp32 residual";
      EXPECT_EQ(g.meta(n.outputs[1]).dtype, DType::f32);
      EXPECT_EQ(g.meta(n.outputs[2]).dtype, DType::f32);
      EXPECT_EQ(out, DType::bf16) << "layernorm writes its output in the compute dtype";
      ++narrowed_layernorms;
    }
    if (n.op == core::OpKind::cast) {
      const int p = g.value(n.inputs[0]).producer;
      EXPECT_FALSE(p >= 0 && g.nodes()[size_t(p)].op == core::OpKind::layernorm) << "a cast after a layernorm";
    }
    if (n.op == core::OpKind::add && i < g.backward_start()) {
      // The residual adds take the bf16 branch as it is (add's mixed form).
      for (const core::ValueId in : n.inputs) {
        const int p = g.value(in).producer;
        EXPECT_FALSE(p >= 0 && g.nodes()[size_t(p)].op == core::OpKind::cast) << "a widening cast before an add";
      }
    }
    if (n.op == core::OpKind::accumulate) {
      EXPECT_EQ(out, DType::f32) << "grads must be fp32";
    }
    if (n.op == core::OpKind::cross_entropy) {
      EXPECT_EQ(out, DType::f32) << "the loss must be fp32";
    }
  }
  // Every Linear (4 per layer + the head), attention and GELU in bf16; the
  // residual adds (2 per layer + the embedding sum) in fp32.
  EXPECT_EQ(by_dtype["linear:bf16"], 4 * 2 + 1);
  EXPECT_EQ(by_dtype["linear:f32"], 0);
  EXPECT_EQ(by_dtype["attention:bf16"], 2);
  EXPECT_EQ(by_dtype["gelu:bf16"], 2);
  EXPECT_EQ(by_dtype["add:f32"], 2 * 2 + 1);
  EXPECT_EQ(by_dtype["add:bf16"], 0);
  EXPECT_EQ(by_dtype["cross_entropy:f32"], 1);
  EXPECT_EQ(narrowed_layernorms, 2 * 2 + 1);  // ln_1, ln_2 per layer and ln_f
  EXPECT_GT(casts, 0);

  // The fp32 graph is the one it always was: not a single cast.
  models::Gpt full(tiny(DType::f32), backend);
  const core::Graph g32 = full.train_graph(kB, kT);
  for (const core::Node& n : g32.nodes()) EXPECT_NE(n.op, core::OpKind::cast);
}

TEST(MixedPrecision, ComputeDtypeMustBeAFloat) {
  models::GptConfig c = tiny(DType::i32);
  EXPECT_THROW(c.validate(), core::ConfigError);
  EXPECT_TRUE(c.same_shape(tiny(DType::bf16))) << "compute is not part of the weights";
}

// ---- one step against fp32 ------------------------------------------------------------

struct Variant {
  const char* name;
  DType dt;
  std::string attention;
  bool fused;
  double loss_tol;
};

TEST(MixedPrecision, OneStepLossAndGradientsTrackFp32) {
  cpu::CpuBackend backend(2);
  std::vector<int32_t> x, y;
  batch_of(7, 64, x, y);
  const Variant variants[] = {
      {"bf16 plain", DType::bf16, "plain", false, 0.01},
      {"bf16 flash", DType::bf16, "flash", false, 0.01},
      {"bf16 fused classifier", DType::bf16, "plain", true, 0.01},
      {"f16 plain", DType::f16, "plain", false, 0.005},
      {"f16 flash", DType::f16, "flash", false, 0.005},
  };
  for (const Variant& v : variants) {
    SCOPED_TRACE(v.name);
    models::GptConfig c32 = tiny(DType::f32), clo = tiny(v.dt);
    c32.attention = clo.attention = v.attention;
    c32.fused_classifier = clo.fused_classifier = v.fused;
    models::Gpt ref(c32, backend), lowp(clo, backend);
    ref.init_weights(11);
    lowp.init_weights(11);
    ref.params().zero_grads();
    lowp.params().zero_grads();
    const double l32 = ref.train_micro_step(x.data(), y.data(), kB, kT);
    const double llo = lowp.train_micro_step(x.data(), y.data(), kB, kT);
    const double rel = std::abs(llo - l32) / l32;
    std::printf("[ info ] %-22s loss fp32 %.6f  %s %.6f  rel diff %.2e\n", v.name, l32,
                std::string(core::dtype_name(v.dt)).c_str(), llo, rel);
    EXPECT_TRUE(std::isfinite(llo));
    EXPECT_LT(rel, v.loss_tol);
    EXPECT_GT(rel, 0.0) << "bit-identical to fp32: the low-precision graph did not run";

    double worst = 1.0;
    std::string worst_name;
    for (const auto& [name, e] : ref.params().entries()) {
      const auto& lo = lowp.params().entries().at(name);
      ASSERT_EQ(lo.grad.dtype(), DType::f32) << name;
      const double cs = cosine(e.grad, lo.grad);
      if (cs < worst) worst = cs, worst_name = name;
      EXPECT_GT(cs, 0.99) << name;
    }
    std::printf("[ info ] %-22s worst gradient cosine %.5f (%s)\n", v.name, worst, worst_name.c_str());
  }
}

// Power-of-two loss scales are exact in bf16 too, so (below overflow) the
// scaled gradient divided by the scale is the unscaled one, bit for bit.
TEST(MixedPrecision, Bf16ScaledBackwardIsExact) {
  cpu::CpuBackend backend(2);
  std::vector<int32_t> x, y;
  batch_of(3, 64, x, y);
  models::Gpt a(tiny(DType::bf16), backend), b(tiny(DType::bf16), backend);
  a.init_weights(5);
  b.init_weights(5);
  a.params().zero_grads();
  b.params().zero_grads();
  a.train_micro_step(x.data(), y.data(), kB, kT, 1.0);
  b.train_micro_step(x.data(), y.data(), kB, kT, 1024.0);
  for (const auto& [name, e] : a.params().entries()) {
    const auto& s = b.params().entries().at(name).grad;
    for (int64_t i = 0; i < e.grad.numel(); ++i)
      ASSERT_EQ(e.grad.item(i) * 1024.0, s.item(i)) << name << "[" << i << "]";
  }
}

// ---- fp16 overflow, directly ----------------------------------------------------------

// At 2^30 the loss gradient (2^30 / 128 tokens = 2^23 per logit) is far past
// fp16's 65504, so the fp16 logits' gradient is inf. That inf must reach the
// fp32 master grads through the matrix products and the casts, AdamW's grad
// norm must see it, and the step be skipped. The same scale in fp32 is fine.
TEST(MixedPrecision, Fp16OverflowReachesTheFp32GradsAndSkipsTheStep) {
  cpu::CpuBackend backend(2);
  std::vector<int32_t> x, y;
  batch_of(9, 64, x, y);
  const float huge = 1073741824.0f;  // 2^30

  models::Gpt f32(tiny(DType::f32), backend);
  f32.init_weights(3);
  optim::AdamW adamw32({}, f32.params(), backend);
  f32.params().zero_grads();
  f32.train_micro_step(x.data(), y.data(), kB, kT, huge);
  EXPECT_TRUE(std::isfinite(adamw32.grad_norm())) << "fp32 gradients should not overflow at 2^30";

  models::Gpt f16(tiny(DType::f16), backend);
  f16.init_weights(3);
  optim::AdamW adamw({}, f16.params(), backend);
  optim::LossScaler scaler({.init_scale = huge});
  std::map<std::string, std::vector<float>> before;
  for (const auto& [name, e] : f16.params().entries()) {
    const float* p = e.value.data_as<float>();
    before[name].assign(p, p + e.value.numel());
  }
  f16.params().zero_grads();
  const double loss = f16.train_micro_step(x.data(), y.data(), kB, kT, scaler.scale());
  EXPECT_TRUE(std::isfinite(loss)) << "the forward is fine; only the gradients overflow";
  int64_t non_finite = 0;
  for (const auto& [name, e] : f16.params().entries())
    for (int64_t i = 0; i < e.grad.numel(); ++i) non_finite += !std::isfinite(e.grad.item(i));
  EXPECT_GT(non_finite, 0) << "the fp16 overflow did not reach the fp32 grads";
  EXPECT_FALSE(std::isfinite(adamw.grad_norm()));

  const optim::ScaledStep r = optim::scaled_step(adamw, scaler, 1e-3f);
  EXPECT_FALSE(r.applied);
  EXPECT_EQ(scaler.skipped_steps(), 1);
  EXPECT_EQ(scaler.scale(), huge / 2);
  EXPECT_EQ(adamw.steps_taken(), 0);
  for (const auto& [name, e] : f16.params().entries()) {
    const float* p = e.value.data_as<float>();
    EXPECT_TRUE(std::equal(p, p + e.value.numel(), before[name].begin())) << name << " changed on a skipped step";
  }
  std::printf("[ info ] fp16 at scale 2^30: %lld non-finite fp32 grad elements, step skipped, scale now 2^%g\n",
              (long long)non_finite, std::log2(double(scaler.scale())));
}

// ---- through the trainer --------------------------------------------------------------

std::string corpus_dir() { return testing_util::corpus_dir("mixed"); }

train::TrainConfig tiny_run(const std::string& precision, int64_t steps, const std::string& tag) {
  const std::string root = corpus_dir();
  auto c = train::load_train_config(
      "", {"model.vocab_size=256", "model.n_layer=2", "model.n_embd=64", "model.n_head=4", "model.block_size=64",
           "train.batch=8", "train.seq=64", "train.steps=" + std::to_string(steps), "train.lr=3e-3",
           "train.warmup=5", "train.eval_every=0", "train.threads=2", "train.loader_workers=0",
           "train.precision=" + precision, "train.precision_fallback=false", "checkpoint.every=0",
           "data.dir=" + root + "/data", "checkpoint.dir=" + root + "/runs/" + tag});
  return c;
}

double tail_mean(const std::vector<double>& v, size_t n) {
  n = std::min(n, v.size());
  return std::accumulate(v.end() - long(n), v.end(), 0.0) / double(n);
}

TEST(MixedPrecision, Bf16TrainingTracksFp32Over60Steps) {
  const auto r32 = train::train(tiny_run("fp32", 60, "fp32"), {.quiet = true});
  const auto r16 = train::train(tiny_run("bf16", 60, "bf16"), {.quiet = true});
  EXPECT_EQ(r32.precision, "fp32");
  EXPECT_EQ(r16.precision, "bf16");
  EXPECT_TRUE(r16.precision_warning.empty()) << "precision_fallback = false must not fall back";
  const double a = tail_mean(r32.losses, 10), b = tail_mean(r16.losses, 10);
  const double rel = std::abs(b - a) / a;
  std::printf("[ info ] 60 steps: loss %.4f -> %.4f fp32, %.4f -> %.4f bf16; last-10 mean %.4f vs %.4f, rel diff %.3f%%\n",
              r32.first_loss, r32.last_loss, r16.first_loss, r16.last_loss, a, b, 100 * rel);
  EXPECT_LT(a, 0.6 * r32.first_loss) << "the fp32 run did not learn: the comparison would be empty";
  EXPECT_LT(rel, 0.02);
  EXPECT_NE(r32.losses, r16.losses) << "identical curves: the bf16 graph did not run";
}

// The fp16 check end to end: a scale of 2^30 overflows the fp16
// gradients; the trainer skips those steps and halves the scale each time,
// then trains with a finite, falling loss.
TEST(MixedPrecision, Fp16LossScalingBacksOffAnOverflowAndTrains) {
  auto cfg = tiny_run("fp16", 40, "fp16");
  cfg.loss_scale_init = 1073741824.0f;  // 2^30
  const auto r = train::train(cfg, {.quiet = true});
  EXPECT_EQ(r.precision, "fp16");
  ASSERT_GT(r.skipped_steps, 0) << "no overflow at loss scale 2^30 in fp16";
  EXPECT_LT(r.skipped_steps, 20) << "the scale never backed off far enough";
  // No growth within 40 steps (interval 2000): every skip halved the scale.
  EXPECT_EQ(double(r.loss_scale), std::ldexp(1.0, 30 - int(r.skipped_steps)));
  for (double l : r.losses) EXPECT_TRUE(std::isfinite(l));
  EXPECT_LT(tail_mean(r.losses, 5), 0.8 * r.first_loss) << "training did not proceed after the back-off";
  std::printf("[ info ] fp16 from 2^30: %lld steps skipped, scale now 2^%g, loss %.4f -> %.4f\n",
              (long long)r.skipped_steps, std::log2(r.loss_scale), r.first_loss, r.last_loss);
}

// ---- configuration --------------------------------------------------------------------

TEST(MixedPrecision, ConfigNamesTheKeyOnBadValues) {
  auto expect_error = [](const std::string& set, const std::string& key) {
    try {
      train::load_train_config("", {set});
      ADD_FAILURE() << set << " accepted";
    } catch (const core::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  };
  expect_error("train.precision=bf17", "train.precision");
  expect_error("train.precision=3", "train.precision");
  expect_error("train.precision_fallback=\"no\"", "train.precision_fallback");
  EXPECT_TRUE(train::load_train_config("", {}).precision_fallback);
  const auto c = train::load_train_config("", {"train.precision=bf16", "train.precision_fallback=false"});
  EXPECT_FALSE(c.precision_fallback);
  EXPECT_NE(train::to_toml(c).find("precision_fallback = false"), std::string::npos);
}

TEST(MixedPrecision, FallbackOffRunsEmulatedWithANote) {
  {
    testing_util::ScopedBf16Path emulated("emulated");  // bf16 as on a CPU without bf16 dot products
    for (auto p : {train::Precision::bf16, train::Precision::fp16}) {
      const auto on = train::resolve_precision(p, true);
      const auto off = train::resolve_precision(p, false);
      // No fast path: fp16 never has one, bf16 not under the override.
      EXPECT_EQ(on.effective, train::Precision::fp32);
      EXPECT_FALSE(on.warning.empty());
      EXPECT_EQ(off.effective, p);
      EXPECT_TRUE(off.emulated);
      EXPECT_TRUE(off.warning.empty());
      EXPECT_NE(off.note.find("emulated"), std::string::npos) << off.note;
      EXPECT_EQ(train::compute_dtype(off.effective), p == train::Precision::bf16 ? DType::bf16 : DType::f16);
      EXPECT_EQ(off.path, p == train::Precision::bf16 ? "bf16-emulated" : "fp16-emulated");
    }
  }
  EXPECT_EQ(train::resolve_precision(train::Precision::fp32, false).effective, train::Precision::fp32);
  EXPECT_FALSE(train::resolve_precision(train::Precision::fp32, false).emulated);
}

}  // namespace
