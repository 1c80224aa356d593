// train.keep_best and train.early_stop of the encoder classifier: the best
// validation so far, kept beside the run's checkpoints in <out_dir>/best/
// (its weights as a checkpoint, and best.json with the metric, the score,
// the epoch and the checkpoint's name in best/, so that the run directory
// may move), so that a resumed run compares with,
// and stops early by, what the stopped run had seen. Internal to src/train.
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

  // Written after the best checkpoint itself: a crash between the two leaves
  // the previous best.json, which names the previous (still kept) weights.
  void write() const {
    const nlohmann::json j = {{"metric", metric},
                              {"score", score},
                              {"epoch", epoch},
                              {"step", step},
                              {"checkpoint", std::filesystem::path(checkpoint).filename().string()}};
    core::write_file_atomic(json_path(), j.dump(2) + "\n");
  }
};

// A fresh run's record (nothing kept yet), or a resumed run's from
// <out_dir>/best/best.json. A best.json kept by another metric is set aside
// (`note` says so): the resumed run keeps its best by the one it names now.
inline BestEpoch read_best_epoch(const std::string& metric, const std::string& out_dir, std::string* note) {
  BestEpoch b;
  b.metric = metric;
  b.dir = (std::filesystem::path(out_dir) / "best").string();
  if (!b.on() || !std::filesystem::exists(b.json_path())) return b;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(core::read_file(b.json_path()));
    if (j.at("metric").get<std::string>() != metric) {
      *note = "keep_best: " + b.json_path() + " was kept by " + j.at("metric").get<std::string>() +
              "; this run keeps its best by " + metric + " from here on\n";
      return b;
    }
    b.score = j.at("score").is_null() ? NAN : j.at("score").get<double>();
    b.epoch = j.at("epoch").get<int64_t>();
    b.step = j.at("step").get<int64_t>();
    const std::string name = j.at("checkpoint").get<std::string>();
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
      throw core::IoError(b.json_path() + ": checkpoint '" + name + "' is not a checkpoint's name in " + b.dir);
    b.checkpoint = (std::filesystem::path(b.dir) / name).string();
  } catch (const nlohmann::json::exception& e) {
    throw core::IoError(b.json_path() + ": not a best-epoch record (" + e.what() + ")");
  }
  if (b.epoch < 1 || b.step < 1 || !std::filesystem::exists(std::filesystem::path(b.checkpoint) / "state.json"))
    throw core::IoError(b.json_path() + ": names epoch " + std::to_string(b.epoch) + ", step " +
                        std::to_string(b.step) + " and checkpoint '" + b.checkpoint +
                        "', which is not a kept checkpoint");
  return b;
}

}  // namespace brisk::train::detail
