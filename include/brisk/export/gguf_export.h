// GGUF export of a brisk GPT (docs/export.md): one file that llama.cpp (and
// what is built on it) loads as its `gpt2` architecture, with the model's
// tokenizer inside. Linear weights and the tied token embedding in f32, f16,
// Q8_0 or Q4_0 (ggml's block formats), or one of llama-quantize's K-quant
// mixes (Q4_K_S, Q4_K_M, Q5_K_S, Q5_K_M, Q6_K), quantized here from the fp32
// master weights with ggml's reference rounding (ggml_quants.h); LayerNorms,
// biases and position embeddings stay f32. Written to `<out>.tmp` and
// renamed, like every output.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "brisk/models/gpt.h"

namespace brisk::exporter {

// The file's type: one ggml type for every weight, or a K-quant mix (which
// weights get which of Q4_K / Q5_K / Q6_K: gguf_export.cpp, weight_type).
enum class GgufType { f32, f16, q8_0, q4_0, q4_k_s, q4_k_m, q5_k_s, q5_k_m, q6_k };

// "f32" | "f16" | "q8_0" | "q4_0" | "q4_k_s" | "q4_k_m" | "q5_k_s" | "q5_k_m" |
// "q6_k", in any case (llama.cpp writes Q4_K_M); throws ConfigError naming
// the choices.
GgufType parse_gguf_type(const std::string& name);
const char* gguf_type_name(GgufType t);

struct GgufExportOptions {
  GgufType type = GgufType::f32;
  std::string vocab_dir;  // GPT-2 vocabulary (encoder.json, vocab.bpe) for gpt2-tokenized models; "" = the default
};

struct GgufExportSummary {
  std::string checkpoint_dir;
  std::string out_path;
  models::GptConfig config;
  std::string tokenizer;
  int64_t tensors = 0;
  std::map<std::string, int64_t> tensors_by_type;  // ggml type name ("f32", "q4_K", ...) -> tensors
  int64_t vocab_tokens = 0;  // tokens written (the model's vocab: padding ids get placeholder tokens)
  uint64_t bytes = 0;
};

// Reads a checkpoint (a checkpoint directory, or a run directory whose newest
// step_* is used) and writes it as GGUF. Throws IoError / ConfigError naming
// the path for a missing or damaged checkpoint, an output path that cannot be
// a file, a missing vocabulary, or a shape the type cannot hold (Q8_0 and
// Q4_0 need n_embd to be a multiple of 32, the K-quants of 256).
GgufExportSummary export_gguf(const std::string& checkpoint, const std::string& out_path,
                              const GgufExportOptions& options = {});

}  // namespace brisk::exporter
