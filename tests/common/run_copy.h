// Helpers for the resume tests of the epoch-based trainers: a run directory
// as a crash after one of its checkpoints would leave it, a file's bytes, and
// the loss of every step in a metrics.jsonl.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace brisk::testing {

// `to` holds checkpoint `step` of the run in `from` and the whole of its
// metrics.jsonl, rows after that step included: a process that died after
// logging steps it never checkpointed.
inline void copy_run_crashed_after(const std::filesystem::path& from, int64_t step, const std::filesystem::path& to) {
  char name[32];
  std::snprintf(name, sizeof name, "step_%07lld", (long long)step);
  std::filesystem::remove_all(to);
  std::filesystem::create_directories(to);
  std::filesystem::copy(from / name, to / name, std::filesystem::copy_options::recursive);
  std::filesystem::copy_file(from / "metrics.jsonl", to / "metrics.jsonl");
}

inline std::string file_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  EXPECT_TRUE(in.good()) << p;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// step -> loss of the step rows; a step logged twice fails the test.
inline std::map<int64_t, double> step_losses(const std::filesystem::path& metrics) {
  std::map<int64_t, double> out;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("loss")) continue;  // an epoch's validation row
    const int64_t step = j["step"].get<int64_t>();
    EXPECT_TRUE(out.emplace(step, j["loss"].get<double>()).second) << "step " << step << " logged twice in " << metrics;
  }
  return out;
}

}  // namespace brisk::testing
