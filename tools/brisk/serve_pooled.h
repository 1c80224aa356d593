// `brisk serve` of an encoder checkpoint (serve_pooled.cpp): an encoder
// classifier or a sequence autoencoder, loaded for a serve::PooledService.
#pragma once

#include <string>

#include "brisk/serve/pooled.h"

namespace brisk::cli {

struct PooledServing {
  std::string checkpoint;   // the checkpoint directory read
  std::string what;         // for the start-up line: "encoder classifier, 2 classes [...]" or "sequence embedder, ..."
  serve::PooledModel model;  // its forward and encode hold the backend and the model they run
  serve::PooledEncode encode;
};

// The checkpoint `path` names (a checkpoint or run directory), when it is
// an encoder classifier's or a sequence autoencoder's; "" otherwise (a GPT,
// a file, nothing there: the GPT loader reports those).
std::string encoder_checkpoint(const std::string& path);

// Loads it, with `threads` CPU threads (0: one per core); a classifier in
// `precision` ("fp32" or "bf16", train::classifier_compute), an embedder in
// fp32 only (ConfigError for bf16).
PooledServing load_pooled(const std::string& checkpoint_dir, int threads, const std::string& precision);

}  // namespace brisk::cli
