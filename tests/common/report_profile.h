// The op profile a run's report.json holds when it ran with --profile
// (options.profile): how often an op ran in the train steps. The precision
// tests read it to tell a bf16 train graph (its weights cast at their use)
// from an fp32 one (no casts at all).
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace brisk::testing {

// Calls of `op` in the report's "profile" (0 when it never ran).
inline int64_t profile_calls(const std::filesystem::path& report_json, const std::string& op) {
  const nlohmann::json report = nlohmann::json::parse(std::ifstream(report_json));
  const nlohmann::json& profile = report.at("profile");
  return profile.contains(op) ? profile.at(op).at("calls").get<int64_t>() : 0;
}

}  // namespace brisk::testing
