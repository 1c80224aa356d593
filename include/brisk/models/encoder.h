// A bidirectional transformer encoder with a classification head, for
// labelled variable-length records (e-mails: ham/spam). Pre-LN blocks like the
// GPT's (same parameter names under "h.<l>."), but attention sees the whole
// sequence, masked only at padding: batches are right-padded to their longest
// member and `lengths` says where each row's real tokens end. The final
// LayerNorm's output is averaged over the real positions (masked mean
// pooling) and a Linear maps that to class logits.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "brisk/core/backend.h"
#include "brisk/core/executor.h"
#include "brisk/core/graph_cache.h"
#include "brisk/core/param_store.h"

namespace brisk::models {

struct EncoderConfig {
  // The defaults are preset E1's.
  int64_t vocab_size = 50304;  // token embedding rows (at least the store's vocabulary)
  int64_t n_layer = 4;
  int64_t n_embd = 256;
  int64_t n_head = 4;
  int64_t max_len = 512;   // longest sequence (rows of the position embedding)
  int64_t n_classes = 2;
  // Attention kernel, not part of the weights: "plain" keeps the
  // (B, n_head, T, T) probabilities for the backward; "flash" keeps only each
  // row's log-sum-exp and recomputes the scores. Flash is the default: it
  // trained E1 (at its earlier, smaller shape) faster than plain, in less
  // memory (docs/encoder.md).
  std::string attention = "flash";
  // Compute dtype of the blocks (mixed precision): f32 or bf16. The
  // ParameterStore keeps fp32 master weights and grads whatever this says; a
  // bf16 graph casts each block weight at its use, runs the blocks' products,
  // attention and GELU in bf16 with fp32 accumulation, and keeps the residual
  // stream, the LayerNorms' statistics, the embeddings, pooling, the head and
  // the loss in fp32 (as the GPT does, gpt.cpp). Not part of the weights, like
  // `attention`; the classifier trainer sets it from train.precision.
  core::DType compute = core::DType::f32;
  // Train programs only (train.recompute): which activations the backward
  // recomputes instead of keeping them from the forward, "none",
  // "selective" or "full" (block_recompute.h). Same gradients, less memory;
  // not part of the weights.
  std::string recompute = "none";
  // Train programs only (model.dropout): as the GPT's (GptConfig::dropout),
  // the embeddings' sum and each block's two residual branches, in [0, 1);
  // 0 builds none. Not part of the weights.
  float dropout = 0.f;
  // model.attention_dropout: as the GPT's (GptConfig::attention_dropout),
  // each block's attention probabilities.
  float attention_dropout = 0.f;
  // model.classifier_dropout: the pooled features before the head, as
  // Hugging Face's classifier_dropout (the config reader's default is
  // model.dropout's value, as theirs is the hidden dropout's).
  float classifier_dropout = 0.f;
  // train.label_smoothing: the train programs' cross-entropy targets
  // (1 - e) onehot + e / n_classes (Hugging Face's label_smoothing_factor,
  // PyTorch's label_smoothing), in [0, 1). Validation and test losses stay
  // the plain cross-entropy. Not part of the weights.
  float label_smoothing = 0.f;
  // train.class_weights: the train programs' cross-entropy weighs each row
  // by its label's weight and divides by the batch's sum of them (PyTorch's
  // CrossEntropyLoss(weight=...)). Empty: none; else n_classes finite
  // weights >= 0, not all 0. Validation and test losses stay unweighted.
  // Not part of the weights.
  std::vector<float> class_weights;

  // "E1" (the spam encoder of docs/workloads.md); throws ConfigError listing the presets.
  static EncoderConfig preset(const std::string& name);
  // Throws ConfigError naming the field if the shape is impossible.
  void validate() const;
  int64_t num_params() const;
  // Training FLOPs per real token at sequence length `seq`: 6N (without the
  // embedding tables, which are gathers) + 12 L T C for the attention products.
  double flops_per_token(int64_t seq) const;
  bool same_shape(const EncoderConfig& o) const;  // every field but `attention`, `compute`, `recompute` and the dropouts
};

// One compiled step for one (batch, seq) shape.
struct EncoderProgram {
  core::Graph graph;
  core::ValueId ids = core::kNoValue, lengths = core::kNoValue, pos = core::kNoValue, labels = core::kNoValue;
  core::ValueId logits = core::kNoValue, loss = core::kNoValue, loss_scale = core::kNoValue;
  core::ValueId dropout_key = core::kNoValue;  // train programs with dropout: (2) i32, written each micro-step
  core::ValueId class_weights = core::kNoValue;  // train programs with class weights: (n_classes) f32
  float last_loss_scale = -1.f;
  std::unique_ptr<core::Executor> executor;
  int64_t batch = 0, seq = 0;
};

class Encoder {
 public:
  Encoder(const EncoderConfig& config, core::Backend& backend);

  const EncoderConfig& config() const { return config_; }
  core::ParameterStore& params() { return params_; }
  const core::ParameterStore& params() const { return params_; }

  // normal(0, 0.02), residual projections scaled by 1/sqrt(2 n_layer),
  // LayerNorm weights 1, biases 0: the GPT's recipe, seeded the same way.
  void init_weights(uint64_t seed);

  // ids: batch*seq token ids, right-padded; lengths: batch values in
  // [1, seq]; labels: batch class ids. Ids and labels out of range throw.
  // Forward + backward; gradients are *added* to the parameter grads,
  // scaled by loss_scale. Returns the mean loss over the batch.
  // With any of the three dropouts, `dropout_key` picks the masks (models::dropout_key).
  double train_micro_step(const int32_t* ids, const int32_t* lengths, const int32_t* labels, int64_t batch,
                          int64_t seq, double loss_scale = 1.0, uint64_t dropout_key = 0);
  // Forward only: (batch, n_classes) logits in f32, valid until the next logits() call.
  const float* logits(const int32_t* ids, const int32_t* lengths, int64_t batch, int64_t seq);

  // The compiled program for (batch, seq), for inspection (its graph, its
  // plan); its inputs are written when a step runs it.
  EncoderProgram& program(bool train, int64_t batch, int64_t seq);
  // The graph program(train, batch, seq) would run, built but neither
  // planned nor cached (`brisk plan`).
  core::Graph graph(bool train, int64_t batch, int64_t seq) { return std::move(build(train, batch, seq)->graph); }
  size_t cached_programs() const { return train_cache_.size() + logits_cache_.size(); }

  // `brisk train --profile`: every train program times its ops, those
  // compiled later too; the times are summed over the programs of every width.
  void set_train_profiling(bool on);
  core::Executor::OpTimes train_op_times() const;

 private:
  std::unique_ptr<EncoderProgram> build(bool train, int64_t batch, int64_t seq);
  void feed(EncoderProgram& p, const int32_t* ids, const int32_t* lengths, const int32_t* labels);
  void write_positions(EncoderProgram& p);

  EncoderConfig config_;
  core::Backend& backend_;
  core::ParameterStore params_;
  // The program for (B, T), ready to run: when another program ran in its
  // arena since, the inputs written once (positions, the loss scale) are
  // written again.
  EncoderProgram& ready(bool train, int64_t B, int64_t T);

  // The train programs (one per batch width) run one at a time, so they
  // share one arena, sized for the widest; so do the logits programs, in an
  // arena of their own (logits() output stays valid while train steps run;
  // a run validates at many widths, and an arena per program kept every one
  // of them). last_[train] is the program whose inputs an arena holds.
  core::SharedArena arenas_[2]{core::SharedArena{backend_.allocator()}, core::SharedArena{backend_.allocator()}};
  const EncoderProgram* last_[2] = {};
  std::vector<int32_t> positions_;  // 0, 1, 2, ...: every program's `pos` input
  core::ShapeCache<EncoderProgram> train_cache_, logits_cache_;
  std::vector<float> host_logits_;
  bool profile_train_ = false;
};

}  // namespace brisk::models
