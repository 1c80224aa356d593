// The weight initialisation every transformer here shares (GPT-2's recipe):
// normal(0, 0.02) for matrices and embeddings, the residual projections
// ("c_proj.weight") scaled by 1/sqrt(2 n_layer), LayerNorm weights 1, biases 0.
#pragma once

#include <cstdint>

#include "brisk/core/param_store.h"

namespace brisk::models {

// Entries are visited in name order, so the same seed gives the same weights
// on any machine.
void init_transformer_weights(core::ParameterStore& params, uint64_t seed, int64_t n_layer);

}  // namespace brisk::models
