#include "epoch_resume.h"

#include <cstring>
#include <sstream>

#include "brisk/core/error.h"
#include "brisk/data/token_hash.h"
#include "stop_signal.h"

namespace brisk::train::detail {

namespace {

template <class T>
std::string text(const T& v) {
  std::ostringstream s;
  s << std::boolalpha << v;
  return s.str();
}

}  // namespace

void check_resumable(const std::string& ckpt, const SavedRun& saved, uint64_t seed, const EpochRunState& now,
                     int64_t total_steps) {
  if (!saved.run)
    throw core::ConfigError("checkpoint " + ckpt +
                            " has no record of its batch stream (its state.json has no \"run\"; it was written "
                            "before epoch-based runs could be resumed): it cannot be resumed, start the run afresh");
  const EpochRunState& was = *saved.run;
  // The keys that decide which records go into which batch, in config order.
  auto same = [&](const char* key, const auto& then, const auto& here) {
    if (then == here) return;
    throw core::ConfigError("checkpoint " + ckpt + " was trained with " + key + " = " + text(then) +
                            ", this config has " + text(here) +
                            ": the batches from here on would not be the stopped run's (set " + key + " = " +
                            text(then) + " to resume it)");
  };
  same("data.split_seed", was.split_seed, now.split_seed);
  same("data.train_frac", was.train_frac, now.train_frac);
  same("data.val_frac", was.val_frac, now.val_frac);
  same("data.bucket", was.bucket, now.bucket);
  same("train.batch", was.batch, now.batch);
  same("train.seed", saved.seed, seed);
  if (was.train_records != now.train_records || was.steps_per_epoch != now.steps_per_epoch)
    throw core::ConfigError("checkpoint " + ckpt + " was trained on a train split of " +
                            std::to_string(was.train_records) + " records (" + std::to_string(was.steps_per_epoch) +
                            " steps per epoch); the store gives " + std::to_string(now.train_records) + " (" +
                            std::to_string(now.steps_per_epoch) +
                            ") with the same split settings: data.store holds other records now");
  if (!was.train_digest.empty() && was.train_digest != now.train_digest)
    throw core::ConfigError("checkpoint " + ckpt + " was trained on other records: the train split's " +
                            std::to_string(now.train_records) +
                            " records differ from the stopped run's (data.store holds other records now)");
  if (saved.step > total_steps)
    throw core::ConfigError("checkpoint " + ckpt + " is at step " + std::to_string(saved.step) +
                            ", past this config's " + std::to_string(total_steps) + " steps (train.epochs x " +
                            std::to_string(now.steps_per_epoch) + " steps per epoch): raise train.epochs to go on");
}

std::string split_digest(const std::vector<std::string>& record_digests, const std::vector<int64_t>& train,
                         const std::vector<int32_t>* labels) {
  std::vector<int32_t> words;
  words.reserve(train.size() * 5);
  for (int64_t i : train) {
    const std::string& d = record_digests[size_t(i)];
    for (size_t k = 0; k + 4 <= d.size(); k += 4) {
      int32_t w;
      std::memcpy(&w, d.data() + k, 4);
      words.push_back(w);
    }
    if (labels) words.push_back((*labels)[size_t(i)]);
  }
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned char c : data::token_digest(words)) out += {hex[c >> 4], hex[c & 15]};
  return out;
}

std::string resumed_line(const std::string& ckpt, int64_t step, int64_t steps_per_epoch, int64_t total_steps) {
  if (step >= total_steps)
    return "resumed from " + ckpt + " at step " + std::to_string(step) +
           ", the run's last: nothing left to train; evaluating and reporting\n";
  return "resumed from " + ckpt + " at step " + std::to_string(step) + " (epoch " +
         std::to_string(step / steps_per_epoch + 1) + ", " + std::to_string(step % steps_per_epoch) + " of its " +
         std::to_string(steps_per_epoch) + " steps done)\n";
}

std::string stopped_line(int64_t step, const std::string& ckpt) {
  return std::string("stopped by ") + stop_signal_name(stop_signal()) + " after step " + std::to_string(step) +
         ": checkpoint saved to " + ckpt + "; the same command with --resume continues the run\n";
}

}  // namespace brisk::train::detail
