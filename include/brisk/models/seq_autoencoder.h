// A sequence autoencoder for residue sequences (proteins): a bidirectional
// transformer encoder squeezes each sequence into one latent vector, and a
// causal transformer decoder rebuilds the sequence from that vector alone,
// one residue after another. The latent is what `brisk encode` exports as a
// per-sequence feature; `brisk decode` turns latents back into sequences.
//
// Encoder: the encoder classifier's body (token + position embeddings,
// pre-LN blocks with attention masked at the padding, final LayerNorm, masked
// mean pooling), then a Linear to `latent` numbers instead of class logits.
// Decoder: at position t its input is residue t-1 (position 0 gets token 0,
// the padding id, whose embedding row thus is a learned start vector), plus a
// position embedding, plus a Linear projection of the latent added at every
// position; causal pre-LN blocks, a final LayerNorm and a Linear to the
// residue vocabulary. The loss is the mean cross-entropy over real positions.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "brisk/core/backend.h"
#include "brisk/core/executor.h"
#include "brisk/core/graph_cache.h"
#include "brisk/core/param_store.h"

namespace brisk::models {

struct SeqAutoencoderConfig {
  int64_t vocab_size = 28;  // residue tokens with 0 = padding (data::kFastaVocab; models cannot see data/)
  int64_t n_layer = 2;      // blocks in the encoder, and as many in the decoder
  int64_t n_embd = 64;
  int64_t n_head = 4;
  int64_t max_len = 256;    // longest sequence (rows of both position embeddings)
  int64_t latent = 32;      // numbers per sequence between encoder and decoder
  // Attention kernel, not part of the weights: "plain" or "flash" (tiled,
  // log-sum-exp only; the default: as fast as plain, in less memory,
  // docs/autoencoder.md).
  std::string attention = "flash";
  // Compute dtype of both stacks' blocks in the train program (mixed
  // precision): f32 or bf16, as EncoderConfig::compute (fp32 master weights
  // and grads; embeddings, residual stream, pooling, the latent, the head
  // and the loss in f32). Encoding, teacher-forced logits and decoding stay
  // f32 whatever this says: they are what `brisk encode` / `brisk decode`
  // compute from the fp32 weights of a checkpoint, so a run's validation and
  // test figures are the ones its checkpoint reproduces, and the cached
  // decoder (host ops one by one, f32) matches the recomputing one. Not part
  // of the weights; the trainer sets it from train.precision.
  core::DType compute = core::DType::f32;
  // Train programs only (train.recompute): which activations the backward
  // recomputes instead of keeping them from the forward, "none",
  // "selective" or "full" (block_recompute.h; full replays the blocks of
  // both stacks). Same gradients, less memory; not part of the weights.
  std::string recompute = "none";

  // Throws ConfigError naming the field if the shape is impossible.
  void validate() const;
  int64_t num_params() const;
  // Training FLOPs per real token at sequence length `seq` (6N without the
  // embedding gathers, plus the attention products of both stacks).
  double flops_per_token(int64_t seq) const;
  bool same_shape(const SeqAutoencoderConfig& o) const;  // every field but `attention`, `compute` and `recompute`
};

// One compiled program for one (batch, seq) shape; which values are set depends on the kind.
struct SeqAutoencoderProgram {
  core::Graph graph;
  core::ValueId ids = core::kNoValue, lengths = core::kNoValue, pos = core::kNoValue;
  core::ValueId dec_ids = core::kNoValue, targets = core::kNoValue, latent_in = core::kNoValue;
  core::ValueId latent = core::kNoValue, logits = core::kNoValue, loss = core::kNoValue;
  core::ValueId loss_scale = core::kNoValue;
  float last_loss_scale = -1.f;
  std::unique_ptr<core::Executor> executor;
  int64_t batch = 0, seq = 0;
};

class SeqAutoencoder {
 public:
  // What a program computes.
  enum class Kind {
    train,        // ids, lengths -> loss, with the backward pass
    encode,       // ids, lengths -> latent (B, latent)
    reconstruct,  // ids, lengths -> teacher-forced logits (B, T, vocab)
    decode,       // latent (B, latent), decoder inputs (B, T) -> logits (B, T, vocab)
  };

  SeqAutoencoder(const SeqAutoencoderConfig& config, core::Backend& backend);

  const SeqAutoencoderConfig& config() const { return config_; }
  core::ParameterStore& params() { return params_; }
  const core::ParameterStore& params() const { return params_; }

  // The GPT's recipe (models/init.h), seeded.
  void init_weights(uint64_t seed);
  // Training only: each decoder input residue (not the start token) becomes
  // token 0 with probability p, drawn from a generator seeded here. With p =
  // 0 (the default) teacher forcing lets the decoder predict most residues
  // from the ones before and neglect the latent; blanking some inputs makes
  // it read the latent (Bowman et al. 2016, "word dropout"). Reconstruction
  // (logits, decode) never drops anything.
  void set_input_dropout(double p, uint64_t seed);
  // The generator's state now: a checkpoint keeps it, and a resumed run
  // passes it back as set_input_dropout's seed to draw the same blanks.
  uint64_t input_dropout_state() const { return dropout_state_; }

  // ids: batch*seq residue tokens, right-padded; lengths: batch values in
  // [1, seq]. Out-of-range ids or lengths throw ShapeError naming them.
  // Forward + backward; gradients are *added* to the parameter grads, scaled
  // by loss_scale. Returns the mean cross-entropy over the real positions.
  double train_micro_step(const int32_t* ids, const int32_t* lengths, int64_t batch, int64_t seq,
                          double loss_scale = 1.0);
  // (batch, latent) f32, valid until the next encode() call.
  const float* encode(const int32_t* ids, const int32_t* lengths, int64_t batch, int64_t seq);
  // Teacher-forced (batch, seq, vocab) f32 logits: row b, position t predicts
  // residue t from the latent and the true residues before t. Valid until the next logits() call.
  const float* logits(const int32_t* ids, const int32_t* lengths, int64_t batch, int64_t seq);
  // Greedy decoding from latents (batch x latent f32): each row grows to
  // lengths[b] residues (in [1, max_len]), every step the argmax residue
  // (never the padding token). Returns batch x max(lengths) tokens, 0 past
  // each row's length. Takes decode_cached() on a host backend, else
  // decode_recompute() (seq_autoencoder_decode.cpp).
  std::vector<int32_t> decode(const float* latents, const int32_t* lengths, int64_t batch);
  std::vector<int32_t> decode(const float* latents, int64_t batch, int64_t length);
  // The whole decoder graph again at every step, no KV cache: the reference.
  std::vector<int32_t> decode_recompute(const float* latents, const int32_t* lengths, int64_t batch);
  // One position per step with a key/value cache (host parameters only).
  std::vector<int32_t> decode_cached(const float* latents, const int32_t* lengths, int64_t batch);

  // The compiled program for (batch, seq), for inspection (its graph, its
  // plan); its inputs are written when a step runs it.
  SeqAutoencoderProgram& program(Kind kind, int64_t batch, int64_t seq);
  // The graph program(kind, batch, seq) would run, built but neither
  // planned nor cached (`brisk plan`).
  core::Graph graph(Kind kind, int64_t batch, int64_t seq) { return std::move(build(kind, batch, seq)->graph); }
  size_t cached_programs() const;

  // `brisk train --profile`: every train program times its ops, those
  // compiled later too; the times are summed over the programs of every width.
  void set_train_profiling(bool on);
  core::Executor::OpTimes train_op_times() const;

 private:
  std::unique_ptr<SeqAutoencoderProgram> build(Kind kind, int64_t batch, int64_t seq);
  void feed(SeqAutoencoderProgram& p, const int32_t* ids, const int32_t* lengths);
  // Value v of a program of `kind` on the host: its arena buffer on a host
  // backend, else a copy in that kind's host buffer.
  const float* host(Kind kind, SeqAutoencoderProgram& p, core::ValueId v, size_t count);
  void write_positions(SeqAutoencoderProgram& p);

  SeqAutoencoderConfig config_;
  core::Backend& backend_;
  core::ParameterStore params_;
  // The program of `kind` for (B, T), ready to run: when another program
  // ran in its kind's arena since, the inputs written once (positions, the
  // loss scale) are written again.
  SeqAutoencoderProgram& ready(Kind kind, int64_t B, int64_t T);

  // The programs of one kind (one per batch width) run one at a time, so
  // they share one arena, sized for the widest, as the encoder's do
  // (encoder.h): a run evaluates at many widths, and an arena per program
  // kept every one of them. A kind's output stays valid until that kind
  // runs again. last_[kind] is the program whose inputs its arena holds.
  core::SharedArena arenas_[4]{core::SharedArena{backend_.allocator()}, core::SharedArena{backend_.allocator()},
                               core::SharedArena{backend_.allocator()}, core::SharedArena{backend_.allocator()}};
  const SeqAutoencoderProgram* last_[4] = {};
  std::vector<int32_t> positions_;  // 0, 1, 2, ...: every program's `pos` input
  core::ShapeCache<SeqAutoencoderProgram> caches_[4];
  bool profile_train_ = false;
  std::vector<int32_t> dec_ids_, targets_;
  double input_dropout_ = 0;
  uint64_t dropout_state_ = 0;
  std::vector<float> host_out_[4];  // per kind, as the arenas
};

}  // namespace brisk::models
