// The weights the inference engine runs: a GPT-2 in brisk's layout, each
// Linear in fp32 or quantized (int8 per output row, or 4-bit groups of 32,
// brisk/ops/quant.h), loaded from any of
//   - a brisk checkpoint (a step directory, or a run directory: the newest),
//   - a brisk quantized file (`brisk quantize`'s safetensors, scheme in its metadata),
//   - a Hugging Face GPT-2 safetensors file (or a directory holding
//     model.safetensors and config.json): Conv1D weights (in, out), names
//     with or without the "transformer." prefix.
// Every Linear is kept (out, in) so a row is one output feature; the LM head
// is the token embedding (tied), quantized with the rest.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "brisk/core/tensor.h"
#include "brisk/models/gpt.h"

namespace brisk::infer {

enum class Scheme { f32, int8, int4 };
const char* scheme_name(Scheme s);  // "fp32", "int8", "int4"
// "int8" | "int4" (and "fp32"/"f32"); throws ConfigError listing them.
Scheme parse_scheme(const std::string& name);

// One Linear: y = x W^T + b. f32: w (out, in) f32; int8: w (out, in) i8 and
// scale (out); int4: w (out, in / 2) u8 codes and scale (out, in / 32).
// bias is undefined where the layer has none (the LM head).
// packed: w is in panels of 16 outputs (brisk/ops/packed_linear.h): f32 in
// linear_packed's (ceil(out/16), in, 16), set by pack_f32_linears; int8 in
// linear_q8_packed's (ceil(out/16), ceil(in/4), 64) bytes and int4 in
// linear_q4_packed's (ceil(out/16), in/32, 256) bytes with scale
// (ceil(out/16), in/32, 16), set by pack_quantized_linears.
struct QLinear {
  Scheme scheme = Scheme::f32;
  int64_t out = 0, in = 0;
  core::Tensor w, scale, bias;
  bool packed = false;
  size_t bytes() const;
};

struct Layer {
  core::Tensor ln1_w, ln1_b, ln2_w, ln2_b;
  QLinear qkv, proj, fc, fc_proj;
};

struct Model {
  models::GptConfig config;
  std::string tokenizer = "bytes";  // "bytes" / "gpt2"
  std::string source;               // what it was loaded from, for messages
  Scheme scheme = Scheme::f32;
  std::string quant_note;           // how it was quantized (calibration), empty for fp32
  core::Tensor wpe, lnf_w, lnf_b;
  QLinear head;  // the token embedding, also the LM head: (vocab, C), no bias
  std::vector<Layer> layers;

  // out[0..C) = embedding of token `id` + position `pos` (dequantized rows
  // where the embedding is quantized).
  void embed(int32_t id, int64_t pos, float* out) const;
  size_t weight_bytes() const;
};

// Loads any of the sources above; throws IoError / ConfigError naming the
// file and the problem (a missing tensor, a shape that is not GPT-2's, a
// file of another architecture).
Model load_model(const std::string& path);

// Repacks every fp32 Linear's weight, in place, into linear_packed's panels
// (the inference engine does this once when it is made: decoding's products
// then run as broadcast tiles, engine.cpp). The memory is the same up to
// the last panel's padding. Quantized Linears are left as they are.
void pack_f32_linears(Model& m);
// The same for every int8 and int4 Linear, into linear_q8_packed's and
// linear_q4_packed's panels (the engine does this where the CPU has
// avx512_vnni, whose vpdpbusd the layouts are made for). fp32 Linears are
// left as they are.
void pack_quantized_linears(Model& m);

// The fp32 model's Linears in `s` (weights only; the activations are
// quantized as the ops run). Throws ConfigError if `m` is already quantized.
// `calibration` (token ids, may be empty): for int4, activation-aware
// scaling (AWQ-style, docs/inference.md) of the Linears whose input scale
// can be folded into the LayerNorm before them.
Model quantize(const Model& m, Scheme s, const std::vector<int32_t>& calibration = {});

// Writes a quantized model as safetensors (scales beside the weights, the
// scheme, config and tokenizer in the metadata), atomically.
void save_quantized(const Model& m, const std::string& path);

}  // namespace brisk::infer
