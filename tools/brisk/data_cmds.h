// `brisk data emails` and `brisk data fasta2lmdb`: the record-store
// converters' command lines (data_cmds.cpp), kept out of main.cpp so that it
// only wires subcommands together.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace brisk::cli {

struct DataCommands {
  CLI::App* emails = nullptr;
  CLI::App* fasta = nullptr;
  std::function<int()> run;  // runs whichever of the two was parsed; 0 = none
  bool parsed() const { return (emails && *emails) || (fasta && *fasta); }
};

// Adds both subcommands under `data`.
DataCommands add_data_commands(CLI::App& data);

}  // namespace brisk::cli
