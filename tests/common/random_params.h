// Random values in every parameter of a model, for tests that compare two
// implementations on the same weights: the default init leaves biases at 0
// and LayerNorm weights at 1, where a wiring mistake in them would not show.
#pragma once

#include <cstdint>
#include <string>

#include "brisk/core/tensor.h"

namespace brisk::testing {

// Ranges that keep the activations moderate: outputs of a few units,
// attention neither uniform nor one-hot. A wider model takes a smaller
// `linear_std` (the Linear weights' spread) for the same activations. Any
// model with params(): the GPT, the encoder, the sequence autoencoder.
template <class Model>
void randomize(Model& model, uint64_t seed, float linear_std = 0.1f) {
  for (auto& [name, e] : model.params().entries()) {
    const bool ln = name.find("ln_") != std::string::npos;
    const bool bias = name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    const bool embedding = name.find("wte.") != std::string::npos || name.find("wpe.") != std::string::npos;
    const float mean = ln && !bias ? 1.f : 0.f;
    const float std = ln && !bias ? 0.2f : bias ? 0.1f : embedding ? 0.3f : linear_std;
    model.params().upload(e.value, core::Tensor::randn(e.value.shape(), core::DType::f32, seed++, mean, std));
  }
}

}  // namespace brisk::testing
