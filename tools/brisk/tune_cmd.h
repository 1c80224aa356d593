// `brisk tune --config C --memory-budget 4GiB [--time-top N] [--out T]`: the
// micro-batch, recompute level and fused-classifier setting of a training
// config whose planned peak RSS fits a budget, chosen from the memory
// planner without running anything (train/tune.h), optionally confirmed by
// timing the best few for a handful of steps; writes the tuned config
// (tune_cmd.cpp, docs/tuning.md). main.cpp only adds it and runs it.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace brisk::cli {

struct TuneCommand {
  CLI::App* app = nullptr;   // `tune`: true in a bool context when it was chosen
  std::function<int()> run;  // searches, prints, writes; returns the exit code
};

TuneCommand add_tune_command(CLI::App& parent);

}  // namespace brisk::cli
