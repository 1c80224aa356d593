// The trainer's end-to-end promises, checked on a tiny model:
// - a run stopped at step k and resumed gives the same losses, bit for bit
//   (==, not near), as a run that never stopped; whether the stop was a
//   checkpoint, SIGINT/SIGTERM, or a crash in the middle of a checkpoint write;
// - SIGINT/SIGTERM end `brisk train` with exit code 0 after a checkpoint;
// - a partial `.tmp_step_*` directory never counts as a checkpoint;
// - `brisk generate` prints the prompt and a continuation, reproducibly.
// Straight reference runs go through train::train() in-process; interrupted
// runs go through the CLI where signals or a crash are involved, because the
// promise is about the process, not the function.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "brisk/core/error.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/train/checkpoint.h"
#include "brisk/train/trainer.h"
#include "integration_util.h"

using namespace brisk;
using namespace brisk::itest;

namespace {

class TrainIntegration : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string err;
    data_ = prepare_tiny_dataset(tmp_.path() / "corpus", &err);
    ASSERT_FALSE(data_.empty()) << "brisk data prepare failed:\n" << err;
  }

  // A config file for a run into out_dir; returns its path.
  std::string config(const std::string& name, int steps, int every, const std::string& schedule = "cosine") {
    const std::string path = tmp_.file(name + ".toml");
    write_text(path, tiny_config_toml(data_, tmp_.file(name), steps, every, schedule));
    return path;
  }

  train::TrainResult run(const std::string& config_path, bool resume, std::vector<std::string> sets = {}) {
    train::TrainOptions o;
    o.resume = resume;
    o.quiet = true;
    return train::train(train::load_train_config(config_path, sets), o);
  }

  void expect_exact_resume_with(const std::vector<std::string>& dropout, const std::vector<std::string>& base,
                                const std::string& name);

  TempDir tmp_;
  std::string data_;
};

std::vector<double> tail(const std::vector<double>& v, size_t from) {
  return {v.begin() + std::ptrdiff_t(from), v.end()};
}

// ---------------------------------------------------------------- resume --

// The literal scenario: 8 steps straight (checkpoint every 4, cosine LR over
// 8 steps) versus a fresh trainer resuming from the step-4 checkpoint of such
// a run with nothing else carried over.
TEST_F(TrainIntegration, ResumeFromMidRunCheckpointIsBitExact) {
  const auto straight = run(config("straight", 8, 4), false);
  ASSERT_EQ(straight.losses.size(), 8u);
  const fs::path ckpt4 = tmp_.path() / "straight" / "step_0000004";
  ASSERT_TRUE(fs::exists(ckpt4 / "state.json"));

  // A new run directory holding only the step-4 checkpoint.
  const std::string cfg = config("resumed", 8, 4);
  fs::create_directories(tmp_.path() / "resumed");
  fs::copy(ckpt4, tmp_.path() / "resumed" / "step_0000004", fs::copy_options::recursive);
  const auto resumed = run(cfg, true);
  EXPECT_EQ(resumed.steps_done, 8);
  ASSERT_EQ(resumed.losses.size(), 4u);
  EXPECT_EQ(resumed.losses, tail(straight.losses, 4));  // exact

  // metrics.jsonl says the same (steps 5..8, same doubles).
  const auto rows = read_metrics(tmp_.file("resumed"));
  ASSERT_EQ(rows.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(rows[i].step, int64_t(i + 5));
    EXPECT_EQ(rows[i].loss, straight.losses[i + 4]);
  }
}

// A resume under another train.seed would draw other batches: refused,
// naming both seeds, before anything is trained or written.
TEST_F(TrainIntegration, ResumeWithAnotherSeedIsAClearError) {
  const std::string cfg = config("reseeded", 8, 4);
  const auto first = run(cfg, false, {"train.steps=4"});
  ASSERT_EQ(first.steps_done, 4);
  const uint64_t seed = train::load_train_config(cfg, {}).seed;
  try {
    run(cfg, true, {"train.seed=" + std::to_string(seed + 1)});
    ADD_FAILURE() << "a resume with another seed trained";
  } catch (const brisk::core::ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("train.seed = " + std::to_string(seed)), std::string::npos) << what;
    EXPECT_NE(what.find(std::to_string(seed + 1)), std::string::npos) << what;
  }
  EXPECT_FALSE(fs::exists(tmp_.path() / "reseeded" / "step_0000008"));
  const auto same = run(cfg, true);  // the stored seed resumes as before
  EXPECT_EQ(same.steps_done, 8);
}

// A resume takes its settings from the config it is given; the log names
// those that differ from the stopped run's config.toml (not the thread
// count, which changes no update), and says nothing when none does.
TEST_F(TrainIntegration, ResumeNamesTheSettingsItChanges) {
  const std::string cfg = config("changed", 8, 4);
  ASSERT_EQ(run(cfg, false, {"train.steps=4"}).steps_done, 4);
  const CliResult changed =
      run_cli({"train", "--config", cfg, "--resume", "--no-progress", "--set", "train.steps=6", "--set",
               "train.lr=0.0123", "--set", "train.threads=1"});
  ASSERT_EQ(changed.exit_code, 0) << changed.err;
  EXPECT_NE(changed.err.find("resume: settings changed since the stopped run"), std::string::npos) << changed.err;
  EXPECT_NE(changed.err.find("train.steps 4 -> 6"), std::string::npos) << changed.err;
  EXPECT_NE(changed.err.find("train.lr "), std::string::npos) << changed.err;
  EXPECT_NE(changed.err.find(" -> 0.0123"), std::string::npos) << changed.err;
  EXPECT_EQ(changed.err.find("train.threads"), std::string::npos) << changed.err;
  const CliResult same = run_cli({"train", "--config", cfg, "--resume", "--no-progress", "--set", "train.steps=7",
                                  "--set", "train.lr=0.0123"});
  ASSERT_EQ(same.exit_code, 0) << same.err;
  EXPECT_NE(same.err.find("train.steps 6 -> 7"), std::string::npos) << same.err;
  EXPECT_EQ(same.err.find("train.lr"), std::string::npos) << "the lr is the stopped run's now: " << same.err;
}

// Train 4 steps as a run of its own, then resume to 8. With a constant LR the
// schedule does not depend on the total, so the two halves must reproduce the
// straight run exactly.
TEST_F(TrainIntegration, TrainFourThenResumeFourIsBitExact) {
  const auto straight = run(config("straight", 8, 4, "constant"), false);
  ASSERT_EQ(straight.losses.size(), 8u);
  const std::string cfg = config("halves", 8, 4, "constant");
  const auto first = run(cfg, false, {"train.steps=4"});
  ASSERT_EQ(first.steps_done, 4);
  const auto second = run(cfg, true);
  EXPECT_EQ(second.steps_done, 8);
  std::vector<double> both = first.losses;
  both.insert(both.end(), second.losses.begin(), second.losses.end());
  EXPECT_EQ(both, straight.losses);
  // The loss falls on this text: the run is really training.
  EXPECT_LT(straight.losses.back(), straight.losses.front());
}

// Dropout: each micro-step's masks come from its key (seed, step,
// micro-step), so a run with `dropout` (its dropout settings, on top of
// `base` and grad_accum 2) resumed from step 4 drops what the straight run
// dropped and ends bit for bit as it does; and the run with `base` alone
// (the same attention kind) has other losses.
void TrainIntegration::expect_exact_resume_with(const std::vector<std::string>& dropout,
                                                const std::vector<std::string>& base, const std::string& name) {
  std::vector<std::string> plain = base, drop = base;
  plain.push_back("train.grad_accum=2");
  drop.push_back("train.grad_accum=2");
  drop.insert(drop.end(), dropout.begin(), dropout.end());
  const auto straight = run(config(name + "-straight", 8, 4), false, drop);
  ASSERT_EQ(straight.losses.size(), 8u);
  const std::string cfg = config(name + "-resumed", 8, 4);
  fs::create_directories(tmp_.path() / (name + "-resumed"));
  fs::copy(tmp_.path() / (name + "-straight") / "step_0000004", tmp_.path() / (name + "-resumed") / "step_0000004",
           fs::copy_options::recursive);
  const auto resumed = run(cfg, true, drop);
  ASSERT_EQ(resumed.losses.size(), 4u);
  EXPECT_EQ(resumed.losses, tail(straight.losses, 4));  // exact
  const auto without = run(config(name + "-without", 8, 4), false, plain);
  EXPECT_NE(without.losses[0], straight.losses[0]) << "dropout changed nothing";
  EXPECT_LT(straight.losses.back(), straight.losses.front());
}

TEST_F(TrainIntegration, ResumeWithDropoutIsBitExact) { expect_exact_resume_with({"model.dropout=0.1"}, {}, "dropout"); }

TEST_F(TrainIntegration, ResumeWithAttentionDropoutIsBitExact) {
  expect_exact_resume_with({"model.attention_dropout=0.2"}, {"model.attention=\"flash\""}, "attention-dropout");
}

// The trainer gives each optimizer step and each micro-step its own dropout
// key. On a corpus of one repeated byte every batch is the same, and at an
// lr of 1e-30 the weights never move: without dropout every step's loss is
// the same, so with dropout the losses differ only if the masks do. With
// grad_accum 2 a step's loss is the mean over its two micro-steps, which
// equals the one-micro-step run's only if the second micro-step's masks
// repeat the first's.
TEST_F(TrainIntegration, EachStepAndMicroStepDrawsItsOwnDropoutMasks) {
  std::string err;
  const std::string data = prepare_tiny_dataset(tmp_.path() / "one-byte", &err, std::string(6000, 'a'));
  ASSERT_FALSE(data.empty()) << err;
  const std::string cfg = tmp_.file("one-byte.toml");
  write_text(cfg, tiny_config_toml(data, tmp_.file("one-byte-run"), 4, 0, "constant"));  // each run its own dir below
  int run_number = 0;
  auto losses = [&](std::vector<std::string> sets) {
    sets.push_back("train.lr=1e-30");
    sets.push_back("checkpoint.dir=\"" + tmp_.file("one-byte-run-" + std::to_string(run_number++)) + "\"");
    train::TrainOptions o;
    o.quiet = true;
    return train::train(train::load_train_config(cfg, sets), o).losses;
  };
  const std::vector<double> still = losses({});
  ASSERT_EQ(still.size(), 4u);
  for (double l : still) ASSERT_EQ(l, still[0]) << "the batches or the weights changed: the test's premise fails";
  for (const char* setting : {"model.dropout=0.1", "model.attention_dropout=0.1"}) {
    SCOPED_TRACE(setting);
    const std::vector<double> one = losses({setting});
    ASSERT_EQ(one.size(), 4u);
    for (size_t i = 0; i < one.size(); ++i)
      for (size_t j = i + 1; j < one.size(); ++j) EXPECT_NE(one[i], one[j]) << "steps " << i << " and " << j;
    const std::vector<double> two = losses({setting, "train.grad_accum=2"});
    ASSERT_EQ(two.size(), 4u);
    EXPECT_NE(two[0], one[0]) << "the second micro-step repeated the first's masks";
  }
}

// The start-up lines say which fusions this device runs: "auto" resolved
// (on the CPU: the backward fusions on, residual add + LayerNorm off), and an
// explicit setting as given.
TEST_F(TrainIntegration, StartupLineNamesTheFusionsAsResolved) {
  const std::string cfg = config("fusions", 1, 0, "constant");
  const CliResult a = run_cli({"train", "--config", cfg, "--no-progress"});
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_NE(a.err.find("fusions: bias+GELU off | residual+LayerNorm off | LayerNorm backward on | GELU backward on | "
                       "bias gradient on"),
            std::string::npos)
      << a.err;
  const CliResult b = run_cli({"train", "--config", cfg, "--no-progress", "--set", "model.fuse_residual_layernorm=on",
                               "--set", "model.fuse_bias_backward=off", "--set",
                               "checkpoint.dir=" + tmp_.file("fusions-b")});
  ASSERT_EQ(b.exit_code, 0) << b.err;
  EXPECT_NE(b.err.find("residual+LayerNorm on | LayerNorm backward on | GELU backward on | bias gradient off"),
            std::string::npos)
      << b.err;
}

// A fresh run into a checkpoint.dir holding another run's checkpoints is
// refused: checkpoint.keep prunes by name, so the new run's first
// checkpoints went as soon as they were written and the directory's newest
// stayed the old run's. Nothing of the old run is touched.
TEST_F(TrainIntegration, AFreshRunRefusesADirectoryWithAnEarlierRunsCheckpoints) {
  const std::string cfg = config("taken", 4, 2, "constant");
  ASSERT_EQ(run_cli({"train", "--config", cfg, "--no-progress"}).exit_code, 0);
  const std::string newest = train::latest_checkpoint(tmp_.file("taken"));
  ASSERT_FALSE(newest.empty());
  const std::string before = read_text(newest + "/model.safetensors");
  const CliResult again = run_cli({"train", "--config", cfg, "--no-progress", "--set", "train.steps=2"});
  EXPECT_EQ(again.exit_code, 2) << again.err;
  EXPECT_NE(again.err.find(newest), std::string::npos) << again.err;
  EXPECT_NE(again.err.find("--resume"), std::string::npos) << again.err;
  EXPECT_EQ(train::latest_checkpoint(tmp_.file("taken")), newest);
  EXPECT_EQ(read_text(newest + "/model.safetensors"), before);
}

// Dynamic loss scaling resumes where it stopped: with growth every 3 clean
// steps from scale 1, the straight run doubles at steps 3 and 6 (scale 4).
// A resume that forgot the scaler would restart at 1 and end at 2; the
// checkpoint's state.json carries scale and streak so it ends at 4 too.
TEST_F(TrainIntegration, LossScalerStateSurvivesResume) {
  const std::vector<std::string> scaling = {"train.loss_scaling=true", "train.loss_scale_init=1",
                                            "train.loss_scale_growth_interval=3"};
  const auto straight = run(config("scaled", 8, 4, "constant"), false, scaling);
  ASSERT_EQ(straight.steps_done, 8);
  EXPECT_EQ(straight.loss_scale, 4.0f);
  EXPECT_EQ(straight.skipped_steps, 0);

  const std::string cfg = config("scaled_halves", 8, 4, "constant");
  auto first_sets = scaling;
  first_sets.push_back("train.steps=4");
  const auto first = run(cfg, false, first_sets);
  EXPECT_EQ(first.loss_scale, 2.0f);
  const auto state = nlohmann::json::parse(read_text(tmp_.file("scaled_halves") + "/step_0000004/state.json"));
  ASSERT_TRUE(state.contains("loss_scaler")) << state.dump();
  EXPECT_EQ(state["loss_scaler"]["scale"].get<float>(), 2.0f);
  EXPECT_EQ(state["loss_scaler"]["clean_streak"].get<int64_t>(), 1);

  const auto second = run(cfg, true, scaling);
  EXPECT_EQ(second.steps_done, 8);
  EXPECT_EQ(second.loss_scale, 4.0f) << "the resumed run restarted its loss scale";
  std::vector<double> both = first.losses;
  both.insert(both.end(), second.losses.begin(), second.losses.end());
  EXPECT_EQ(both, straight.losses);
}

// --------------------------------------------------------------- signals --

class SignalStop : public TrainIntegration, public ::testing::WithParamInterface<int> {};

// `brisk train` on a long run; the signal arrives after the first step line.
// Exit 0, a "stopped by SIG..." line, a complete checkpoint; then --resume
// continues from that step and the losses match an uninterrupted run.
TEST_P(SignalStop, CheckpointsExitsZeroAndResumesExactly) {
  const int sig = GetParam();
  const std::string name = sig == SIGINT ? "SIGINT" : "SIGTERM";
  const std::string cfg = config("sig", 100000, 0, "constant");
  bool sent = false;
  CliHooks hooks;
  hooks.on_err_line = [&](const std::string& line, pid_t pid) {
    if (!sent && line.rfind("step ", 0) == 0) {
      ::kill(pid, sig);
      sent = true;
    }
  };
  const CliResult r = run_cli({"train", "--config", cfg, "--no-progress"}, hooks);
  ASSERT_FALSE(r.timed_out) << r.err;
  ASSERT_TRUE(sent) << "no step line seen:\n" << r.err;
  EXPECT_EQ(r.signal, 0) << "killed by signal " << r.signal << "\n" << r.err;
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("stopped by " + name), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("(interrupted)"), std::string::npos) << r.out;

  const std::string ckpt = train::latest_checkpoint(tmp_.file("sig"));
  ASSERT_FALSE(ckpt.empty());
  for (const char* f : {"model.safetensors", "optimizer.safetensors", "state.json"})
    EXPECT_TRUE(fs::exists(fs::path(ckpt) / f)) << ckpt << " lacks " << f;
  train::TrainState st;
  train::read_checkpoint_config(ckpt, &st);
  ASSERT_GE(st.step, 1);
  ASSERT_LT(st.step, 100000);
  const auto before = read_metrics(tmp_.file("sig"));
  ASSERT_EQ(int64_t(before.size()), st.step);

  // Resume for three more steps.
  const int64_t total = st.step + 3;
  const CliResult r2 = run_cli({"train", "--config", cfg, "--no-progress", "--resume", "--set",
                                "train.steps=" + std::to_string(total)});
  ASSERT_EQ(r2.exit_code, 0) << r2.err;
  EXPECT_NE(r2.err.find("resumed from " + ckpt + " at step " + std::to_string(st.step)), std::string::npos) << r2.err;
  const auto rows = read_metrics(tmp_.file("sig"));
  ASSERT_EQ(int64_t(rows.size()), total);
  for (size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(rows[i].step, int64_t(i + 1));

  // The same steps without a stop, in-process.
  const auto straight = run(config("sig_straight", int(total), 0, "constant"), false);
  ASSERT_EQ(int64_t(straight.losses.size()), total);
  for (size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(rows[i].loss, straight.losses[i]) << "step " << i + 1;
}

INSTANTIATE_TEST_SUITE_P(Signals, SignalStop, ::testing::Values(SIGINT, SIGTERM),
                         [](const auto& info) { return info.param == SIGINT ? "SIGINT" : "SIGTERM"; });

// ------------------------------------------------------ crash mid-write --

// A process killed while writing a checkpoint (SIGXFSZ from a file-size limit
// smaller than model.safetensors, a real mid-write death) leaves a partial
// .tmp_step_* directory; the previous checkpoint stays the newest, loads, and
// a resume from it reproduces the straight run.
TEST_F(TrainIntegration, CrashMidCheckpointWriteKeepsPreviousCheckpoint) {
  const std::string cfg = config("crash", 8, 4, "constant");
  const CliResult first = run_cli({"train", "--config", cfg, "--no-progress", "--set", "train.steps=4"});
  ASSERT_EQ(first.exit_code, 0) << first.err;
  const fs::path out = tmp_.path() / "crash";
  const fs::path ckpt4 = out / "step_0000004";
  ASSERT_TRUE(fs::exists(ckpt4 / "state.json"));
  const auto model_bytes = fs::file_size(ckpt4 / "model.safetensors");

  CliHooks limit;
  limit.in_child = [model_bytes] {
    rlimit core{0, 0}, fsize{rlim_t(model_bytes / 2), rlim_t(model_bytes / 2)};
    setrlimit(RLIMIT_CORE, &core);
    setrlimit(RLIMIT_FSIZE, &fsize);
  };
  const CliResult crashed = run_cli({"train", "--config", cfg, "--no-progress", "--resume"}, limit);
  ASSERT_FALSE(crashed.timed_out);
  ASSERT_EQ(crashed.signal, SIGXFSZ) << "exit " << crashed.exit_code << "\n" << crashed.err;
  ASSERT_TRUE(fs::exists(out / ".tmp_step_0000008")) << "the crash did not happen mid-checkpoint";
  EXPECT_FALSE(fs::exists(out / "step_0000008"));

  // The partial directory is ignored; the previous checkpoint is intact.
  EXPECT_EQ(train::latest_checkpoint(out.string()), ckpt4.string());
  {
    cpu::CpuBackend backend(1);
    train::TrainState st;
    models::Gpt model(train::read_checkpoint_config(ckpt4.string(), &st), backend);
    optim::AdamW adamw({}, model.params(), backend);
    EXPECT_NO_THROW(train::load_checkpoint(ckpt4.string(), model, &adamw));
    EXPECT_EQ(st.step, 4);
  }

  // The crashed attempt logged steps 5..8 before dying; a resume drops those
  // rows from metrics.jsonl and logs the steps again, once each.
  const auto rows = read_metrics(out.string());
  ASSERT_EQ(rows.size(), 8u);
  const auto resumed = run(cfg, true);
  EXPECT_EQ(resumed.steps_done, 8);
  EXPECT_FALSE(fs::exists(out / ".tmp_step_0000008"));  // replaced by the real one
  EXPECT_TRUE(fs::exists(out / "step_0000008" / "state.json"));
  const auto straight = run(config("crash_straight", 8, 4, "constant"), false);
  EXPECT_EQ(resumed.losses, tail(straight.losses, 4));
  // What the crashed attempt logged before dying was the same numbers too.
  for (const auto& row : rows) EXPECT_EQ(row.loss, straight.losses[size_t(row.step - 1)]) << "step " << row.step;
  const auto after = read_metrics(out.string());
  ASSERT_EQ(after.size(), 8u);
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(after[i].step, int64_t(i + 1));
    EXPECT_EQ(after[i].loss, straight.losses[i]);
  }
}

// Stale partial directories (a .tmp_step_* of a later step, a step_* without
// state.json) are never taken for checkpoints, by latest_checkpoint or resume.
TEST_F(TrainIntegration, PartialCheckpointDirectoriesAreIgnored) {
  const std::string cfg = config("partial", 4, 2, "constant");
  ASSERT_EQ(run(cfg, false).steps_done, 4);
  const fs::path out = tmp_.path() / "partial";
  fs::create_directories(out / ".tmp_step_0000006");
  write_text((out / ".tmp_step_0000006" / "model.safetensors").string(), "half a header");
  write_text((out / ".tmp_step_0000006" / "state.json").string(), "{\"step\": 6");
  fs::create_directories(out / "step_0000009");
  write_text((out / "step_0000009" / "model.safetensors").string(), "garbage");
  EXPECT_EQ(train::latest_checkpoint(out.string()), (out / "step_0000004").string());

  const auto resumed = run(cfg, true, {"train.steps=6"});
  EXPECT_EQ(resumed.steps_done, 6);
  EXPECT_EQ(resumed.losses.size(), 2u);
  EXPECT_EQ(train::latest_checkpoint(out.string()), (out / "step_0000006").string());
  EXPECT_FALSE(fs::exists(out / ".tmp_step_0000006"));
}

// A fresh (not resumed) run into a directory used before (its checkpoints
// removed: a directory that still holds them is refused) starts its
// metrics.jsonl anew instead of appending steps 1.. after the old ones.
TEST_F(TrainIntegration, FreshRunRestartsMetrics) {
  const std::string cfg = config("again", 3, 0, "constant");
  ASSERT_EQ(run(cfg, false).steps_done, 3);
  for (const auto& e : fs::directory_iterator(tmp_.file("again")))
    if (e.path().filename().string().rfind("step_", 0) == 0) fs::remove_all(e.path());
  ASSERT_EQ(run(cfg, false).steps_done, 3);
  const auto rows = read_metrics(tmp_.file("again"));
  ASSERT_EQ(rows.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(rows[i].step, int64_t(i + 1));
}

// -------------------------------------------------------------- generate --

TEST_F(TrainIntegration, GeneratePrintsPromptThenTextReproducibly) {
  ASSERT_EQ(run(config("gen", 8, 8), false).steps_done, 8);
  const std::string ckpt = tmp_.file("gen");
  const std::vector<std::string> args = {"generate", "--checkpoint", ckpt, "--prompt", "the king", "--max-new", "40",
                                         "--temperature", "0.9", "--top-k", "20", "--seed", "11", "--threads", "1"};
  const CliResult a = run_cli(args);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  ASSERT_EQ(a.out.rfind("the king", 0), 0u) << a.out;
  EXPECT_GT(a.out.size(), std::string("the king").size() + 1) << a.out;
  const CliResult b = run_cli(args);
  ASSERT_EQ(b.exit_code, 0) << b.err;
  EXPECT_EQ(a.out, b.out);
  // A step directory works as well as the run directory.
  auto step_args = args;
  step_args[2] = (fs::path(ckpt) / "step_0000008").string();
  EXPECT_EQ(run_cli(step_args).out, a.out);
  // Text that cannot be written (a full disk behind stdout) is an error, streamed or not.
  for (const char* mode : {"", " --no-stream"}) {
    std::string cmd = cli_path();
    for (const std::string& arg : args) cmd += " '" + arg + "'";
    const CliResult full = run_program("/bin/sh", {"-c", cmd + mode + " > /dev/full"});
    EXPECT_EQ(full.exit_code, 2) << mode << full.err;
    EXPECT_NE(full.err.find("stdout failed"), std::string::npos) << full.err;
  }
}

// Streamed, the text is what --no-stream prints, cut before the stop
// string: the tail that could begin it is held back until the next token
// decides. Streaming used to print the stop string's first bytes and skip
// only the token that completed it.
TEST_F(TrainIntegration, GenerateStreamsTheTextItPrintsWithoutStreamingCutAtTheStop) {
  ASSERT_EQ(run(config("stop", 8, 8), false).steps_done, 8);
  const std::vector<std::string> base = {"generate", "--checkpoint", tmp_.file("stop"), "--prompt", "the king",
                                         "--max-new", "40", "--temperature", "0", "--threads", "1"};
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> args = base;
    args.insert(args.end(), more.begin(), more.end());
    const CliResult r = run_cli(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.out;
  };
  // --no-stream: "=== 0: <reason>\n" then the prompt, the completion and "\n".
  auto batch_text = [](const std::string& out) {
    const std::string body = out.substr(out.find('\n') + 1);
    return body.substr(0, body.size() - 1);
  };
  const std::string whole = batch_text(with({"--no-stream"}));
  ASSERT_EQ(whole.rfind("the king", 0), 0u) << whole;
  const std::string completion = whole.substr(8);
  ASSERT_GE(completion.size(), 16u) << completion;
  EXPECT_EQ(with({}), whole + "\n");
  for (const size_t at : {size_t(5), size_t(12)}) {
    const std::string stop = completion.substr(at, 3);
    const std::string expected = "the king" + completion.substr(0, completion.find(stop));
    EXPECT_EQ(batch_text(with({"--no-stream", "--stop", stop})), expected) << "stop '" << stop << "'";
    EXPECT_EQ(with({"--stop", stop}), expected + "\n") << "stop '" << stop << "'";
  }
}

// Prompt files: a NUL is text (it was printed as the end of a C string) and
// a CRLF line ends without its CR (which was fed to the model).
TEST_F(TrainIntegration, GeneratePromptFilesKeepNulsAndDropCarriageReturns) {
  ASSERT_EQ(run(config("nul", 8, 8), false).steps_done, 8);
  const std::string prompt("the\0king", 8);
  write_text(tmp_.file("crlf.txt"), prompt + "\r\n");
  write_text(tmp_.file("lf.txt"), prompt + "\n");
  std::string outs[2];
  int k = 0;
  for (const char* file : {"crlf.txt", "lf.txt"}) {
    const CliResult r = run_cli({"generate", "--checkpoint", tmp_.file("nul"), "--prompt-file", tmp_.file(file),
                                 "--max-new", "8", "--temperature", "0", "--threads", "1", "--no-stream"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::string body = r.out.substr(r.out.find('\n') + 1);
    EXPECT_EQ(body.rfind(prompt, 0), 0u) << file;
    EXPECT_GT(body.size(), prompt.size() + 1) << file;
    outs[k++] = body;
  }
  EXPECT_EQ(outs[0], outs[1]) << "the CR is no part of the prompt";
}

}  // namespace

// Memory as the run goes: every progress line and metrics.jsonl row carries
// the process's resident memory after that step, and it is the process's
// (a few MiB at least, below its peak at the end of the run).
TEST_F(TrainIntegration, ProgressAndMetricsCarryResidentMemory) {
  const std::string cfg = config("memory", 4, 0);
  const CliResult r = run_cli({"train", "--config", cfg, "--no-progress"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  int lines = 0;
  std::istringstream err(r.err);
  for (std::string line; std::getline(err, line);)
    if (line.rfind("step ", 0) == 0 && line.find(" | loss ") != std::string::npos) {
      ++lines;
      EXPECT_TRUE(std::regex_search(line, std::regex(R"( \| RSS [0-9]+ MiB \| )"))) << line;
    }
  EXPECT_GE(lines, 2);  // the first and the last step at least
  std::ifstream in(tmp_.path() / "memory" / "metrics.jsonl");
  int rows = 0;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    ASSERT_TRUE(j.contains("rss_mib")) << line;
    EXPECT_GT(j["rss_mib"].get<double>(), 4.0) << line;
    EXPECT_LT(j["rss_mib"].get<double>(), 64.0 * 1024) << line;
    ++rows;
  }
  EXPECT_EQ(rows, 4);
}
