// Run presets and train.memory_budget in the config (config.h,
// run_presets.h): a preset fills exactly its keys, every key the file or a
// --set names wins over it, an unknown preset or a bad size is an error
// naming the key, the resolved config round-trips through to_toml, and the
// table in docs/tuning.md lists what the code sets.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "brisk/core/error.h"
#include "brisk/train/config.h"
#include "brisk/train/run_presets.h"

using namespace brisk;
using train::parse_train_config;

namespace {

std::string error_of(const std::string& text, const std::vector<std::string>& sets = {}) {
  try {
    parse_train_config(text, "run.toml", sets);
  } catch (const core::ConfigError& e) {
    return e.what();
  }
  return "(loaded)";
}

}  // namespace

TEST(RunPresets, MemoryConstrainedFillsItsKeys) {
  const train::TrainConfig c = parse_train_config("[train]\npreset = \"memory-constrained\"\n", "run.toml");
  EXPECT_EQ(c.run_preset, "memory-constrained");
  EXPECT_EQ(c.model.recompute, "full");
  EXPECT_TRUE(c.model.fused_classifier);
  EXPECT_EQ(c.model.attention, "flash");
  EXPECT_EQ(c.loader_workers, 1);
  EXPECT_EQ(c.batch, 4);  // the defaults' 8 sequences per step, in two micro-batches
  EXPECT_EQ(c.grad_accum, 2);
}

TEST(RunPresets, HighPerformanceAndProduction) {
  const train::TrainConfig hp = parse_train_config("[train]\npreset = \"high-performance\"\n", "run.toml");
  EXPECT_TRUE(hp.model.fused_classifier);
  EXPECT_EQ(hp.model.attention, "plain");
  EXPECT_EQ(hp.model.recompute, "none");
  EXPECT_FALSE(hp.model.fuse_bias_gelu);
  EXPECT_TRUE(hp.adamw.fused);
  EXPECT_EQ(hp.loader_workers, 2);
  EXPECT_EQ(hp.batch, 8);
  const train::TrainConfig p = parse_train_config("[train]\npreset = \"production\"\n", "run.toml");
  EXPECT_EQ(p.checkpoint_every, 250);
  EXPECT_EQ(p.keep_checkpoints, 5);
  EXPECT_EQ(p.eval_every, 250);
  EXPECT_EQ(p.eval_batches, 32);
  EXPECT_EQ(p.log_every, 50);
  EXPECT_TRUE(p.precision_fallback);
}

TEST(RunPresets, ExplicitKeysAndSetsWin) {
  const std::string text =
      "[model]\nattention = \"plain\"\n[train]\npreset = \"memory-constrained\"\nrecompute = \"selective\"\nbatch = 16\n";
  const train::TrainConfig c = parse_train_config(text, "run.toml", {"model.fused_classifier=false"});
  EXPECT_EQ(c.model.attention, "plain");     // the file
  EXPECT_EQ(c.model.recompute, "selective");  // the file
  EXPECT_FALSE(c.model.fused_classifier);    // --set
  EXPECT_EQ(c.loader_workers, 1);            // the preset
  // The file sets train.batch: the preset's micro-batch split stays out, so
  // the tokens per optimizer step are the file's.
  EXPECT_EQ(c.batch, 16);
  EXPECT_EQ(c.grad_accum, 1);
  // grad_accum alone set: no split either.
  const train::TrainConfig a = parse_train_config("[train]\npreset = \"memory-constrained\"\ngrad_accum = 3\n", "run.toml");
  EXPECT_EQ(a.batch, 8);
  EXPECT_EQ(a.grad_accum, 3);
  // --preset on the command line is train.preset before the --sets.
  const train::TrainConfig s = parse_train_config("", "run.toml", {"train.preset=production", "checkpoint.keep=2"});
  EXPECT_EQ(s.keep_checkpoints, 2);
  EXPECT_EQ(s.checkpoint_every, 250);
}

TEST(RunPresets, UnknownPresetNamesTheKeyAndTheChoices) {
  const std::string msg = error_of("[train]\npreset = \"fast\"\n");
  EXPECT_NE(msg.find("run.toml"), std::string::npos) << msg;
  EXPECT_NE(msg.find("train.preset"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'fast'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("high-performance, memory-constrained, production"), std::string::npos) << msg;
  EXPECT_NE(error_of("[train]\npreset = 3\n").find("train.preset must be a string"), std::string::npos);
}

TEST(MemoryBudgetKey, ParsesAndRoundTrips) {
  const train::TrainConfig c = parse_train_config("[train]\nmemory_budget = \"1.5GiB\"\n", "run.toml");
  EXPECT_EQ(c.memory_budget, "1.5GiB");
  const train::TrainConfig n = parse_train_config("[train]\nmemory_budget = 1073741824\n", "run.toml");
  EXPECT_EQ(n.memory_budget, "1073741824");
  const train::TrainConfig s = parse_train_config("", "run.toml", {"train.memory_budget=512MiB"});
  EXPECT_EQ(s.memory_budget, "512MiB");
  const train::TrainConfig none = parse_train_config("", "run.toml");
  EXPECT_EQ(none.memory_budget, "");
  EXPECT_EQ(train::to_toml(none).find("memory_budget"), std::string::npos) << "unset keys stay out of config.toml";
  EXPECT_EQ(train::to_toml(none).find("preset"), std::string::npos);
  // Written back, a config with a preset and a budget loads to the same text.
  const train::TrainConfig p =
      parse_train_config("[train]\npreset = \"memory-constrained\"\nmemory_budget = \"2GB\"\n", "run.toml");
  const std::string written = train::to_toml(p);
  EXPECT_EQ(train::to_toml(parse_train_config(written, "config.toml")), written);
  EXPECT_NE(written.find("memory_budget = \"2GB\""), std::string::npos) << written;
}

TEST(MemoryBudgetKey, BadSizeIsAClearError) {
  for (const char* bad : {"\"4 gigs\"", "\"0\"", "\"1.5\"", "-5", "true"}) {
    const std::string msg = error_of(std::string("[train]\nmemory_budget = ") + bad + "\n");
    EXPECT_NE(msg.find("train.memory_budget"), std::string::npos) << bad << ": " << msg;
  }
  EXPECT_NE(error_of("", {"train.memory_budget=lots"}).find("'lots' is not a memory size"), std::string::npos);
  // A TOML float says what is wrong with it (it said "must be a string").
  EXPECT_NE(error_of("[train]\nmemory_budget = 4.5\n").find("4.5 is not a memory size (a number of bytes must be whole)"),
            std::string::npos);
  EXPECT_NE(error_of("[train]\nmemory_budget = 1e30\n").find("(too large)"), std::string::npos);
  // The message lists the bare K/M/G/T the parser takes.
  EXPECT_NE(error_of("", {"train.memory_budget=4Q"}).find("G/GiB"), std::string::npos);
}

TEST(RunPresets, DocsTableListsEveryKey) {
  const auto docs = std::filesystem::path(__FILE__).parent_path().parent_path().parent_path() / "docs" / "tuning.md";
  std::ifstream in(docs);
  ASSERT_TRUE(in) << docs;
  std::stringstream text;
  text << in.rdbuf();
  for (const train::RunPreset& p : train::run_presets())
    for (const train::PresetKey& k : p.keys) {
      const std::string row = "| `" + p.name + "` | `" + k.section + "." + k.key + "` | `" + k.value + "` |";
      EXPECT_NE(text.str().find(row), std::string::npos) << "docs/tuning.md lacks the row " << row;
    }
}

// config.toml holds every number exactly: ranks compare their configs as
// this text, and lr 0.01000004 printed in a stream's 6 digits read "0.01",
// so two ranks with different learning rates trained side by side.
TEST(ConfigToml, NumbersRoundTripExactly) {
  const std::vector<std::string> sets = {"train.lr=0.01000004",        "train.eps=1.2345678e-9",
                                         "train.beta2=0.9990001",      "train.weight_decay=0.1000001",
                                         "train.grad_clip=0.30000001", "train.min_lr_ratio=0.1234567",
                                         "dist.bucket_mb=0.0123456789", "dist.timeout_s=123.456789"};
  const train::TrainConfig c = parse_train_config("", "run.toml", sets);
  const std::string written = train::to_toml(c);
  const train::TrainConfig back = parse_train_config(written, "config.toml");
  EXPECT_EQ(back.schedule.max_lr, c.schedule.max_lr) << written;
  EXPECT_EQ(back.adamw.eps, c.adamw.eps);
  EXPECT_EQ(back.adamw.beta2, c.adamw.beta2);
  EXPECT_EQ(back.adamw.weight_decay, c.adamw.weight_decay);
  EXPECT_EQ(back.adamw.grad_clip, c.adamw.grad_clip);
  EXPECT_EQ(back.schedule.min_lr_ratio, c.schedule.min_lr_ratio);
  EXPECT_EQ(back.dist.bucket_mb, c.dist.bucket_mb);
  EXPECT_EQ(back.dist.timeout_s, c.dist.timeout_s);
  EXPECT_EQ(train::to_toml(back), written);
  EXPECT_NE(written, train::to_toml(parse_train_config("", "run.toml", {"train.lr=0.01"})));
  EXPECT_NE(written.find("\nlr = 0.01000004\n"), std::string::npos) << "the shortest exact form: " << written;
  // A timeout past a year would overflow the deadline's clock arithmetic.
  EXPECT_NE(error_of("", {"dist.timeout_s=1e17"}).find("dist.timeout_s"), std::string::npos);
}
