// `brisk report`: reads each run directory (monitor::load_run), names the
// runs, compares B against A when asked, writes the page atomically and
// prints one line per run (its score) plus the comparison table. Exit code
// 0 whether or not B regressed -- the table and the page say REGRESSION --
// unless --fail-on-regression asks for 1, for scripts and CI.
#include "report_cmd.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "brisk/core/atomic_file.h"
#include "brisk/core/error.h"
#include "brisk/core/safetensors.h"
#include "brisk/monitor/compare.h"
#include "brisk/monitor/report.h"
#include "cli_checks.h"

namespace brisk::cli {

namespace {

struct Args {
  std::vector<std::string> runs;
  std::vector<std::string> compare;
  std::string out = "report.html";
  bool fail_on_regression = false;
};

int run_report(const Args& a) {
  std::vector<std::string> dirs = a.compare;  // A and B first: the comparison names them A and B
  dirs.insert(dirs.end(), a.runs.begin(), a.runs.end());
  if (dirs.empty()) throw core::ConfigError("brisk report: name at least one run directory (or --compare A B)");
  for (const std::string& d : dirs) core::check_output_not_input(a.out, d);  // --out run/metrics.jsonl
  std::vector<monitor::RunData> runs;
  for (const std::string& d : dirs) runs.push_back(monitor::load_run(d));
  monitor::name_runs(runs);

  std::optional<monitor::Comparison> cmp;
  if (!a.compare.empty()) cmp = monitor::compare_runs(runs[0], runs[1]);
  core::write_file_atomic(a.out, monitor::html_report(runs, cmp ? &*cmp : nullptr));

  for (const monitor::RunData& r : runs) {
    const std::string score = r.advice.score >= 0 ? std::to_string(r.advice.score) + "/100" : "no score";
    std::printf("%-24s %s, score %s%s\n", r.name.c_str(), r.dir.c_str(), score.c_str(),
                r.advice_recorded ? "" : " (computed here: the run wrote no recommendations.json)");
  }
  if (cmp) std::printf("\n%s", monitor::format_comparison(*cmp).c_str());
  std::printf("\nreport: %s\n", a.out.c_str());
  return cmp && cmp->any_regression() && a.fail_on_regression ? 1 : 0;
}

}  // namespace

ReportCommand add_report_command(CLI::App& parent) {
  auto* app = parent.add_subcommand(
      "report", "One self-contained HTML page of training runs: plots over steps, recommendations, memory, config");
  auto args = std::make_shared<Args>();
  app->add_option("runs", args->runs, "Run directories (checkpoint.dir of each run); several overlay in every plot");
  app->add_option("--compare", args->compare,
                  "Two run directories A B: flag regressions of B against A (tokens/s, MFU, final loss, memory) "
                  "beyond A's own spread")
      ->expected(2);
  app->add_option("--out", args->out, "The HTML file to write")->check(output_file())->capture_default_str();
  app->add_flag("--fail-on-regression", args->fail_on_regression,
                "Exit code 1 when --compare finds a regression (default: 0, with REGRESSION in the table)");
  ReportCommand cmd;
  cmd.app = app;
  cmd.run = [args]() {
    if (args->fail_on_regression && args->compare.empty())
      throw core::ConfigError("brisk report: --fail-on-regression needs --compare A B");
    return run_report(*args);
  };
  return cmd;
}

void print_run_advice(const std::string& run_dir) {
  const std::string path = (std::filesystem::path(run_dir) / "recommendations.json").string();
  std::ifstream in(path);
  if (!in) return;
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return;
  std::printf("\n%s", monitor::format_advice(monitor::advice_from_json(j, path)).c_str());
  std::printf("report         brisk report %s --out report.html\n", run_dir.c_str());
}

}  // namespace brisk::cli
