// Helpers shared by the fuzz targets (fuzz/*.cpp, docs/fuzzing.md).
//
// A target gets arbitrary bytes. Rejecting them with a typed core::Error is
// the correct outcome; anything else (another exception, a sanitizer report,
// a failed FUZZ_CHECK) is a finding. FUZZ_CHECK states a property the code
// under test promises for every input; it aborts rather than throws so that
// no catch in the target can swallow it, under libFuzzer and in the replay
// tests alike.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#define FUZZ_CHECK(cond)                                                                  \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                       \
    }                                                                                     \
  } while (0)

namespace brisk::fuzz {

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// A directory private to this process, for code under test that only reads
// real files. Under $TMPDIR (scripts/fuzz.sh points it at /dev/shm when it
// can, so a run does not write to disk), removed when the process exits
// normally; one left by a crash is named for its pid.
inline const std::filesystem::path& scratch_dir() {
  struct Dir {
    std::filesystem::path path;
    Dir() {
      path = std::filesystem::temp_directory_path() / ("brisk_fuzz_" + std::to_string(::getpid()));
      std::filesystem::create_directories(path);
    }
    ~Dir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static const Dir dir;
  return dir.path;
}

inline void write_bytes(const std::filesystem::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  if (!out) {
    std::fprintf(stderr, "fuzz: cannot write %s\n", path.c_str());
    std::abort();
  }
}

}  // namespace brisk::fuzz
