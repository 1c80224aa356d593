// train.recompute through the CLI: `brisk plan` prints the memory of every
// level before anything runs (the arena shrinking none > selective > full),
// for GPT, encoder classifier and sequence autoencoder configs,
// a bad level is a clear error, and training with full recomputation takes
// exactly the steps (losses bit for bit) that training without it takes, with
// the start-up memory line naming the level.
#include <gtest/gtest.h>

#include <sstream>
#include <utility>
#include <vector>

#include "integration_util.h"

using namespace brisk::itest;

namespace {

class RecomputeCli : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string err;
    data_ = prepare_tiny_dataset(tmp_.path() / "corpus", &err);
    ASSERT_FALSE(data_.empty()) << "brisk data prepare failed:\n" << err;
  }
  std::string config(const std::string& name, int steps) {
    const std::string path = tmp_.file(name + ".toml");
    write_text(path, tiny_config_toml(data_, tmp_.file(name), steps, 100));
    return path;
  }
  TempDir tmp_;
  std::string data_;
};

}  // namespace

namespace {

// `brisk plan`'s table: every level's row in order, and the arena shrinking level by level.
void expect_every_level_shrinking(const std::string& out) {
  std::vector<std::string> levels;
  std::vector<double> arena;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream row(line);
    std::string level;
    double a = 0;
    row >> level >> a;
    if ((level == "none" || level == "selective" || level == "full") && row) {
      levels.push_back(level);
      arena.push_back(a);
    }
  }
  ASSERT_EQ(levels, (std::vector<std::string>{"none", "selective", "full"})) << out;
  EXPECT_LT(arena[1], arena[0]) << out;
  EXPECT_LT(arena[2], arena[1]) << out;
}

}  // namespace

TEST_F(RecomputeCli, PlanPrintsEveryLevel) {
  const CliResult r = run_cli({"plan", config("plan", 2)});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_every_level_shrinking(r.out);
}

// The encoder classifier's and the sequence autoencoder's configs: their
// widest train step per level and the arena their evaluation adds (no
// store needed: nothing is read or run); --ranks is for GPT runs.
TEST_F(RecomputeCli, PlanOfEncoderAndAutoencoderConfigs) {
  const std::string body = "n_layer = 2\nn_embd = 32\nn_head = 2\nmax_len = 64\n[train]\nbatch = 4\n";
  const std::string encoder = tmp_.file("encoder.toml"), autoencoder = tmp_.file("autoencoder.toml");
  write_text(encoder, "[model]\nkind = \"encoder\"\nvocab_size = 64\n" + body);
  write_text(autoencoder, "[model]\nkind = \"autoencoder\"\nlatent = 8\n" + body);
  for (const auto& [path, what] : {std::pair{encoder, "(encoder classifier)"}, {autoencoder, "(sequence autoencoder)"}}) {
    const CliResult r = run_cli({"plan", "--config", path});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find(what), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("batch 4 x max_len 64 (the widest step)"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("evaluation (val and test splits"), std::string::npos) << r.out;
    expect_every_level_shrinking(r.out);
    const CliResult ranks = run_cli({"plan", "--config", path, "--ranks", "2"});
    EXPECT_EQ(ranks.exit_code, 2) << ranks.out;
    EXPECT_NE(ranks.err.find("--ranks is for GPT configs"), std::string::npos) << ranks.err;
  }
}

TEST_F(RecomputeCli, UnknownLevelIsAClearError) {
  for (const char* cmd : {"plan", "train"}) {
    const std::string cfg = config(std::string("bad_") + cmd, 2);
    const CliResult r = run_cli({cmd, "--config", cfg, "--set", "train.recompute=sometimes"});
    EXPECT_EQ(r.exit_code, 2) << cmd << "\n" << r.err;
    EXPECT_NE(r.err.find("train.recompute"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("none, selective, full"), std::string::npos) << r.err;
  }
}

TEST_F(RecomputeCli, FullTrainsTheSameStepsAsNone) {
  std::vector<std::vector<MetricRow>> runs;
  for (const char* level : {"none", "full"}) {
    const std::string cfg = config(std::string("run_") + level, 3);
    const CliResult r =
        run_cli({"train", "--config", cfg, "--no-progress", "--set", std::string("train.recompute=") + level});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find(std::string("recompute ") + level + " | memory plan"), std::string::npos) << r.err;
    runs.push_back(read_metrics(tmp_.file(std::string("run_") + level)));
  }
  ASSERT_EQ(runs[0].size(), 3u);
  ASSERT_EQ(runs[1].size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(runs[1][i].loss, runs[0][i].loss) << "step " << runs[0][i].step;
}

// A CUDA run is planned as the GPU runs it, on a machine without one: its
// precision (bf16 on the tensor cores, not this CPU's fp32 fallback), named
// in the header. On an H200 the G1 plan printed here matched the trainer's
// start-up plan to the MiB (docs/gpu.md).
TEST_F(RecomputeCli, PlanOfACudaRunUsesTheGpusPrecision) {
  const std::string cfg = config("plan_cuda", 2);
  auto none_arena = [](const std::string& out) {
    std::istringstream lines(out);
    for (std::string line; std::getline(lines, line);) {
      std::istringstream row(line);
      std::string level;
      double a = 0;
      if (row >> level >> a && level == "none") return a;
    }
    return -1.0;
  };
  const CliResult bf16 = run_cli({"plan", cfg, "--set", "train.device=cuda", "--set", "train.precision=bf16"});
  ASSERT_EQ(bf16.exit_code, 0) << bf16.err;
  EXPECT_NE(bf16.out.find("precision bf16 | GPU memory (cuda)"), std::string::npos) << bf16.out;
  EXPECT_EQ(bf16.err.find("training in fp32"), std::string::npos) << bf16.err;
  const CliResult fp32 = run_cli({"plan", cfg, "--set", "train.device=cuda", "--set", "train.precision=fp32"});
  ASSERT_EQ(fp32.exit_code, 0) << fp32.err;
  EXPECT_NE(fp32.out.find("precision fp32 | GPU memory (cuda)"), std::string::npos) << fp32.out;
  const double a16 = none_arena(bf16.out), a32 = none_arena(fp32.out);
  ASSERT_GT(a16, 0) << bf16.out;
  EXPECT_LT(a16, a32) << "a bf16 graph's activations take less than an fp32 one's\n" << bf16.out << fp32.out;
  const CliResult host = run_cli({"plan", cfg});
  ASSERT_EQ(host.exit_code, 0) << host.err;
  EXPECT_NE(host.out.find("| host memory (cpu)"), std::string::npos) << host.out;
}
