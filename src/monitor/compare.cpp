// Regressions of run B against run A (compare.h). Per-step figures
// (tokens/s, MFU) compare medians over the steps after the first, with A's
// interquartile range as the noise band: B regresses when its median falls
// behind A's by more than that range (or 2% of A's median, where A was so
// steady that its range says nothing). The final loss is taken at the last
// step both runs reached, as the median over the last tenth of the steps up
// to there, so a longer run is not judged on steps the other never made.
// Memory has no per-step spread: the plan is deterministic (5% allowed) and
// peak RSS varies a little between runs (10% allowed).
#include "brisk/monitor/compare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace brisk::monitor {

namespace {

constexpr double kMinRelTolerance = 0.02;   // tokens/s and MFU: at least 2% of A's median
constexpr double kLossRelTolerance = 0.01;  // final loss: at least 1% of A's
constexpr double kPlanTolerance = 0.05;     // planned memory: 5%
constexpr double kRssTolerance = 0.10;      // peak RSS: 10%

// The values of `key` in the step rows after the first with step in (from, to].
std::vector<double> values(const RunData& r, const std::string& key, int64_t from = -1, int64_t to = INT64_MAX,
                           bool skip_first = true) {
  std::vector<double> v;
  bool first = true;
  for (const MetricsRow& row : r.rows) {
    if (!row.has("loss") && !row.has("ms_per_step") && !row.has("lr")) continue;  // a validation row
    const bool was_first = first;
    first = false;
    if (skip_first && was_first) continue;
    if (row.step <= from || row.step > to) continue;
    if (auto it = row.values.find(key); it != row.values.end()) v.push_back(it->second);
  }
  return v;
}

MetricComparison per_step(const RunData& a, const RunData& b, const std::string& key, const char* metric,
                          double scale) {
  MetricComparison m;
  m.metric = metric;
  m.higher_is_better = true;
  std::vector<double> va = values(a, key), vb = values(b, key);
  // 0 means not measured (an MFU without a known peak), in either run.
  if (va.empty() || vb.empty() || quantile(va, 0.5) <= 0 || quantile(vb, 0.5) <= 0) {
    m.basis = "not recorded by both runs";
    return m;
  }
  for (double& x : va) x *= scale;
  for (double& x : vb) x *= scale;
  m.available = true;
  m.a = quantile(va, 0.5);
  m.b = quantile(vb, 0.5);
  m.a_spread = quantile(va, 0.75) - quantile(va, 0.25);
  m.tolerance = std::max(m.a_spread, kMinRelTolerance * std::abs(m.a));
  m.regression = m.b < m.a - m.tolerance;
  m.basis = "median over " + std::to_string(va.size()) + " / " + std::to_string(vb.size()) +
            " steps after the first; allowed: max(A's IQR, 2% of A)";
  return m;
}

MetricComparison final_loss(const RunData& a, const RunData& b) {
  MetricComparison m;
  m.metric = "final loss";
  m.higher_is_better = false;
  const int64_t last = std::min(a.summary.counters.last_step, b.summary.counters.last_step);
  const int64_t window = std::max<int64_t>(5, last / 10);
  std::vector<double> va = values(a, "loss", last - window, last, false), vb = values(b, "loss", last - window, last, false);
  if (va.empty() || vb.empty()) {
    m.basis = "no common steps with a loss";
    return m;
  }
  m.available = true;
  m.a = quantile(va, 0.5);
  m.b = quantile(vb, 0.5);
  m.a_spread = quantile(va, 0.75) - quantile(va, 0.25);
  m.tolerance = std::max(m.a_spread, kLossRelTolerance * std::abs(m.a));
  m.regression = m.b > m.a + m.tolerance;
  m.basis = "median loss over steps " + std::to_string(std::max<int64_t>(1, last - window + 1)) + ".." +
            std::to_string(last) + " (the last both reached); allowed: max(A's IQR there, 1% of A)";
  return m;
}

MetricComparison one_off(const char* metric, bool have, double a, double b, double rel, const char* basis) {
  MetricComparison m;
  m.metric = metric;
  m.higher_is_better = false;
  if (!have || a <= 0 || b <= 0) {
    m.basis = "not recorded by both runs (run_summary.json)";
    return m;
  }
  m.available = true;
  m.a = a;
  m.b = b;
  m.tolerance = rel * a;
  m.regression = b > a + m.tolerance;
  m.basis = basis;
  return m;
}

}  // namespace

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = q * double(v.size() - 1);
  const size_t lo = size_t(std::floor(pos)), hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - double(lo));
}

bool Comparison::any_regression() const {
  return std::any_of(rows.begin(), rows.end(), [](const MetricComparison& m) { return m.regression; });
}

Comparison compare_runs(const RunData& a, const RunData& b) {
  Comparison c;
  c.a_name = a.name.empty() ? a.dir : a.name;
  c.b_name = b.name.empty() ? b.dir : b.name;
  c.rows.push_back(per_step(a, b, "tokens_per_s", "tokens/s", 1.0));
  c.rows.push_back(per_step(a, b, "mfu", "MFU %", 100.0));
  c.rows.push_back(final_loss(a, b));
  const RunSummary &sa = a.summary, &sb = b.summary;
  const double mib = 1.0 / double(1 << 20);
  c.rows.push_back(one_off("planned memory MiB", sa.has_memory_plan && sb.has_memory_plan,
                           double(sa.memory.total()) * mib, double(sb.memory.total()) * mib, kPlanTolerance,
                           "the memory plan's total; allowed: 5% (the plan is deterministic)"));
  c.rows.push_back(one_off("peak RSS MiB", sa.has_facts && sb.has_facts, double(sa.peak_rss_bytes) * mib,
                           double(sb.peak_rss_bytes) * mib, kRssTolerance,
                           "the training process's VmHWM; allowed: 10%"));
  return c;
}

std::string format_comparison(const Comparison& c) {
  std::string out = "== B against A ==\nA: " + c.a_name + "\nB: " + c.b_name + "\n";
  char buf[256];
  std::snprintf(buf, sizeof buf, "%-20s %14s %14s %9s %14s %14s  %s\n", "metric", "A", "B", "change", "A spread (IQR)",
                "allowed", "verdict");
  out += buf;
  for (const MetricComparison& m : c.rows) {
    if (!m.available) {
      std::snprintf(buf, sizeof buf, "%-20s %14s %14s %9s %14s %14s  %s\n", m.metric.c_str(), "-", "-", "-", "-", "-",
                    "n/a");
    } else {
      const char* verdict = m.regression ? "REGRESSION" : "ok";
      std::snprintf(buf, sizeof buf, "%-20s %14.6g %14.6g %+8.1f%% %14.4g %14.4g  %s\n", m.metric.c_str(), m.a, m.b,
                    100 * m.change(), m.a_spread, m.tolerance, verdict);
    }
    out += buf;
  }
  out += c.any_regression() ? "REGRESSION: B falls behind A beyond A's own spread (see above)\n"
                            : "no regression of B against A\n";
  return out;
}

}  // namespace brisk::monitor
