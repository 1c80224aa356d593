// The plateau schedule (optim::ReduceOnPlateau, train.schedule = "plateau"):
// when it cuts (PyTorch's rule: more than `patience` evaluations in a row
// without a relative improvement of 1e-4), its floor, NaN losses, the lr it
// gives during warm-up; the config keys and their errors; and its state in
// a checkpoint's state.json (absent in older checkpoints). Exact resume with
// it is checked end to end in tests/integration/monitor_integration_test.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <functional>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "brisk/core/error.h"
#include "brisk/core/safetensors.h"
#include "brisk/optim/plateau.h"
#include "brisk/train/checkpoint.h"
#include "brisk/train/classify_config.h"
#include "brisk/train/config.h"
#include "../common/tiny_gpt.h"

using namespace brisk;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const core::Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(Plateau, CutsAfterMoreThanPatienceEvaluationsWithoutImprovement) {
  optim::ReduceOnPlateau p(/*patience=*/2, /*factor=*/0.5, /*min_scale=*/0.01);
  EXPECT_FALSE(p.observe(3.0));  // the first evaluation always improves
  EXPECT_FALSE(p.observe(2.9));
  EXPECT_FALSE(p.observe(2.95));  // 1 without improvement
  EXPECT_FALSE(p.observe(2.9));   // 2: equal is no improvement
  EXPECT_EQ(p.scale(), 1.0);
  EXPECT_TRUE(p.observe(2.91));  // 3 > patience: cut
  EXPECT_EQ(p.scale(), 0.5);
  EXPECT_EQ(p.state().bad_evals, 0);
  EXPECT_EQ(p.state().cuts, 1);
  EXPECT_EQ(p.state().best, 2.9);
  EXPECT_FALSE(p.observe(2.8));  // an improvement resets the count
  EXPECT_EQ(p.state().bad_evals, 0);
  for (int i = 0; i < 2; ++i) EXPECT_FALSE(p.observe(2.8));
  EXPECT_TRUE(p.observe(2.8));
  EXPECT_EQ(p.scale(), 0.25);
}

TEST(Plateau, ImprovementMustBeRelativeOneInTenThousand) {
  optim::ReduceOnPlateau p(0, 0.5, 0.0);
  p.observe(2.0);
  EXPECT_TRUE(p.observe(2.0 * (1 - 0.5e-4)));  // too small to count: patience 0 cuts at once
  EXPECT_FALSE(p.observe(2.0 * (1 - 2e-4)));
  EXPECT_EQ(p.state().best, 2.0 * (1 - 2e-4));
}

TEST(Plateau, NeverBelowTheFloorAndNanIsNoImprovement) {
  optim::ReduceOnPlateau p(0, 0.5, 0.3);
  p.observe(1.0);
  EXPECT_TRUE(p.observe(std::nan("")));
  EXPECT_EQ(p.scale(), 0.5);
  EXPECT_TRUE(p.observe(1.0));
  EXPECT_EQ(p.scale(), 0.3);  // 0.25 would be below min_lr_ratio
  EXPECT_FALSE(p.observe(1.0));
  EXPECT_EQ(p.scale(), 0.3);
  EXPECT_EQ(p.state().cuts, 2);
}

TEST(Plateau, LrIsTheWarmupScheduleTimesTheScale) {
  optim::LrSchedule s;
  s.kind = optim::Schedule::plateau;
  s.max_lr = 1e-3f;
  s.warmup_steps = 2;
  s.total_steps = 100;
  s.min_lr_ratio = 0.1f;
  s.plateau_patience = 0;
  s.plateau_factor = 0.5f;
  optim::ReduceOnPlateau p(s);
  EXPECT_EQ(p.lr(s, 0), 0.5e-3f);
  EXPECT_EQ(p.lr(s, 1), 1e-3f);
  EXPECT_EQ(p.lr(s, 99), 1e-3f);  // no decay of its own
  p.observe(1.0);
  p.observe(1.0);
  EXPECT_EQ(p.lr(s, 50), float(double(1e-3f) * 0.5));
  optim::ReduceOnPlateau q(s);
  q.restore(p.state());
  EXPECT_EQ(q.lr(s, 50), p.lr(s, 50));
  EXPECT_TRUE(q.state() == p.state());
}

TEST(Plateau, ScheduleNameIsOnlyForRunsThatFeedIt) {
  EXPECT_EQ(optim::LrSchedule::parse("plateau", true), optim::Schedule::plateau);
  const std::string e = error_of([] { optim::LrSchedule::parse("plateau"); });
  EXPECT_NE(e.find("train.schedule"), std::string::npos) << e;
  EXPECT_NE(e.find("GPT"), std::string::npos) << e;
  EXPECT_NE(error_of([] { optim::LrSchedule::parse("step", true); }).find("plateau)"), std::string::npos);
  // The encoder classifier's config refuses it by name.
  const std::string c = error_of([] {
    train::parse_classify_config("[model]\nkind = \"encoder\"\n[train]\nschedule = \"plateau\"\n", "enc.toml");
  });
  EXPECT_NE(c.find("plateau"), std::string::npos) << c;
}

TEST(Plateau, ConfigKeysAreCheckedAndWrittenBack) {
  const train::TrainConfig c = train::parse_train_config(
      "[train]\nschedule = \"plateau\"\nplateau_patience = 4\nplateau_factor = 0.25\ntensorboard = false\n", "t.toml");
  EXPECT_EQ(c.schedule.kind, optim::Schedule::plateau);
  EXPECT_EQ(c.schedule.plateau_patience, 4);
  EXPECT_EQ(c.schedule.plateau_factor, 0.25f);
  EXPECT_FALSE(c.tensorboard);
  const train::TrainConfig back = train::parse_train_config(train::to_toml(c), "config.toml");
  EXPECT_EQ(back.schedule.kind, optim::Schedule::plateau);
  EXPECT_EQ(back.schedule.plateau_patience, 4);
  EXPECT_EQ(back.schedule.plateau_factor, 0.25f);
  EXPECT_FALSE(back.tensorboard);
  EXPECT_TRUE(train::parse_train_config("", "empty.toml").tensorboard) << "on by default";

  auto err = [](const std::string& toml) { return error_of([&] { train::parse_train_config(toml, "t.toml"); }); };
  EXPECT_NE(err("[train]\nschedule = \"plateau\"\neval_every = 0\n").find("train.eval_every"), std::string::npos);
  EXPECT_NE(err("[train]\nplateau_factor = 1.0\n").find("train.plateau_factor"), std::string::npos);
  EXPECT_NE(err("[train]\nplateau_factor = 0\n").find("train.plateau_factor"), std::string::npos);
  EXPECT_NE(err("[train]\nplateau_patience = -1\n").find("train.plateau_patience"), std::string::npos);
}

TEST(Plateau, StateRoundTripsThroughStateJsonAndOldCheckpointsHaveNone) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("brisk_plateau_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const std::string ckpt = brisk::testing::save_tiny_gpt(dir.string());
  train::TrainState st;
  train::read_checkpoint_config(ckpt, &st);
  EXPECT_FALSE(st.lr_plateau.has_value()) << "a checkpoint without the field";

  // Saved again with a plateau state: before any evaluation (best = infinity) and after.
  cpu::CpuBackend be(1);
  models::Gpt gpt(train::read_checkpoint_config(ckpt), be);
  for (const optim::PlateauState want :
       {optim::PlateauState{}, optim::PlateauState{0.25, 1.2345678901234567, 2, 3}}) {
    st.step = 5;
    st.lr_plateau = want;
    const std::string saved = train::save_checkpoint(dir.string(), gpt, nullptr, st, 0);
    train::TrainState got;
    train::read_checkpoint_config(saved, &got);
    ASSERT_TRUE(got.lr_plateau.has_value());
    EXPECT_TRUE(*got.lr_plateau == want) << got.lr_plateau->best;
  }

  // A damaged field is named.
  const std::string state_path = (fs::path(dir) / "step_0000005" / "state.json").string();
  auto j = nlohmann::json::parse(core::read_file(state_path));
  j["lr_plateau"]["scale"] = -1;
  core::write_file_atomic(state_path, j.dump());
  const std::string e = error_of([&] { train::read_checkpoint_config((fs::path(dir) / "step_0000005").string(), &st); });
  EXPECT_NE(e.find("lr_plateau.scale"), std::string::npos) << e;
  fs::remove_all(dir);
}
