// Fuzz target: the TOML training configurations: a GPT run's
// (src/train/config.cpp), an encoder classifier run's
// (src/train/classify_config.cpp) and a sequence autoencoder run's
// (src/train/autoencoder_config.cpp), each fed every input.
//
// Input: TOML text, optionally followed by NUL-separated `--set` overrides
// ("train.steps=100"); at most 8 are used.
//
// A config that loads must also survive what `brisk train` does with it: it
// writes the resolved configuration to config.toml in the run directory
// (to_toml), which users load again; that text must load to the same
// configuration. Which trainer `brisk train` picks (is_encoder_config) is
// decided from a file, so it is not reached here.
#include <cstdint>
#include <string>
#include <vector>

#include "brisk/core/error.h"
#include "brisk/train/autoencoder_config.h"
#include "brisk/train/classify_config.h"
#include "brisk/train/config.h"
#include "fuzz_util.h"

namespace {

// Parses, writes back with to_toml, parses that: it must load and write the same text.
template <class Config, class Parse>
void round_trip(std::string_view text, const std::vector<std::string>& overrides, Parse parse) {
  using namespace brisk;
  Config c;
  try {
    c = parse(text, "fuzz.toml", overrides);
  } catch (const core::Error&) {
    return;
  }
  const std::string written = train::to_toml(c);
  try {
    const Config again = parse(written, "config.toml", {});
    FUZZ_CHECK(train::to_toml(again) == written);
  } catch (const core::Error& e) {
    std::fprintf(stderr, "to_toml wrote a config that does not load:\n%s\n-> %s\n", written.c_str(), e.what());
    FUZZ_CHECK(!"to_toml's output loads");
  }
}

}  // namespace

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

  round_trip<train::TrainConfig>(text, overrides,
                                  [](std::string_view t, const std::string& n, const std::vector<std::string>& o) {
                                    return train::parse_train_config(t, n, o);
                                  });
  round_trip<train::ClassifyConfig>(text, overrides,
                                     [](std::string_view t, const std::string& n, const std::vector<std::string>& o) {
                                       return train::parse_classify_config(t, n, o);
                                     });
  round_trip<train::AutoencoderConfig>(text, overrides,
                                        [](std::string_view t, const std::string& n, const std::vector<std::string>& o) {
                                          return train::parse_autoencoder_config(t, n, o);
                                        });
  return 0;
}
