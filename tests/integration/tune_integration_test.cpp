// `brisk tune` and train.memory_budget through the CLI on a tiny config: a
// generous budget keeps the config, a tight one changes the micro-batch or
// the recompute level while keeping batch x grad_accum and fitting the
// budget by the planner's own figures, a budget below every setting and a
// malformed size are clear errors, --time-top trains candidates, the tuned
// config written with --out loads, and `brisk train` applies a budget (and a
// preset) at start-up and records the choice in the run's config.toml.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>

#include "brisk/cpu/cpu_backend.h"
#include "brisk/train/tune.h"
#include "integration_util.h"

using namespace brisk;
using namespace brisk::itest;

namespace {

class TuneCli : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string err;
    data_ = prepare_tiny_dataset(tmp_.path() / "corpus", &err);
    ASSERT_FALSE(data_.empty()) << "brisk data prepare failed:\n" << err;
    config_ = tmp_.file("tiny.toml");
    write_text(config_, tiny_config_toml(data_, tmp_.file("run"), 2, 100));
  }
  // The planned peak of the tiny config with `sets` applied, from the library.
  uint64_t planned(const std::vector<std::string>& sets = {}) {
    cpu::CpuBackend backend(1);
    return train::estimate_run_memory(train::load_train_config(config_, sets), backend).total();
  }
  TempDir tmp_;
  std::string data_, config_;
};

}  // namespace

TEST_F(TuneCli, GenerousBudgetKeepsTheConfig) {
  const std::string out = tmp_.file("tuned.toml");
  const CliResult r = run_cli({"tune", "--config", config_, "--memory-budget", "64GiB", "--out", out});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("candidates"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("planned peak RSS"), std::string::npos) << r.out;
  const train::TrainConfig t = train::load_train_config(out, {});
  EXPECT_EQ(t.batch, 4);
  EXPECT_EQ(t.grad_accum, 1);
  EXPECT_EQ(t.model.recompute, "none");
  EXPECT_EQ(t.memory_budget, "");
}

TEST_F(TuneCli, TightBudgetFitsAndKeepsTokensPerStep) {
  const uint64_t as_given = planned();
  const uint64_t budget = as_given - 1;  // the config as written is just over
  const std::string out = tmp_.file("tight.toml");
  const CliResult r = run_cli({"tune", config_, "-m", std::to_string(budget), "-o", out});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const train::TrainConfig t = train::load_train_config(out, {});
  EXPECT_EQ(t.batch * t.grad_accum, 4) << r.out;
  EXPECT_TRUE(t.batch < 4 || t.model.recompute != "none" || t.model.fused_classifier) << r.out;
  cpu::CpuBackend backend(1);
  EXPECT_LE(train::estimate_run_memory(t, backend).total(), budget);
  if (t.grad_accum != 1) {
    EXPECT_NE(r.out.find("keeps the global batch at 4"), std::string::npos) << r.out;
  }
}

TEST_F(TuneCli, ErrorsAreClear) {
  const CliResult low = run_cli({"tune", config_, "--memory-budget", "1MiB"});
  EXPECT_EQ(low.exit_code, 2) << low.err;
  EXPECT_NE(low.err.find("below the smallest planned run"), std::string::npos) << low.err;
  const CliResult bad = run_cli({"tune", config_, "--memory-budget", "4 gigs"});
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  EXPECT_NE(bad.err.find("--memory-budget: '4 gigs' is not a memory size"), std::string::npos) << bad.err;
  const CliResult missing = run_cli({"tune", config_});
  EXPECT_EQ(missing.exit_code, 2);
}

TEST_F(TuneCli, TimeTopTrainsTheBestCandidates) {
  const CliResult r = run_cli({"tune", config_, "--memory-budget", "64GiB", "--time-top", "2", "--time-steps", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("timing the best 2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tokens/s"), std::string::npos) << r.out;
}

// A timed choice is written like an untimed one: at a smaller micro-batch,
// eval_batches is raised so that validation scores the config's windows
// (--time-top wrote the config's eval_batches, scoring half of them at half
// the micro-batch).
TEST_F(TuneCli, TimedChoicesKeepTheValidationWindows) {
  // Just under every setting's plan at micro-batch 4: only smaller ones fit.
  uint64_t smallest_at_4 = UINT64_MAX;
  for (const char* recompute : {"none", "selective", "full"})
    for (const char* fused : {"true", "false"})
      smallest_at_4 = std::min(smallest_at_4, planned({std::string("train.recompute=") + recompute,
                                                       std::string("model.fused_classifier=") + fused}));
  const std::string out = tmp_.file("timed.toml");
  const CliResult r = run_cli({"tune", config_, "-m", std::to_string(smallest_at_4 - 1), "--time-top", "2",
                               "--time-steps", "2", "-o", out});
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  const train::TrainConfig given = train::load_train_config(config_, {}), t = train::load_train_config(out, {});
  ASSERT_LT(t.batch, 4) << r.out;
  ASSERT_GT(given.eval_batches, 0);
  EXPECT_EQ(t.eval_batches, (4 * given.eval_batches + t.batch - 1) / t.batch) << r.out;
}

// train.device = "cuda": the budget is GPU memory, planned on this machine
// (no GPU needed) as the GPU runs the config; a budget just under the
// config's own plan makes the tuner choose a smaller plan that fits, by the
// library's GPU estimate. --time-top, which trains on the CPU, is refused.
TEST_F(TuneCli, GpuBudgetIsPlannedHere) {
  const std::vector<std::string> gpu = {"train.device=cuda", "train.precision=bf16"};
  const uint64_t as_given = planned(gpu);
  EXPECT_GE(as_given, train::kCudaProcessBytes);
  const std::string out = tmp_.file("gpu.toml");
  const CliResult r = run_cli({"tune", config_, "--set", gpu[0], "--set", gpu[1], "-m",
                               std::to_string(as_given - 1), "-o", out});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("GPU memory (cuda) budget"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("= planned GPU memory"), std::string::npos) << r.out;
  const train::TrainConfig t = train::load_train_config(out, {});
  EXPECT_EQ(t.device, "cuda");
  EXPECT_EQ(t.batch * t.grad_accum, 4) << r.out;
  cpu::CpuBackend backend(1);
  EXPECT_LE(train::estimate_run_memory(t, backend).total(), as_given - 1);
  const CliResult timed = run_cli({"tune", config_, "--set", gpu[0], "-m", "8GiB", "--time-top", "1"});
  EXPECT_EQ(timed.exit_code, 2);
  EXPECT_NE(timed.err.find("--time-top trains on this machine's CPU"), std::string::npos) << timed.err;
}

TEST_F(TuneCli, AutoBudgetReadsTheHostsAvailableMemory) {
  const CliResult r = run_cli({"tune", config_, "--memory-budget", "auto"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("auto: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("of the host's MemAvailable"), std::string::npos) << r.out;
  const CliResult gpu = run_cli({"tune", config_, "--set", "train.device=cuda", "--memory-budget", "auto"});
  EXPECT_EQ(gpu.exit_code, 2);
  EXPECT_NE(gpu.err.find("give the card's size"), std::string::npos) << gpu.err;
}

TEST_F(TuneCli, TrainAppliesTheBudgetAndRecordsTheChoice) {
  const uint64_t budget = planned() - 1;
  const std::string run = tmp_.file("run");
  const CliResult r = run_cli({"train", "--config", config_, "--no-progress", "--set",
                               "train.memory_budget=" + std::to_string(budget)});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("train.memory_budget: memory budget"), std::string::npos) << r.err;
  const train::TrainConfig recorded = train::load_train_config(run + "/config.toml", {});
  EXPECT_EQ(recorded.memory_budget, "") << "config.toml holds the choice, not the budget";
  EXPECT_EQ(recorded.batch * recorded.grad_accum, 4);
  cpu::CpuBackend backend(1);
  EXPECT_LE(train::estimate_run_memory(recorded, backend).total(), budget);
}

TEST_F(TuneCli, TrainPresetFlag) {
  const CliResult r = run_cli({"train", "--config", config_, "--no-progress", "--preset", "memory-constrained"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("recompute full | memory plan"), std::string::npos) << r.err;
  const CliResult bad = run_cli({"train", "--config", config_, "--preset", "turbo"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("train.preset: unknown preset 'turbo'"), std::string::npos) << bad.err;
}
