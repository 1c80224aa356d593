// Sequence autoencoder configs (autoencoder_config.h): the known keys and their checks.
#include "brisk/train/autoencoder_config.h"

#include <cmath>
#include <sstream>

#include "brisk/data/converters.h"
#include "brisk/train/config.h"
#include "epoch_config.h"
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
    {"train", detail::epoch_train_keys({"input_dropout"})},
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
  detail::read_epoch_train_keys(r, c);
  r.get("train", "input_dropout", c.input_dropout);
  r.get("checkpoint", "dir", c.out_dir);
  r.get("checkpoint", "keep", c.keep_checkpoints);

  c.model.validate();
  detail::check_epoch_train_keys(c);
  if (c.cache_mb <= 0) throw ConfigError("config: data.cache_mb must be positive, got " + std::to_string(c.cache_mb));
  if (!(c.input_dropout >= 0 && c.input_dropout < 1))
    throw ConfigError("config: train.input_dropout must be in [0, 1), got " + std::to_string(c.input_dropout));
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
  s << "[model]\nkind = \"autoencoder\"\nvocab_size = " << c.model.vocab_size << "\nn_layer = " << c.model.n_layer
    << "\nn_embd = " << c.model.n_embd << "\nn_head = " << c.model.n_head << "\nmax_len = " << c.model.max_len
    << "\nlatent = " << c.model.latent << "\nattention = " << toml_string(c.model.attention)
    << "\n\n[data]\nstore = " << toml_string(c.store) << "\ntrain_frac = " << c.train_frac
    << "\nval_frac = " << c.val_frac << "\nsplit_seed = " << c.split_seed
    << "\nbucket = " << (c.bucket ? "true" : "false") << "\ncache_mb = " << c.cache_mb << "\n\n[train]\n";
  detail::write_epoch_train_keys(s, c);
  s << "input_dropout = " << c.input_dropout << "\n\n[checkpoint]\ndir = " << toml_string(c.out_dir)
    << "\nkeep = " << c.keep_checkpoints << "\n";
  return s.str();
}

}  // namespace brisk::train
