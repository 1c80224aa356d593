// `brisk export onnx`: reads a checkpoint (or the newest one of a run
// directory) and writes one self-contained .onnx file through
// brisk::exporter::export_onnx. Errors (missing checkpoint, an output path
// that cannot be written) are core::Errors, which main.cpp turns into one
// line and exit code 2.
#include "export_cmd.h"

#include <cstdio>
#include <memory>
#include <string>

#include "brisk/export/onnx_export.h"

namespace brisk::cli {

namespace {

int run_onnx(const std::string& checkpoint, const std::string& out) {
  const exporter::OnnxExportSummary s = exporter::export_onnx(checkpoint, out);
  const models::GptConfig& c = s.config;
  std::printf("exported %s -> %s\n", s.checkpoint_dir.c_str(), s.out_path.c_str());
  std::printf("  model    GPT n_layer %lld, n_embd %lld, n_head %lld, vocab %lld, block %lld (%lld parameters)\n",
              (long long)c.n_layer, (long long)c.n_embd, (long long)c.n_head, (long long)c.vocab_size,
              (long long)c.block_size, (long long)s.parameters);
  std::printf("  graph    ONNX opset %lld, %lld nodes, %lld initializers, %.2f MB\n", (long long)exporter::kOnnxOpset,
              (long long)s.nodes, (long long)s.initializers, double(s.bytes) / 1e6);
  std::printf("  input    input_ids int64 [batch, seq], seq <= %lld\n", (long long)c.block_size);
  std::printf("  output   logits float32 [batch, seq, %lld]\n", (long long)c.vocab_size);
  return 0;
}

}  // namespace

ExportCommand add_export_command(CLI::App& parent) {
  auto* exp = parent.add_subcommand("export", "Export a checkpoint to another format (onnx)");
  exp->require_subcommand(1);
  auto* onnx = exp->add_subcommand("onnx", "Write a checkpoint as an ONNX model (opset 17, dynamic batch and seq)");
  auto checkpoint = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  onnx->add_option("--checkpoint", *checkpoint, "Checkpoint directory, or a run directory (newest is used)")
      ->required();
  onnx->add_option("--out", *out, "Output file, e.g. model.onnx (written atomically)")->required();
  ExportCommand cmd;
  cmd.app = exp;
  cmd.run = [checkpoint, out]() { return run_onnx(*checkpoint, *out); };
  return cmd;
}

}  // namespace brisk::cli
