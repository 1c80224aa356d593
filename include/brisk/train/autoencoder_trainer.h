// Training a sequence autoencoder on a FASTA record store (`brisk train
// --config configs/protein.toml`), and the pieces `brisk encode` / `brisk
// decode` share with it. The run mirrors the encoder classifier's
// (classifier_trainer.h): a seeded train/val/test split by distinct
// sequence, length-bucketed batches through the prefetching loader with an
// LRU record cache in front of the store, AdamW with warmup and cosine decay,
// validation and a checkpoint after each epoch. At the end it reports, on
// the held-out test split, the per-residue reconstruction accuracy of
// teacher-forced decoding and of free-running greedy decoding from the
// latent, next to the trivial predictor (the train split's most frequent
// residue everywhere). The run directory gets config.toml, metrics.jsonl,
// report.json and the checkpoints.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "brisk/data/cache.h"
#include "brisk/models/seq_autoencoder.h"
#include "brisk/train/autoencoder_config.h"
#include "brisk/train/classifier_trainer.h"  // Split

namespace brisk::train {

// Rows of the reconstruct and encode programs that score the val and test
// splits (at most max_len wide): their arenas live beside the train step's
// (`brisk plan`).
constexpr int64_t kAutoencoderEvalBatch = 32;

// Reconstruction of a set of sequences (each cut to the model's max_len).
struct Reconstruction {
  int64_t sequences = 0, residues = 0;
  double loss = 0;            // mean teacher-forced cross-entropy per residue (nats)
  double teacher_forced = 0;  // share of residues whose teacher-forced argmax is right
  double free_running = -1;   // the same for greedy decoding from the latent (-1: not run)
  double exact = -1;          // share of sequences greedy decoding rebuilds exactly (-1: not run)
  double trivial = 0;         // share of residues equal to the trivial residue
  int32_t trivial_token = 0;  // what the trivial predictor says everywhere
};

// Scores `sequences` (token ids, none empty) batched by length; greedy
// decoding only when `free_running` (it costs one decoder pass per position).
Reconstruction evaluate_reconstruction(models::SeqAutoencoder& model,
                                       const std::vector<std::vector<int32_t>>& sequences, int32_t trivial_token,
                                       bool free_running);

// Latents of sequences through an LRU cache keyed by a digest of each
// sequence's residues (data::token_digest of its first max_len tokens, all
// the model sees): a sequence met before -- earlier in the same call or in an
// earlier call on this object -- reuses its latent instead of being encoded
// again. One cache belongs to one model.
class LatentCache {
 public:
  LatentCache(models::SeqAutoencoder& model, size_t budget_bytes);
  // sequences.size() x latent f32, in input order. Each sequence is cut to
  // max_len; an empty one throws ShapeError naming its index.
  std::vector<float> encode(const std::vector<std::vector<int32_t>>& sequences);
  uint64_t hits() const { return hits_; }
  uint64_t lookups() const { return lookups_; }
  double hit_rate() const { return lookups_ ? double(hits_) / double(lookups_) : 0.0; }
  data::CacheStats stats() const { return cache_.stats(); }

 private:
  models::SeqAutoencoder& model_;
  data::LruCache cache_;
  uint64_t hits_ = 0, lookups_ = 0;
};

struct AutoencoderOptions {
  bool quiet = false;  // no output (tests)
  // Continue from the newest checkpoint in checkpoint.dir (a fresh run when
  // there is none): the same weights as an uninterrupted run, bit for bit.
  bool resume = false;
  // Time every op of the train steps: the table is printed at the end and
  // kept in report.json ("profile").
  bool profile = false;
};

struct AutoencoderResult {
  int64_t steps = 0, epochs = 0;  // steps: the run's total so far (a resumed run counts the earlier ones)
  int64_t start_step = 0;         // 0, or the checkpoint's step a resumed run continued from
  bool interrupted = false;       // stopped by SIGINT/SIGTERM: checkpoint saved, no test split or report
  double first_loss = 0, last_loss = 0;  // this process's first and last step
  double seconds = 0, train_seconds = 0, eval_seconds = 0;
  double tokens_per_s = 0;         // real (unpadded) residues per second of training steps
  double padded_tokens_per_s = 0;  // batch cells per second, padding included
  double padding_waste = 0;        // padded cells / all cells over the run
  double cache_hit_rate = 0;
  std::string precision_path = "fp32";  // fp32 | bf16-native | bf16-emulated (resolve_precision's path)
  int64_t records = 0, dropped_empty = 0, duplicates = 0;
  int64_t truncated = 0;  // kept sequences longer than max_len (cut to their first max_len residues)
  Split split;
  Reconstruction val, test;
  std::string checkpoint;  // the last one written
  // train.keep_best: the best epoch (1-based; 0: none kept), its score and
  // checkpoint (<out_dir>/best/step_*); `val` and `test` are then the best
  // weights' figures.
  int64_t best_epoch = 0;
  double best_score = 0;
  std::string best_checkpoint;
  bool early_stopped = false;  // train.early_stop ended training before train.epochs
};

AutoencoderResult train_autoencoder(const AutoencoderConfig& config, const AutoencoderOptions& options = {});

}  // namespace brisk::train
