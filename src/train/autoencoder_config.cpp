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
    {"checkpoint", detail::kEpochCheckpointKeys},
};

AutoencoderConfig config_from_table(const toml::table& root) {
  AutoencoderConfig c;
  detail::Reader r(root);
  std::string kind = "autoencoder";
  r.get("model", "kind", kind);
  if (kind != "autoencoder") throw ConfigError("config: model.kind must be \"autoencoder\" here, got '" + kind + "'");
  detail::read_body_model_keys(r, c.model);
  r.get("model", "latent", c.model.latent);
  r.get("data", "store", c.store);
  detail::read_split_keys(r, c);
  detail::read_epoch_train_keys(r, c);
  r.get("train", "input_dropout", c.input_dropout);
  detail::read_checkpoint_keys(r, c);

  c.model.validate();
  // The decoder's outputs are residues: a larger vocabulary has outputs that
  // are none, which decode wrote as '?' and encode then refused.
  if (c.model.vocab_size != data::kFastaVocab)
    throw ConfigError("config: model.vocab_size must be " + std::to_string(data::kFastaVocab) +
                      " (the FASTA residues and specials) for a sequence autoencoder, got " +
                      std::to_string(c.model.vocab_size));
  detail::check_epoch_train_keys(c);
  if (!(c.input_dropout >= 0 && c.input_dropout < 1))
    throw ConfigError("config: train.input_dropout must be in [0, 1), got " + std::to_string(c.input_dropout));
  detail::check_keep_best(c, "val_accuracy");
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
  s << "[model]\nkind = \"autoencoder\"\n";
  detail::write_body_model_keys(s, c.model);
  s << "latent = " << c.model.latent << "\nattention = " << toml_string(c.model.attention)
    << "\n\n[data]\nstore = " << toml_string(c.store) << "\n";
  detail::write_split_keys(s, c);
  s << "\n[train]\n";
  detail::write_epoch_train_keys(s, c);
  s << "input_dropout = " << toml_number(c.input_dropout) << "\n";
  detail::write_checkpoint_keys(s, c);
  return s.str();
}

}  // namespace brisk::train
