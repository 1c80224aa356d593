// Loading an encoder checkpoint for `brisk serve` (serve_pooled.h): the
// model, its forward for the PooledService, and how an input text becomes
// token ids, read the way `brisk classify` and `brisk encode` read their
// inputs.
#include "serve_pooled.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>

#include <nlohmann/json.hpp>

#include "brisk/core/error.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/data/converters.h"
#include "brisk/data/tokenizer.h"
#include "brisk/models/encoder.h"
#include "brisk/models/seq_autoencoder.h"
#include "brisk/serve/api.h"
#include "brisk/train/checkpoint.h"
#include "brisk/train/classifier_trainer.h"

namespace brisk::cli {

namespace fs = std::filesystem;

std::string encoder_checkpoint(const std::string& path) {
  if (!fs::is_directory(path)) return "";
  const std::string dir = train::latest_checkpoint(path);
  if (dir.empty()) return "";
  const std::string kind = train::checkpoint_kind(dir);
  return kind == train::kEncoderCheckpoint || kind == train::kAutoencoderCheckpoint ? dir : "";
}

namespace {

// A model on its own CPU backend; the closures that run it share it.
template <class Model>
struct Owned {
  cpu::CpuBackend backend;
  Model model;
  template <class Config>
  Owned(const Config& config, int threads) : backend(threads), model(config, backend) {}
};

// A classifier reads the text with its tokenizer, its body only when it was
// trained on bodies (as brisk classify reads a message file).
PooledServing load_classifier(const std::string& dir, int threads, const std::string& precision) {
  train::EncoderCheckpoint info = train::read_encoder_checkpoint(dir);
  std::shared_ptr<const data::Tokenizer> tok = train::message_tokenizer(info, dir, "brisk serve");
  info.config.compute = train::classifier_compute(
      precision, [](const std::string& line) { std::fprintf(stderr, "brisk serve: %s\n", line.c_str()); });
  auto owned = std::make_shared<Owned<models::Encoder>>(info.config, threads);
  train::load_encoder_checkpoint(dir, owned->model);
  PooledServing s;
  s.checkpoint = dir;
  s.what = "encoder classifier, " + std::to_string(info.config.n_classes) + " classes " +
           nlohmann::json(info.label_names).dump() + ", " + info.tokenizer + " tokens" +
           (info.strip_headers ? " of message bodies" : "") +
           (info.config.compute == core::DType::bf16 ? ", bf16" : "");
  s.model.kind = serve::PooledModel::Kind::classifier;
  s.model.width = info.config.n_classes;
  s.model.max_len = info.config.max_len;
  // Ids a request may send: the tokenizer's (the embedding may be padded past them).
  s.model.vocab = std::min<int64_t>(info.config.vocab_size, int64_t(tok->vocab_size()));
  s.model.labels = info.label_names;
  // The service answers probabilities: the logits' softmax, into a buffer
  // the next forward reuses.
  const int64_t K = info.config.n_classes;
  auto probs = std::make_shared<std::vector<float>>();
  s.model.forward = [owned, K, probs](const int32_t* ids, const int32_t* lengths, int64_t B, int64_t T) {
    probs->resize(size_t(B * K));
    train::class_probabilities(owned->model.logits(ids, lengths, B, T), B, K, probs->data());
    return static_cast<const float*>(probs->data());
  };
  s.encode = [tok, info](const std::string& text, const std::string& param) {
    const std::string_view in = train::message_text(info, text);
    if (!text.empty() && in.empty())
      throw serve::ApiError(400, param + ": the message has no body: the classifier reads bodies only, so it "
                                 "takes a whole message (headers, an empty line, the body), or a body alone after "
                                 "an empty line", param);
    return tok->encode(in);
  };
  return s;
}

// A sequence autoencoder's encoder reads residue letters (either case;
// white space between them is ignored, as inside FASTA lines, line breaks
// too).
PooledServing load_embedder(const std::string& dir, int threads, const std::string& precision) {
  if (precision != "fp32")
    throw core::ConfigError("--precision " + precision + ": " + dir +
                            " is a sequence autoencoder, whose encoder serves in fp32 only");
  const train::AutoencoderCheckpoint info = train::read_autoencoder_checkpoint(dir);
  auto owned = std::make_shared<Owned<models::SeqAutoencoder>>(info.config, threads);
  train::load_autoencoder_checkpoint(dir, owned->model);
  PooledServing s;
  s.checkpoint = dir;
  s.what = "sequence embedder (a sequence autoencoder's encoder), latent " + std::to_string(info.config.latent) +
           ", " + info.tokenizer + " residues";
  s.model.kind = serve::PooledModel::Kind::embedder;
  s.model.width = info.config.latent;
  s.model.max_len = info.config.max_len;
  s.model.vocab = info.config.vocab_size;
  s.model.forward = [owned](const int32_t* ids, const int32_t* lengths, int64_t B, int64_t T) {
    return owned->model.encode(ids, lengths, B, T);
  };
  s.encode = [](const std::string& text, const std::string& param) {
    std::vector<int32_t> ids;
    ids.reserve(text.size());
    for (size_t i = 0; i < text.size(); ++i) {
      const unsigned char c = static_cast<unsigned char>(text[i]);
      if (c == '\n' || data::fasta_space(c)) continue;  // lines joined, as FASTA records are
      const int32_t t = data::fasta_token(c);
      if (t == 0) {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02X", unsigned(c));
        throw serve::ApiError(400, param + ": invalid residue " +
                                       (c >= 0x20 && c < 0x7f ? "'" + std::string(1, char(c)) + "' " : std::string()) +
                                       "(" + hex + ") at byte " + std::to_string(i) + " (residues: " +
                                       std::string(data::kFastaAlphabet) + ", either case)",
                              param);
      }
      ids.push_back(t);
    }
    return ids;
  };
  return s;
}

}  // namespace

PooledServing load_pooled(const std::string& dir, int threads, const std::string& precision) {
  return train::checkpoint_kind(dir) == train::kEncoderCheckpoint ? load_classifier(dir, threads, precision)
                                                                  : load_embedder(dir, threads, precision);
}

}  // namespace brisk::cli
