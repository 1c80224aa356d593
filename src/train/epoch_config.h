// The keys every epoch-based run shares (the encoder classifier and the
// sequence autoencoder): the encoder body's [model] shape; [data]'s split,
// bucketing and cache; [train]'s batch, epochs, the lr schedule, AdamW,
// seed, threads, loader workers, logging, the blocks' compute precision,
// recomputation, and the best epoch (keep_best, early_stop).
// Read, checked and written back by one piece of code, so the two configs
// cannot drift apart. Internal to src/train; the configs are duck-typed
// (both name these fields alike).
#pragma once

#include <cmath>
#include <ostream>
#include <string>

#include "brisk/optim/optimizer.h"
#include "brisk/train/config.h"
#include "toml_config.h"

namespace brisk::train::detail {

// The [train] keys of an epoch-based run, as KnownKeys lists them.
inline std::vector<std::string> epoch_train_keys(std::vector<std::string> extra = {}) {
  std::vector<std::string> keys = {"batch", "epochs",   "lr",   "min_lr_ratio", "warmup", "schedule",
                                   "weight_decay", "grad_clip", "beta1", "beta2", "eps", "seed",
                                   "threads", "loader_workers", "log_every", "precision", "precision_fallback", "recompute",
                                   "keep_best", "early_stop"};
  keys.insert(keys.end(), extra.begin(), extra.end());
  return keys;
}

template <class Config>
void read_epoch_train_keys(const Reader& r, Config& c) {
  r.get("train", "batch", c.batch);
  r.get("train", "epochs", c.epochs);
  r.get("train", "lr", c.schedule.max_lr);
  r.get("train", "min_lr_ratio", c.schedule.min_lr_ratio);
  r.get("train", "warmup", c.schedule.warmup_steps);
  std::string schedule = "cosine";
  r.get("train", "schedule", schedule);
  c.schedule.kind = optim::LrSchedule::parse(schedule);  // refuses "plateau": it follows a GPT run's val loss
  r.get("train", "weight_decay", c.adamw.weight_decay);
  r.get("train", "grad_clip", c.adamw.grad_clip);
  r.get("train", "beta1", c.adamw.beta1);
  r.get("train", "beta2", c.adamw.beta2);
  r.get("train", "eps", c.adamw.eps);
  r.get("train", "seed", c.seed);
  r.get("train", "threads", c.threads);
  r.get("train", "loader_workers", c.loader_workers);
  r.get("train", "log_every", c.log_every);
  // The blocks' compute precision (the model's `compute`): fp32 or bf16.
  std::string precision = "fp32";
  r.get("train", "precision", precision);
  c.precision = parse_precision(precision);
  if (c.precision == Precision::fp16)
    throw ConfigError("train.precision: fp16 is not available for encoder-bodied runs (it needs dynamic loss "
                      "scaling, which only GPT runs have); allowed here: fp32, bf16");
  r.get("train", "precision_fallback", c.precision_fallback);
  r.get("train", "recompute", c.model.recompute);  // checked (none | selective | full) with the model
  r.get("train", "keep_best", c.keep_best);         // checked by check_keep_best
  r.get("train", "early_stop", c.early_stop);
}

// train.keep_best and train.early_stop (best_epoch.h): "none", "val_loss"
// (lowest), or the run's own higher-is-better score `higher` (the
// classifier's val_f1, the autoencoder's val_accuracy).
template <class Config>
void check_keep_best(const Config& c, const std::string& higher) {
  if (c.keep_best != "none" && c.keep_best != "val_loss" && c.keep_best != higher)
    throw ConfigError("config: train.keep_best: unknown value '" + c.keep_best + "' (allowed: none, val_loss, " +
                      higher + ")");
  if (c.keep_best != "none" && !(c.val_frac > 0))
    throw ConfigError("config: train.keep_best = \"" + c.keep_best +
                      "\" picks the best epoch by validation, but data.val_frac is 0 (no validation split)");
  if (c.early_stop > 0 && c.keep_best == "none")
    throw ConfigError("config: train.early_stop = " + std::to_string(c.early_stop) +
                      " counts epochs without a better train.keep_best score: set train.keep_best to val_loss or " +
                      higher);
}

// After the model was validated (it gives max_len). Sets adamw.lr from the schedule.
template <class Config>
void check_epoch_train_keys(Config& c) {
  if (!(c.train_frac > 0 && c.val_frac >= 0 && c.train_frac + c.val_frac < 1))
    throw ConfigError("config: data.train_frac and data.val_frac must be > 0 and >= 0 with a sum below 1 (the "
                      "rest is the test split), got " + std::to_string(c.train_frac) + " and " +
                      std::to_string(c.val_frac));
  auto positive = [](int64_t v, const char* key) {
    if (v <= 0) throw ConfigError(std::string("config: ") + key + " must be positive, got " + std::to_string(v));
  };
  positive(c.batch, "train.batch");
  positive(c.epochs, "train.epochs");
  positive(c.log_every, "train.log_every");
  if (c.batch > (int64_t(1) << 31) / c.model.max_len)
    throw ConfigError("config: train.batch x model.max_len must stay below 2^31 tokens");
  if (c.loader_workers < 0 || c.loader_workers > 64)
    throw ConfigError("config: train.loader_workers must be in [0, 64], got " + std::to_string(c.loader_workers));
  // 0 turns the cache off (every record decoded at every use); the bound
  // keeps the byte budget (cache_mb << 20) from overflowing.
  if (!(c.cache_mb >= 0 && c.cache_mb <= (int64_t(1) << 24)))
    throw ConfigError("config: data.cache_mb must be in [0, 16777216] (0: no cache), got " +
                      std::to_string(c.cache_mb));
  if (!(c.schedule.max_lr > 0) || !std::isfinite(c.schedule.max_lr))
    throw ConfigError("config: train.lr must be a positive finite number");
  if (!(c.schedule.min_lr_ratio >= 0 && c.schedule.min_lr_ratio <= 1))  // NaN too
    throw ConfigError("config: train.min_lr_ratio must be in [0, 1], got " + toml_number(c.schedule.min_lr_ratio));
  if (c.threads < 0 || c.threads > 4096)
    throw ConfigError("config: train.threads must be in [0, 4096] (0: all cores), got " + std::to_string(c.threads));
  if (!(c.adamw.weight_decay >= 0) || !std::isfinite(c.adamw.weight_decay))
    throw ConfigError("config: train.weight_decay must be a finite number >= 0");
  if (!(c.adamw.grad_clip >= 0) || !std::isfinite(c.adamw.grad_clip))
    throw ConfigError("config: train.grad_clip must be a finite number >= 0 (0 disables clipping)");
  if (!(c.adamw.beta1 >= 0 && c.adamw.beta1 < 1) || !(c.adamw.beta2 >= 0 && c.adamw.beta2 < 1))
    throw ConfigError("config: train.beta1 and train.beta2 must be in [0, 1)");
  if (!(c.adamw.eps > 0) || !std::isfinite(c.adamw.eps))
    throw ConfigError("config: train.eps must be a positive finite number");
  c.adamw.lr = c.schedule.max_lr;
}

// [model]: the encoder body's shape and attention kernel (each model adds
// its own head key: n_classes, latent).
template <class Model>
void read_body_model_keys(const Reader& r, Model& m) {
  r.get("model", "vocab_size", m.vocab_size);
  r.get("model", "n_layer", m.n_layer);
  r.get("model", "n_embd", m.n_embd);
  r.get("model", "n_head", m.n_head);
  r.get("model", "max_len", m.max_len);
  r.get("model", "attention", m.attention);
}

// [data]: the split and the loader's bucketing and record cache.
template <class Config>
void read_split_keys(const Reader& r, Config& c) {
  r.get("data", "train_frac", c.train_frac);
  r.get("data", "val_frac", c.val_frac);
  r.get("data", "split_seed", c.split_seed);
  r.get("data", "bucket", c.bucket);
  r.get("data", "cache_mb", c.cache_mb);
}

// [checkpoint]: where, how often within an epoch (every: steps, 0 = at
// epoch ends only; an epoch's end always saves one), how many to keep.
inline const std::vector<std::string> kEpochCheckpointKeys = {"dir", "every", "keep"};

template <class Config>
void read_checkpoint_keys(const Reader& r, Config& c) {
  r.get("checkpoint", "dir", c.out_dir);
  r.get("checkpoint", "every", c.checkpoint_every);
  r.get("checkpoint", "keep", c.keep_checkpoints);  // (the reader refuses a negative every)
  if (c.out_dir.empty()) throw ConfigError("config: checkpoint.dir must not be empty");
}

template <class Config>
void write_checkpoint_keys(std::ostream& s, const Config& c) {
  s << "\n[checkpoint]\ndir = " << toml_string(c.out_dir) << "\nevery = " << c.checkpoint_every
    << "\nkeep = " << c.keep_checkpoints << "\n";
}

// The body's shape as TOML lines, vocab_size to max_len.
template <class Model>
void write_body_model_keys(std::ostream& s, const Model& m) {
  s << "vocab_size = " << m.vocab_size << "\nn_layer = " << m.n_layer << "\nn_embd = " << m.n_embd
    << "\nn_head = " << m.n_head << "\nmax_len = " << m.max_len << "\n";
}

template <class Config>
void write_split_keys(std::ostream& s, const Config& c) {
  s << "train_frac = " << toml_number(c.train_frac) << "\nval_frac = " << toml_number(c.val_frac) << "\nsplit_seed = " << c.split_seed
    << "\nbucket = " << (c.bucket ? "true" : "false") << "\ncache_mb = " << c.cache_mb << "\n";
}

// The shared [train] keys as TOML lines (no section header).
template <class Config>
void write_epoch_train_keys(std::ostream& s, const Config& c) {
  const char* kinds[] = {"constant", "linear", "cosine"};  // what read_epoch_train_keys accepts
  s << "batch = " << c.batch << "\nepochs = " << c.epochs << "\nlr = " << toml_number(c.schedule.max_lr)
    << "\nmin_lr_ratio = " << toml_number(c.schedule.min_lr_ratio) << "\nwarmup = " << c.schedule.warmup_steps
    << "\nschedule = \"" << kinds[int(c.schedule.kind)] << "\"\nweight_decay = " << toml_number(c.adamw.weight_decay)
    << "\ngrad_clip = " << toml_number(c.adamw.grad_clip) << "\nbeta1 = " << toml_number(c.adamw.beta1) << "\nbeta2 = " << toml_number(c.adamw.beta2)
    << "\neps = " << toml_number(c.adamw.eps) << "\nseed = " << c.seed << "\nthreads = " << c.threads
    << "\nloader_workers = " << c.loader_workers << "\nlog_every = " << c.log_every << "\nprecision = \""
    << precision_name(c.precision) << "\"\nprecision_fallback = " << (c.precision_fallback ? "true" : "false")
    << "\nrecompute = " << toml_string(c.model.recompute) << "\nkeep_best = " << toml_string(c.keep_best)
    << "\nearly_stop = " << c.early_stop << "\n";
}

}  // namespace brisk::train::detail
