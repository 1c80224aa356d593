// The pre-LN transformer block of the encoder (encoder.cpp), shared with the
// sequence autoencoder (seq_autoencoder.cpp), whose encoder uses it as is and
// whose decoder uses it with causal attention. One definition keeps the two
// models' blocks -- and their parameter names under `prefix` -- identical.
#pragma once

#include <cstdint>
#include <string>

#include "brisk/core/graph.h"

namespace brisk::models {

enum class BlockAttention {
  padding_masked,  // bidirectional; keys at positions >= lengths[b] are masked
  causal,          // each position sees itself and earlier ones (GPT's attention; lengths unused)
};

// x (B, T, C) -> (B, T, C): x + proj(attn(ln_1(x))), then + proj(gelu(fc(ln_2(x)))).
// Parameters are `prefix` + "ln_1.weight", "attn.c_attn.weight", ... (the GPT's
// names). `lengths` (B) i32 is read only by padding_masked attention; `flash`
// picks the tiled kernel that keeps only each row's log-sum-exp.
core::ValueId encoder_block(core::Graph& g, core::ValueId x, core::ValueId lengths, const std::string& prefix,
                            int64_t C, int n_head, bool flash, BlockAttention attention = BlockAttention::padding_masked);

}  // namespace brisk::models
