// Fuzz target: the TOML training configuration (src/train/config.cpp).
//
// Input: TOML text, optionally followed by NUL-separated `--set` overrides
// ("train.steps=100"); at most 8 are used.
//
// A config that loads must also survive what `brisk train` does with it: it
// writes the resolved configuration to config.toml in the run directory
// (to_toml), which users load again; that text must load to the same
// configuration.
#include <cstdint>
#include <string>
#include <vector>

#include "brisk/core/error.h"
#include "brisk/train/config.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace brisk;
  const std::string_view in = fuzz::as_text(data, size);
  const size_t nul = in.find('\0');
  const std::string_view text = in.substr(0, nul);
  std::vector<std::string> overrides;
  for (size_t at = nul; at != std::string_view::npos && overrides.size() < 8;) {
    const size_t next = in.find('\0', at + 1);
    overrides.emplace_back(in.substr(at + 1, next == std::string_view::npos ? next : next - at - 1));
    at = next;
  }

  train::TrainConfig c;
  try {
    c = train::parse_train_config(text, "fuzz.toml", overrides);
  } catch (const core::Error&) {
    return 0;
  }
  const std::string written = train::to_toml(c);
  try {
    const train::TrainConfig again = train::parse_train_config(written, "config.toml");
    FUZZ_CHECK(train::to_toml(again) == written);
  } catch (const core::Error& e) {
    std::fprintf(stderr, "to_toml wrote a config that does not load:\n%s\n-> %s\n", written.c_str(), e.what());
    FUZZ_CHECK(!"to_toml's output loads");
  }
  return 0;
}
