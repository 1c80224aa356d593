// train.keep_best and train.early_stop of the encoder classifier: the best
// validation so far, kept beside the run's checkpoints in <out_dir>/best/
// (its weights as a checkpoint, and best.json with the metric, the score,
// the epoch and the checkpoint's name in best/, so that the run directory
// may move), so that a resumed run compares with, and stops early by, what
// the stopped run had seen. Internal to src/train.
#pragma once

#include <cmath>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "brisk/core/atomic_file.h"
#include "brisk/core/error.h"
#include "brisk/core/safetensors.h"  // read_file
#include "brisk/train/classifier_trainer.h"

namespace brisk::train::detail {

struct BestEpoch {
  std::string metric = "none";  // "val_loss" (lower is better) or "val_f1" (higher)
  std::string dir;              // <out_dir>/best
  int64_t epoch = 0;            // 1-based; 0: none yet
  int64_t step = 0;
  double score = 0;
  std::string checkpoint;

  bool on() const { return metric != "none"; }
  double score_of(const ClassMetrics& m) const { return metric == "val_loss" ? m.loss : m.f1; }
  // Strictly better than every earlier epoch (a tie is no improvement); a
  // NaN score never is, and any score beats a NaN.
  bool better(const ClassMetrics& m) const {
    const double s = score_of(m);
    if (std::isnan(s)) return false;
    if (epoch == 0 || std::isnan(score)) return true;
    return metric == "val_loss" ? s < score : s > score;
  }
  std::string json_path() const { return (std::filesystem::path(dir) / "best.json").string(); }

  // Records `ckpt` (just written into dir, beside the previous best) as the
  // best, then removes the other checkpoints in dir. In that order, a crash
  // at any point leaves best.json naming a checkpoint that is there.
  void replace_with(const std::string& ckpt, int64_t new_epoch, int64_t new_step, double new_score) {
    namespace fs = std::filesystem;
    checkpoint = ckpt, epoch = new_epoch, step = new_step, score = new_score;
    const nlohmann::json j = {{"metric", metric},
                              {"score", score},
                              {"epoch", epoch},
                              {"step", step},
                              {"checkpoint", fs::path(checkpoint).filename().string()}};
    core::write_file_atomic(json_path(), j.dump(2) + "\n");
    for (const auto& e : std::vector<fs::directory_entry>(fs::directory_iterator(dir), {}))
      if (e.is_directory() && e.path().filename() != fs::path(checkpoint).filename()) fs::remove_all(e.path());
  }
};

// A fresh run's record (nothing kept yet), or a resumed run's from
// <out_dir>/best/best.json. A best.json kept by another metric is set aside
// (`note` says so): the resumed run keeps its best by the one it names now.
inline BestEpoch read_best_epoch(const std::string& metric, const std::string& out_dir, std::string* note) {
  namespace fs = std::filesystem;
  BestEpoch b;
  b.metric = metric;
  b.dir = (fs::path(out_dir) / "best").string();
  if (!b.on() || !fs::exists(b.json_path())) return b;
  const auto fail = [&](const std::string& what) {
    throw core::IoError(b.json_path() + ": " + what + " (remove " + b.dir +
                        " to resume without the best epoch so far, or set train.keep_best = \"none\")");
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(core::read_file(b.json_path()));
  } catch (const nlohmann::json::exception& e) {
    fail(std::string("not JSON: ") + e.what());
  }
  const auto field = [&](const char* key, bool ok) -> const nlohmann::json& {
    if (!j.is_object() || !j.contains(key) || !ok)
      fail(std::string("field '") + key + "' is missing or of the wrong type");
    return j[key];
  };
  const auto has = [&](const char* key, auto test) { return j.is_object() && j.contains(key) && test(j[key]); };
  const std::string kept_by =
      field("metric", has("metric", [](const nlohmann::json& v) { return v.is_string(); })).get<std::string>();
  if (kept_by != metric) {
    *note = "keep_best: " + b.json_path() + " was kept by " + kept_by + "; this run keeps its best by " + metric +
            " from here on\n";
    return b;
  }
  const auto integer = [](const nlohmann::json& v) { return v.is_number_integer() && v.get<int64_t>() >= 1; };
  b.epoch = field("epoch", has("epoch", integer)).get<int64_t>();
  b.step = field("step", has("step", integer)).get<int64_t>();
  const auto number_or_null = [](const nlohmann::json& v) { return v.is_number() || v.is_null(); };
  const nlohmann::json& s = field("score", has("score", number_or_null));
  b.score = s.is_null() ? NAN : s.get<double>();  // a NaN is written as null
  const std::string name =
      field("checkpoint", has("checkpoint", [](const nlohmann::json& v) { return v.is_string(); })).get<std::string>();
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
    fail("checkpoint '" + name + "' is not the name of a checkpoint in " + b.dir);
  b.checkpoint = (fs::path(b.dir) / name).string();
  if (!fs::exists(fs::path(b.checkpoint) / "state.json")) fail("names " + b.checkpoint + ", which is not there");
  return b;
}

}  // namespace brisk::train::detail
