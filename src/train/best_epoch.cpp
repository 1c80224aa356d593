// keep_best / early_stop bookkeeping of the epoch trainers (best_epoch.h).
#include "best_epoch.h"

#include <sstream>
#include <vector>

#include "brisk/core/atomic_file.h"
#include "brisk/core/error.h"
#include "brisk/core/safetensors.h"  // read_file
#include "fresh_run.h"               // check_creatable_dir

namespace brisk::train::detail {

namespace fs = std::filesystem;

namespace {

// Removes every directory in dir but the checkpoint `keep` (a path in dir).
void remove_all_but(const std::string& dir, const std::string& keep) {
  for (const auto& e : std::vector<fs::directory_entry>(fs::directory_iterator(dir), {}))
    if (e.is_directory() && e.path().filename() != fs::path(keep).filename()) fs::remove_all(e.path());
}

}  // namespace

std::optional<BestRecord> read_best_record(const std::string& dir, const std::string& way_out) {
  const std::string path = (fs::path(dir) / kBestRecord).string();
  if (!fs::exists(path)) return std::nullopt;
  const auto fail = [&](const std::string& what) { throw core::IoError(path + ": " + what + " (" + way_out + ")"); };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(core::read_file(path));
  } catch (const nlohmann::json::exception& e) {
    fail(std::string("not JSON: ") + e.what());
  }
  const auto field = [&](const char* key, auto test) -> const nlohmann::json& {
    if (!j.is_object() || !j.contains(key) || !test(j[key]))
      fail(std::string("field '") + key + "' is missing or of the wrong type");
    return j[key];
  };
  const auto string = [](const nlohmann::json& v) { return v.is_string(); };
  const auto count = [](const nlohmann::json& v) { return v.is_number_integer() && v.get<int64_t>() >= 1; };
  const auto number_or_null = [](const nlohmann::json& v) { return v.is_number() || v.is_null(); };
  BestRecord r;
  r.metric = field("metric", string).get<std::string>();
  r.epoch = field("epoch", count).get<int64_t>();
  r.step = field("step", count).get<int64_t>();
  const nlohmann::json& s = field("score", number_or_null);
  r.score = s.is_null() ? NAN : s.get<double>();  // JSON has no NaN: it is written as null
  const std::string name = field("checkpoint", string).get<std::string>();
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
    fail("checkpoint '" + name + "' is not the name of a checkpoint in " + dir);
  r.checkpoint = (fs::path(dir) / name).string();
  if (!fs::exists(fs::path(r.checkpoint) / "state.json")) fail("names " + r.checkpoint + ", which is not there");
  return r;
}

std::string recorded_best_checkpoint(const std::string& dir) {
  const std::optional<BestRecord> r =
      read_best_record(dir, "remove it to read the newest checkpoint in " + dir + " instead");
  return r ? r->checkpoint : std::string();
}

void BestEpoch::replace_with(const std::string& ckpt, int64_t new_epoch, int64_t new_step, double new_score) {
  checkpoint = ckpt, epoch = new_epoch, step = new_step, score = new_score;
  const nlohmann::json j = {{"metric", metric},
                            {"score", score},
                            {"epoch", epoch},
                            {"step", step},
                            {"checkpoint", fs::path(checkpoint).filename().string()}};
  core::write_file_atomic(json_path(), j.dump(2) + "\n");
  remove_all_but(dir, checkpoint);
}

KeepBest::KeepBest(const std::string& metric, int64_t early_stop, const std::string& out_dir, bool resuming,
                   bool val_empty, const std::string& split)
    : early_stop_(early_stop) {
  best_.metric = metric;
  best_.dir = (fs::path(out_dir) / "best").string();
  // A fresh run must not inherit another run's best epoch; a resumed one reads its own.
  if (!resuming && fs::exists(best_.dir))
    throw core::ConfigError("checkpoint.dir " + out_dir + " holds an earlier run's best epoch (" + best_.dir +
                            ") but no checkpoint to resume: give this run another checkpoint.dir, or remove it");
  check_creatable_dir(best_.dir, "checkpoint.dir's best/");
  if (!on()) return;
  if (val_empty)
    throw core::ConfigError("train.keep_best = \"" + metric + "\" needs a validation split, but this one is empty (" +
                            split + "): raise data.val_frac");
  const std::optional<BestRecord> r = read_best_record(
      best_.dir, "remove " + best_.dir + " to resume without the best epoch so far, or set train.keep_best = \"none\"");
  if (!r) return;
  // What a crash left beside the recorded checkpoint (a newer best saved but
  // not yet recorded, or an older one not yet removed) goes now.
  remove_all_but(best_.dir, r->checkpoint);
  if (r->metric != metric) {
    note_ = "keep_best: " + best_.json_path() + " was kept by " + r->metric + "; this run keeps its best by " +
            metric + " from here on\n";
    return;
  }
  best_.epoch = r->epoch, best_.step = r->step, best_.score = r->score, best_.checkpoint = r->checkpoint;
}

std::string KeepBest::start_line(const std::string& what) const {
  std::string line = "keep_best: the epoch with the best " + what + " keeps its weights in " + best_.dir;
  if (early_stop_ > 0)
    line += " | early stop after " + std::to_string(early_stop_) + " epoch(s) without a better one";
  return line + "\n";
}

bool KeepBest::patience_out(int64_t epochs_done, std::string* line) const {
  if (!(early_stop_ > 0 && best_.epoch > 0 && epochs_done - best_.epoch >= early_stop_)) return false;
  *line = "early stop after epoch " + std::to_string(epochs_done) + ": no better " + best_.metric + " in the " +
          std::to_string(early_stop_) + " epoch(s) since epoch " + std::to_string(best_.epoch) + "\n";
  return true;
}

void KeepBest::consider(double score, int64_t epoch, int64_t step,
                        const std::function<std::string(const std::string&)>& save) {
  if (!on() || !best_.better(score)) return;
  best_.replace_with(save(best_.dir), epoch + 1, step, score);
  in_model_ = true;
}

nlohmann::json KeepBest::report() const {
  return {{"metric", best_.metric},
          {"score", best_.score},
          {"epoch", best_.epoch},
          {"step", best_.step},
          {"checkpoint", best_.checkpoint}};
}

std::string KeepBest::result_line() const {
  std::ostringstream s;
  s << "best epoch " << best_.epoch << " (" << best_.metric << " " << best_.score
    << "): val and test are its weights' figures (" << best_.checkpoint << ")\n";
  return s.str();
}

}  // namespace brisk::train::detail
