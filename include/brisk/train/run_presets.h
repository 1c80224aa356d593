// Run presets: named groups of training settings (`brisk train --preset P`,
// or `[train] preset = "P"`). A preset only fills keys: every key the config
// file or a --set names keeps its own value, so a preset is a starting point,
// never a mode. The table in docs/tuning.md is generated from these lists
// (tests/unit/run_presets_test.cpp checks that they agree).
#pragma once

#include <string>
#include <vector>

namespace brisk::train {

struct PresetKey {
  std::string section, key;
  std::string value;  // as TOML: true, 2, "full"
  std::string why;    // the measurement or reason behind it
};

struct RunPreset {
  std::string name;
  std::string purpose;
  std::vector<PresetKey> keys;
  // Halve the default micro-batch and accumulate over two (train.batch = 4,
  // train.grad_accum = 2: the defaults' 8 sequences per optimizer step),
  // applied only when neither train.batch nor train.grad_accum is set, so the
  // tokens per optimizer step never change behind a config's back.
  bool split_micro_batch = false;
};

// high-performance, memory-constrained, production.
const std::vector<RunPreset>& run_presets();
// Throws ConfigError naming train.preset and listing the presets.
const RunPreset& find_run_preset(const std::string& name);

}  // namespace brisk::train
