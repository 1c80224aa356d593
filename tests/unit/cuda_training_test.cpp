// Device-resident training on the CUDA backend, against the same model on the
// CPU: the loss of a train step, the gradients, AdamW's update and the
// checkpointed weights must agree (fp32, so to ~1e-4 of scale), the step
// must be captured as one CUDA graph and replay to the same numbers, and
// asking for train.device = "cuda" where there is no GPU must be a clear
// configuration error. Skips, visibly and with the loader's reason, where no
// GPU is present (the error test runs everywhere).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "brisk/core/backend_loader.h"
#include "brisk/core/error.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/models/gpt.h"
#include "brisk/optim/optimizer.h"
#include "brisk/train/config.h"
#include "brisk/train/trainer.h"

using namespace brisk;

namespace {

std::vector<int32_t> ids(int64_t n, int64_t vocab, uint32_t seed) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  uint32_t s = seed;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = int32_t((s >> 8) % uint32_t(vocab));
  }
  return v;
}

double max_rel_diff(const core::Tensor& a, const core::Tensor& b) {
  double diff = 0, scale = 1e-12;
  for (int64_t i = 0; i < a.numel(); ++i) {
    diff = std::max(diff, std::abs(a.item(i) - b.item(i)));
    scale = std::max(scale, std::abs(a.item(i)));
  }
  return diff / scale;
}

std::unique_ptr<core::Backend> cuda_or_skip_reason(std::string* why) { return core::load_cuda_backend(why); }

TEST(CudaTraining, DeviceWithoutGpuIsAClearError) {
  std::string why;
  if (cuda_or_skip_reason(&why)) GTEST_SKIP() << "a GPU is present: the no-GPU error cannot be provoked here";
  train::TrainConfig cfg = train::load_train_config("", {"train.device=\"cuda\"", "train.steps=1"});
  train::TrainOptions opt;
  opt.quiet = true;
  try {
    train::train(cfg, opt);
    FAIL() << "training on cuda without a GPU did not fail";
  } catch (const core::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("train.device = \"cuda\""), std::string::npos) << e.what();
  }
}

// Same weights, same batches: three steps of train + AdamW on each backend.
TEST(CudaTraining, StepsMatchTheCpu) {
  std::string why;
  std::unique_ptr<core::Backend> gpu = cuda_or_skip_reason(&why);
  if (!gpu) GTEST_SKIP() << "CUDA training not run: " << why;
  cpu::CpuBackend cpu(2);
  models::GptConfig cfg{97, 2, 64, 4, 32};
  cfg.attention = "flash";
  models::Gpt on_cpu(cfg, cpu), on_gpu(cfg, *gpu);
  on_cpu.init_weights(7);
  on_gpu.init_weights(7);
  optim::AdamWConfig oc;
  optim::AdamW opt_cpu(oc, on_cpu.params(), cpu), opt_gpu(oc, on_gpu.params(), *gpu);
  const int64_t B = 3, T = 32;
  for (int step = 0; step < 3; ++step) {
    const auto x = ids(B * T, cfg.vocab_size, 11 + step), y = ids(B * T, cfg.vocab_size, 101 + step);
    on_cpu.params().zero_grads();
    on_gpu.params().zero_grads();
    const double lc = on_cpu.train_micro_step(x.data(), y.data(), B, T);
    const double lg = on_gpu.train_micro_step(x.data(), y.data(), B, T);
    EXPECT_NEAR(lg, lc, 1e-4 * std::abs(lc)) << "step " << step;
    for (const auto& [name, e] : on_cpu.params().entries())
      EXPECT_LE(max_rel_diff(e.grad, on_gpu.params().download(on_gpu.params().at(name).grad)), 1e-3)
          << "grad " << name << " step " << step;
    const auto sc = opt_cpu.step(oc.lr), sg = opt_gpu.step(oc.lr);
    EXPECT_NEAR(sg.grad_norm, sc.grad_norm, 1e-4 * sc.grad_norm);
  }
  // The attention key bias is left out: its gradient is zero analytically
  // (softmax cancels it), so its AdamW steps follow each engine's rounding
  // noise, amplified by the 1/sqrt(v) of a tiny v, and cannot change any output.
  for (const auto& [name, e] : on_cpu.params().entries()) {
    if (name.find("attn.c_attn.bias") != std::string::npos) {
      const core::Tensor got = on_gpu.params().download(on_gpu.params().at(name).value);
      const int64_t C = cfg.n_embd;
      for (int64_t i = 0; i < 3 * C; ++i)
        if (i < C || i >= 2 * C) {
          EXPECT_NEAR(got.item(i), e.value.item(i), 1e-4) << name << "[" << i << "]";
        }
      continue;
    }
    EXPECT_LE(max_rel_diff(e.value, on_gpu.params().download(on_gpu.params().at(name).value)), 1e-4) << name;
  }
  // The train step was recorded as a CUDA graph after its first run.
  EXPECT_TRUE(on_gpu.program(true, B, T).executor->graph_captured());
}

// Replaying the recorded step gives what running it kernel by kernel gives.
TEST(CudaTraining, GraphReplayMatchesEagerRun) {
  std::string why;
  std::unique_ptr<core::Backend> gpu = cuda_or_skip_reason(&why);
  if (!gpu) GTEST_SKIP() << "CUDA graphs not run: " << why;
  models::GptConfig cfg{97, 2, 64, 4, 32};
  models::Gpt model(cfg, *gpu);
  model.init_weights(3);
  const int64_t B = 2, T = 32;
  const auto x = ids(B * T, cfg.vocab_size, 5), y = ids(B * T, cfg.vocab_size, 6);
  std::vector<double> losses;
  for (int i = 0; i < 4; ++i) losses.push_back(model.eval_loss(x.data(), y.data(), B, T));
  EXPECT_TRUE(model.program(false, B, T).executor->graph_captured());
  for (double l : losses) EXPECT_EQ(l, losses[0]);  // same kernels, same order: bit for bit
  // Another batch through the recorded graph: the inputs are read at replay.
  const auto x2 = ids(B * T, cfg.vocab_size, 9);
  const double l2 = model.eval_loss(x2.data(), y.data(), B, T);
  model.program(false, B, T).executor->set_graph_capture(false);
  EXPECT_EQ(model.eval_loss(x2.data(), y.data(), B, T), l2);
  EXPECT_NE(l2, losses[0]);
}

// An id outside the vocabulary is refused on the host before it reaches a
// kernel that cannot throw.
TEST(CudaTraining, OutOfRangeTokenIsAnError) {
  std::string why;
  std::unique_ptr<core::Backend> gpu = cuda_or_skip_reason(&why);
  if (!gpu) GTEST_SKIP() << "CUDA training not run: " << why;
  models::GptConfig cfg{97, 1, 32, 2, 16};
  models::Gpt model(cfg, *gpu);
  auto x = ids(16, cfg.vocab_size, 1), y = ids(16, cfg.vocab_size, 2);
  x[5] = 97;
  EXPECT_THROW(model.eval_loss(x.data(), y.data(), 1, 16), core::ShapeError);
}

}  // namespace
