// `brisk plan <config.toml>`: the memory a training run will need, for each
// recomputation level, planned before anything is allocated or run
// (plan_cmd.cpp). main.cpp only adds it and runs it when it was chosen.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace brisk::cli {

struct PlanCommand {
  CLI::App* app = nullptr;   // `plan`: true in a bool context when it was chosen
  std::function<int()> run;  // prints the table, returns the exit code
};

PlanCommand add_plan_command(CLI::App& parent);

}  // namespace brisk::cli
