// ONNX export of a brisk GPT, encoder classifier or sequence autoencoder's
// encoder (docs/export.md): one self-contained .onnx file, opset 17, weights
// as float32 initializers named and laid out as in model.safetensors
// (Hugging Face GPT-2's names for the GPT). A GPT takes `input_ids` int64
// (batch, seq) and returns `logits` float32 (batch, seq, vocab), both axes
// symbolic; with the KV cache also an attention mask, position ids and every
// layer's past keys and values in and present ones out. An encoder
// classifier takes `input_ids` and `attention_mask` int64 (batch, seq) and
// returns `logits` float32 (batch, n_classes); an autoencoder's encoder
// takes the same and returns `latent` float32 (batch, latent). The file is written to `<out>.tmp` and renamed, so a failed
// export never leaves a half-written model behind (an existing file at `out`
// stays as it was).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "brisk/models/encoder.h"
#include "brisk/models/gpt.h"
#include "brisk/models/seq_autoencoder.h"

namespace brisk::exporter {

struct OnnxExportOptions {
  // Also take attention_mask (batch, past_seq + seq), position_ids (batch,
  // seq) and past_key_values.<l>.key/.value (batch, n_head, past_seq,
  // head_dim), and return present.<l>.key/.value (batch, n_head, past_seq +
  // seq, head_dim), so that a runtime can generate one token per call without
  // re-running the prefix, rows of different lengths left-padded in one batch.
  // past_seq may be 0 (a prompt), so one model serves both phases. GPT
  // checkpoints only: the encoder classifier and the autoencoder's encoder
  // read a whole sequence per call.
  bool kv_cache = false;
};

// What an export wrote.
struct OnnxExportSummary {
  std::string checkpoint_dir;  // the checkpoint actually read (newest step_* of a run directory)
  std::string out_path;
  std::string kind;                        // train::checkpoint_kind() of what was written
  models::GptConfig config;                // kind "gpt"
  models::EncoderConfig encoder;           // kind "encoder-classifier"
  std::vector<std::string> label_names;    // kind "encoder-classifier": one per class
  models::SeqAutoencoderConfig autoencoder;  // kind "seq-autoencoder" (its encoder half was written)
  int64_t nodes = 0;
  int64_t initializers = 0;
  int64_t parameters = 0;  // weights in the file (the GPT's tied wte counted once)
  uint64_t bytes = 0;      // size of the .onnx file
  bool kv_cache = false;
};

inline constexpr int64_t kOnnxOpset = 17;

// Reads a checkpoint (a checkpoint directory, or a run directory whose newest
// step_* is used), a GPT, an encoder classifier or a sequence autoencoder
// (its encoder half), and writes it as ONNX to out_path. Throws IoError for
// a missing or damaged checkpoint, one of a kind brisk does not know, or a
// write that fails, ConfigError for an output path that cannot be a file
// (missing directory, a directory itself), `kv_cache` asked of anything but
// a GPT, or a model past protobuf's 2 GiB limit; each message names the path.
OnnxExportSummary export_onnx(const std::string& checkpoint, const std::string& out_path,
                              const OnnxExportOptions& options = {});

// The same from a model in memory; `metadata` goes into the model's
// metadata_props next to the model shape.
OnnxExportSummary write_onnx(const models::Gpt& model, const std::string& out_path,
                             const std::map<std::string, std::string>& metadata = {},
                             const OnnxExportOptions& options = {});
OnnxExportSummary write_onnx(const models::Encoder& model, const std::string& out_path,
                             const std::map<std::string, std::string>& metadata = {});
// The autoencoder's encoder half: a sequence to its latent.
OnnxExportSummary write_onnx(const models::SeqAutoencoder& model, const std::string& out_path,
                             const std::map<std::string, std::string>& metadata = {});

}  // namespace brisk::exporter
