// `brisk generate` and `brisk quantize` (infer_cmds.cpp): main.cpp adds them
// and runs whichever was chosen.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace brisk::cli {

struct InferCommands {
  CLI::App* generate = nullptr;
  CLI::App* quantize = nullptr;
  std::function<int()> run;
  bool parsed() const { return (generate && *generate) || (quantize && *quantize); }
};

InferCommands add_infer_commands(CLI::App& app);

}  // namespace brisk::cli
