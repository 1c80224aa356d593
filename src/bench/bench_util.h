// Helpers the benchmarks share: where the checkout is, child processes with
// their own peak RSS (each side of a comparison runs in a process of its
// own, so its high-water mark is its own), and small formatting bits.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace brisk::bench {

double median(std::vector<double> v);  // the mean of the middle two for even sizes
std::string self_exe();                // this executable's path
// The checkout this binary belongs to: the first directory, walking up from
// the working directory and then from the executable, that holds
// bench/torch_peer.py. Defaults (data, peer script, results) hang off it, so
// `brisk bench` works from the repository root and from build/<dir> alike.
std::filesystem::path repo_root();
// A path relative to the working directory when it lies below it.
std::string shown(const std::filesystem::path& p);
std::string now_iso();  // UTC, e.g. 2026-11-21T12:00:00Z
// The machine's CPU time so far, busy and total, in clock ticks (/proc/stat);
// in a VM it counts every tenant's work.
std::pair<double, double> machine_cpu_ticks();

struct ChildResult {
  int exit_code = -1;     // -1: did not exit normally
  std::string signal;     // set when killed by a signal
  std::string out;        // everything it wrote on stdout
  double maxrss_mib = 0;  // the kernel's high-water mark for it
  double others_pct = -1; // share of the machine's CPU time others used meanwhile
};

// Runs argv[0] with stdout captured and stderr passed through (progress).
// Started with posix_spawn (vfork semantics), so the child's high-water mark
// is its own and never includes a copy of ours.
ChildResult run_child(const std::vector<std::string>& argv);

// The last stdout line that parses as a JSON object: the child's report.
std::optional<nlohmann::json> report_of(const std::string& out);

}  // namespace brisk::bench
