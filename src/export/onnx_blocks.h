// The pre-LayerNorm transformer block that models::Gpt and models::Encoder
// share (include/brisk/models/transformer_block.h), spelled in opset-17 ONNX
// ops, with the parameters as float32 initializers under their
// model.safetensors names: what onnx_gpt.cpp and onnx_encoder.cpp both build on.
#pragma once

#include <cstdint>
#include <string>

#include "brisk/core/param_store.h"
#include "onnx_graph.h"

namespace brisk::exporter {

// Interface names both models' graphs use (Hugging Face's).
inline constexpr const char* kInputName = "input_ids";
inline constexpr const char* kOutputName = "logits";
inline constexpr const char* kAttentionMaskName = "attention_mask";

// The GPT's KV-cache inputs and outputs, with Hugging Face Optimum's names
// for GPT-2: per layer past_key_values.<l>.key / .value in and
// present.<l>.key / .value out, each (batch, n_head, length, head_dim).
std::string past_name(int64_t layer, const char* kv);  // kv: "key" or "value"
std::string present_name(int64_t layer, const char* kv);

class BlockWriter {
 public:
  // With `kv_cache`, each layer's attention appends its keys and values to
  // the graph inputs past_name(layer, ...) and names the results
  // present_name(layer, ...) (the caller declares both). The blocks'
  // parameters are "<prefix>h.<layer>.*" (the autoencoder's encoder: "enc.").
  BlockWriter(const core::ParameterStore& params, OnnxGraph& g, int64_t n_embd, int64_t n_head,
              bool kv_cache = false, std::string prefix = "");

  // The constants block() reads (const.*); call once, before any block.
  void constants();
  // A parameter as a float32 initializer under its own name. brisk keeps
  // Linear weights (out, in); `transpose` stores them (in, out), Hugging
  // Face's Conv1D layout, as model.safetensors holds them.
  std::string param(const std::string& name, bool transpose = false);
  // LayerNormalization over the last axis with `prefix`.weight / .bias.
  std::string layernorm(const std::string& x, const std::string& prefix);
  // Block `layer` ("<prefix>h.<layer>." parameters) on x (B, T, C):
  //   x += c_proj(attention(c_attn(ln_1(x)))); x += c_proj(gelu_tanh(c_fc(ln_2(x))))
  // where query i attends to key j only where `mask` (bool, broadcast to
  // (B, H, T, keys)) is true.
  std::string block(const std::string& x, int64_t layer, const std::string& mask);
  // Weight elements written by param() so far (constants not counted).
  int64_t parameters() const { return parameters_; }

 private:
  std::string linear(const std::string& x, const std::string& prefix);
  std::string gelu(const std::string& x, const std::string& prefix);
  std::string attention(const std::string& x, int64_t layer, const std::string& mask);

  const core::ParameterStore& params_;
  OnnxGraph& g_;
  int64_t C_, H_;
  bool kv_cache_;
  std::string prefix_;
  int64_t parameters_ = 0;
};

}  // namespace brisk::exporter
