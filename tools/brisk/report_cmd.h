// `brisk report RUN [RUN...] [--out report.html] [--compare A B]
// [--fail-on-regression]`: one self-contained HTML page about training
// runs, and the regression check of B against A (report_cmd.cpp). main.cpp
// only adds it, runs it when chosen, and calls print_run_advice() at the
// end of `brisk train`.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>

namespace brisk::cli {

struct ReportCommand {
  CLI::App* app = nullptr;   // `report`: true in a bool context when it was chosen
  std::function<int()> run;  // writes the page, prints the comparison; returns the exit code
};

ReportCommand add_report_command(CLI::App& parent);

// Prints run_dir/recommendations.json as text (nothing when the run wrote
// none): the end of `brisk train`'s summary.
void print_run_advice(const std::string& run_dir);

}  // namespace brisk::cli
