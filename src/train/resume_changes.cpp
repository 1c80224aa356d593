// Settings a resumed run changes; see resume_changes.h.
#include "resume_changes.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

namespace brisk::train::detail {

namespace {

// "section.key" -> value text, from the flat TOML that to_toml writes.
std::map<std::string, std::string> settings_of(const std::string& toml) {
  std::map<std::string, std::string> out;
  std::istringstream in(toml);
  std::string section;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    if (line.front() == '[' && line.back() == ']') {
      section = line.substr(1, line.size() - 2);
      continue;
    }
    const size_t eq = line.find(" = ");
    if (eq == std::string::npos) continue;
    out[section + "." + line.substr(0, eq)] = line.substr(eq + 3);
  }
  return out;
}

// Keys that change how fast or where a run goes, not its updates (the
// kernel fusions and the fused AdamW change rounding at most: equal to
// 1e-7 relative, tests/unit/fusion_test.cpp).
bool shapes_the_run(const std::string& key) {
  static const char* const kNot[] = {"train.threads", "train.loader_workers", "train.log_every", "train.tensorboard",
                                     "data.cache_mb", "checkpoint.dir", "checkpoint.every", "checkpoint.keep",
                                     "dist.timeout_s", "dist.bucket_mb", "dist.backend", "train.fused_adamw",
                                     "train.preset", "train.memory_budget"};
  return !key.starts_with("model.fuse_") && std::find(std::begin(kNot), std::end(kNot), key) == std::end(kNot);
}

}  // namespace

std::vector<std::string> changed_settings(const std::string& old_toml, const std::string& new_toml,
                                          const std::string& defaults_toml) {
  auto before = settings_of(old_toml);
  const auto now = settings_of(new_toml);
  for (const auto& [key, value] : settings_of(defaults_toml)) before.emplace(key, value);  // only where missing
  std::vector<std::string> out;
  auto add = [&](const std::string& key, const std::string& a, const std::string& b) {
    if (a != b && shapes_the_run(key)) out.push_back(key + " " + a + " -> " + b);
  };
  for (const auto& [key, value] : now) {
    const auto it = before.find(key);
    add(key, it == before.end() ? "(none)" : it->second, value);
  }
  for (const auto& [key, value] : before)
    if (!now.count(key)) add(key, value, "(none)");
  return out;
}

std::string changed_settings_line(const std::string& run_dir, const std::string& new_toml,
                                  const std::string& defaults_toml) {
  const std::filesystem::path path = std::filesystem::path(run_dir) / "config.toml";
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  std::ostringstream old;
  old << in.rdbuf();
  const std::vector<std::string> changes = changed_settings(old.str(), new_toml, defaults_toml);
  if (changes.empty()) return {};
  std::string line = "resume: settings changed since the stopped run (" + path.string() + "): ";
  for (size_t i = 0; i < changes.size(); ++i) line += (i ? ", " : "") + changes[i];
  return line + "; the run continues with the new values";
}

}  // namespace brisk::train::detail
