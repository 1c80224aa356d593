// GPT-2, read top to bottom. The model is a function from (batch, seq) to a
// graph: embeddings, n_layer pre-LN blocks (attention, MLP, residual adds),
// final LayerNorm, and the LM head as a Linear whose weight *is* the token
// embedding (tied: one parameter, two uses, gradients summed by autograd).
// One graph is built and planned per shape and mode, then cached, so a
// training run builds exactly one train program and one eval program.
#include "brisk/models/gpt.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "brisk/core/autograd.h"
#include "brisk/core/error.h"
#include "brisk/core/passes.h"
#include "brisk/models/block_recompute.h"
#include "brisk/models/init.h"
#include "brisk/models/lowp.h"
#include "brisk/models/transformer_block.h"
#include "brisk/ops/ops.h"

namespace brisk::models {

using core::ConfigError;
using core::DType;
using core::Graph;
using core::Shape;
using core::ValueId;

// ---- configuration ----------------------------------------------------------------

GptConfig GptConfig::preset(const std::string& name) {
  GptConfig c;
  if (name == "W1" || name == "gpt2-tiny") {
    c = {50304, 4, 256, 4, 256};
  } else if (name == "W2" || name == "char-small") {
    c = {256, 6, 384, 6, 256};
  } else if (name == "G1" || name == "gpt2-124m") {
    c = {50304, 12, 768, 12, 1024};
  } else {
    throw ConfigError("unknown model preset '" + name + "' (allowed: W1 / gpt2-tiny, W2 / char-small, G1 / gpt2-124m)");
  }
  return c;
}

void GptConfig::validate() const {
  auto positive = [](int64_t v, const char* key) {
    if (v <= 0) throw ConfigError(std::string("model.") + key + " must be positive, got " + std::to_string(v));
  };
  positive(vocab_size, "vocab_size");
  positive(n_layer, "n_layer");
  positive(n_embd, "n_embd");
  positive(n_head, "n_head");
  positive(block_size, "block_size");
  // Bounds far above any real model that keep every size derived from the
  // config (parameter counts, tensor bytes) clear of int64 overflow: a
  // hostile config or checkpoint state is rejected here, not in an allocation.
  auto at_most = [](int64_t v, int64_t limit, const char* key) {
    if (v > limit)
      throw ConfigError(std::string("model.") + key + " must be at most " + std::to_string(limit) + ", got " +
                        std::to_string(v));
  };
  constexpr int64_t kMaxDim = int64_t(1) << 24;
  at_most(vocab_size, int64_t(1) << 31, "vocab_size");  // token ids are int32
  at_most(n_layer, kMaxDim, "n_layer");
  at_most(n_embd, kMaxDim, "n_embd");
  at_most(n_head, kMaxDim, "n_head");
  at_most(block_size, kMaxDim, "block_size");
  constexpr int64_t kMaxParams = int64_t(1) << 40;
  const __int128 C = n_embd, per_layer = 12 * C * C + 13 * C;  // num_params() in 128 bits
  const __int128 params = vocab_size * C + block_size * C + n_layer * per_layer + 2 * C;
  if (params > kMaxParams) {
    char count[32];
    std::snprintf(count, sizeof count, "%.3g", double(params));
    throw ConfigError("model (n_layer " + std::to_string(n_layer) + ", n_embd " + std::to_string(n_embd) + ", vocab " +
                      std::to_string(vocab_size) + ", block " + std::to_string(block_size) + ") has " + count +
                      " parameters; at most 2^40 are supported");
  }
  if (n_embd % n_head != 0)
    throw ConfigError("model.n_embd (" + std::to_string(n_embd) + ") must be divisible by model.n_head (" +
                      std::to_string(n_head) + ")");
  if (attention != "flash" && attention != "plain")
    throw ConfigError("model.attention: unknown value '" + attention + "' (allowed: flash, plain)");
  for (const auto& [key, value] : {std::pair<const char*, const std::string&>{"fuse_residual_layernorm",
                                                                              fuse_residual_layernorm},
                                    {"fuse_layernorm_backward", fuse_layernorm_backward},
                                    {"fuse_gelu_backward", fuse_gelu_backward},
                                    {"fuse_bias_backward", fuse_bias_backward},
                                    {"fuse_weight_casts", fuse_weight_casts}})
    if (value != "auto" && value != "on" && value != "off")
      throw ConfigError("model." + std::string(key) + ": unknown value '" + value + "' (allowed: auto, on, off)");
  validate_recompute(recompute);
  Dropout::validate(dropout);
  Dropout::validate(attention_dropout, "model.attention_dropout");
  if (!core::dtype_is_float(compute))
    throw ConfigError("model compute dtype: unknown value '" + std::string(core::dtype_name(compute)) +
                      "' (allowed: f32, bf16, f16; set through train.precision)");
}

bool GptConfig::same_shape(const GptConfig& o) const {
  return vocab_size == o.vocab_size && n_layer == o.n_layer && n_embd == o.n_embd && n_head == o.n_head &&
         block_size == o.block_size;
}

GptConfig GptConfig::with_fusions_for(bool on_device) const {
  GptConfig c = *this;
  auto resolve = [](std::string& mode, bool auto_on) {
    if (mode == "auto") mode = auto_on ? "on" : "off";
  };
  // No gain on the CPU. Under full recomputation the add fused across a
  // block boundary makes the next block's ln_1 output in this block's
  // segment, so it stays alive (W2's full arena 78.0 -> 90.1 MiB): the level
  // chosen to save memory keeps it off.
  resolve(c.fuse_residual_layernorm, on_device && c.recompute != "full");
  resolve(c.fuse_layernorm_backward, true);
  resolve(c.fuse_gelu_backward, true);
  resolve(c.fuse_bias_backward, !on_device);        // slower on a GPU (G1: 34.1 vs 33.7 ms)
  resolve(c.fuse_weight_casts, true);
  return c;
}

int64_t GptConfig::num_params() const {
  const int64_t C = n_embd;
  return vocab_size * C + block_size * C + n_layer * transformer_block_params(C) + 2 * C;
}

double GptConfig::flops_per_token(int64_t seq) const {
  return 6.0 * double(num_params()) + 12.0 * double(n_layer) * double(seq) * double(n_embd);
}

// ---- the model --------------------------------------------------------------------

Gpt::Gpt(const GptConfig& config, core::Backend& backend) : config_(config), backend_(backend) {
  config_.validate();
  // Weights, gradients and optimizer state live where the backend computes.
  params_.set_backend(&backend);
  // Build a tiny program once so the store knows every parameter.
  auto probe = build(Mode::eval, 1, 1);
  params_.adopt(probe->graph);
}

namespace {

// ---- mixed precision ---------------------------------------------------------------
// With config.compute = bf16 or f16 the graph is the fp32 one with casts put
// in (torch.autocast's recipe, not llm.c's):
// - Master weights stay fp32 in the store. Each use of a weight casts it to
//   the compute dtype in the graph; the cast's backward casts the gradient
//   back to fp32, autograd sums several uses in fp32 and accumulates into the
//   fp32 grad, so the optimizer and checkpoints never see a 16-bit number.
// - The residual stream, the embeddings that start it, every LayerNorm's
//   statistics and the loss stay fp32; each LayerNorm writes its output
//   straight in the compute dtype for the branch's first Linear (narrow_to:
//   the same numbers as an f32 output and a cast, without either), and the
//   residual add takes the branch's compute-dtype output as it is (add's
//   mixed form widens it per element). A bf16 residual (llm.c) rounds every
//   add to 8 mantissa bits, so a block's small update loses most of its
//   bits; an fp32 one costs one (B, T, C) cast per branch, in the backward
//   (the branch's gradient narrowed; four casts before narrow_to and the
//   mixed add). Measured at W2 over 300
//   steps (brisk bench precision, and the same run with a bf16 residual):
//   final loss 2.1943 in fp32, 2.1914 with this fp32 residual, 2.1915 with
//   a bf16 one; step times equal within noise; arena 283 vs 264 MiB (fp32:
//   378) then, 276.2 for this fp32 residual against 371.2 in fp32 in today's
//   plan (recompute none). Both track here; fp32 is the one whose error does
//   not grow with depth and run length, for 7% of the arena. Under full
//   recomputation bf16 saves no arena (W2: 79.2 against 78.0 MiB in fp32):
//   what is kept there is the fp32 residual stream, and the replayed blocks
//   add their casts.
// - Linear, attention, GELU and the logits run in the compute dtype. On CPU
//   the bf16 products are bf16 dot products with fp32 accumulation where the
//   CPU has them (bf16-native, docs/cpu-paths.md) and widen to fp32
//   elsewhere; softmax and the loss's log-sum-exp are fp32 either way. An op whose forward or
//   backward has no kernel in the compute dtype on this backend runs in f32
//   between casts: the same numbers as a widen-compute-narrow kernel.
// The helpers are Lowp's (brisk/models/lowp.h), the block is
// transformer_block.h's; with compute == f32 each helper is the identity, so
// the fp32 graph is exactly what it was.

// A rewritten graph replaces the program's, its named values followed through the map.
void adopt_rewrite(GptProgram& p, core::RewriteResult&& r) {
  for (ValueId* v : {&p.ids, &p.pos, &p.targets, &p.logits, &p.loss, &p.loss_scale, &p.chunk_losses, &p.dropout_key})
    if (*v != core::kNoValue) *v = r.map[size_t(*v)];
  p.graph = std::move(r.graph);
}

// The fusion passes on a program's forward graph, all in one rewrite (they
// claim disjoint nodes): linear + gelu -> linear_gelu, add + layernorm ->
// add_layernorm, and in train programs linear + cross_entropy ->
// ops::classifier_train seeded by loss_scale, the (B*T, V) logits gone.
// The fused classifier's chunks (GptConfig::classifier_chunk_floats): by
// default the CPU's 64 MiB of f32 logits on the host; on a GPU enough that
// each product fills the chip: in 656-row chunks, the (rows, C) =
// (rows, V) x (V, C) product of dx has too few output tiles for 132 SMs.
void fuse(GptProgram& p, const GptConfig& c, bool train, bool on_device) {
  std::vector<core::Pattern> patterns;
  if (c.fuse_bias_gelu) patterns.push_back(ops::bias_gelu_fusion());
  if (c.with_fusions_for(on_device).fuse_residual_layernorm == "on") patterns.push_back(ops::residual_layernorm_fusion());
  if (train && c.fused_classifier)
    patterns.push_back(ops::classifier_fusion(
        "loss_scale", c.classifier_chunk_floats > 0 ? c.classifier_chunk_floats
                                                    : (on_device ? kDeviceClassifierChunkFloats : 0)));
  if (patterns.empty()) return;
  adopt_rewrite(p, core::rewrite(p.graph, patterns));
}

// The backward fusions on the finished train graph: each LayerNorm's backward
// takes in the residual gradient it is added to (and writes the narrowed copy
// a low-precision branch reads: fuse_layernorm_backward), the MLP's GELU
// backward rides on the product before it (fuse_gelu_backward), and each
// Linear's bias gradient on its weight gradient's product
// (fuse_bias_backward), and the forward's weight casts become one node
// (fuse_weight_casts). "auto" is resolved per device by
// GptConfig::with_fusions_for.
void fuse_backward(GptProgram& p, const GptConfig& config, bool on_device) {
  const GptConfig c = config.with_fusions_for(on_device);
  std::vector<core::Pattern> patterns;
  if (c.fuse_layernorm_backward == "on") patterns.push_back(ops::residual_layernorm_backward_fusion());
  if (c.fuse_gelu_backward == "on") patterns.push_back(ops::gelu_backward_fusion());
  if (c.fuse_bias_backward == "on") patterns.push_back(ops::bias_grad_fusion());
  // Recomputation replays the casts of a block with the block: hoisting them
  // to the start would keep every copy alive through the whole forward.
  if (c.fuse_weight_casts == "on" && c.recompute == "none") patterns.push_back(ops::weight_cast_fusion());
  if (!patterns.empty()) adopt_rewrite(p, core::rewrite(p.graph, patterns));
}

// ---- recomputation (train.recompute, block_recompute.h) ------------------------------
// Applied to the finished train graph, after backward(). (With add_layernorm
// fused across a block boundary, the next block's ln_1 output is made in
// the earlier block's segment and read by the next, so under full it stays.)
void apply_recompute(GptProgram& p, const std::string& level, int64_t n_layer) {
  core::RecomputeResult r = recompute_blocks(p.graph, level, {"resid."}, n_layer);
  remap_values(r, {&p.ids, &p.pos, &p.targets, &p.logits, &p.loss, &p.loss_scale, &p.chunk_losses, &p.dropout_key});
  p.graph = std::move(r.graph);
}

}  // namespace

std::unique_ptr<GptProgram> Gpt::build(Mode mode, int64_t B, int64_t T) {
  if (T > config_.block_size)
    throw ConfigError("sequence length " + std::to_string(T) + " exceeds model.block_size " +
                      std::to_string(config_.block_size));
  const int64_t C = config_.n_embd, V = config_.vocab_size;
  const bool on_device = !backend_.device().is_host();
  auto p = std::make_unique<GptProgram>();
  p->batch = B;
  p->seq = T;
  Graph& g = p->graph;

  // --- inputs
  p->ids = g.input("ids", {B, T}, DType::i32);
  p->pos = g.input("pos", {T}, DType::i32);
  ValueId wte = g.param("wte.weight", {V, C});
  ValueId wpe = g.param("wpe.weight", {config_.block_size, C});

  const Lowp lp{g, &backend_, config_.compute};

  // --- dropout (train programs with model.dropout or model.attention_dropout)
  const Dropout drop = Dropout::for_program(g, mode == Mode::train, config_.dropout, config_.attention_dropout);
  if (drop && on_device) {
    const std::string key = config_.dropout > 0.f ? "model.dropout" : "model.attention_dropout";
    throw ConfigError(key + " runs on the CPU only for now (the CUDA backend has no dropout kernels); set " + key +
                      " = 0 to train on the GPU");
  }
  p->dropout_key = drop.key;

  // --- token + position embeddings: the fp32 residual stream      (B, T, C)
  // (a gather of fp32 rows; its backward scatter-adds in fp32)
  ValueId x = ops::add(g, ops::embedding(g, p->ids, wte), ops::embedding(g, p->pos, wpe));
  x = drop.apply(g, x, Dropout::kEmbeddings, Lowp::fp32(g));

  // --- the blocks
  g.set_name(x, "resid.0");  // the block boundaries: recompute = full cuts its segments there
  for (int64_t l = 0; l < config_.n_layer; ++l) {
    x = transformer_block(g, x, core::kNoValue, "h." + std::to_string(l) + ".", C, int(config_.n_head),
                          config_.attention == "flash", BlockAttention::causal, lp, drop, l);
    g.set_name(x, "resid." + std::to_string(l + 1));
  }

  // --- final LayerNorm and the tied LM head                      (B*T, V)
  // In the compute dtype, except in a fused train program on a backend with
  // no fused classifier kernel in that dtype: there it stays fp32 (the fused
  // op never makes the logits, so the memory it exists for is saved anyway).
  const bool fused_head = mode == Mode::train && config_.fused_classifier;
  const Lowp head = fused_head && !backend_.supports(core::OpKind::classifier_train, lp.dt)
                        ? Lowp::fp32(g) : lp;
  auto lnf = ops::layernorm(g, x, g.param("ln_f.weight", {C}), g.param("ln_f.bias", {C}), 1e-5f, head.dt);
  const int64_t N = B * T;
  const int64_t chunk = mode == Mode::eval && config_.fused_classifier ? eval_chunk_rows(N, V) : N;
  if (chunk < N) {
    // --- an eval program with the fused classifier: the head and the loss
    // in row chunks, so only one (chunk, V) block of logits exists at a time
    // (the planner gives every chunk's logits the same bytes). Each chunk's
    // mean loss is an output; eval_loss() weighs them by their kept targets.
    p->targets = g.input("targets", {N}, DType::i32);
    std::vector<int64_t> rows;
    for (int64_t r0 = 0; r0 < N; r0 += chunk) rows.push_back(std::min(chunk, N - r0));
    const std::vector<ValueId> xs = ops::split_many(g, ops::reshape(g, lnf.y, {N, C}), 0, rows);
    const std::vector<ValueId> ts = ops::split_many(g, p->targets, 0, rows);
    const ValueId w = head.narrow(wte);
    const bool ce_native = head.native(core::OpKind::cross_entropy, core::OpKind::cross_entropy_backward);
    std::vector<ValueId> losses;
    for (size_t k = 0; k < rows.size(); ++k) {
      const ValueId logits = ops::linear(g, xs[k], w);
      losses.push_back(ops::reshape(g, ops::cross_entropy(g, ce_native ? logits : head.wide(logits), ts[k]), {1}));
    }
    p->logits = core::kNoValue;
    p->chunk_losses = ops::concat(g, losses, 0);
    p->chunk_rows = std::move(rows);
    g.mark_output(p->chunk_losses);
    fuse(*p, config_, false, on_device);
    return p;
  }
  p->logits = ops::linear(g, ops::reshape(g, lnf.y, {B * T, C}), head.narrow(wte));

  if (mode == Mode::logits) {
    p->logits = head.wide(p->logits);  // logits() hands out f32
    g.mark_output(p->logits);
  } else {
    // --- loss: mean cross-entropy over all positions, fp32 out of any logits dtype
    p->targets = g.input("targets", {B * T}, DType::i32);
    const bool ce_native = head.native(core::OpKind::cross_entropy, core::OpKind::cross_entropy_backward);
    p->loss = ops::cross_entropy(g, ce_native ? p->logits : head.wide(p->logits), p->targets);
    g.mark_output(p->loss);
    if (mode == Mode::train) {
      p->loss_scale = g.input("loss_scale", Shape{}, DType::f32);
      fuse(*p, config_, true, on_device);
      core::backward(g, p->loss, {.seed = p->loss_scale});
      fuse_backward(*p, config_, on_device);
      if (config_.recompute != "none") apply_recompute(*p, config_.recompute, config_.n_layer);
    }
  }
  if (mode != Mode::train) fuse(*p, config_, false, on_device);
  return p;
}

GptProgram& Gpt::get(Mode mode, int64_t B, int64_t T) {
  LastProgram& last = last_[int(mode)];
  if (last.program && last.batch == B && last.seq == T) return *last.program;
  auto& cache = mode == Mode::train ? train_cache_ : mode == Mode::eval ? eval_cache_ : logits_cache_;
  GptProgram& found = cache.get({Shape{B, T}}, [&] {
    auto p = build(mode, B, T);
    params_.adopt(p->graph);
    p->executor = std::make_unique<core::Executor>(p->graph, backend_);
    p->executor->bind(params_);
    std::vector<int32_t> pos(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) pos[size_t(t)] = int32_t(t);
    p->executor->write(p->pos, pos.data(), pos.size() * 4);
    return p;
  });
  last = {B, T, &found};  // programs live in the cache until the model goes
  return found;
}

GptProgram& Gpt::program(bool train, int64_t batch, int64_t seq) {
  return get(train ? Mode::train : Mode::eval, batch, seq);
}

namespace {
// On a device the embedding and loss kernels cannot throw, so ids are checked
// here, on the host, before they travel (the CPU kernels check them too).
void check_ids(const int32_t* ids, size_t n, int64_t vocab, const char* what, bool allow_ignore = false) {
  for (size_t i = 0; i < n; ++i)
    if ((ids[i] < 0 || ids[i] >= vocab) && !(allow_ignore && ids[i] == ops::CrossEntropyParams{}.ignore_index))
      throw core::ShapeError(std::string(what) + " id " + std::to_string(ids[i]) + " at position " +
                             std::to_string(i) + " is out of range [0, " + std::to_string(vocab) + ")");
}
}  // namespace

void Gpt::feed(GptProgram& p, const int32_t* x, const int32_t* y) {
  if (!backend_.device().is_host()) {
    check_ids(x, size_t(p.batch * p.seq), config_.vocab_size, "token");
    if (y) check_ids(y, size_t(p.batch * p.seq), config_.vocab_size, "target", true);
  }
  // Ordered before the step's kernels without waiting: the loss read-back
  // at the end of the step synchronises, before the loader reuses x and y.
  const size_t n = size_t(p.batch * p.seq);
  p.executor->write_async(p.ids, x, n * 4);
  if (y && p.targets != core::kNoValue) p.executor->write_async(p.targets, y, n * 4);
}

double Gpt::train_micro_step(const int32_t* x, const int32_t* y, int64_t B, int64_t T, double loss_scale,
                             uint64_t dropout_key) {
  GptProgram& p = get(Mode::train, B, T);
  feed(p, x, y);
  write_dropout_key(*p.executor, p.dropout_key, dropout_key);
  const float seed = float(loss_scale);
  if (seed != p.last_loss_scale) {  // a synchronous copy, only when it changes
    p.executor->write(p.loss_scale, &seed, 4);
    p.last_loss_scale = seed;
  }
  p.executor->run();
  return p.executor->read_scalar(p.loss);
}

double Gpt::eval_loss(const int32_t* x, const int32_t* y, int64_t B, int64_t T) {
  GptProgram& p = get(Mode::eval, B, T);
  feed(p, x, y);
  p.executor->run();
  if (p.chunk_losses == core::kNoValue) return p.executor->read_scalar(p.loss);
  // Row chunks: each chunk's loss is the mean over its kept targets, so the
  // batch's mean weighs each by that count (an all-ignored chunk reports 0
  // and weighs nothing), as one cross_entropy over every row would.
  p.chunk_loss_host.resize(p.chunk_rows.size());
  p.executor->read(p.chunk_losses, p.chunk_loss_host.data(), p.chunk_loss_host.size() * sizeof(float));
  const int32_t ignore = ops::CrossEntropyParams{}.ignore_index;
  double sum = 0;
  int64_t kept = 0, r0 = 0;
  for (size_t k = 0; k < p.chunk_rows.size(); ++k) {
    int64_t n = 0;
    for (int64_t r = r0; r < r0 + p.chunk_rows[k]; ++r) n += y[r] != ignore;
    sum += double(p.chunk_loss_host[k]) * double(n);
    kept += n;
    r0 += p.chunk_rows[k];
  }
  return kept ? sum / double(kept) : 0.0;
}

int64_t Gpt::eval_chunk_rows(int64_t rows, int64_t vocab) {
  // At most 16 MiB of fp32 logits per chunk (a quarter of the fused train
  // op's chunk: the eval arena sits beside the train arena, and at W1's
  // micro-batch 1 a 64 MiB chunk would be the whole (256, V) logits, 49 MiB
  // that the smallest run cannot spare). Equal chunks, at least 16 rows
  // each. At W1 (V 50304): 4 chunks of 64 rows for one sequence of 256, 25
  // of 82 for 8. Smaller chunks cost eval time, as each chunk's product
  // packs the head weight again: W1's head products in an eval batch of 8
  // took 493 ms in 25 chunks against 379 ms whole (executor op profile).
  constexpr int64_t kChunkFloats = int64_t(1) << 22;
  if (rows <= 0) return 1;
  const int64_t max_rows = std::max<int64_t>(16, kChunkFloats / std::max<int64_t>(vocab, 1));
  const int64_t chunks = (rows + max_rows - 1) / max_rows;
  return (rows + chunks - 1) / chunks;
}

const float* Gpt::logits(const int32_t* x, int64_t B, int64_t T) {
  GptProgram& p = get(Mode::logits, B, T);
  feed(p, x, nullptr);
  p.executor->run();
  if (backend_.device().is_host()) return static_cast<const float*>(p.executor->data(p.logits));
  host_logits_.resize(size_t(p.executor->view(p.logits).numel()));
  p.executor->read(p.logits, host_logits_.data(), host_logits_.size() * sizeof(float));
  return host_logits_.data();
}

void Gpt::init_weights(uint64_t seed) { init_transformer_weights(params_, seed, config_.n_layer); }

}  // namespace brisk::models
