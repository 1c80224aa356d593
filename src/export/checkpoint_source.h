// The checkpoint an export reads, found the same way for every format: a
// checkpoint directory, or a run directory whose newest step_* is used.
#pragma once

#include <string>

#include "brisk/core/error.h"
#include "brisk/train/checkpoint.h"

namespace brisk::exporter {

// Throws ConfigError for an empty path and IoError naming it when it holds
// no checkpoint.
inline std::string checkpoint_to_export(const std::string& checkpoint) {
  if (checkpoint.empty()) throw core::ConfigError("--checkpoint: empty path");
  std::string dir = train::latest_checkpoint(checkpoint);
  if (dir.empty())
    throw core::IoError(checkpoint + ": no checkpoint found (expected a checkpoint directory holding state.json and "
                        "model.safetensors, or a run directory with step_* checkpoints)");
  return dir;
}

}  // namespace brisk::exporter
