// Option checks for the command lines, with messages in brisk's words:
// CLI11's PositiveNumber says "Value 0 not in range 0.000000 to 1.797e308".
// CLI11 puts the option's name in front ("--batch: must be ...") and the
// command exits 2 (main.cpp).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

#include "brisk/core/atomic_file.h"
#include "brisk/core/error.h"

namespace brisk::cli {

// An integer >= `least`.
inline CLI::Validator at_least(int64_t least) {
  return CLI::Validator(
      [least](std::string& value) -> std::string {
        int64_t v = 0;
        if (!CLI::detail::lexical_cast(value, v)) return "must be an integer, got '" + value + "'";
        if (v < least) return "must be at least " + std::to_string(least) + ", got " + value;
        return "";
      },
      ">= " + std::to_string(least));
}

inline CLI::Validator positive() { return at_least(1); }
inline CLI::Validator non_negative() { return at_least(0); }

// A path the command can write its output file to (core::check_output_file),
// checked before any work is done: a directory given as --out used to fail
// only at the final rename.
inline CLI::Validator output_file() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        try {
          core::check_output_file(value);
        } catch (const core::Error& e) {
          return e.what();
        }
        return "";
      },
      "FILE");
}

}  // namespace brisk::cli
