// Checkpoints: a directory per step holding model.safetensors (HF GPT-2 names
// and layout), optimizer.safetensors (AdamW moments) and state.json (step,
// data position, model config, tokenizer, loss scaler). A checkpoint is written into a
// temporary directory and renamed into place, so a crash mid-write leaves the
// previous one intact; only the newest `keep` are kept.
#pragma once

#include <cstdint>
#include <optional>
#include <functional>
#include <string>
#include <vector>

#include "brisk/models/encoder.h"
#include "brisk/models/gpt.h"
#include "brisk/models/seq_autoencoder.h"
#include "brisk/optim/loss_scaler.h"
#include "brisk/optim/optimizer.h"
#include "brisk/optim/plateau.h"

namespace brisk::train {

struct TrainState {
  int64_t step = 0;             // optimizer steps completed
  uint64_t data_position = 0;   // windows drawn from the train split
  uint64_t seed = 0;
  std::string tokenizer;        // "bytes" / "gpt2"
  // Dynamic loss scaling's state, for runs that use it.
  std::optional<optim::LossScalerState> loss_scaler;
  // train.schedule = "plateau": the lr scale, best validation loss and count
  // of evaluations without improvement (absent in older checkpoints: fresh).
  std::optional<optim::PlateauState> lr_plateau;
};

// ZeRO-1: the optimizer's moments when each rank holds only its chunk of
// them. The function runs the gather (a collective, which the other ranks
// run at the same time) and hands every run of values to `place`: the
// parameter, the moment (0 exp_avg, 1 exp_avg_sq), its first element, the
// values; the file is filled as they come (dist::DataParallel::stream_moments).
using MomentPlace =
    std::function<void(const std::string& param, int moment, int64_t first, const float* values, int64_t count)>;
using ShardedMoments = std::function<void(const MomentPlace& place)>;

// Returns the directory written (out_dir/step_NNNNNNN). With `sharded`, the
// moments of every f32 parameter come from it, not from the store's state.
std::string save_checkpoint(const std::string& out_dir, const models::Gpt& model, const optim::AdamW* optimizer,
                            const TrainState& state, int keep, const ShardedMoments* sharded = nullptr);

// The newest checkpoint under out_dir, or "" if none. A path that is itself a
// checkpoint directory is returned as is; a train.keep_best directory
// (<run>/best) gives the checkpoint its best.json names (IoError naming the
// file when that is damaged).
std::string latest_checkpoint(const std::string& path);
// latest_checkpoint(path) for a command that needs one: throws IoError naming
// `path` when it holds no checkpoint (ConfigError when it is empty).
std::string require_checkpoint(const std::string& path);

// Reads config + state; throws IoError/ConfigError naming the file and problem.
models::GptConfig read_checkpoint_config(const std::string& ckpt_dir, TrainState* state = nullptr);
// Loads weights (and moments, if optimizer != nullptr) into an existing model
// whose config must match: another model size is rejected with both shapes
// named. Every name and shape is checked before a tensor is read; a tensor
// found damaged while reading (NaN, a file cut short) throws with the model
// partly loaded, so a caller must not use it after a throw.
void load_checkpoint(const std::string& ckpt_dir, models::Gpt& model, optim::AdamW* optimizer);

// ---- the epoch-based runs (encoder classifiers, sequence autoencoders) ------------------
// What built a run's batch stream, and the autoencoder's dropout generator:
// `brisk train --resume` rebuilds the same stream from the config, checks it
// against these, and continues at the checkpoint's step (mid-epoch too).
// Checkpoints written before resume existed have none: they cannot be resumed.
struct EpochRunState {
  int64_t batch = 0;            // train.batch
  int64_t steps_per_epoch = 0;  // batches per epoch, from the split and the batch
  int64_t train_records = 0;    // records in the train split
  bool bucket = true;           // data.bucket
  uint64_t split_seed = 0;      // data.split_seed
  double train_frac = 0, val_frac = 0;
  uint64_t input_dropout_state = 0;  // the autoencoder's input-dropout generator (0 for a classifier)
  // Hex digest of the train split's records in split order (their tokens, and
  // a classifier's labels): a store holding other records of the same count
  // is refused on resume. Empty in checkpoints written before it existed.
  std::string train_digest;
};

// ---- encoder classifiers ---------------------------------------------------------------
// The same directory layout; state.json says "kind": "encoder-classifier"
// (GPT checkpoints say "gpt" or nothing), so a classifier handed to
// generate, or a GPT handed to classify, is refused with both kinds named.
struct EncoderCheckpoint {
  models::EncoderConfig config;
  std::vector<std::string> label_names;  // one per class
  std::string tokenizer;                 // the record store's: "gpt2", "bytes", "fasta"
  bool strip_headers = false;            // trained on message bodies: classify strips headers too
  int64_t step = 0;
  uint64_t seed = 0;
  std::optional<EpochRunState> run;      // what --resume needs (absent in older checkpoints)
};
std::string save_encoder_checkpoint(const std::string& out_dir, const models::Encoder& model,
                                    const optim::AdamW* optimizer, const EncoderCheckpoint& info, int keep);
// Throws IoError naming the file and field for a damaged state, or another kind.
EncoderCheckpoint read_encoder_checkpoint(const std::string& ckpt_dir);
// Weights, and the AdamW moments and step count when `optimizer` is given (a resume).
void load_encoder_checkpoint(const std::string& ckpt_dir, models::Encoder& model, optim::AdamW* optimizer = nullptr);

// ---- sequence autoencoders -------------------------------------------------------------
// The same layout again, "kind": "seq-autoencoder": what `brisk encode` and
// `brisk decode` read, and what generate / classify refuse by name.
struct AutoencoderCheckpoint {
  models::SeqAutoencoderConfig config;
  std::string tokenizer;  // the record store's: "fasta"
  int64_t step = 0;
  uint64_t seed = 0;
  std::optional<EpochRunState> run;  // what --resume needs (absent in older checkpoints)
};
std::string save_autoencoder_checkpoint(const std::string& out_dir, const models::SeqAutoencoder& model,
                                        const optim::AdamW* optimizer, const AutoencoderCheckpoint& info, int keep);
// Throws IoError naming the file and field for a damaged state, or another kind.
AutoencoderCheckpoint read_autoencoder_checkpoint(const std::string& ckpt_dir);
// Weights, and the AdamW moments and step count when `optimizer` is given (a resume).
void load_autoencoder_checkpoint(const std::string& ckpt_dir, models::SeqAutoencoder& model,
                                 optim::AdamW* optimizer = nullptr);

// What a checkpoint holds, from its state.json's "kind": "gpt" (also when
// the field is absent: GPT checkpoints predate it), "encoder-classifier" or
// "seq-autoencoder"; any other string is returned as it is. Throws IoError
// naming the file for a missing or damaged state.json.
std::string checkpoint_kind(const std::string& ckpt_dir);
inline constexpr const char* kGptCheckpoint = "gpt";
inline constexpr const char* kEncoderCheckpoint = "encoder-classifier";
inline constexpr const char* kAutoencoderCheckpoint = "seq-autoencoder";

// Hugging Face stores Conv1D weights (in, out); brisk stores (out, in).
bool is_hf_conv1d_weight(const std::string& name);
// Parameter `pname` (meta `param`) from its tensor in a model.safetensors:
// checked against the parameter (Conv1D weights as (in, out)), transposed
// where HF layout needs it. Throws IoError naming `path`, both shapes.
core::Tensor param_from_file(const std::string& path, const std::string& pname, const core::Tensor& stored,
                             const core::TensorMeta& param);

}  // namespace brisk::train
