// `brisk classify --checkpoint C FILE|DIR...`: a label and its probability
// per message from an encoder classifier checkpoint (classify_cmd.cpp).
// main.cpp only adds it and runs it when it was chosen.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace brisk::cli {

struct ClassifyCommand {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

ClassifyCommand add_classify_command(CLI::App& parent);

}  // namespace brisk::cli
