// Reading a run directory for the report (report.h: load_run, name_runs).
// recommendations.json is shown as the run recorded it; a run without one
// (the encoder classifier's, or one from before the file existed) gets the
// advice computed here from what its directory holds.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "brisk/core/error.h"
#include "brisk/monitor/report.h"

namespace brisk::monitor {

namespace fs = std::filesystem;

namespace {

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw core::IoError(p.string() + ": cannot read");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

RunData load_run(const std::string& dir) {
  RunData r;
  r.dir = dir;
  r.summary = load_run_summary(dir, &r.rows);  // checks the directory and metrics.jsonl first
  const fs::path rec = fs::path(dir) / "recommendations.json";
  if (fs::exists(rec)) {
    const nlohmann::json j = nlohmann::json::parse(read_all(rec), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) throw core::IoError(rec.string() + ": not valid JSON (damaged or truncated)");
    r.advice = advice_from_json(j, rec.string());
    r.advice_recorded = true;
  } else {
    r.advice = advise(r.summary);
  }
  if (fs::exists(fs::path(dir) / "config.toml")) r.config_toml = read_all(fs::path(dir) / "config.toml");
  if (fs::exists(fs::path(dir) / "report.json")) r.encoder_report = read_all(fs::path(dir) / "report.json");
  return r;
}

void name_runs(std::vector<RunData>& runs) {
  // Start from the last component; where two runs share it, take one more
  // component for all of them, up to the whole path.
  std::vector<fs::path> paths;
  for (const RunData& r : runs) {
    fs::path p = fs::path(r.dir).lexically_normal();
    if (!p.empty() && p.filename().empty()) p = p.parent_path();  // "runs/a/" -> "runs/a"
    paths.push_back(p.relative_path());  // "/" is no name
  }
  std::vector<int> depth(runs.size(), 1);
  auto label = [&](size_t i) {
    std::vector<std::string> parts;
    for (const auto& c : paths[i]) parts.push_back(c.string());
    const size_t n = std::min(parts.size(), size_t(depth[i]));
    std::string s;
    for (size_t k = parts.size() - n; k < parts.size(); ++k) s += (s.empty() ? "" : "/") + parts[k];
    return s.empty() ? runs[i].dir : s;
  };
  for (int round = 0; round < 64; ++round) {
    std::vector<bool> clash(runs.size(), false);
    for (size_t i = 0; i < runs.size(); ++i)
      for (size_t j = i + 1; j < runs.size(); ++j)
        if (label(i) == label(j)) clash[i] = clash[j] = true;
    bool grew = false;
    for (size_t i = 0; i < runs.size(); ++i)
      if (clash[i] && depth[i] < int(std::distance(paths[i].begin(), paths[i].end()))) ++depth[i], grew = true;
    if (!grew) break;  // no clash left, or only the same path twice
  }
  for (size_t i = 0; i < runs.size(); ++i) runs[i].name = label(i);
  // The same directory twice: number them.
  for (size_t i = 0; i < runs.size(); ++i)
    for (size_t j = i + 1; j < runs.size(); ++j)
      if (runs[i].name == runs[j].name) runs[j].name += " (" + std::to_string(j + 1) + ")";
}

}  // namespace brisk::monitor
