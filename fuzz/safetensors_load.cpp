// Fuzz target: the safetensors reader (src/core/safetensors.cpp), which
// loads model and optimizer checkpoints. Input: the bytes of a .safetensors
// file. Every tensor that loads is read end to end, so that a size or offset
// the reader got wrong shows up as an ASan report here.
#include <cstdint>

#include "brisk/core/error.h"
#include "brisk/core/safetensors.h"
#include "fuzz_util.h"

namespace {
volatile unsigned g_sink;  // keeps the reads of the tensor bytes from being optimised away
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace brisk;
  try {
    const core::SafetensorsFile f = core::parse_safetensors(fuzz::as_text(data, size), "fuzz.safetensors");
    for (const auto& [name, t] : f.tensors) {
      FUZZ_CHECK(t.bytes() == size_t(t.numel()) * core::dtype_size(t.dtype()));
      const auto* p = static_cast<const unsigned char*>(t.data());
      unsigned sum = 0;
      for (size_t i = 0; i < t.bytes(); ++i) sum += p[i];
      g_sink = sum;
    }
  } catch (const core::Error&) {
  }
  return 0;
}
