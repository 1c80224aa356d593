// A small byte-level corpus prepared into token shards, for tests that train
// through the trainer: a few sentences repeated with variations, so a tiny
// model learns something real in 60 steps. Built once per test binary in a
// temp directory that is removed at exit (with the runs written under it).
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "brisk/data/shards.h"

namespace brisk::testing_util {

struct TempRoot {
  std::filesystem::path path;
  explicit TempRoot(const std::string& tag)
      : path(std::filesystem::temp_directory_path() / ("brisk_" + tag + "_" + std::to_string(::getpid()))) {}
  ~TempRoot() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

// The root directory: the shards are in <root>/data; runs may go anywhere below.
inline std::string corpus_dir(const std::string& tag) {
  static TempRoot temp(tag);
  static const std::string dir = [] {
    const auto root = temp.path;
    std::filesystem::create_directories(root / "text");
    std::ofstream out(root / "text" / "corpus.txt");
    const char* words[] = {"the", "lord", "said", "unto", "moses", "and", "aaron", "in", "land", "of",
                           "egypt", "saying", "this", "month", "shall", "be", "beginning", "months"};
    std::mt19937 rng(42);
    for (int line = 0; line < 4000; ++line) {
      const int n = 5 + int(rng() % 8);
      for (int w = 0; w < n; ++w) out << (w ? " " : "") << words[(line + w + (rng() % 4 == 0)) % 18];
      out << ".\n";
    }
    out.close();
    data::PrepareOptions o;
    o.inputs = {(root / "text").string()};
    o.out_dir = (root / "data").string();
    o.val_fraction = 0.05;
    o.progress = false;
    o.threads = 1;
    data::prepare_dataset(o);
    return root.string();
  }();
  return dir;
}

}  // namespace brisk::testing_util
