// What the benchmark programs of bench/ share: reading a flag's value from
// the command line, the median of repeated timings, and writing the JSON.
#pragma once

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "brisk/core/atomic_file.h"

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

// A flag's value as a whole number >= lo, or the program ends (exit 2)
// naming the flag: atoi read "abc" as 0 and "2x" as 2, stoi threw past main.
inline long long int_value(const char* text, const char* flag, const char* program, long long lo = 0) {
  long long v = 0;
  const char* end = text + std::strlen(text);
  const auto [p, ec] = std::from_chars(text, end, v);
  if (ec != std::errc() || p != end || *text == '\0' || v < lo) {
    std::fprintf(stderr, "%s: %s needs a whole number >= %lld, got '%s'\n", program, flag, lo, text);
    std::exit(2);
  }
  return v;
}

// A flag's value as a finite number > lo (>= lo when inclusive), or the
// program ends (exit 2) naming the flag.
inline double number_value(const char* text, const char* flag, const char* program, double lo, bool inclusive = false) {
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text, &end);
  if (*text == '\0' || *end != '\0' || errno != 0 || !(v == v) || v == std::numeric_limits<double>::infinity() ||
      (inclusive ? v < lo : v <= lo)) {
    std::fprintf(stderr, "%s: %s needs a number %s %g, got '%s'\n", program, flag, inclusive ? ">=" : ">", lo, text);
    std::exit(2);
  }
  return v;
}

// Writes `text` to `path` with core::write_file_atomic (a temporary file
// renamed into place), its directory created first. A failure ends the
// program (exit 1) naming the path: a bench must not say "wrote" for a file
// it could not write.
inline void write_json(const std::string& path, const std::string& text, const char* program) {
  try {
    const std::filesystem::path out(path);
    if (out.has_parent_path()) std::filesystem::create_directories(out.parent_path());
    core::write_file_atomic(path, text);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: cannot write %s: %s\n", program, path.c_str(), e.what());
    std::exit(1);
  }
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
