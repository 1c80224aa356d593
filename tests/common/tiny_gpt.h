// A small random GPT saved as a brisk checkpoint (byte tokenizer), for the
// tests that need a model on disk: the engine, the server, the CLI.
#pragma once

#include <cstdint>
#include <string>

#include "brisk/cpu/cpu_backend.h"
#include "brisk/models/gpt.h"
#include "brisk/train/checkpoint.h"

namespace brisk::testing {

struct TinyGpt {
  int64_t layers = 2, width = 32, heads = 2, context = 64, vocab = 256;
  uint64_t seed = 3;
  // Weights times this: above 1 the logits are far from uniform, so greedy
  // choices are well separated and survive small numeric differences.
  float scale = 1.f;
};

// Saves it under `dir` (a run directory); returns the checkpoint directory.
inline std::string save_tiny_gpt(const std::string& dir, const TinyGpt& t = {}) {
  models::GptConfig c;
  c.vocab_size = t.vocab;
  c.n_layer = t.layers;
  c.n_embd = t.width;
  c.n_head = t.heads;
  c.block_size = t.context;
  cpu::CpuBackend be(1);
  models::Gpt gpt(c, be);
  gpt.init_weights(t.seed);
  if (t.scale != 1.f)
    for (auto& [name, e] : gpt.params().entries()) {
      (void)name;
      float* p = e.value.data_as<float>();
      for (int64_t i = 0; i < e.value.numel(); ++i) p[i] *= t.scale;
    }
  train::TrainState st;
  st.tokenizer = "bytes";
  return train::save_checkpoint(dir, gpt, nullptr, st, 1);
}

}  // namespace brisk::testing
