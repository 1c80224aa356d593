// What the benchmark programs of bench/ share: reading a flag's value from
// the command line, and the median of repeated timings.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <vector>

namespace brisk::bench_cli {

// The argument after argv[i], moving i past it; a flag without one ends the
// program (exit 2) with a message naming the program and the flag.
inline const char* flag_value(int argc, char** argv, int& i, const char* program) {
  if (i + 1 >= argc) {
    std::fprintf(stderr, "%s: %s needs a value\n", program, argv[i]);
    std::exit(2);
  }
  return argv[++i];
}

// The middle element, or the mean of the two middle ones for an even
// count; NaN for none.
inline double median(std::vector<double> v) {
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace brisk::bench_cli
