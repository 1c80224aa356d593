// Helpers for the resume tests of the epoch-based trainers: a run directory
// as a crash after one of its checkpoints would leave it, a file's bytes, the
// loss of every step in a metrics.jsonl, the whole check that a run
// resumed from any checkpoint ends as the uninterrupted one, and that an
// early-stopped run stays stopped.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <exception>
#include <sstream>
#include <string>
#include <vector>

namespace brisk::testing {

// `to` holds checkpoint `step` of the run in `from` and the whole of its
// metrics.jsonl, rows after that step included: a process that died after
// logging steps it never checkpointed.
inline void copy_run_crashed_after(const std::filesystem::path& from, int64_t step, const std::filesystem::path& to) {
  char name[32];
  std::snprintf(name, sizeof name, "step_%07lld", (long long)step);
  std::filesystem::remove_all(to);
  std::filesystem::create_directories(to);
  std::filesystem::copy(from / name, to / name, std::filesystem::copy_options::recursive);
  std::filesystem::copy_file(from / "metrics.jsonl", to / "metrics.jsonl");
}

inline std::string file_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  EXPECT_TRUE(in.good()) << p;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// step -> loss of the step rows; a step logged twice fails the test.
inline std::map<int64_t, double> step_losses(const std::filesystem::path& metrics) {
  std::map<int64_t, double> out;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("loss")) continue;  // an epoch's validation row
    const int64_t step = j["step"].get<int64_t>();
    EXPECT_TRUE(out.emplace(step, j["loss"].get<double>()).second) << "step " << step << " logged twice in " << metrics;
  }
  return out;
}

// Trains `cfg` (2 epochs, checkpoint.every 5, every checkpoint kept) straight
// through, then, for a crash after step 5, after the first epoch's end and
// after a mid-epoch checkpoint of the second epoch, resumes a copy of the run
// directory and expects the uninterrupted run's model.safetensors and
// optimizer.safetensors byte for byte, each step logged once with the same
// loss, and `same_figures(resumed, straight)` (the test split's figures).
// `train(config, resume)` runs the trainer quietly.
template <class Config, class Result>
void expect_resumes_end_as_the_straight_run(const std::filesystem::path& dir, Config cfg,
                                            const std::function<Result(const Config&, bool)>& train,
                                            const std::function<void(const Result&, const Result&)>& same_figures) {
  cfg.epochs = 2;
  cfg.checkpoint_every = 5;
  cfg.keep_checkpoints = 0;  // keep all
  cfg.out_dir = (dir / "run").string();
  const Result straight = train(cfg, false);
  const int64_t per_epoch = straight.steps / cfg.epochs;
  ASSERT_NE(per_epoch % 5, 0) << "the test wants mid-epoch checkpoints apart from the epoch ends";
  const auto straight_losses = step_losses(dir / "run" / "metrics.jsonl");
  ASSERT_EQ(int64_t(straight_losses.size()), straight.steps);
  const std::filesystem::path last_straight(straight.checkpoint);

  for (const int64_t at : {int64_t(5), per_epoch, (per_epoch / 5 + 1) * 5}) {
    SCOPED_TRACE("resumed at step " + std::to_string(at));
    const std::filesystem::path run = dir / ("resumed_" + std::to_string(at));
    copy_run_crashed_after(dir / "run", at, run);
    Config c = cfg;
    c.out_dir = run.string();
    const Result r = train(c, true);
    EXPECT_EQ(r.start_step, at);
    EXPECT_EQ(r.steps, straight.steps);
    const std::filesystem::path last(r.checkpoint);
    EXPECT_EQ(last.filename(), last_straight.filename());
    for (const char* f : {"model.safetensors", "optimizer.safetensors"})
      EXPECT_TRUE(file_bytes(last / f) == file_bytes(last_straight / f))
          << f << " differs from the uninterrupted run's";
    EXPECT_EQ(step_losses(run / "metrics.jsonl"), straight_losses);
    same_figures(r, straight);
  }
}

// After a run `r` that train.early_stop ended: a --resume trains nothing
// more and reports the same figures (the best epoch read back from
// best/best.json); then, with the run's own checkpoints removed, a fresh
// run and a --resume that finds no checkpoint are both refused the
// directory that holds the best epoch. `train(resume)` runs the trainer.
template <class Result>
void expect_stopped_run_stays_stopped(const std::filesystem::path& run_dir, const Result& r,
                                      const std::function<Result(bool resume)>& train) {
  const Result again = train(true);
  EXPECT_EQ(again.start_step, r.steps);
  EXPECT_EQ(again.steps, r.steps) << "the resumed run trained on";
  EXPECT_TRUE(again.early_stopped);
  EXPECT_EQ(again.best_epoch, r.best_epoch);
  EXPECT_EQ(again.test.loss, r.test.loss);

  namespace fs = std::filesystem;
  for (const auto& e : std::vector<fs::directory_entry>(fs::directory_iterator(run_dir), {}))
    if (e.path().filename().string().starts_with("step_")) fs::remove_all(e.path());
  for (const bool resume : {false, true}) {
    std::string message = "no error";
    try {
      train(resume);
    } catch (const std::exception& e) {
      message = e.what();
    }
    EXPECT_NE(message.find("holds an earlier run's best epoch"), std::string::npos)
        << "resume " << resume << ": " << message;
  }
}

}  // namespace brisk::testing
