// Seeing and tuning a run (docs/monitoring.md), end to end on a tiny model:
// - train.schedule = "plateau": a run resumed from a mid-run checkpoint
//   gives the same losses and learning rates, bit for bit, as one that never
//   stopped, after the schedule has cut the lr (its state is in state.json);
// - `brisk train --trace`: a Chrome trace of the chosen (or default) steps
//   whose events have the fields viewers need, op names that are brisk's,
//   leaf durations that add up to at most the step time metrics.jsonl
//   reports; steps outside the run are refused by name.
// TensorBoard event files are checked by an independent reader
// (tests/monitor/read_tfevents.py, ctest tfevents_check).
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "brisk/core/op.h"
#include "brisk/train/trainer.h"
#include "integration_util.h"

using namespace brisk;
using namespace brisk::itest;

namespace {

class MonitorIntegration : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string err;
    data_ = prepare_tiny_dataset(tmp_.path() / "corpus", &err);
    ASSERT_FALSE(data_.empty()) << "brisk data prepare failed:\n" << err;
  }

  std::string config(const std::string& name, int steps, int every, const std::string& schedule = "cosine") {
    const std::string path = tmp_.file(name + ".toml");
    write_text(path, tiny_config_toml(data_, tmp_.file(name), steps, every, schedule));
    return path;
  }

  train::TrainResult run(const std::string& config_path, bool resume, const std::vector<std::string>& sets) {
    train::TrainOptions o;
    o.resume = resume;
    o.quiet = true;
    return train::train(train::load_train_config(config_path, sets), o);
  }

  // Every metrics.jsonl row of a run directory, by step.
  std::map<int64_t, nlohmann::json> rows(const std::string& name) {
    std::map<int64_t, nlohmann::json> out;
    std::ifstream in(tmp_.path() / name / "metrics.jsonl");
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) {
        auto j = nlohmann::json::parse(line);
        out[j.at("step").get<int64_t>()] = j;
      }
    return out;
  }

  TempDir tmp_;
  std::string data_;
};

// A high lr and an evaluation every step with patience 0: the validation
// loss stalls and the schedule cuts within 12 steps (checked, or the resume
// would prove nothing about the carried state).
const std::vector<std::string> kPlateau = {"train.lr=0.05", "train.eval_every=1", "train.plateau_patience=0",
                                           "train.plateau_factor=0.5", "train.min_lr_ratio=0.01"};

}  // namespace

TEST_F(MonitorIntegration, PlateauScheduleResumesBitExact) {
  const auto straight = run(config("straight", 12, 6, "plateau"), false, kPlateau);
  ASSERT_EQ(straight.losses.size(), 12u);
  const auto straight_rows = rows("straight");
  // The step-6 checkpoint must hold a cut scale, or the resume below would
  // not exercise the saved state; the steps after it run at the lower lr.
  const auto state = nlohmann::json::parse(read_text(tmp_.file("straight") + "/step_0000006/state.json"));
  ASSERT_TRUE(state.contains("lr_plateau")) << state.dump();
  ASSERT_LT(state["lr_plateau"]["scale"].get<double>(), 1.0) << "no cut by step 6: " << state.dump();
  EXPECT_GE(state["lr_plateau"]["cuts"].get<int64_t>(), 1);
  EXPECT_TRUE(state["lr_plateau"]["best"].is_number());
  const double max_lr = straight_rows.at(3).at("lr").get<double>();  // after the 2-step warm-up
  EXPECT_LT(straight_rows.at(7).at("lr").get<double>(), max_lr);

  // A new run directory holding only the step-6 checkpoint.
  const std::string cfg = config("resumed", 12, 6, "plateau");
  fs::create_directories(tmp_.path() / "resumed");
  fs::copy(tmp_.path() / "straight" / "step_0000006", tmp_.path() / "resumed" / "step_0000006",
           fs::copy_options::recursive);
  const auto resumed = run(cfg, true, kPlateau);
  EXPECT_EQ(resumed.steps_done, 12);
  ASSERT_EQ(resumed.losses.size(), 6u);
  EXPECT_EQ(resumed.losses, std::vector<double>(straight.losses.begin() + 6, straight.losses.end()));  // exact
  const auto resumed_rows = rows("resumed");
  for (int64_t step = 7; step <= 12; ++step) {
    EXPECT_EQ(resumed_rows.at(step).at("lr").get<double>(), straight_rows.at(step).at("lr").get<double>()) << step;
    if (straight_rows.at(step).contains("val_loss")) {
      EXPECT_EQ(resumed_rows.at(step).at("val_loss").get<double>(), straight_rows.at(step).at("val_loss").get<double>());
    }
  }
  EXPECT_EQ(read_text(tmp_.file("resumed") + "/step_0000012/state.json"),
            read_text(tmp_.file("straight") + "/step_0000012/state.json"));
}

// A checkpoint written before the plateau state existed resumes with a fresh
// schedule (scale 1) instead of failing.
TEST_F(MonitorIntegration, PlateauResumesFromACheckpointWithoutItsState) {
  run(config("old", 4, 4, "constant"), false, {});
  const auto state = nlohmann::json::parse(read_text(tmp_.file("old") + "/step_0000004/state.json"));
  EXPECT_FALSE(state.contains("lr_plateau"));
  const auto resumed = run(tmp_.file("old.toml"), true, {"train.schedule=\"plateau\"", "train.steps=6"});
  EXPECT_EQ(resumed.steps_done, 6);
  const auto after = nlohmann::json::parse(read_text(tmp_.file("old") + "/step_0000006/state.json"));
  ASSERT_TRUE(after.contains("lr_plateau"));
}

TEST_F(MonitorIntegration, TraceHoldsEveryOpOfTheChosenSteps) {
  const std::string cfg = config("traced", 6, 6);
  const std::string trace = tmp_.file("out/trace.json");
  const CliResult r = run_cli({"train", "--config", cfg, "--no-progress", "--set", "train.grad_accum=2", "--trace",
                               trace, "--trace-steps", "3,5"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("trace          " + trace), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(trace + ".tmp"));
  const auto j = nlohmann::json::parse(read_text(trace));
  ASSERT_TRUE(j.contains("traceEvents") && j["traceEvents"].is_array()) << j.dump().substr(0, 200);

  std::set<std::string> op_names;
  for (int op = 0; op < core::kNumOps; ++op) op_names.insert(std::string(core::op_name(core::OpKind(op))));
  const std::set<std::string> leaf_cats = {"forward", "backward", "data", "optimizer", "comm"};
  const auto metrics = rows("traced");

  std::map<int64_t, nlohmann::json> steps;
  std::map<int64_t, std::vector<nlohmann::json>> leaves;
  std::map<int64_t, std::set<int64_t>> micros;
  std::map<int64_t, std::map<std::string, int>> count;
  for (const auto& e : j["traceEvents"]) {
    ASSERT_TRUE(e.contains("name") && e.contains("ph") && e.contains("pid")) << e.dump();
    if (e["ph"] == "M") continue;  // process and thread names
    ASSERT_EQ(e["ph"], "X") << e.dump();
    for (const char* k : {"ts", "dur", "tid", "cat"}) ASSERT_TRUE(e.contains(k)) << k << " missing: " << e.dump();
    ASSERT_TRUE(e["ts"].is_number() && e["dur"].is_number()) << e.dump();
    EXPECT_GE(e["dur"].get<double>(), 0.0);
    const int64_t step = e["args"]["step"].get<int64_t>();
    const std::string cat = e["cat"], name = e["name"];
    ++count[step][cat];
    if (cat == "step") steps[step] = e;
    if (leaf_cats.count(cat)) leaves[step].push_back(e);
    if (cat == "forward" || cat == "backward") {
      EXPECT_TRUE(op_names.count(name)) << "'" << name << "' is not an op name";
      ASSERT_TRUE(e["args"].contains("inputs") && e["args"].contains("outputs")) << e.dump();
      micros[step].insert(e["args"]["micro"].get<int64_t>());
    }
  }
  ASSERT_EQ(steps.size(), 2u);
  ASSERT_TRUE(steps.count(3) && steps.count(5));
  for (const int64_t step : {int64_t(3), int64_t(5)}) {
    SCOPED_TRACE("step " + std::to_string(step));
    const double t0 = steps[step]["ts"], dur = steps[step]["dur"];
    // The step's span is the time metrics.jsonl reports for it.
    EXPECT_NEAR(dur / 1e3, metrics.at(step).at("ms_per_step").get<double>(), 1e-3);
    double sum = 0;
    for (const auto& e : leaves[step]) {
      const double ts = e["ts"], d = e["dur"];
      EXPECT_GE(ts, t0 - 1e-3) << e.dump();
      EXPECT_LE(ts + d, t0 + dur + 1e-3) << e.dump();
      sum += d;
    }
    EXPECT_LE(sum, dur + 1e-3) << "the step's ops, data waits and optimizer step take longer than the step";
    EXPECT_GT(sum, 0.5 * dur) << "most of the step should be in its ops";
    EXPECT_EQ(count[step]["data"], 2) << "one data wait per micro-step";
    EXPECT_EQ(count[step]["micro_step"], 2);
    EXPECT_EQ(count[step]["optimizer"], 1);
    EXPECT_GT(count[step]["forward"], 10);
    EXPECT_GT(count[step]["backward"], 10);
    EXPECT_EQ(micros[step], (std::set<int64_t>{0, 1}));
  }
}

TEST_F(MonitorIntegration, TraceDefaultsToStepsAfterWarmUpAndRefusesOthers) {
  const std::string cfg = config("default_trace", 8, 8);
  const std::string trace = tmp_.file("default.json");
  const CliResult r = run_cli({"train", "--config", cfg, "--no-progress", "--trace", trace});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::set<int64_t> traced;
  const auto j = nlohmann::json::parse(read_text(trace));
  for (const auto& e : j["traceEvents"])
    if (e.value("cat", "") == "step") traced.insert(e["args"]["step"].get<int64_t>());
  EXPECT_EQ(traced, (std::set<int64_t>{3, 4, 5}));

  const CliResult bad = run_cli({"train", "--config", cfg, "--no-progress", "--set",
                                 "checkpoint.dir=\"" + tmp_.file("bad") + "\"", "--trace", trace, "--trace-steps", "9"});
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  EXPECT_NE(bad.err.find("--trace-steps: step 9"), std::string::npos) << bad.err;
  const CliResult orphan = run_cli({"train", "--config", cfg, "--trace-steps", "2"});
  EXPECT_EQ(orphan.exit_code, 2) << "--trace-steps without --trace";
}

// A run that diverges ends with an error and never reaches the trainer's
// finish(): the steps it traced were lost, though a stop signal keeps them.
TEST_F(MonitorIntegration, ADivergedRunKeepsTheStepsItTraced) {
  const std::string cfg = config("diverged", 8, 8);
  const std::string trace = tmp_.file("diverged.json");
  const CliResult r = run_cli({"train", "--config", cfg, "--no-progress", "--set", "train.lr=1e30", "--set",
                               "train.warmup=0", "--set", "train.grad_clip=0", "--trace", trace, "--trace-steps",
                               "1,2,8"});
  ASSERT_EQ(r.exit_code, 2) << r.err;
  ASSERT_NE(r.err.find("diverged"), std::string::npos) << r.err;
  ASSERT_TRUE(fs::exists(trace)) << r.err;
  std::set<int64_t> traced;
  const nlohmann::json j = nlohmann::json::parse(read_text(trace));
  for (const auto& e : j["traceEvents"])
    if (e.value("cat", "") == "step") traced.insert(e["args"]["step"].get<int64_t>());
  EXPECT_TRUE(traced.count(1)) << r.err;
  EXPECT_FALSE(traced.count(8));
}
