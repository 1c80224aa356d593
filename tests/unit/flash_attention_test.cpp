// flash_attention against the plain attention op it replaces, on the CPU
// backend: the same y, the same dqkv (the flash backward fed the flash
// forward's y and lse, the plain one its probs), over shapes that cover one
// tile, ragged tiles and many tiles. Then what the op is for: the planner's
// arena for a GPT training step shrinks by about the saved probabilities, and
// the model's `attention` choice is no part of its checkpoints.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unistd.h>

#include "brisk/core/error.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/models/gpt.h"
#include "brisk/ops/ops.h"
#include "brisk/train/checkpoint.h"
#include "brisk/train/config.h"
#include "test_util.h"

using namespace brisk;
using core::DType;
using core::OpKind;
using core::Tensor;
using core::TensorView;
namespace fs = std::filesystem;

namespace {

using testing_util::backend;

using testing_util::normalized_error;

// Runs one op on the CPU backend with a workspace sized by its OpDef.
void run(OpKind k, const std::vector<Tensor>& in, const std::vector<Tensor>& out, const ops::AttentionParams& p) {
  std::vector<TensorView> iv, ov;
  std::vector<core::TensorMeta> metas;
  for (const Tensor& t : in) iv.push_back(t.as_view()), metas.push_back(t.meta());
  for (const Tensor& t : out) ov.push_back(t.as_view());
  const core::OpDef& def = core::op_def(k);
  std::vector<unsigned char> ws(def.workspace_bytes ? def.workspace_bytes(metas, p) : 0);
  core::run_op(backend(), k, iv, ov, p, ws.data(), ws.size());
}

struct Shape4 {
  int64_t B, T, C;
  int n_head;
};

}  // namespace

TEST(FlashAttention, MatchesPlainAttentionForwardAndBackward) {
  ops::register_ops();
  const Shape4 shapes[] = {{2, 7, 12, 3},  {1, 33, 18, 3},  {3, 64, 24, 2},   {2, 130, 32, 2},
                           {1, 200, 10, 1}, {2, 256, 96, 3}, {1, 257, 64, 1}, {8, 256, 384, 6}};
  uint64_t seed = 11;
  for (const Shape4& s : shapes) {
    SCOPED_TRACE("B" + std::to_string(s.B) + " T" + std::to_string(s.T) + " C" + std::to_string(s.C) + " nh" +
                 std::to_string(s.n_head));
    const ops::AttentionParams p{s.n_head, 0.f};
    const Tensor qkv = Tensor::uniform({s.B, s.T, 3 * s.C}, DType::f32, seed++, -1.f, 1.f);
    const Tensor dy = Tensor::uniform({s.B, s.T, s.C}, DType::f32, seed++, -1.f, 1.f);

    const Tensor y_plain = Tensor::empty({s.B, s.T, s.C}, DType::f32);
    const Tensor probs = Tensor::empty({s.B, s.n_head, s.T, s.T}, DType::f32);
    run(OpKind::attention, {qkv}, {y_plain, probs}, p);
    const Tensor y_flash = Tensor::empty({s.B, s.T, s.C}, DType::f32);
    const Tensor lse = Tensor::empty({s.B, s.n_head, s.T}, DType::f32);
    run(OpKind::flash_attention, {qkv}, {y_flash, lse}, p);
    const double ey = normalized_error(y_plain, y_flash);
    EXPECT_LE(ey, 1e-5) << "y";

    const Tensor dqkv_plain = Tensor::empty(qkv.shape(), DType::f32);
    run(OpKind::attention_backward, {dy, qkv, probs}, {dqkv_plain}, p);
    const Tensor dqkv_flash = Tensor::empty(qkv.shape(), DType::f32);
    run(OpKind::flash_attention_backward, {dy, qkv, y_flash, lse}, {dqkv_flash}, p);
    const double eg = normalized_error(dqkv_plain, dqkv_flash);
    EXPECT_LE(eg, 1e-5) << "dqkv";
    std::printf("B%lld T%lld C%lld nh%d: y %.2e, dqkv %.2e (normalized)\n", (long long)s.B, (long long)s.T,
                (long long)s.C, s.n_head, ey, eg);
  }
}

TEST(FlashAttention, RunsWithoutAPlannedWorkspace) {
  // run_op without scratch (tools, or more threads than the plan assumed): the
  // kernels fall back to their own buffers and give the same answer.
  ops::register_ops();
  const ops::AttentionParams p{2, 0.f};
  const Tensor qkv = Tensor::uniform({2, 150, 3 * 40}, DType::f32, 5, -1.f, 1.f);
  const Tensor y1 = Tensor::empty({2, 150, 40}, DType::f32), l1 = Tensor::empty({2, 2, 150}, DType::f32);
  const Tensor y2 = Tensor::empty({2, 150, 40}, DType::f32), l2 = Tensor::empty({2, 2, 150}, DType::f32);
  run(OpKind::flash_attention, {qkv}, {y1, l1}, p);
  const std::vector<TensorView> in{qkv.as_view()}, out{y2.as_view(), l2.as_view()};
  core::run_op(backend(), OpKind::flash_attention, in, out, p);
  EXPECT_EQ(normalized_error(y1, y2), 0.0);
  EXPECT_EQ(normalized_error(l1, l2), 0.0);
}

TEST(FlashAttention, ShrinksTheArenaOfAGptTrainingStep) {
  // T = 256: each layer's plain attention saves (B, H, T, T) f32 probabilities
  // until its backward; flash saves (B, H, T).
  models::GptConfig cfg{256, 2, 64, 4, 256};
  constexpr int64_t B = 2, T = 256;
  cfg.attention = "plain";
  models::Gpt plain(cfg, backend());
  cfg.attention = "flash";
  models::Gpt flash(cfg, backend());
  const core::MemoryReport& rp = plain.program(true, B, T).executor->plan().report;
  const core::MemoryReport& rf = flash.program(true, B, T).executor->plan().report;
  const double probs = double(cfg.n_layer * B * cfg.n_head * T * T * 4);
  std::printf("arena at T=%lld: plain %.2f MiB, flash %.2f MiB (saved probs %.2f MiB)\n", (long long)T,
              double(rp.arena) / (1 << 20), double(rf.arena) / (1 << 20), probs / (1 << 20));
  EXPECT_LT(rf.arena, rp.arena);
  EXPECT_LE(double(rf.arena) + 0.9 * probs, double(rp.arena)) << "plain:\n" << rp.str() << "flash:\n" << rf.str();
}

TEST(FlashAttention, GptLossMatchesPlainAndCheckpointsCrossLoad) {
  const fs::path dir = fs::temp_directory_path() / ("brisk_flash_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  models::GptConfig cfg{61, 2, 24, 3, 40};
  cfg.attention = "flash";
  models::Gpt flash(cfg, backend());
  flash.init_weights(3);
  const std::string ckpt = train::save_checkpoint(dir.string(), flash, nullptr, {}, 1);
  EXPECT_EQ(train::read_checkpoint_config(ckpt).attention, "flash");

  // Same weights into a plain model: loads, and gives the same loss.
  cfg.attention = "plain";
  models::Gpt plain(cfg, backend());
  train::load_checkpoint(ckpt, plain, nullptr);
  constexpr int64_t B = 2, T = 37;
  std::vector<int32_t> x(B * T), y(B * T);
  for (size_t i = 0; i < x.size(); ++i) x[i] = int32_t(i * 7 % 61), y[i] = int32_t(i * 13 % 61);
  const double lf = flash.eval_loss(x.data(), y.data(), B, T), lp = plain.eval_loss(x.data(), y.data(), B, T);
  EXPECT_NEAR(lf, lp, 1e-5 * std::abs(lp));
  // And the same gradients' effect: one micro-step's loss is the forward's.
  EXPECT_NEAR(flash.train_micro_step(x.data(), y.data(), B, T), plain.train_micro_step(x.data(), y.data(), B, T),
              1e-5 * std::abs(lp));

  // A checkpoint written before the field existed reads as plain attention.
  const fs::path state = fs::path(ckpt) / "state.json";
  std::stringstream text;
  text << std::ifstream(state).rdbuf();
  nlohmann::json st = nlohmann::json::parse(text.str());
  st["model"].erase("attention");
  std::ofstream(state) << st.dump(2);
  EXPECT_EQ(train::read_checkpoint_config(ckpt).attention, "plain");
  train::load_checkpoint(ckpt, flash, nullptr);
  fs::remove_all(dir);
}

TEST(FlashAttention, ConfigRejectsAnUnknownKind) {
  models::GptConfig cfg{61, 2, 24, 3, 40};
  cfg.attention = "sparse";
  try {
    cfg.validate();
    FAIL() << "attention = sparse validated";
  } catch (const core::ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("model.attention"), std::string::npos) << m;
    EXPECT_NE(m.find("flash, plain"), std::string::npos) << m;
  }
  // Through the config file's key model.attention.
  EXPECT_EQ(train::load_train_config("", {"model.attention=plain"}).model.attention, "plain");
  EXPECT_THROW(train::load_train_config("", {"model.attention=sparse"}), core::ConfigError);
}
