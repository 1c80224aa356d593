// The encoder classifier, read top to bottom: token + position embeddings,
// n_layer pre-LN blocks whose attention is bidirectional and masked at the
// padding, a final LayerNorm, masked mean pooling and a Linear head.
//
// Why these choices:
// - Mean pooling over the real positions rather than a [CLS] token: the
//   stores hold raw tokenizer output with no special tokens, and a mean gives
//   every position a direct gradient path, which trains faster at this size.
// - Padding never reaches a real position: attention masks padded keys and
//   every other op works per position, so a batch padded to 40 or to 200
//   gives its real rows the same numbers (tests/models/encoder_test.cpp).
// - One graph per (batch, seq) shape, cached; the trainer rounds seq up to a
//   multiple of 32 so a run builds a handful of programs, not one per length.
#include "brisk/models/encoder.h"

#include <cmath>
#include <cstdio>
#include <string>

#include "brisk/core/autograd.h"
#include "brisk/core/error.h"
#include "brisk/models/block_recompute.h"
#include "brisk/models/transformer_block.h"
#include "brisk/models/init.h"
#include "brisk/ops/ops.h"

namespace brisk::models {

using core::ConfigError;
using core::DType;
using core::Graph;
using core::Shape;
using core::ValueId;

// ---- configuration ----------------------------------------------------------------

EncoderConfig EncoderConfig::preset(const std::string& name) {
  // E1 of docs/workloads.md: GPT-2 BPE padded to 50304 (a multiple of 64, as
  // the GPT's W1 and G1 are), 4 layers, 256 wide, 4 heads, the first 512
  // tokens of a message, 2 classes.
  if (name == "E1" || name == "spam-encoder") {
    EncoderConfig c;
    c.vocab_size = 50304, c.n_layer = 4, c.n_embd = 256, c.n_head = 4, c.max_len = 512, c.n_classes = 2;
    return c;
  }
  throw ConfigError("unknown encoder preset '" + name + "' (allowed: E1 / spam-encoder)");
}

void EncoderConfig::validate() const {
  validate_encoder_body(vocab_size, n_layer, n_embd, n_head, max_len, attention, compute, recompute);
  Dropout::validate(dropout);
  Dropout::validate(attention_dropout, "model.attention_dropout");
  Dropout::validate(classifier_dropout, "model.classifier_dropout");
  Dropout::validate(label_smoothing, "train.label_smoothing");  // a probability, checked as the dropouts are
  if (n_classes < 2 || n_classes > (int64_t(1) << 20))
    throw ConfigError("model.n_classes must be in [2, " + std::to_string(int64_t(1) << 20) + "], got " +
                      std::to_string(n_classes));
  if (class_weights.empty()) return;
  if (int64_t(class_weights.size()) != n_classes)
    throw ConfigError("train.class_weights has " + std::to_string(class_weights.size()) +
                      " weights but model.n_classes is " + std::to_string(n_classes));
  bool any = false;
  for (float w : class_weights) {
    if (!(w >= 0.f) || !std::isfinite(w)) {
      char got[32];
      std::snprintf(got, sizeof got, "%g", double(w));
      throw ConfigError(std::string("train.class_weights must be finite numbers >= 0, got ") + got);
    }
    any = any || w > 0.f;
  }
  if (!any) throw ConfigError("train.class_weights are all 0: no row would count");
}

bool EncoderConfig::same_shape(const EncoderConfig& o) const {
  return vocab_size == o.vocab_size && n_layer == o.n_layer && n_embd == o.n_embd && n_head == o.n_head &&
         max_len == o.max_len && n_classes == o.n_classes;
}

int64_t EncoderConfig::num_params() const {
  const int64_t C = n_embd;
  return vocab_size * C + max_len * C + n_layer * transformer_block_params(C) + 2 * C + n_classes * C + n_classes;
}

double EncoderConfig::flops_per_token(int64_t seq) const {
  const double dense = double(num_params() - (vocab_size + max_len) * n_embd);
  return 6.0 * dense + 12.0 * double(n_layer) * double(seq) * double(n_embd);
}

// ---- the model --------------------------------------------------------------------

Encoder::Encoder(const EncoderConfig& config, core::Backend& backend) : config_(config), backend_(backend) {
  config_.validate();
  params_.set_backend(&backend);
  auto probe = build(false, 1, 1);  // so the store knows every parameter
  params_.adopt(probe->graph);
}

namespace {

void check_range(const int32_t* v, int64_t n, int64_t lo, int64_t hi, const std::string& what) {
  for (int64_t i = 0; i < n; ++i)
    if (v[i] < lo || v[i] >= hi)
      throw core::ShapeError(what + " " + std::to_string(v[i]) + " at position " + std::to_string(i) +
                             " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + ")");
}

}  // namespace

std::unique_ptr<EncoderProgram> Encoder::build(bool train, int64_t B, int64_t T) {
  if (T > config_.max_len)
    throw ConfigError("sequence length " + std::to_string(T) + " exceeds model.max_len " +
                      std::to_string(config_.max_len));
  const int64_t C = config_.n_embd, K = config_.n_classes;
  auto p = std::make_unique<EncoderProgram>();
  p->batch = B;
  p->seq = T;
  Graph& g = p->graph;

  // --- inputs
  p->ids = g.input("ids", {B, T}, DType::i32);
  p->lengths = g.input("lengths", {B}, DType::i32);
  p->pos = g.input("pos", {T}, DType::i32);

  // --- dropout (train programs with any of the three): the GPT's sites, and the pooled features'
  const Dropout drop =
      Dropout::for_program(g, train, config_.dropout, config_.attention_dropout, config_.classifier_dropout);
  p->dropout_key = drop.key;

  // --- token + position embeddings                                  (B, T, C)
  ValueId x = ops::add(g, ops::embedding(g, p->ids, g.param("wte.weight", {config_.vocab_size, C})),
                       ops::embedding(g, p->pos, g.param("wpe.weight", {config_.max_len, C})));
  x = drop.apply(g, x, Dropout::kEmbeddings, Lowp::fp32(g));

  // --- the blocks, in the compute dtype (f32: the helpers are the identity)
  const Lowp lp{g, &backend_, config_.compute};
  g.set_name(x, "resid.0");  // the block boundaries: recompute = full cuts its segments there
  for (int64_t l = 0; l < config_.n_layer; ++l) {
    x = transformer_block(g, x, p->lengths, "h." + std::to_string(l) + ".", C, int(config_.n_head),
                          config_.attention == "flash", BlockAttention::padding_masked, lp, drop, l);
    g.set_name(x, "resid." + std::to_string(l + 1));
  }

  // --- final LayerNorm, mean over the real positions, class logits   (B, K)
  auto lnf = ops::layernorm(g, x, g.param("ln_f.weight", {C}), g.param("ln_f.bias", {C}));
  const ValueId pooled = drop.classifier_input(g, ops::masked_mean(g, lnf.y, p->lengths));  // (B, C)
  p->logits = ops::linear(g, pooled, g.param("head.weight", {K, C}), g.param("head.bias", {K}));
  g.mark_output(p->logits);

  if (train) {
    // --- loss: mean cross-entropy over the rows
    p->labels = g.input("labels", {B}, DType::i32);
    if (!config_.class_weights.empty()) p->class_weights = g.input("class_weights", {K}, DType::f32);
    p->loss = ops::cross_entropy(g, p->logits, p->labels, ops::CrossEntropyParams{}.ignore_index,
                                 config_.label_smoothing, p->class_weights);
    g.mark_output(p->loss);
    p->loss_scale = g.input("loss_scale", Shape{}, DType::f32);
    core::backward(g, p->loss, {.seed = p->loss_scale});
    if (config_.recompute != "none") {  // train.recompute (block_recompute.h)
      core::RecomputeResult r = recompute_blocks(g, config_.recompute, {"resid."}, config_.n_layer);
      remap_values(r, {&p->ids, &p->lengths, &p->pos, &p->labels, &p->logits, &p->loss, &p->loss_scale,
                       &p->dropout_key, &p->class_weights});
      p->graph = std::move(r.graph);
    }
  }
  return p;
}

EncoderProgram& Encoder::program(bool train, int64_t B, int64_t T) {
  auto& cache = train ? train_cache_ : logits_cache_;
  return cache.get({Shape{B, T}}, [&] {
    auto p = build(train, B, T);
    params_.adopt(p->graph);
    p->executor = std::make_unique<core::Executor>(p->graph, backend_, &arenas_[train]);
    p->executor->bind(params_);
    if (train) p->executor->set_profiling(profile_train_);
    last_[train] = nullptr;  // attaching may have moved the shared arena: ready() writes the inputs
    return p;
  });
}

void Encoder::write_positions(EncoderProgram& p) {
  // Grows only with the widest program so far: rewriting positions when
  // the batch width changes allocates nothing in the steady state.
  for (int64_t t = int64_t(positions_.size()); t < p.seq; ++t) positions_.push_back(int32_t(t));
  p.executor->write(p.pos, positions_.data(), size_t(p.seq) * 4);
}

void Encoder::set_train_profiling(bool on) {
  profile_train_ = on;
  train_cache_.for_each([&](const EncoderProgram& p) { p.executor->set_profiling(on); });
}

core::Executor::OpTimes Encoder::train_op_times() const {
  core::Executor::OpTimes sum{};
  train_cache_.for_each([&](const EncoderProgram& p) { core::add_op_times(sum, p.executor->op_times()); });
  return sum;
}

void Encoder::feed(EncoderProgram& p, const int32_t* ids, const int32_t* lengths, const int32_t* labels) {
  // Checked on the host for every backend: a device kernel cannot report a
  // bad id, and a length outside [1, T] would read past the row.
  check_range(ids, p.batch * p.seq, 0, config_.vocab_size, "token id");
  check_range(lengths, p.batch, 1, p.seq + 1, "sequence length");
  if (labels) check_range(labels, p.batch, 0, config_.n_classes, "label");
  p.executor->write(p.ids, ids, size_t(p.batch * p.seq) * 4);
  p.executor->write(p.lengths, lengths, size_t(p.batch) * 4);
  if (labels && p.labels != core::kNoValue) p.executor->write(p.labels, labels, size_t(p.batch) * 4);
}

EncoderProgram& Encoder::ready(bool train, int64_t B, int64_t T) {
  EncoderProgram& p = program(train, B, T);
  if (&p != last_[train]) {  // another width ran in the shared arena since: the inputs written once are gone
    write_positions(p);
    if (p.class_weights != core::kNoValue)
      p.executor->write(p.class_weights, config_.class_weights.data(), config_.class_weights.size() * 4);
    p.last_loss_scale = -1.f;
    last_[train] = &p;
  }
  return p;
}

double Encoder::train_micro_step(const int32_t* ids, const int32_t* lengths, const int32_t* labels, int64_t B,
                                 int64_t T, double loss_scale, uint64_t dropout_key) {
  EncoderProgram& p = ready(true, B, T);
  feed(p, ids, lengths, labels);
  write_dropout_key(*p.executor, p.dropout_key, dropout_key);
  const float seed = float(loss_scale);
  if (seed != p.last_loss_scale) {
    p.executor->write(p.loss_scale, &seed, 4);
    p.last_loss_scale = seed;
  }
  p.executor->run();
  return p.executor->read_scalar(p.loss);
}

const float* Encoder::logits(const int32_t* ids, const int32_t* lengths, int64_t B, int64_t T) {
  EncoderProgram& p = ready(false, B, T);
  feed(p, ids, lengths, nullptr);
  p.executor->run();
  if (backend_.device().is_host()) return static_cast<const float*>(p.executor->data(p.logits));
  host_logits_.resize(size_t(B * config_.n_classes));
  p.executor->read(p.logits, host_logits_.data(), host_logits_.size() * sizeof(float));
  return host_logits_.data();
}

void Encoder::init_weights(uint64_t seed) { init_transformer_weights(params_, seed, config_.n_layer); }

}  // namespace brisk::models
