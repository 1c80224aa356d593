// `brisk bench ...`: the subcommand's options live in bench_cmd.cpp; main.cpp
// only adds it and, after parsing, runs it when it was chosen.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace brisk::cli {

struct BenchCommand {
  CLI::App* app = nullptr;   // `bench`: true in a bool context when it was chosen
  std::function<int()> run;  // runs the chosen bench subcommand, returns the exit code
};

BenchCommand add_bench_command(CLI::App& parent);

}  // namespace brisk::cli
