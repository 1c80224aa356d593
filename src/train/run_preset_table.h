// train.preset applied to a parsed TOML config (run_presets.h): internal to
// src/train, used by config.cpp before it reads any key.
#pragma once

#include "toml_config.h"

namespace brisk::train::detail {

// `root` with the keys of its train.preset filled in where root leaves them
// unset (root itself when it names no preset). Throws ConfigError for an
// unknown preset name or a train.preset that is not a string.
toml::table with_run_preset(const toml::table& root);

}  // namespace brisk::train::detail
