// Replays fuzz inputs without libFuzzer. Linked with one fuzz/<target>.cpp
// into fuzz_replay_<target> (fuzz/CMakeLists.txt), it calls
// LLVMFuzzerTestOneInput once on every file of the directories (or on the
// files) named on the command line, in name order. A crash or an exception
// escaping the target fails the run as it would under the fuzzer. So does a
// directory holding no files: a moved or emptied corpus must not turn the
// test into one that checks nothing.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s DIR_OR_FILE...\n", argv[0]);
    return 2;
  }
  size_t replayed = 0;
  for (int a = 1; a < argc; ++a) {
    std::vector<fs::path> files;
    std::error_code ec;
    if (fs::is_directory(argv[a], ec)) {
      for (const auto& e : fs::directory_iterator(argv[a]))
        if (e.is_regular_file()) files.push_back(e.path());
      std::sort(files.begin(), files.end());
      if (files.empty()) {
        std::fprintf(stderr, "replay: %s holds no files\n", argv[a]);
        return 1;
      }
    } else if (fs::is_regular_file(argv[a], ec)) {
      files.push_back(argv[a]);
    } else {
      std::fprintf(stderr, "replay: %s is neither a directory nor a file\n", argv[a]);
      return 1;
    }
    for (const fs::path& f : files) {
      std::ifstream in(f, std::ios::binary);
      const std::vector<char> bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
      if (!in.good() && !in.eof()) {
        std::fprintf(stderr, "replay: cannot read %s\n", f.c_str());
        return 1;
      }
      // Named before it runs: if it crashes, the log says which input did it.
      std::fprintf(stderr, "replay: %s (%zu bytes)\n", f.c_str(), bytes.size());
      // libFuzzer never passes a null pointer, not even for an empty input.
      static const uint8_t kNone = 0;
      const auto* data = bytes.empty() ? &kNone : reinterpret_cast<const uint8_t*>(bytes.data());
      try {
        LLVMFuzzerTestOneInput(data, bytes.size());
      } catch (const std::exception& e) {
        std::fprintf(stderr, "replay: %s: uncaught exception: %s\n", f.c_str(), e.what());
        return 1;
      }
      ++replayed;
    }
  }
  std::fprintf(stderr, "replay: %zu inputs, all fine\n", replayed);
  return 0;
}
