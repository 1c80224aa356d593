// `brisk export onnx`: reads a checkpoint (or the newest one of a run
// directory) and writes one self-contained .onnx file through
// brisk::exporter::export_onnx (with `--kv-cache`, a model that also takes and
// returns each layer's keys and values). Errors (missing checkpoint, an output
// path that cannot be written) are core::Errors, which main.cpp turns into
// one line and exit code 2.
#include "export_cmd.h"

#include <cstdio>
#include <memory>
#include <string>

#include "brisk/export/onnx_export.h"

namespace brisk::cli {

namespace {

int run_onnx(const std::string& checkpoint, const std::string& out, const exporter::OnnxExportOptions& options) {
  const exporter::OnnxExportSummary s = exporter::export_onnx(checkpoint, out, options);
  const models::GptConfig& c = s.config;
  std::printf("exported %s -> %s\n", s.checkpoint_dir.c_str(), s.out_path.c_str());
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

}  // namespace

ExportCommand add_export_command(CLI::App& parent) {
  auto* exp = parent.add_subcommand("export", "Export a checkpoint to another format (onnx)");
  exp->require_subcommand(1);
  auto* onnx = exp->add_subcommand("onnx", "Write a checkpoint as an ONNX model (opset 17, dynamic batch and seq)");
  auto checkpoint = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto options = std::make_shared<exporter::OnnxExportOptions>();
  onnx->add_option("--checkpoint", *checkpoint, "Checkpoint directory, or a run directory (newest is used)")
      ->required();
  onnx->add_option("--out", *out, "Output file, e.g. model.onnx (written atomically)")->required();
  onnx->add_flag("--kv-cache", options->kv_cache,
                 "Also take each layer's past keys/values and return the present ones (past_key_values.<l>.key "
                 "-> present.<l>.key), for generating one token per call");
  ExportCommand cmd;
  cmd.app = exp;
  cmd.run = [checkpoint, out, options]() { return run_onnx(*checkpoint, *out, *options); };
  return cmd;
}

}  // namespace brisk::cli
