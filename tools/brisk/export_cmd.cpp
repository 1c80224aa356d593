// `brisk export onnx` and `brisk export gguf`: read a checkpoint (or the
// newest one of a run directory) and write one self-contained file through
// brisk::exporter::export_onnx (a GPT, an encoder classifier, or a sequence
// autoencoder's encoder; with `--kv-cache`, a GPT that also takes and
// returns each layer's keys and values) or export_gguf (a GPT, for
// llama.cpp).
// Errors (missing checkpoint, an output path that cannot be written) are
// core::Errors, which main.cpp turns into one line and exit code 2.
#include "export_cmd.h"

#include <cstdio>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "brisk/export/gguf_export.h"
#include "brisk/export/onnx_export.h"
#include "brisk/train/checkpoint.h"

namespace brisk::cli {

namespace {

// The lines an encoder-bodied export shares: the graph and its two inputs.
void print_encoder_graph(const exporter::OnnxExportSummary& s, int64_t max_len) {
  std::printf("  graph    ONNX opset %lld, %lld nodes, %lld initializers, %.2f MB\n", (long long)exporter::kOnnxOpset,
              (long long)s.nodes, (long long)s.initializers, double(s.bytes) / 1e6);
  std::printf("  inputs   input_ids int64 [batch, seq], attention_mask int64 [batch, seq] (1 on the real tokens, rows "
              "right-padded), seq <= %lld\n",
              (long long)max_len);
}

void print_encoder(const exporter::OnnxExportSummary& s) {
  const models::EncoderConfig& c = s.encoder;
  const std::string labels = nlohmann::json(s.label_names).dump();  // quoted: a label may hold a comma
  std::printf("  model    encoder classifier n_layer %lld, n_embd %lld, n_head %lld, vocab %lld, max_len %lld, %lld "
              "classes %s (%lld parameters)\n",
              (long long)c.n_layer, (long long)c.n_embd, (long long)c.n_head, (long long)c.vocab_size,
              (long long)c.max_len, (long long)c.n_classes, labels.c_str(), (long long)s.parameters);
  print_encoder_graph(s, c.max_len);
  std::printf("  output   logits float32 [batch, %lld] (classes in the order above)\n", (long long)c.n_classes);
}

void print_autoencoder(const exporter::OnnxExportSummary& s) {
  const models::SeqAutoencoderConfig& c = s.autoencoder;
  std::printf("  model    sequence autoencoder's encoder n_layer %lld, n_embd %lld, n_head %lld, vocab %lld, max_len "
              "%lld, latent %lld (%lld parameters; the decoder is not exported)\n",
              (long long)c.n_layer, (long long)c.n_embd, (long long)c.n_head, (long long)c.vocab_size,
              (long long)c.max_len, (long long)c.latent, (long long)s.parameters);
  print_encoder_graph(s, c.max_len);
  std::printf("  output   latent float32 [batch, %lld] (what brisk encode writes)\n", (long long)c.latent);
}

int run_onnx(const std::string& checkpoint, const std::string& out, const exporter::OnnxExportOptions& options) {
  const exporter::OnnxExportSummary s = exporter::export_onnx(checkpoint, out, options);
  std::printf("exported %s -> %s\n", s.checkpoint_dir.c_str(), s.out_path.c_str());
  if (s.kind == train::kEncoderCheckpoint) {
    print_encoder(s);
    return 0;
  }
  if (s.kind == train::kAutoencoderCheckpoint) {
    print_autoencoder(s);
    return 0;
  }
  const models::GptConfig& c = s.config;
  std::printf("  model    GPT n_layer %lld, n_embd %lld, n_head %lld, vocab %lld, block %lld (%lld parameters)\n",
              (long long)c.n_layer, (long long)c.n_embd, (long long)c.n_head, (long long)c.vocab_size,
              (long long)c.block_size, (long long)s.parameters);
  std::printf("  graph    ONNX opset %lld, %lld nodes, %lld initializers, %.2f MB\n", (long long)exporter::kOnnxOpset,
              (long long)s.nodes, (long long)s.initializers, double(s.bytes) / 1e6);
  const long long head_dim = c.n_embd / c.n_head;
  if (!s.kv_cache) {
    std::printf("  input    input_ids int64 [batch, seq], seq <= %lld\n", (long long)c.block_size);
    std::printf("  output   logits float32 [batch, seq, %lld]\n", (long long)c.vocab_size);
    return 0;
  }
  std::printf("  inputs   input_ids int64 [batch, seq], attention_mask int64 [batch, past_seq + seq], position_ids "
              "int64 [batch, seq],\n           past_key_values.{0..%lld}.key/.value float32 [batch, %lld, past_seq, "
              "%lld], past_seq + seq <= %lld\n",
              (long long)c.n_layer - 1, (long long)c.n_head, head_dim, (long long)c.block_size);
  std::printf("  outputs  logits float32 [batch, seq, %lld],\n           present.{0..%lld}.key/.value float32 "
              "[batch, %lld, past_seq + seq, %lld]\n",
              (long long)c.vocab_size, (long long)c.n_layer - 1, (long long)c.n_head, head_dim);
  return 0;
}

int run_gguf(const std::string& checkpoint, const std::string& out, const std::string& type,
             const std::string& vocab_dir) {
  exporter::GgufExportOptions o;
  o.type = exporter::parse_gguf_type(type);
  o.vocab_dir = vocab_dir;
  const exporter::GgufExportSummary s = exporter::export_gguf(checkpoint, out, o);
  const models::GptConfig& c = s.config;
  std::printf("exported %s -> %s\n", s.checkpoint_dir.c_str(), s.out_path.c_str());
  std::printf("  model    GPT n_layer %lld, n_embd %lld, n_head %lld, vocab %lld, block %lld\n", (long long)c.n_layer,
              (long long)c.n_embd, (long long)c.n_head, (long long)c.vocab_size, (long long)c.block_size);
  std::string by_type;
  for (const auto& [name, n] : s.tensors_by_type) by_type += (by_type.empty() ? "" : ", ") + std::to_string(n) + " " + name;
  std::printf("  file     GGUF v3, architecture gpt2, weights %s, %lld tensors (%s), %.2f MB\n",
              exporter::gguf_type_name(o.type), (long long)s.tensors, by_type.c_str(), double(s.bytes) / 1e6);
  std::printf("  vocab    %s tokenizer, %lld tokens\n", s.tokenizer.c_str(), (long long)s.vocab_tokens);
  return 0;
}

}  // namespace

ExportCommand add_export_command(CLI::App& parent) {
  auto* exp = parent.add_subcommand("export", "Export a checkpoint to another format (onnx, gguf)");
  exp->require_subcommand(1);
  auto* onnx = exp->add_subcommand("onnx", "Write a checkpoint as an ONNX model (opset 17, dynamic batch and seq): a GPT, an encoder classifier, "
      "or a sequence autoencoder's encoder");
  auto checkpoint = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto options = std::make_shared<exporter::OnnxExportOptions>();
  onnx->add_option("--checkpoint", *checkpoint, "Checkpoint directory, or a run directory (newest is used)")
      ->required();
  onnx->add_option("--out", *out, "Output file, e.g. model.onnx (written atomically)")->required();
  onnx->add_flag("--kv-cache", options->kv_cache,
                 "GPT only: also take each layer's past keys/values and return the present ones "
                 "(past_key_values.<l>.key -> present.<l>.key), for generating one token per call");
  auto* gguf = exp->add_subcommand("gguf", "Write a checkpoint as GGUF for llama.cpp (architecture gpt2, tokenizer inside)");
  auto gguf_checkpoint = std::make_shared<std::string>();
  auto gguf_out = std::make_shared<std::string>();
  auto gguf_type = std::make_shared<std::string>("f32");
  auto vocab_dir = std::make_shared<std::string>();
  gguf->add_option("--checkpoint", *gguf_checkpoint, "Checkpoint directory, or a run directory (newest is used)")
      ->required();
  gguf->add_option("--out", *gguf_out, "Output file, e.g. model.gguf (written atomically)")->required();
  gguf->add_option("--type", *gguf_type, "Weights: f32 | f16 | q8_0 | q4_0 | q4_k_s | q4_k_m | q5_k_s | q5_k_m | q6_k (ggml's formats; K-quants as llama-quantize mixes them)")
      ->capture_default_str();
  gguf->add_option("--vocab-dir", *vocab_dir, "GPT-2 vocabulary directory (gpt2 models)");
  ExportCommand cmd;
  cmd.app = exp;
  cmd.run = [=]() {
    if (*gguf) return run_gguf(*gguf_checkpoint, *gguf_out, *gguf_type, *vocab_dir);
    return run_onnx(*checkpoint, *out, *options);
  };
  return cmd;
}

}  // namespace brisk::cli
