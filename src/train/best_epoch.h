// train.keep_best and train.early_stop of the epoch-based runs (the encoder
// classifier and the sequence autoencoder): the best validation so far,
// kept beside the run's checkpoints in <out_dir>/best/ (its weights as a
// checkpoint, and best.json with the metric, the score, the epoch and the
// checkpoint's name in best/, so that the run directory may move), so that
// a resumed run compares with, and stops early by, what the stopped run had
// seen. Internal to src/train.
#pragma once

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace brisk::train::detail {

// best.json's name in a keep_best directory.
inline constexpr const char* kBestRecord = "best.json";

// What <dir>/best.json records. `checkpoint` is the full path of the
// checkpoint it names in dir.
struct BestRecord {
  std::string metric;
  int64_t epoch = 0;  // 1-based
  int64_t step = 0;
  double score = 0;   // NaN is written as null
  std::string checkpoint;
};

// Reads <dir>/best.json, nullopt when there is none. A damaged one (not JSON, a field missing or of the wrong type, a
// checkpoint name that is a path or names nothing there) is an IoError
// naming the file, the field and `way_out`.
std::optional<BestRecord> read_best_record(const std::string& dir, const std::string& way_out);

// The checkpoint a keep_best directory's best.json names, or "" when dir
// has no best.json (latest_checkpoint: a crash between saving a new best
// and recording it leaves a newer unrecorded step_* beside the recorded
// one, which the resumed run removes).
std::string recorded_best_checkpoint(const std::string& dir);

struct BestEpoch {
  std::string metric = "none";  // "val_loss" (lower is better), or an accuracy or F1 (higher)
  std::string dir;              // <out_dir>/best
  int64_t epoch = 0;            // 1-based; 0: none yet
  int64_t step = 0;
  double score = 0;
  std::string checkpoint;

  bool on() const { return metric != "none"; }
  bool lower_is_better() const { return metric == "val_loss"; }
  // Strictly better than every earlier epoch (a tie is no improvement); a
  // NaN score never is, and any score beats a NaN.
  bool better(double s) const {
    if (std::isnan(s)) return false;
    if (epoch == 0 || std::isnan(score)) return true;
    return lower_is_better() ? s < score : s > score;
  }
  std::string json_path() const { return (std::filesystem::path(dir) / kBestRecord).string(); }

  // Records `ckpt` (just written into dir, beside the previous best) as the
  // best, then removes the other checkpoints in dir. In that order, a crash
  // at any point leaves best.json naming a checkpoint that is there.
  void replace_with(const std::string& ckpt, int64_t new_epoch, int64_t new_step, double new_score);
};

// The keep_best / early_stop bookkeeping of one run, shared by the epoch
// trainers: each gives its own metric's score, description and checkpoint
// writer.
class KeepBest {
 public:
  // `metric`: train.keep_best ("none" turns everything off). A fresh run
  // (`resuming` false: also a --resume that found no checkpoint) is refused
  // a directory that already holds best/; a resumed one reads its own
  // best.json (one kept by another metric is set aside: note()). Refuses an
  // empty validation split (`split` describes the split for the message).
  KeepBest(const std::string& metric, int64_t early_stop, const std::string& out_dir, bool resuming,
           bool val_empty, const std::string& split);

  bool on() const { return best_.on(); }
  const BestEpoch& best() const { return best_; }
  const std::string& note() const { return note_; }  // "" or a line to print
  // The start-up line ("keep_best: the epoch with the best <what> keeps ...").
  std::string start_line(const std::string& what) const;

  // At the start of an epoch, after `epochs_done` epochs: true when
  // early_stop epochs in a row did not beat the best one (*line says so).
  bool patience_out(int64_t epochs_done, std::string* line) const;

  // After the validation of epoch `epoch` (0-based) at `step`: when `score`
  // beats every earlier epoch, `save(dir)` writes the weights into dir
  // (returning the checkpoint's path) and they become the best.
  void consider(double score, int64_t epoch, int64_t step, const std::function<std::string(const std::string&)>& save);
  // report.json's "best": metric, score, epoch, step, checkpoint.
  nlohmann::json report() const;
  // The result's line: "best epoch N (metric S): val and test are its weights' figures (checkpoint)".
  std::string result_line() const;

  // A train step changed the weights: the model no longer holds the best ones.
  void trained() { in_model_ = false; }
  // The model holds the best epoch's weights (none trained since it was kept).
  bool in_model() const { return in_model_; }

 private:
  BestEpoch best_;
  int64_t early_stop_ = 0;
  std::string note_;
  bool in_model_ = false;
};

}  // namespace brisk::train::detail
