// `brisk bench train --workload E1` end to end, briefly: a small labelled
// record store written here (so the test needs no SpamAssassin corpus), a
// config pointing at it with a batch of 8, two interleaved rounds of brisk and
// the PyTorch peer on bucketed and on padded batches (one warm-up and two
// timed steps each), and the JSON report: both variants, both engines,
// finite positive figures, falling losses, and the two engines starting from
// the same weights on the same batches.
// The peer needs Debian's /usr/bin/python3 with python3-torch; like the
// PyTorch cross-checks, the test fails without it rather than skipping.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>

#include "brisk/data/record_store.h"
#include "integration_util.h"

namespace brisk::itest {
namespace {

// 240 records of 3..90 tokens, one in ten labelled spam (drawing most tokens
// from another id range than ham): the first few AdamW steps of a fresh model
// all push the same way, so even a 4-step run's loss falls from its first
// step to its last (balanced labels make those steps overshoot and swing).
// Lengths vary widely, so bucketing has padding to remove.
std::string write_store(const TempDir& dir) {
  const std::string path = dir.file("mail.lmdb");
  data::RecordWriterOptions wo;
  wo.tokenizer = "gpt2";
  wo.vocab_size = 50257;
  data::RecordWriter w(path, wo);
  std::mt19937 rng(7);
  for (int i = 0; i < 240; ++i) {
    const int32_t label = i % 10 == 0;
    const int n = 3 + int(rng() % 88);
    std::vector<int32_t> tokens;
    for (int t = 0; t < n; ++t)
      tokens.push_back(rng() % 4 ? (label ? 1000 : 2000) + int32_t(rng() % 20) : int32_t(rng() % 50257));
    w.add(tokens, label, "msg-" + std::to_string(i));
  }
  w.finish();
  return path;
}

std::string config_toml(const std::string& store) {
  return "[model]\nkind = \"encoder\"\npreset = \"E1\"\n\n[data]\nstore = \"" + store +
         "\"\nlabel_names = [\"ham\", \"spam\"]\n\n[train]\nbatch = 8\nlr = 2e-4\nwarmup = 0\nseed = 5\n";
}

TEST(BenchTrainE1, BucketedAndPaddedAgainstThePeer) {
  ASSERT_EQ(::access("/usr/bin/python3", X_OK), 0) << "the peer needs Debian's python3-torch (scripts/install_deps.sh)";
  TempDir dir;
  const std::string config = dir.file("e1.toml");
  write_text(config, config_toml(write_store(dir)));
  const std::string report = dir.file("results/train_E1.json");  // the directory does not exist yet
  CliHooks hooks;
  // 16 processes of a 16M-parameter model and PyTorch: 45-50 s each on a
  // 2-core Zen 5 under ctest -j2; an AVX2 machine, bf16 emulated, or the
  // sanitizer build take several times that.
  hooks.timeout_s = 500;
  const CliResult r = run_cli({"bench", "train", "--workload", "E1", "--config", config, "--rounds", "2", "--steps",
                               "2", "--warmup", "1", "--json", report},
                              hooks);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("ratio brisk bucketed / pytorch bucketed"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ratio brisk padded / pytorch padded"), std::string::npos) << r.out;

  const auto j = nlohmann::json::parse(read_text(report));
  EXPECT_EQ(j.at("workload"), "E1");
  EXPECT_EQ(j.at("batch"), 8);
  EXPECT_EQ(j.at("rounds"), 2);
  auto finite_positive = [](const nlohmann::json& v) {
    return v.is_number() && std::isfinite(v.get<double>()) && v.get<double>() > 0;
  };
  // Bucketing must remove padding: over the whole epoch, before rounding
  // widths up to 32 (the timed steps are too few to be sure of it).
  const auto& vb = j.at("variants").at("bucketed");
  const auto& vp = j.at("variants").at("padded");
  EXPECT_LT(vb.at("epoch_padding_waste_unrounded").get<double>(), vp.at("epoch_padding_waste_unrounded").get<double>());
  for (const auto* v : {&vb, &vp}) {
    EXPECT_GE(v->at("padding_waste").get<double>(), 0.0);
    EXPECT_LT(v->at("padding_waste").get<double>(), 1.0);
    EXPECT_TRUE(finite_positive(v->at("timed_real_tokens")));
    for (const auto& w : v->at("timed_widths")) EXPECT_EQ(w.get<int>() % 32, 0) << "widths are rounded up to 32";
  }
  std::set<std::string> names;
  ASSERT_EQ(j.at("rows").size(), 4u) << j.dump(2);
  for (const auto& row : j.at("rows")) {
    const std::string name = row.at("name");
    names.insert(name);
    ASSERT_TRUE(row.at("ok").get<bool>()) << name << ": " << row.dump(2);
    for (const char* key : {"tokens_per_s", "cells_per_s", "ms_per_step", "gflops", "loss_first", "loss_last"})
      EXPECT_TRUE(finite_positive(row.at(key))) << name << " " << key << " = " << row.at(key);
    // Real tokens are fewer than the cells they are padded into.
    EXPECT_LT(row.at("tokens_per_s").get<double>(), row.at("cells_per_s").get<double>()) << name;
    EXPECT_TRUE(row.at("loss_fell").get<bool>()) << name;
    ASSERT_EQ(row.at("rounds").size(), 2u) << name;
    for (const auto& round : row.at("rounds")) {
      EXPECT_TRUE(finite_positive(round.at("tokens_per_s"))) << name;
      EXPECT_EQ(round.at("losses").size(), 3u) << name;
    }
    const auto& range = row.at("tokens_per_s_range");
    EXPECT_LE(range[0].get<double>(), row.at("tokens_per_s").get<double>()) << name;
    EXPECT_GE(range[1].get<double>(), row.at("tokens_per_s").get<double>()) << name;
  }
  EXPECT_EQ(names, (std::set<std::string>{"brisk bucketed", "pytorch bucketed", "brisk padded", "pytorch padded"}));
  for (const char* v : {"bucketed", "padded"}) {
    const auto& same = j.at("same_start").at(v);
    EXPECT_TRUE(same.at("same_start").get<bool>()) << same.dump();
    EXPECT_LT(same.at("first_loss_max_abs_diff").get<double>(), 1e-4) << same.dump();
    const std::string key = std::string("brisk ") + v + "/pytorch " + v;
    EXPECT_TRUE(finite_positive(j.at("ratio_tokens_per_s").at(key))) << j.at("ratio_tokens_per_s").dump();
  }
}

// --bf16 adds a bf16 side per engine and kind of batch: brisk's blocks in
// bf16 (native or emulated, never fp32), PyTorch under autocast, paired as
// the fp32 sides are and started from the same weights.
TEST(BenchTrainE1, Bf16SidesBesideTheFp32Ones) {
  ASSERT_EQ(::access("/usr/bin/python3", X_OK), 0) << "the peer needs Debian's python3-torch (scripts/install_deps.sh)";
  TempDir dir;
  const std::string config = dir.file("e1.toml");
  write_text(config, config_toml(write_store(dir)));
  const std::string report = dir.file("train_E1.json");
  CliHooks hooks;
  // 16 processes of a 16M-parameter model and PyTorch: 45-50 s each on a
  // 2-core Zen 5 under ctest -j2; an AVX2 machine, bf16 emulated, or the
  // sanitizer build take several times that.
  hooks.timeout_s = 500;
  const CliResult r = run_cli({"bench", "train", "--workload", "E1", "--config", config, "--bf16", "--rounds", "1",
                               "--steps", "2", "--warmup", "1", "--json", report},
                              hooks);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto j = nlohmann::json::parse(read_text(report));
  ASSERT_EQ(j.at("rows").size(), 8u) << j.dump(2);
  int bf16_rows = 0;
  for (const auto& row : j.at("rows")) {
    const std::string name = row.at("name");
    ASSERT_TRUE(row.at("ok").get<bool>()) << name << ": " << row.dump(2);
    EXPECT_TRUE(row.at("loss_fell").get<bool>()) << name;
    const bool bf16 = name.size() > 5 && name.substr(name.size() - 5) == " bf16";
    EXPECT_EQ(row.at("precision"), bf16 ? "bf16" : "fp32") << name;
    if (bf16 && row.at("engine") == "brisk") {
      const std::string path = row.at("precision_path");
      EXPECT_TRUE(path == "bf16-native" || path == "bf16-emulated") << name << ": " << path;
    }
    bf16_rows += bf16;
  }
  EXPECT_EQ(bf16_rows, 4);
  for (const char* v : {"bucketed bf16", "padded bf16"}) {
    const auto& same = j.at("same_start").at(v);
    EXPECT_TRUE(same.at("same_start").get<bool>()) << same.dump();
    EXPECT_GT(same.at("any_step_loss_max_abs_diff").get<double>(), 0.0) << "two engines rounding to bf16 differ";
  }
  for (const char* key : {"brisk bucketed bf16/pytorch bucketed bf16", "brisk padded bf16/pytorch padded bf16",
                          "brisk bucketed bf16/brisk bucketed", "pytorch padded bf16/pytorch padded"})
    EXPECT_GT(j.at("ratio_tokens_per_s").value(key, 0.0), 0.0) << key << ": " << j.at("ratio_tokens_per_s").dump();
}

TEST(BenchTrainE1, RefusesWhatE1HasNoCounterpartFor) {
  const CliResult r = run_cli({"bench", "train", "--workload", "E1", "--ablation"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("--ablation is for W1/W2"), std::string::npos) << r.err;
}

TEST(BenchTrainE1, MissingStoreSaysHowToMakeIt) {
  TempDir dir;
  const std::string config = dir.file("e1.toml");
  write_text(config, config_toml(dir.file("no-such.lmdb")));
  const CliResult r = run_cli({"bench", "train", "--workload", "E1", "--config", config, "--no-peer"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("brisk data emails"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace brisk::itest
