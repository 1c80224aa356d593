// Fuzz target: the inference engine's model loader (src/infer/model.cpp) on a
// single safetensors file: brisk's quantized files (scheme, config and
// tokenizer in the metadata, scales beside the weights) and Hugging Face
// GPT-2 files (shapes give the config). Input: the bytes of that file.
//
// A model that loads must be consistent: every Linear's weight and scale
// have the sizes its scheme implies, and embedding any token at any
// position reads only what is there (ASan reports a read past a tensor).
#include <cstdint>
#include <vector>

#include "brisk/core/error.h"
#include "brisk/infer/model.h"
#include "fuzz_util.h"

namespace {

using brisk::infer::QLinear;
using brisk::infer::Scheme;

void check_linear(const QLinear& l) {
  FUZZ_CHECK(l.out > 0 && l.in > 0);
  switch (l.scheme) {
    case Scheme::f32:
      FUZZ_CHECK(l.w.numel() == l.out * l.in);
      break;
    case Scheme::int8:
      FUZZ_CHECK(l.w.numel() == l.out * l.in && l.scale.numel() == l.out);
      break;
    case Scheme::int4:
      FUZZ_CHECK(l.in % 32 == 0 && l.w.numel() == l.out * l.in / 2 && l.scale.numel() == l.out * (l.in / 32));
      break;
  }
  if (l.bias.defined()) FUZZ_CHECK(l.bias.numel() == l.out);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace brisk;
  const auto path = fuzz::scratch_dir() / "model.safetensors";
  fuzz::write_bytes(path, fuzz::as_text(data, size));
  try {
    const infer::Model m = infer::load_model(path.string());
    const auto& c = m.config;
    FUZZ_CHECK(int64_t(m.layers.size()) == c.n_layer);
    check_linear(m.head);
    FUZZ_CHECK(m.head.out == c.vocab_size && m.head.in == c.n_embd);
    for (const auto& layer : m.layers) {
      for (const QLinear* l : {&layer.qkv, &layer.proj, &layer.fc, &layer.fc_proj}) check_linear(*l);
      FUZZ_CHECK(layer.qkv.in == c.n_embd && layer.qkv.out == 3 * c.n_embd);
    }
    FUZZ_CHECK(m.wpe.numel() == c.block_size * c.n_embd);
    std::vector<float> row(size_t(c.n_embd));
    m.embed(0, 0, row.data());
    m.embed(int32_t(c.vocab_size - 1), c.block_size - 1, row.data());
  } catch (const core::Error&) {
  }
  return 0;
}
