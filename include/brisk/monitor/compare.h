// `brisk report --compare A B`: does run B regress against run A? Each
// figure is compared against A's own spread, so noise that A itself shows
// from step to step is not called a regression (compare.cpp;
// docs/monitoring.md, "Comparing runs").
#pragma once

#include <string>
#include <vector>

#include "brisk/monitor/report.h"

namespace brisk::monitor {

struct MetricComparison {
  std::string metric;              // "tokens/s", "MFU", "final loss", "planned memory", "peak RSS"
  bool higher_is_better = true;
  bool available = false;          // both runs recorded it
  double a = 0, b = 0;             // A's and B's figure (medians over steps for per-step counters)
  double a_spread = 0;             // A's interquartile range over the same steps (0 for one-off figures)
  double tolerance = 0;            // how far B may fall behind before it is a regression
  bool regression = false;
  std::string basis;               // how the figures were taken, one line
  double change() const { return a != 0 ? (b - a) / a : 0.0; }
};

struct Comparison {
  std::string a_name, b_name;
  std::vector<MetricComparison> rows;
  bool any_regression() const;
};

Comparison compare_runs(const RunData& a, const RunData& b);

// A fixed-width table, one row per metric, "REGRESSION" where B regressed.
std::string format_comparison(const Comparison& c);

// Linear-interpolated quantile q in [0, 1] of v (0 for an empty v).
double quantile(std::vector<double> v, double q);

}  // namespace brisk::monitor
