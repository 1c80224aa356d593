// `brisk export onnx` (onnx_export.h): checkpoint in, one .onnx file out. A
// GPT is loaded through models::Gpt and train::load_checkpoint, an encoder
// classifier or a sequence autoencoder through its own model and loader, so
// the checkpoint gets the same checks as `brisk generate`, `classify` or
// `encode` (every tensor present with its shape); the graphs come from
// onnx_gpt.cpp and onnx_encoder.cpp; the file is serialized by protobuf
// straight into `<out>.tmp`, fsync'ed and renamed into place.
#include "brisk/export/onnx_export.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <utility>

#include <nlohmann/json.hpp>

#include "brisk/core/atomic_file.h"
#include "brisk/core/error.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/train/checkpoint.h"
#include "onnx.pb.h"
#include "onnx_encoder.h"
#include "onnx_gpt.h"

namespace brisk::exporter {

namespace fs = std::filesystem;

namespace {

// Opset 17 came with IR version 8 (ONNX 1.12); runtimes that read opset 17 read it.
constexpr int64_t kIrVersion = 8;

std::string errno_text() { return std::strerror(errno); }

// Serializes into path.tmp, fsyncs it, renames it over path, then fsyncs the
// directory so the rename itself survives a crash. On any failure the
// temporary file is removed and whatever was at `path` stays.
void write_model_atomic(const onnx::ModelProto& model, const std::string& path) {
  const std::string tmp = path + ".tmp";
  // Locked, as core::AtomicFile's: a second export to the same path is refused.
  const int fd = core::open_locked_temporary(tmp, path);
  std::string why;
  if (!model.SerializeToFileDescriptor(fd)) why = "write failed (" + errno_text() + ")";
  else if (::fsync(fd) != 0) why = "fsync failed (" + errno_text() + ")";
  if (!why.empty()) {
    ::unlink(tmp.c_str());
    ::close(fd);
    throw core::IoError(tmp + ": " + why);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {  // renamed while still locked
    why = errno_text();
    ::unlink(tmp.c_str());
    ::close(fd);
    throw core::IoError(path + ": rename from " + tmp + " failed (" + why + ")");
  }
  ::close(fd);
  const fs::path dir = fs::path(path).has_parent_path() ? fs::path(path).parent_path() : fs::path(".");
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

// The model around a graph: IR version, opset 17, producer, a line on the
// model, and `props` as metadata_props.
onnx::ModelProto model_proto(const std::string& doc, const std::map<std::string, std::string>& props) {
  onnx::ModelProto proto;
  proto.set_ir_version(kIrVersion);
  proto.set_producer_name("brisk");
  proto.set_doc_string(doc);
  onnx::OperatorSetIdProto* opset = proto.add_opset_import();
  opset->set_domain("");  // the default ai.onnx domain
  opset->set_version(kOnnxOpset);
  for (const auto& [k, v] : props) {
    onnx::StringStringEntryProto* e = proto.add_metadata_props();
    e->set_key(k);
    e->set_value(v);
  }
  return proto;
}

// Writes a built model; returns its size.
uint64_t write_model(const onnx::ModelProto& proto, const std::string& out_path) {
  // protobuf cannot serialize a message of 2 GiB or more; such a model would
  // need ONNX's external-data files, which this exporter does not write.
  const size_t bytes = proto.ByteSizeLong();
  if (bytes > size_t(INT_MAX))
    throw core::ConfigError(out_path + ": the model is " + std::to_string(bytes >> 20) +
                            " MiB, over the 2 GiB protobuf limit of a single .onnx file (external data is not "
                            "supported)");
  write_model_atomic(proto, out_path);
  return bytes;
}

OnnxExportSummary summary(const std::string& out_path, const GraphStats& stats, uint64_t bytes) {
  OnnxExportSummary s;
  s.out_path = out_path;
  s.nodes = stats.nodes;
  s.initializers = stats.initializers;
  s.parameters = stats.parameters;
  s.bytes = bytes;
  return s;
}

// The model proto of an encoder-bodied model (Config: EncoderConfig or
// SeqAutoencoderConfig): its shape and `head` (the name and width of what
// follows the pooling) in metadata_props and the doc line, after `what`;
// `metadata` and `identity` (kind, ...) added to the props.
template <class Config>
onnx::ModelProto encoder_model_proto(const Config& cfg, const std::string& what,
                                     const std::pair<std::string, int64_t>& head,
                                     const std::map<std::string, std::string>& metadata,
                                     const std::map<std::string, std::string>& identity) {
  std::map<std::string, std::string> props = metadata;
  for (const auto& [k, v] : identity) props[k] = v;
  const std::pair<std::string, int64_t> shape[] = {{"vocab_size", cfg.vocab_size}, {"n_layer", cfg.n_layer},
                                                   {"n_embd", cfg.n_embd},         {"n_head", cfg.n_head},
                                                   {"max_len", cfg.max_len},       head};
  std::string doc = what + ":";
  for (const auto& [k, v] : shape) {
    props[k] = std::to_string(v);
    doc += (k == "vocab_size" ? " " : ", ") + k + " " + std::to_string(v);
  }
  return model_proto(doc, props);
}

// --kv-cache is the GPT's: the encoders read a whole sequence per call.
void refuse_kv_cache(const std::string& dir, const OnnxExportOptions& options, const std::string& what) {
  if (options.kv_cache)
    throw core::ConfigError(dir + ": --kv-cache is for GPT checkpoints; this one is " + what +
                            ", which reads a whole sequence per call");
}

// An encoder classifier checkpoint (`dir`) to ONNX; its labels, tokenizer
// and header setting go into the metadata, for a caller to prepare inputs
// and read outputs as brisk classify does.
OnnxExportSummary export_encoder(const std::string& dir, const std::string& out_path,
                                 const OnnxExportOptions& options) {
  refuse_kv_cache(dir, options, "an encoder classifier");
  const train::EncoderCheckpoint info = train::read_encoder_checkpoint(dir);
  cpu::CpuBackend backend(1);
  models::Encoder model(info.config, backend);
  train::load_encoder_checkpoint(dir, model);
  const std::map<std::string, std::string> meta{{"step", std::to_string(info.step)},
                                                {"tokenizer", info.tokenizer},
                                                {"strip_headers", info.strip_headers ? "true" : "false"},
                                                {"label_names", nlohmann::json(info.label_names).dump()}};
  OnnxExportSummary s = write_onnx(model, out_path, meta);
  s.checkpoint_dir = dir;
  s.label_names = info.label_names;
  return s;
}

// A sequence autoencoder checkpoint (`dir`): its encoder half.
OnnxExportSummary export_autoencoder(const std::string& dir, const std::string& out_path,
                                     const OnnxExportOptions& options) {
  refuse_kv_cache(dir, options, "a sequence autoencoder");
  const train::AutoencoderCheckpoint info = train::read_autoencoder_checkpoint(dir);
  cpu::CpuBackend backend(1);
  models::SeqAutoencoder model(info.config, backend);
  train::load_autoencoder_checkpoint(dir, model);
  OnnxExportSummary s =
      write_onnx(model, out_path, {{"step", std::to_string(info.step)}, {"tokenizer", info.tokenizer}});
  s.checkpoint_dir = dir;
  return s;
}

}  // namespace

OnnxExportSummary write_onnx(const models::Gpt& model, const std::string& out_path,
                             const std::map<std::string, std::string>& metadata, const OnnxExportOptions& options) {
  core::check_output_file(out_path);
  const models::GptConfig& cfg = model.config();
  std::map<std::string, std::string> props = metadata;
  props["vocab_size"] = std::to_string(cfg.vocab_size);
  props["n_layer"] = std::to_string(cfg.n_layer);
  props["n_embd"] = std::to_string(cfg.n_embd);
  props["n_head"] = std::to_string(cfg.n_head);
  props["block_size"] = std::to_string(cfg.block_size);
  props["kv_cache"] = options.kv_cache ? "true" : "false";
  props["kind"] = train::kGptCheckpoint;
  onnx::ModelProto proto =
      model_proto("GPT-2 (pre-LayerNorm, tanh GELU, learned positions, LM head tied to wte): n_layer " +
                      std::to_string(cfg.n_layer) + ", n_embd " + std::to_string(cfg.n_embd) + ", n_head " +
                      std::to_string(cfg.n_head) + ", vocab " + std::to_string(cfg.vocab_size) + ", block " +
                      std::to_string(cfg.block_size),
                  props);
  const GraphStats stats = build_gpt_graph(model, *proto.mutable_graph(), options.kv_cache);
  OnnxExportSummary s = summary(out_path, stats, write_model(proto, out_path));
  s.kind = train::kGptCheckpoint;
  s.config = cfg;
  s.kv_cache = options.kv_cache;
  return s;
}

OnnxExportSummary write_onnx(const models::Encoder& model, const std::string& out_path,
                             const std::map<std::string, std::string>& metadata) {
  core::check_output_file(out_path);
  const models::EncoderConfig& cfg = model.config();
  onnx::ModelProto proto = encoder_model_proto(
      cfg, "encoder classifier (pre-LayerNorm blocks, attention masked at padded keys, mean over the real positions, "
           "Linear head)",
      {"n_classes", cfg.n_classes}, metadata, {{"kind", train::kEncoderCheckpoint}});
  const GraphStats stats = build_encoder_graph(model, *proto.mutable_graph());
  OnnxExportSummary s = summary(out_path, stats, write_model(proto, out_path));
  s.kind = train::kEncoderCheckpoint;
  s.encoder = cfg;
  return s;
}

OnnxExportSummary write_onnx(const models::SeqAutoencoder& model, const std::string& out_path,
                             const std::map<std::string, std::string>& metadata) {
  core::check_output_file(out_path);
  const models::SeqAutoencoderConfig& cfg = model.config();
  onnx::ModelProto proto = encoder_model_proto(
      cfg, "sequence autoencoder's encoder (pre-LayerNorm blocks, attention masked at padded keys, mean over the "
           "real positions, Linear to the latent)",
      {"latent", cfg.latent}, metadata, {{"kind", train::kAutoencoderCheckpoint}, {"part", "encoder"}});
  const GraphStats stats = build_autoencoder_encoder_graph(model, *proto.mutable_graph());
  OnnxExportSummary s = summary(out_path, stats, write_model(proto, out_path));
  s.kind = train::kAutoencoderCheckpoint;
  s.autoencoder = cfg;
  return s;
}

OnnxExportSummary export_onnx(const std::string& checkpoint, const std::string& out_path,
                              const OnnxExportOptions& options) {
  // The output path first: a typo there should not cost a model load.
  core::check_output_file(out_path);
  core::check_output_not_input(out_path, checkpoint);
  const std::string dir = train::require_checkpoint(checkpoint);
  const std::string kind = train::checkpoint_kind(dir);
  if (kind == train::kEncoderCheckpoint) return export_encoder(dir, out_path, options);
  if (kind == train::kAutoencoderCheckpoint) return export_autoencoder(dir, out_path, options);
  if (kind != train::kGptCheckpoint)
    throw core::IoError(dir + ": this checkpoint is of unknown kind '" + kind + "' (state.json); brisk export onnx "
                        "writes '" + train::kGptCheckpoint + "', '" + train::kEncoderCheckpoint + "' and '" +
                        train::kAutoencoderCheckpoint + "' checkpoints");
  train::TrainState state;
  const models::GptConfig cfg = train::read_checkpoint_config(dir, &state);
  // The weights only pass through host memory: one thread, nothing is run.
  cpu::CpuBackend backend(1);
  models::Gpt model(cfg, backend);
  train::load_checkpoint(dir, model, nullptr);

  std::map<std::string, std::string> meta{{"step", std::to_string(state.step)}};
  if (!state.tokenizer.empty()) meta["tokenizer"] = state.tokenizer;
  OnnxExportSummary s = write_onnx(model, out_path, meta, options);
  s.checkpoint_dir = dir;
  return s;
}

}  // namespace brisk::exporter
