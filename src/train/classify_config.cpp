// Encoder classifier configs (classify_config.h): the known keys and their checks.
#include "brisk/train/classify_config.h"

#include <cmath>
#include <optional>
#include <sstream>

#include "brisk/train/config.h"
#include "epoch_config.h"
#include "toml_config.h"

namespace brisk::train {

using core::ConfigError;

namespace {

const detail::KnownKeys kKnownKeys = {
    {"model", {"kind", "preset", "vocab_size", "n_layer", "n_embd", "n_head", "max_len", "n_classes", "attention",
               "dropout", "attention_dropout", "classifier_dropout"}},
    {"data", {"store", "label_names", "strip_headers", "train_frac", "val_frac", "split_seed", "bucket", "cache_mb"}},
    {"train", detail::epoch_train_keys({"label_smoothing", "class_weights"})},
    {"checkpoint", detail::kEpochCheckpointKeys},
};

ClassifyConfig config_from_table(const toml::table& root) {
  ClassifyConfig c;
  detail::Reader r(root);
  std::string kind = "encoder";
  r.get("model", "kind", kind);
  if (kind != "encoder") throw ConfigError("config: model.kind must be \"encoder\" here, got '" + kind + "'");
  r.get("model", "preset", c.preset);
  if (!c.preset.empty()) c.model = models::EncoderConfig::preset(c.preset);
  detail::read_body_model_keys(r, c.model);
  r.get("model", "n_classes", c.model.n_classes);
  c.model.dropout = detail::read_probability(r, "model", "dropout", c.model.dropout);
  c.model.attention_dropout = detail::read_probability(r, "model", "attention_dropout", c.model.attention_dropout);
  // Unset, it follows model.dropout, as Hugging Face's classifier_dropout
  // follows the hidden dropout.
  c.model.classifier_dropout = detail::read_probability(r, "model", "classifier_dropout", c.model.dropout);
  r.get("data", "store", c.store);
  if (const toml::node* n = root.at_path("data.label_names").node()) {
    const toml::array* a = n->as_array();
    if (!a) throw ConfigError("config: data.label_names must be an array of strings");
    for (const toml::node& e : *a) {
      if (!e.is_string()) throw ConfigError("config: data.label_names must be an array of strings");
      c.label_names.push_back(e.value<std::string>().value());
    }
  }
  r.get("data", "strip_headers", c.strip_headers);
  detail::read_split_keys(r, c);
  detail::read_epoch_train_keys(r, c);
  c.model.label_smoothing = detail::read_probability(r, "train", "label_smoothing", c.model.label_smoothing);
  // train.class_weights: "none", "balanced" (from the train split's label
  // counts, at run time), or one number per class.
  if (const toml::node* n = root.at_path("train.class_weights").node()) {
    const toml::array* a = n->as_array();
    const std::optional<std::string> mode = n->value<std::string>();
    bool ok = a ? !a->empty() : mode == "none" || mode == "balanced";
    for (size_t i = 0; ok && a && i < a->size(); ++i) ok = (*a)[i].is_number();
    if (!ok)
      throw ConfigError("config: train.class_weights must be \"none\", \"balanced\" or an array of numbers (one "
                        "per class)");
    c.class_weights = a ? "given" : *mode;
    for (size_t i = 0; a && i < a->size(); ++i) c.model.class_weights.push_back(float(*(*a)[i].value<double>()));
  }
  detail::read_checkpoint_keys(r, c);

  c.model.validate();
  if (c.label_names.empty())
    for (int64_t k = 0; k < c.model.n_classes; ++k) c.label_names.push_back(std::to_string(k));
  if (int64_t(c.label_names.size()) != c.model.n_classes)
    throw ConfigError("config: data.label_names has " + std::to_string(c.label_names.size()) +
                      " names but model.n_classes is " + std::to_string(c.model.n_classes));
  detail::check_epoch_train_keys(c);
  detail::check_keep_best(c, "val_f1");
  return c;
}

}  // namespace

bool is_encoder_config(const std::string& path, const std::vector<std::string>& overrides) {
  return detail::model_kind_of(path, overrides) == "encoder";
}

ClassifyConfig load_classify_config(const std::string& path, const std::vector<std::string>& overrides) {
  return detail::load_toml_config<ClassifyConfig>(path, overrides, kKnownKeys, config_from_table);
}

ClassifyConfig parse_classify_config(std::string_view text, const std::string& name,
                                     const std::vector<std::string>& overrides) {
  return detail::parse_toml_config<ClassifyConfig>(text, name, overrides, kKnownKeys, config_from_table);
}

std::string to_toml(const ClassifyConfig& c) {
  std::ostringstream s;
  s << "[model]\nkind = \"encoder\"\n";
  detail::write_body_model_keys(s, c.model);
  s << "n_classes = " << c.model.n_classes << "\nattention = " << toml_string(c.model.attention)
    << "\ndropout = " << toml_number(c.model.dropout)
    << "\nattention_dropout = " << toml_number(c.model.attention_dropout)
    << "\nclassifier_dropout = " << toml_number(c.model.classifier_dropout)
    << "\n\n[data]\nstore = " << toml_string(c.store) << "\nlabel_names = [";
  for (size_t i = 0; i < c.label_names.size(); ++i) s << (i ? ", " : "") << toml_string(c.label_names[i]);
  s << "]\nstrip_headers = " << (c.strip_headers ? "true" : "false") << "\n";
  detail::write_split_keys(s, c);
  s << "\n[train]\n";
  detail::write_epoch_train_keys(s, c);
  s << "label_smoothing = " << toml_number(c.model.label_smoothing) << "\nclass_weights = ";
  if (c.class_weights != "balanced" && !c.model.class_weights.empty()) {  // "given", or set through the API
    s << "[";
    for (size_t i = 0; i < c.model.class_weights.size(); ++i)
      s << (i ? ", " : "") << toml_number(c.model.class_weights[i]);
    s << "]\n";
  } else {
    s << toml_string(c.class_weights == "balanced" ? "balanced" : "none") << "\n";
  }
  detail::write_checkpoint_keys(s, c);
  return s.str();
}

}  // namespace brisk::train
