// The run presets (run_presets.h) and their application to a parsed config
// (run_preset_table.h). Each key carries the measurement that chose it, so
// the docs table and `brisk train --help` say why, not only what.
#include "brisk/train/run_presets.h"

#include "run_preset_table.h"

namespace brisk::train {

const std::vector<RunPreset>& run_presets() {
  static const std::vector<RunPreset> kPresets = {
      {"high-performance",
       "the fastest step measured on this code base, memory no object",
       {{"model", "fused_classifier", "true",
         "the largest single gain of the W2 ablation (1.10x); W1 within noise; W1 planned peak 1626 -> 521 MiB (brisk tune)"},
        {"model", "attention", "\"plain\"", "flash fwd+bwd takes ~1.13x plain's time at W2's shape (bench_attention)"},
        {"model", "fuse_bias_gelu", "false", "no gain measured (gpt.h: W2 fwd+bwd 1127 vs 1126 ms, within +-1%)"},
        {"model", "fuse_residual_layernorm", "\"auto\"",
         "off on the CPU, no gain (gpt.h: W2 fwd+bwd 1127 vs 1131 ms); on on a GPU (G1 34.3 vs 34.8 ms/step)"},
        {"train", "recompute", "\"none\"", "recomputation only adds work (full: +23% of a W2 step's FLOPs)"},
        {"train", "fused_adamw", "true", "one parallel AdamW pass over every parameter"},
        {"train", "loader_workers", "2", "batches prefetched off the training thread: data wait ~0"}},
       false},
      {"memory-constrained",
       "the smallest planned peak at the same tokens per optimizer step",
       {{"train", "recompute", "\"full\"", "W2 arena 371 -> 78 MiB (brisk plan), +23% FLOPs"},
        {"model", "fused_classifier", "true", "the (B*T, V) logits never exist: W1 arena 950 -> 222 MiB"},
        {"model", "attention", "\"flash\"", "saves per-row statistics instead of (B, H, T, T) probabilities"},
        {"train", "loader_workers", "1", "3 loader slots and one thread stack instead of 5 and two"}},
       true},
      {"production",
       "a long unattended run: regular checkpoints and validation, no surprises",
       {{"checkpoint", "every", "250", "a crash loses at most 250 steps"},
        {"checkpoint", "keep", "5", "room to step back past a bad stretch"},
        {"train", "eval_every", "250", "validation loss with every checkpoint"},
        {"train", "eval_batches", "32", "a steadier validation figure than the default 8 batches"},
        {"train", "log_every", "50", "quieter logs; metrics.jsonl still has every step"},
        {"train", "precision_fallback", "true", "a precision without a fast path trains in fp32, with a warning"}},
       false},
  };
  return kPresets;
}

const RunPreset& find_run_preset(const std::string& name) {
  std::string names;
  for (const RunPreset& p : run_presets()) {
    if (p.name == name) return p;
    names += (names.empty() ? "" : ", ") + p.name;
  }
  throw core::ConfigError("config: train.preset: unknown preset '" + name + "' (allowed: " + names + ")");
}

namespace detail {

toml::table with_run_preset(const toml::table& given) {
  const toml::node* n = given.at_path("train.preset").node();
  if (!n) return given;
  if (!n->is_string()) throw ConfigError("config: train.preset must be a string");
  const RunPreset& preset = find_run_preset(n->value<std::string>().value());
  toml::table root = given;
  auto set_if_unset = [&root](const std::string& section, const std::string& key, const std::string& value) {
    if (!root.contains(section)) root.insert(section, toml::table{});
    toml::table* t = root[section].as_table();
    if (!t || t->contains(key)) return;  // the file or --set said it: theirs wins
    toml::table parsed = toml::parse("v = " + value);
    t->insert(key, *parsed["v"].node());
  };
  for (const PresetKey& k : preset.keys) set_if_unset(k.section, k.key, k.value);
  if (preset.split_micro_batch && !root.at_path("train.batch").node() && !root.at_path("train.grad_accum").node()) {
    set_if_unset("train", "batch", "4");
    set_if_unset("train", "grad_accum", "2");
  }
  return root;
}

}  // namespace detail

}  // namespace brisk::train
