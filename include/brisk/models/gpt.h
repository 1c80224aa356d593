// The GPT-2 architecture as docs/workloads.md defines it: pre-LayerNorm blocks
// (eps 1e-5), tanh-GELU, learned positions, biases on every Linear, a final
// LayerNorm and an LM head tied to the token embedding. Parameters use the
// Hugging Face GPT-2 names ("h.0.attn.c_attn.weight", ...); internally every
// Linear weight is stored (out, in) like torch.nn.Linear, and checkpoints
// transpose the Conv1D weights to HF's (in, out) layout on the way out.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "brisk/core/backend.h"
#include "brisk/core/executor.h"
#include "brisk/core/graph_cache.h"
#include "brisk/core/param_store.h"

namespace brisk::models {

// The fused classifier's chunk on a GPU: 1 GiB of f32 logits, i.e. two
// chunks of 8192 bf16 rows at G1's shape (N 16384, V 50304); with the CPU's
// 64 MiB (25 chunks of 656 rows) a G1 step on an H200 took 37.4 instead of
// 34.2 ms (docs/gpu.md).
inline constexpr int64_t kDeviceClassifierChunkFloats = int64_t(1) << 28;

struct GptConfig {
  int64_t vocab_size = 256;  // embedding rows (GPT-2 BPE is padded from 50257 to 50304)
  int64_t n_layer = 6;
  int64_t n_embd = 384;
  int64_t n_head = 6;
  int64_t block_size = 256;  // longest sequence (rows of the position embedding)
  // Attention kernel, not part of the weights: "flash" (tiled, online softmax,
  // saves only per-row statistics; the backward recomputes the scores) or
  // "plain" (saves the (B, n_head, T, T) probabilities). Same function; either
  // loads the other's checkpoints. Plain by default: at W2's shape (B 8, T 256,
  // 6 heads of 64) on 2 threads flash's fwd+bwd takes ~1.13x plain's time
  // (bench_attention); flash is the choice when memory is what runs out.
  std::string attention = "plain";
  // Train programs: the LM head, the loss and their backward as one chunked
  // op (ops::classifier_fusion), so the (B*T, V) logits and their gradient
  // never exist. Eval programs: the head and the loss in row chunks of at
  // most 16 MiB of logits (Gpt::eval_chunk_rows). Same function; logits
  // programs unfused (they hand the logits out).
  // Off by default: at W1 it cuts the planned arena from 950 to 222 MiB (peak
  // RSS 1347 -> 667 MiB when measured) but ran 2-9% slower here (its row-chunked gemms are
  // a little less efficient than the three whole ones); at W2 no memory gain.
  bool fused_classifier = false;
  // Its train op's chunk: f32 logits per chunk of rows in the op's workspace
  // (CrossEntropyParams::chunk_floats; model.classifier_chunk_mb in a config,
  // docs/tuning.md). 0: the backend's choice, 64 MiB on a
  // CPU (near its caches) and kDeviceClassifierChunkFloats on a GPU (whose
  // products fill the chip only at thousands of rows). `brisk plan` sets the
  // GPU's figure to plan a CUDA run on a machine without one.
  int64_t classifier_chunk_floats = 0;
  // Every program (train, eval, logits): each MLP's c_fc Linear and its GELU
  // as one linear_gelu (ops::bias_gelu_fusion: each thread applies GELU to
  // its block of rows right after its gemm), and each residual add with the
  // LayerNorm that reads it as one add_layernorm
  // (ops::residual_layernorm_fusion). The same function and gradients up to
  // float rounding (fp32 weights after a few steps differ by ~5e-6 at most,
  // losses agree to every printed digit); not part of the weights.
  // Off by default: no measurable step-time gain on this 2-core machine. W2
  // fwd+bwd, 30 interleaved rounds, quiet machine: off 1127 ms, bias+GELU
  // 1126, residual+LN 1131, both 1138 (+-1% noise). Per op, 2048 rows, one
  // thread: add_layernorm 0.36 ms vs add + layernorm 0.48 (x13 per W2 step);
  // linear_gelu 30.3 ms vs linear + gelu 30.2 (GELU is compute bound).
  // `brisk train` 12 steps, median ms/step of steps 4-12: W2 off 1166,
  // bias+GELU 1198, residual+LN 1217, both 1151; W1 off 1518 / 1679, both
  // 1688 / 1680 in two runs: run-to-run noise (+-6%) is larger than any gain.
  bool fuse_bias_gelu = false;
  // Each residual add and the LayerNorm after it as one add_layernorm
  // (ops::residual_layernorm_fusion). "auto" (the default): off on the CPU
  // (no gain, above), on on a GPU, where it is one pass over the rows instead
  // of two (G1 on an H200: 34.3 against 34.8 ms per step, docs/gpu.md),
  // except under recompute = "full": fused across a block boundary, the next
  // block's ln_1 output is made in this block's segment and kept (W2's full
  // arena 78.0 -> 90.1 MiB in fp32).
  // "on" | "off"; a config file's true / false mean on / off.
  std::string fuse_residual_layernorm = "auto";
  // Train programs: each LayerNorm's backward and the add that sums its dx
  // into the residual stream's gradient (and, in mixed precision, the cast
  // narrowing that sum for the branch below) as one layernorm_backward
  // (ops::residual_layernorm_backward_fusion): one pass over the rows where
  // there were two (three in mixed precision). "auto" (the default): on
  // (the CUDA kernels passed the op harness on an H200, and G1 ran 34.1
  // against 34.8 ms per step with it, docs/gpu.md). "on" | "off".
  std::string fuse_layernorm_backward = "auto";
  // Train programs: the MLP's second Linear's input-gradient product and the
  // GELU backward after it as one matmul_gelu_backward
  // (ops::gelu_backward_fusion; cuBLASLt's DGELU epilogue on a GPU, so the
  // (B, T, 4C) product is not written and read back). The CPU composes the
  // same two kernels (same bits, no speed change). "auto" (the default): on
  // (the CUDA path passed the op harness on an H200; G1 ran 34.3 against
  // 34.8 ms per step with it, docs/gpu.md). "on" | "off".
  std::string fuse_gelu_backward = "auto";
  // Train programs: a Linear's weight gradient (dy^T x summed into the
  // parameter's gradient) and its bias gradient (dy's column sums) as one
  // linear_param_grad (ops::bias_grad_fusion; cuBLASLt's BGRADB epilogue on
  // a GPU sums the columns while the product reads dy, so dy is not read a
  // second time). The CPU composes the same two kernels (same bits).
  // "auto" (the default): on for the CPU; off on a GPU, where the epilogue's
  // reduction slowed the product by what the separate pass cost (G1 on an
  // H200: 34.1 against 33.7 ms per step, docs/gpu.md). "on" | "off".
  std::string fuse_bias_backward = "auto";
  // Train programs without recomputation: the forward's casts of the f32
  // weights and biases to the compute dtype (mixed precision: 97 in G1) as
  // one cast_many at the step's start (ops::weight_cast_fusion): a
  // multi-tensor kernel where there were 97 launches. Same bits; the copies
  // are all alive at the end of the forward either way, so the peak memory
  // does not grow. G1 on an H200 measured no gain (1.001x: in a replayed
  // graph the 97 casts cost about 0.03 ms, docs/gpu.md); it stays on as one
  // node instead of 97. "auto" (the default): on. "on" | "off".
  std::string fuse_weight_casts = "auto";
  // Compute dtype of the graph (mixed precision): f32, bf16 or f16. The
  // ParameterStore keeps fp32 master weights and grads whatever this says;
  // a low-precision graph casts each weight at its use (the cast's backward
  // brings the gradient back to fp32), runs the matrix products, attention,
  // GELU and the logits in this dtype with fp32 accumulation, and keeps the
  // residual stream, LayerNorm and the loss in fp32 (gpt.cpp says why).
  // Not part of the weights, like `attention`; the trainer sets it from
  // train.precision.
  core::DType compute = core::DType::f32;
  // Train programs only (train.recompute): which activations the backward
  // recomputes instead of keeping them from the forward (core::recompute).
  // "none"; "selective": GELU and LayerNorm outputs, elementwise work, about
  // 6 of the ~16 (B, T, C)-sized tensors a block saves; "full": each block
  // replays its forward in the backward from its saved input, only the
  // residual stream between blocks stays (the blocks' forward products run
  // twice: +23% of a W2 step's FLOPs). `brisk plan` prints each level's
  // memory. Same function, same gradients; not part of the weights.
  std::string recompute = "none";
  // Train programs only (model.dropout): the probability in [0, 1) that
  // dropout zeroes an element of the embeddings' sum and of each block's
  // two residual branches (the attention's and the MLP's projections)
  // before they are added, as GPT-2's embd_pdrop and resid_pdrop. 0 (the
  // default) builds no dropout at all. Each micro-step's masks come from its
  // key (models::dropout_key): no mask is stored, and the backward,
  // recomputed blocks and a resumed run remake the same ones. Eval and
  // logits programs never drop. CPU only for now. Not part of the weights.
  float dropout = 0.f;
  // Train programs only (model.attention_dropout): the same for each
  // block's attention probabilities after the softmax, as GPT-2's
  // attn_pdrop (nanoGPT's attn_dropout), inside the attention kernels,
  // flash ones too (no T x T mask is stored either). Independent of
  // `dropout`; 0 (the default) changes nothing.
  float attention_dropout = 0.f;

  // "W1"/"gpt2-tiny", "W2"/"char-small", "G1"/"gpt2-124m"; throws ConfigError listing them.
  static GptConfig preset(const std::string& name);
  // Throws ConfigError naming the field if the shape is impossible.
  void validate() const;
  int64_t num_params() const;  // tied head counted once
  // Training FLOPs per token: 6N + 12 L T C (PaLM / nanoGPT count).
  double flops_per_token(int64_t seq) const;
  bool operator==(const GptConfig& o) const = default;
  // Same parameter names and shapes (every field but the kernel choices
  // `attention`, `fused_classifier` and `compute`): what a
  // checkpoint must match to load.
  bool same_shape(const GptConfig& o) const;
  // This config with each "auto" fusion mode above made "on" or "off" as it
  // resolves on a GPU (on_device) or on the CPU: what a program built there
  // fuses. The model builds its graphs from it, and planning a GPU run on
  // this machine (train::planned_model_config) uses it to plan the GPU's.
  GptConfig with_fusions_for(bool on_device) const;
};

// One compiled step for one (batch, seq) shape.
struct GptProgram {
  core::Graph graph;
  core::ValueId ids = core::kNoValue, targets = core::kNoValue, pos = core::kNoValue;
  core::ValueId logits = core::kNoValue, loss = core::kNoValue;  // no logits in fused train programs
  core::ValueId loss_scale = core::kNoValue;  // train programs: the backward seed
  core::ValueId dropout_key = core::kNoValue;  // train programs with dropout: (2) i32, written each micro-step
  // Eval programs with the fused classifier: the loss of each row chunk, (K)
  // f32, with the rows of each; `loss` and `logits` are then kNoValue.
  core::ValueId chunk_losses = core::kNoValue;
  std::vector<int64_t> chunk_rows;
  std::vector<float> chunk_loss_host;  // eval_loss()'s read-back
  float last_loss_scale = -1.f;                // the seed last written (written only on change)
  std::unique_ptr<core::Executor> executor;
  int64_t batch = 0, seq = 0;
};

class Gpt {
 public:
  Gpt(const GptConfig& config, core::Backend& backend);

  const GptConfig& config() const { return config_; }
  core::ParameterStore& params() { return params_; }
  const core::ParameterStore& params() const { return params_; }
  core::Backend& backend() { return backend_; }

  // normal(0, 0.02); residual projections scaled by 1/sqrt(2 n_layer);
  // LayerNorm weights 1; biases 0. Same seed, same weights, on any machine.
  void init_weights(uint64_t seed);

  // Forward + backward on one micro-batch: gradients are *added* to the
  // parameter grads, scaled by loss_scale. Returns the (unscaled) mean loss.
  // x and y hold batch*seq token ids; an id outside the vocab throws.
  // With model.dropout, `dropout_key` picks the masks (models::dropout_key):
  // a caller training with dropout passes each micro-step its own (the same
  // key twice drops the same elements); without dropout it is unused.
  double train_micro_step(const int32_t* x, const int32_t* y, int64_t batch, int64_t seq, double loss_scale = 1.0,
                          uint64_t dropout_key = 0);
  // Forward only: mean loss. With fused_classifier the head and the loss
  // run in chunks of eval_chunk_rows() rows: the (batch*seq, vocab) logits
  // never exist, and the chunk means are combined here (by kept targets).
  double eval_loss(const int32_t* x, const int32_t* y, int64_t batch, int64_t seq);
  // Rows per chunk of that eval head for `rows` = batch*seq rows (== rows:
  // one chunk).
  static int64_t eval_chunk_rows(int64_t rows, int64_t vocab);
  // Forward only: logits (batch*seq, vocab) in f32; valid until the next call.
  const float* logits(const int32_t* x, int64_t batch, int64_t seq);

  // The program for a shape (built and planned on first use).
  GptProgram& program(bool train, int64_t batch, int64_t seq);
  // The graph a train program for this shape would run, built but neither
  // planned nor cached: for memory reports and tests that plan without running.
  core::Graph train_graph(int64_t batch, int64_t seq) { return std::move(build(Mode::train, batch, seq)->graph); }
  // The same for the eval program (forward and loss; the head in row chunks
  // with fused_classifier): its arena lives beside the train program's once
  // a run has evaluated (train/tune.cpp).
  core::Graph eval_graph(int64_t batch, int64_t seq) { return std::move(build(Mode::eval, batch, seq)->graph); }
  size_t cached_programs() const { return train_cache_.size() + eval_cache_.size() + logits_cache_.size(); }

 private:
  enum class Mode { train, eval, logits };
  std::unique_ptr<GptProgram> build(Mode mode, int64_t batch, int64_t seq);
  GptProgram& get(Mode mode, int64_t batch, int64_t seq);
  void feed(GptProgram& p, const int32_t* x, const int32_t* y);

  GptConfig config_;
  core::Backend& backend_;
  core::ParameterStore params_;
  core::ShapeCache<GptProgram> train_cache_, eval_cache_, logits_cache_;
  // The last program of each mode: every micro-step asks for the same one,
  // and finding it here needs no cache key (which would allocate).
  struct LastProgram {
    int64_t batch = 0, seq = 0;
    GptProgram* program = nullptr;
  };
  LastProgram last_[3];
  std::vector<float> host_logits_;  // logits() on a device backend: the host copy
};

}  // namespace brisk::models
