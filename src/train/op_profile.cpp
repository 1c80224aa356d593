#include "op_profile.h"

#include <algorithm>
#include <cstdio>
#include <utility>
#include <vector>

namespace brisk::train::detail {

namespace {

// (seconds, op) of the ops called, largest first, and their total.
std::vector<std::pair<double, int>> ranked(const core::Executor::OpTimes& times, double& total) {
  std::vector<std::pair<double, int>> rows;
  total = 0;
  for (int op = 0; op < core::kNumOps; ++op) {
    const auto& t = times[size_t(op)];
    if (t.calls == 0) continue;
    rows.emplace_back(t.seconds, op);
    total += t.seconds;
  }
  std::sort(rows.rbegin(), rows.rend());
  return rows;
}

}  // namespace

std::string op_time_table(const core::Executor::OpTimes& times) {
  double total = 0;
  std::string out = "op                       calls    seconds   share\n";
  char buf[128];
  for (const auto& [sec, op] : ranked(times, total)) {
    std::snprintf(buf, sizeof buf, "%-24s %6lld %10.3f %6.1f%%\n", std::string(core::op_name(core::OpKind(op))).c_str(),
                  (long long)times[size_t(op)].calls, sec, 100 * sec / std::max(total, 1e-12));
    out += buf;
  }
  return out;
}

nlohmann::json op_times_json(const core::Executor::OpTimes& times) {
  double total = 0;
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [sec, op] : ranked(times, total))
    j[std::string(core::op_name(core::OpKind(op)))] = {
        {"calls", times[size_t(op)].calls}, {"seconds", sec}, {"share", sec / std::max(total, 1e-12)}};
  return j;
}

}  // namespace brisk::train::detail
