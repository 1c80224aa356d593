// Sequence autoencoder configs (autoencoder_config.h): the known keys and their checks.
#include "brisk/train/autoencoder_config.h"

#include <cmath>
#include <sstream>

#include "brisk/data/converters.h"
#include "brisk/train/config.h"
#include "toml_config.h"

namespace brisk::train {

using core::ConfigError;

AutoencoderConfig::AutoencoderConfig() {
  model.vocab_size = data::kFastaVocab;
  schedule.max_lr = 1e-3f;
  schedule.warmup_steps = 20;
  adamw.weight_decay = 0.01f;
}

namespace {

const detail::KnownKeys kKnownKeys = {
    {"model", {"kind", "vocab_size", "n_layer", "n_embd", "n_head", "max_len", "latent", "attention"}},
    {"data", {"store", "train_frac", "val_frac", "split_seed", "bucket", "cache_mb"}},
    {"train", {"batch", "epochs", "lr", "min_lr_ratio", "warmup", "schedule", "weight_decay", "grad_clip", "beta1",
               "beta2", "eps", "input_dropout", "seed", "threads", "loader_workers", "log_every"}},
    {"checkpoint", {"dir", "keep"}},
};

AutoencoderConfig config_from_table(const toml::table& root) {
  AutoencoderConfig c;
  detail::Reader r(root);
  std::string kind = "autoencoder";
  r.get("model", "kind", kind);
  if (kind != "autoencoder") throw ConfigError("config: model.kind must be \"autoencoder\" here, got '" + kind + "'");
  r.get("model", "vocab_size", c.model.vocab_size);
  r.get("model", "n_layer", c.model.n_layer);
  r.get("model", "n_embd", c.model.n_embd);
  r.get("model", "n_head", c.model.n_head);
  r.get("model", "max_len", c.model.max_len);
  r.get("model", "latent", c.model.latent);
  r.get("model", "attention", c.model.attention);
  r.get("data", "store", c.store);
  r.get("data", "train_frac", c.train_frac);
  r.get("data", "val_frac", c.val_frac);
  r.get("data", "split_seed", c.split_seed);
  r.get("data", "bucket", c.bucket);
  r.get("data", "cache_mb", c.cache_mb);
  r.get("train", "batch", c.batch);
  r.get("train", "epochs", c.epochs);
  r.get("train", "lr", c.schedule.max_lr);
  r.get("train", "min_lr_ratio", c.schedule.min_lr_ratio);
  r.get("train", "warmup", c.schedule.warmup_steps);
  std::string schedule = "cosine";
  r.get("train", "schedule", schedule);
  c.schedule.kind = optim::LrSchedule::parse(schedule);
  if (c.schedule.kind != optim::Schedule::constant && c.schedule.kind != optim::Schedule::linear &&
      c.schedule.kind != optim::Schedule::cosine)
    throw ConfigError("config: train.schedule '" + schedule +
                      "' is for GPT runs; an autoencoder run takes constant, linear or cosine");
  r.get("train", "weight_decay", c.adamw.weight_decay);
  r.get("train", "grad_clip", c.adamw.grad_clip);
  r.get("train", "beta1", c.adamw.beta1);
  r.get("train", "beta2", c.adamw.beta2);
  r.get("train", "eps", c.adamw.eps);
  r.get("train", "input_dropout", c.input_dropout);
  r.get("train", "seed", c.seed);
  r.get("train", "threads", c.threads);
  r.get("train", "loader_workers", c.loader_workers);
  r.get("train", "log_every", c.log_every);
  r.get("checkpoint", "dir", c.out_dir);
  r.get("checkpoint", "keep", c.keep_checkpoints);

  c.model.validate();
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
  positive(c.cache_mb, "data.cache_mb");
  if (c.batch > (int64_t(1) << 31) / c.model.max_len)
    throw ConfigError("config: train.batch x model.max_len must stay below 2^31 tokens");
  if (c.loader_workers > 64)
    throw ConfigError("config: train.loader_workers must be at most 64, got " + std::to_string(c.loader_workers));
  if (!(c.schedule.max_lr > 0) || !std::isfinite(c.schedule.max_lr))
    throw ConfigError("config: train.lr must be a positive finite number");
  if (c.schedule.min_lr_ratio < 0 || c.schedule.min_lr_ratio > 1)
    throw ConfigError("config: train.min_lr_ratio must be in [0, 1]");
  if (!(c.adamw.weight_decay >= 0) || !std::isfinite(c.adamw.weight_decay))
    throw ConfigError("config: train.weight_decay must be a finite number >= 0");
  if (!(c.adamw.grad_clip >= 0) || !std::isfinite(c.adamw.grad_clip))
    throw ConfigError("config: train.grad_clip must be a finite number >= 0 (0 disables clipping)");
  if (!(c.adamw.beta1 >= 0 && c.adamw.beta1 < 1) || !(c.adamw.beta2 >= 0 && c.adamw.beta2 < 1))
    throw ConfigError("config: train.beta1 and train.beta2 must be in [0, 1)");
  if (!(c.adamw.eps > 0) || !std::isfinite(c.adamw.eps))
    throw ConfigError("config: train.eps must be a positive finite number");
  if (!(c.input_dropout >= 0 && c.input_dropout < 1))
    throw ConfigError("config: train.input_dropout must be in [0, 1), got " + std::to_string(c.input_dropout));
  c.adamw.lr = c.schedule.max_lr;
  return c;
}

}  // namespace

bool is_autoencoder_config(const std::string& path, const std::vector<std::string>& overrides) {
  return detail::model_kind_of(path, overrides) == "autoencoder";
}

AutoencoderConfig load_autoencoder_config(const std::string& path, const std::vector<std::string>& overrides) {
  return detail::load_toml_config<AutoencoderConfig>(path, overrides, kKnownKeys, config_from_table);
}

AutoencoderConfig parse_autoencoder_config(std::string_view text, const std::string& name,
                                           const std::vector<std::string>& overrides) {
  return detail::parse_toml_config<AutoencoderConfig>(text, name, overrides, kKnownKeys, config_from_table);
}

std::string to_toml(const AutoencoderConfig& c) {
  std::ostringstream s;
  const char* kinds[] = {"constant", "linear", "cosine"};
  s << "[model]\nkind = \"autoencoder\"\nvocab_size = " << c.model.vocab_size << "\nn_layer = " << c.model.n_layer
    << "\nn_embd = " << c.model.n_embd << "\nn_head = " << c.model.n_head << "\nmax_len = " << c.model.max_len
    << "\nlatent = " << c.model.latent << "\nattention = " << toml_string(c.model.attention)
    << "\n\n[data]\nstore = " << toml_string(c.store) << "\ntrain_frac = " << c.train_frac
    << "\nval_frac = " << c.val_frac << "\nsplit_seed = " << c.split_seed
    << "\nbucket = " << (c.bucket ? "true" : "false") << "\ncache_mb = " << c.cache_mb << "\n\n[train]\nbatch = "
    << c.batch << "\nepochs = " << c.epochs << "\nlr = " << c.schedule.max_lr
    << "\nmin_lr_ratio = " << c.schedule.min_lr_ratio << "\nwarmup = " << c.schedule.warmup_steps
    << "\nschedule = \"" << kinds[int(c.schedule.kind)] << "\"\nweight_decay = " << c.adamw.weight_decay
    << "\ngrad_clip = " << c.adamw.grad_clip << "\nbeta1 = " << c.adamw.beta1 << "\nbeta2 = " << c.adamw.beta2
    << "\neps = " << c.adamw.eps << "\ninput_dropout = " << c.input_dropout << "\nseed = " << c.seed << "\nthreads = " << c.threads
    << "\nloader_workers = " << c.loader_workers << "\nlog_every = " << c.log_every
    << "\n\n[checkpoint]\ndir = " << toml_string(c.out_dir) << "\nkeep = " << c.keep_checkpoints << "\n";
  return s.str();
}

}  // namespace brisk::train
