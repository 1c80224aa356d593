// A run started without --resume into a checkpoint.dir that holds an earlier
// run's checkpoints would mix the two: checkpoint.keep prunes by name, so the
// new run's first checkpoints (lower steps) were deleted as soon as they were
// written, and --resume, generate, eval and classify then found the old
// run's newest. Every trainer refuses such a directory before touching it.
// Internal to src/train.
#pragma once

#include <filesystem>
#include <string>

#include "brisk/core/error.h"
#include "brisk/train/checkpoint.h"

namespace brisk::train::detail {

inline void refuse_earlier_checkpoints(const std::string& out_dir) {
  const std::string earlier = latest_checkpoint(out_dir);
  if (earlier.empty()) return;
  throw core::ConfigError("checkpoint.dir " + out_dir + " holds an earlier run's checkpoints (newest " + earlier +
                          "): continue that run with --resume, or give this run another checkpoint.dir (or remove "
                          "them)");
}

// A directory the run will create (checkpoint.dir, --trace's): refused up
// front, naming `what`, when a file sits where one of its parents should be.
// The filesystem's own error named neither the key nor the file, and came
// after the run directory was written.
inline void check_creatable_dir(const std::string& dir, const std::string& what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (fs::path p = fs::path(dir); !p.empty(); p = p.parent_path()) {
    if (fs::exists(p, ec)) {
      if (!fs::is_directory(p, ec))
        throw core::ConfigError(what + " '" + dir + "': " + p.string() + " is a file, not a directory");
      return;
    }
    if (p == p.parent_path()) return;
  }
}

}  // namespace brisk::train::detail
