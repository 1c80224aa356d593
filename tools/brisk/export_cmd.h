// `brisk export onnx --checkpoint C --out model.onnx`: a checkpoint as an ONNX
// model (export_cmd.cpp, docs/export.md). main.cpp only adds it and runs it
// when it was chosen.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace brisk::cli {

struct ExportCommand {
  CLI::App* app = nullptr;   // `export`: true in a bool context when it was chosen
  std::function<int()> run;  // runs the chosen format's export, returns the exit code
};

ExportCommand add_export_command(CLI::App& parent);

}  // namespace brisk::cli
