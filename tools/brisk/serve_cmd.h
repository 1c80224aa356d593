// `brisk serve` (serve_cmd.cpp): main.cpp adds it and runs it when chosen.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace brisk::cli {

struct ServeCommand {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

ServeCommand add_serve_command(CLI::App& app);

}  // namespace brisk::cli
