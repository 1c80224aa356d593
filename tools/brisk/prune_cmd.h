// `brisk prune --checkpoint C --sparsity S --method magnitude|2:4 --out P`:
// prunes a checkpoint's block weights into a new checkpoint and reports the
// zeros per layer (prune_cmd.cpp, docs/pruning.md). main.cpp only adds it and
// runs it when it was chosen.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace brisk::cli {

struct PruneCommand {
  CLI::App* app = nullptr;   // `prune`: true in a bool context when it was chosen
  std::function<int()> run;  // prunes, writes, prints the table; returns the exit code
};

PruneCommand add_prune_command(CLI::App& parent);

}  // namespace brisk::cli
