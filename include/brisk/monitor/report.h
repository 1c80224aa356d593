// `brisk report`: one self-contained HTML page about one or more run
// directories (html_report.cpp). Everything is inline -- the plots are SVG
// written here, the style sheet and the few lines of script (legend
// toggling) sit in the page -- so the file can be mailed, archived or opened
// offline and shows the same thing. A run directory needs metrics.jsonl;
// run_summary.json, recommendations.json, config.toml, report.json (the
// encoder classifier's) add their sections where they exist.
#pragma once

#include <string>
#include <vector>

#include "brisk/monitor/advice.h"
#include "brisk/monitor/run_summary.h"

namespace brisk::monitor {

struct Comparison;

struct RunData {
  std::string dir;                 // as given
  std::string name;                // the legend's label (the directory's last component, made unique)
  std::vector<MetricsRow> rows;    // metrics.jsonl
  RunSummary summary;              // run_summary.json (when present) + the counters of rows
  Advice advice;                   // recommendations.json, or computed here when the run has none
  bool advice_recorded = false;    // advice came from recommendations.json
  std::string config_toml;         // config.toml verbatim ("" when absent)
  std::string encoder_report;      // report.json verbatim ("" when absent)
};

// Reads a run directory. Throws IoError naming the file: no directory, no
// metrics.jsonl, a damaged row, a damaged run_summary.json or
// recommendations.json.
RunData load_run(const std::string& dir);

// Gives each run a distinct legend name (the last path component, or more
// of the path where two runs share it).
void name_runs(std::vector<RunData>& runs);

// The page. `comparison` (may be null) adds the regression table.
std::string html_report(const std::vector<RunData>& runs, const Comparison* comparison);

}  // namespace brisk::monitor
