// Hugging Face GPT-2 weights as a starting point for training
// (train.init_from): a model.safetensors in Hugging Face's GPT-2 layout
// (the layout brisk's own checkpoints use: Conv1D weights stored (in, out),
// names with or without the "transformer." prefix), with its config.json
// beside it when there is one. This is how a run fine-tunes the released
// GPT-2 weights, as llm.c starts from gpt2_124M.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "brisk/models/gpt.h"

namespace brisk::train {

// A .safetensors file, or a directory holding model.safetensors but no brisk
// checkpoint (no state.json there nor step_* directories under it).
bool is_hf_gpt2_source(const std::string& path);

struct HfLoadReport {
  std::string file;          // the safetensors file read
  int64_t file_vocab = 0;    // wte rows in the file
  int64_t file_positions = 0;  // wpe rows in the file
  bool config_checked = false;  // a config.json was there and matched the model
};

// Loads the weights into `model`, whose shape must match the file's:
//  - n_layer, n_embd and (from config.json, where there is one) n_head exactly;
//  - the token embedding may have fewer rows than the model's vocabulary:
//    the rest are the mean of the file's rows (GPT-2's 50257 padded to
//    50304, as llm.c does; hf_weights.cpp says why not zeros);
//  - the position embedding may have more rows than the model's block: the
//    first block_size are used (training on shorter windows).
// f16 and bf16 files are widened to f32. The attention mask buffers of older
// files (h.N.attn.bias, h.N.attn.masked_bias) and lm_head.weight (tied to
// the token embedding) are skipped; any other tensor the model has no
// parameter for is an error, like a missing one. Throws ConfigError for
// shapes that do not fit (naming both), IoError for an unreadable file.
HfLoadReport load_hf_gpt2(const std::string& path, models::Gpt& model);

// Refuses a Hugging Face config.json (parsed, at `path`) whose GPT-2 keys ask
// for a computation brisk does not do: an activation other than tanh GELU,
// a LayerNorm epsilon other than 1e-5, unscaled or layer-scaled attention,
// cross-attention, an untied head. Sizes are checked by the callers.
void check_hf_computation(const nlohmann::json& config, const std::string& path);

}  // namespace brisk::train
