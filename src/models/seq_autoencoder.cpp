// The sequence autoencoder, read top to bottom: the encoder (embeddings,
// padding-masked pre-LN blocks, final LayerNorm, masked mean pooling, a
// Linear to the latent), then the decoder (shifted residues + positions + the
// projected latent, causal pre-LN blocks, final LayerNorm, a Linear to the
// residue vocabulary), then the loss over the real positions.
//
// Why these choices:
// - The latent is added at every decoder position rather than fed as a
//   prefix position: every position gets a direct path to it (a prefix is
//   reached only through attention, which the decoder learns to neglect
//   while teacher forcing lets it copy from the residues before), and the
//   decoder keeps the encoder's length, so targets need no shifting and the
//   position table no extra row.
// - The start input is token 0, the padding id: a real position never has
//   it as input (residues are 1..27), so its embedding row is free to become
//   the learned start vector, and no BOS id has to enter the vocabulary.
// - Right padding is harmless on both sides: the encoder masks padded keys
//   and pools real positions only; the decoder's attention is causal, so a
//   real position only sees earlier, real ones, and padded positions have
//   target -100 (ignored by the loss). A batch padded to 40 or to 200 gives
//   the same latents and loss (tests/models/seq_autoencoder_test.cpp).
// - Greedy decoding lives in seq_autoencoder_decode.cpp: a reference that
//   recomputes the decoder graph at every step (no KV cache), and a cached
//   one that adds one position per step through the ops one by one.
// - One graph per (kind, batch, seq), cached, like the encoder classifier.
#include "brisk/models/seq_autoencoder.h"

#include <cmath>
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

void SeqAutoencoderConfig::validate() const {
  validate_encoder_body(vocab_size, n_layer, n_embd, n_head, max_len, attention, compute, recompute);
  if (vocab_size < 2) throw ConfigError("model.vocab_size must be at least 2 (padding + one residue)");
  if (latent <= 0 || latent > (int64_t(1) << 20))
    throw ConfigError("model.latent must be in [1, " + std::to_string(int64_t(1) << 20) + "], got " +
                      std::to_string(latent));
}

bool SeqAutoencoderConfig::same_shape(const SeqAutoencoderConfig& o) const {
  return vocab_size == o.vocab_size && n_layer == o.n_layer && n_embd == o.n_embd && n_head == o.n_head &&
         max_len == o.max_len && latent == o.latent;
}

int64_t SeqAutoencoderConfig::num_params() const {
  const int64_t C = n_embd, V = vocab_size, Z = latent;
  const int64_t per_layer = transformer_block_params(C);
  const int64_t embeddings = 2 * (V * C + max_len * C);
  const int64_t stacks = 2 * (n_layer * per_layer + 2 * C);  // blocks + final LayerNorm, each side
  return embeddings + stacks + (Z * C + Z) + (C * Z + C) + (V * C + V);
}

double SeqAutoencoderConfig::flops_per_token(int64_t seq) const {
  const double dense = double(num_params() - 2 * (vocab_size + max_len) * n_embd);
  return 6.0 * dense + 2 * 12.0 * double(n_layer) * double(seq) * double(n_embd);
}

// ---- the graphs -------------------------------------------------------------------

namespace {

// ids (B, T), lengths (B), pos (T) -> the latent (B, Z). The blocks compute in lp.dt.
ValueId encoder(Graph& g, const SeqAutoencoderConfig& c, const Lowp& lp, ValueId ids, ValueId lengths, ValueId pos) {
  const int64_t C = c.n_embd;
  // --- token + position embeddings                                  (B, T, C)
  ValueId x = ops::add(g, ops::embedding(g, ids, g.param("enc.wte.weight", {c.vocab_size, C})),
                       ops::embedding(g, pos, g.param("enc.wpe.weight", {c.max_len, C})));
  // --- blocks whose attention sees every real position of the row
  g.set_name(x, "enc.resid.0");  // the block boundaries: recompute = full cuts its segments there
  for (int64_t l = 0; l < c.n_layer; ++l) {
    x = transformer_block(g, x, lengths, "enc.h." + std::to_string(l) + ".", C, int(c.n_head),
                          c.attention == "flash", BlockAttention::padding_masked, lp);
    g.set_name(x, "enc.resid." + std::to_string(l + 1));
  }
  // --- final LayerNorm, mean over the real positions, the latent     (B, Z)
  auto lnf = ops::layernorm(g, x, g.param("enc.ln_f.weight", {C}), g.param("enc.ln_f.bias", {C}));
  ValueId pooled = ops::masked_mean(g, lnf.y, lengths);  // (B, C)
  return ops::linear(g, pooled, g.param("to_latent.weight", {c.latent, C}), g.param("to_latent.bias", {c.latent}));
}

// latent (B, Z), dec_ids (B, T) (residue t-1 at t, 0 at t = 0), pos (T) -> logits (B, T, V).
// The blocks compute in lp.dt.
ValueId decoder(Graph& g, const SeqAutoencoderConfig& c, const Lowp& lp, ValueId latent, ValueId dec_ids,
                ValueId pos) {
  const int64_t C = c.n_embd;
  const Shape& s = g.shape(dec_ids);
  const int64_t B = s[0], T = s[1];
  // --- shifted residues + positions + the latent at every position   (B, T, C)
  ValueId x = ops::add(g, ops::embedding(g, dec_ids, g.param("dec.wte.weight", {c.vocab_size, C})),
                       ops::embedding(g, pos, g.param("dec.wpe.weight", {c.max_len, C})));
  ValueId z = ops::linear(g, latent, g.param("from_latent.weight", {C, c.latent}), g.param("from_latent.bias", {C}));
  x = ops::add(g, x, ops::expand(g, z, Shape{B, T, C}, 1));  // (B, C) broadcast over T
  // --- causal blocks: position t sees inputs 0..t, i.e. residues before t
  g.set_name(x, "dec.resid.0");
  for (int64_t l = 0; l < c.n_layer; ++l) {
    x = transformer_block(g, x, core::kNoValue, "dec.h." + std::to_string(l) + ".", C, int(c.n_head),
                          c.attention == "flash", BlockAttention::causal, lp);
    g.set_name(x, "dec.resid." + std::to_string(l + 1));
  }
  // --- final LayerNorm, residue logits                                (B, T, V)
  auto lnf = ops::layernorm(g, x, g.param("dec.ln_f.weight", {C}), g.param("dec.ln_f.bias", {C}));
  return ops::linear(g, lnf.y, g.param("dec.head.weight", {c.vocab_size, C}), g.param("dec.head.bias", {c.vocab_size}));
}

void check_range(const int32_t* v, int64_t n, int64_t lo, int64_t hi, const std::string& what) {
  for (int64_t i = 0; i < n; ++i)
    if (v[i] < lo || v[i] >= hi)
      throw core::ShapeError(what + " " + std::to_string(v[i]) + " at position " + std::to_string(i) +
                             " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + ")");
}

}  // namespace

SeqAutoencoder::SeqAutoencoder(const SeqAutoencoderConfig& config, core::Backend& backend)
    : config_(config), backend_(backend) {
  config_.validate();
  params_.set_backend(&backend);
  auto probe = build(Kind::reconstruct, 1, 1);  // both halves: the store learns every parameter
  params_.adopt(probe->graph);
}

std::unique_ptr<SeqAutoencoderProgram> SeqAutoencoder::build(Kind kind, int64_t B, int64_t T) {
  if (T > config_.max_len)
    throw ConfigError("sequence length " + std::to_string(T) + " exceeds model.max_len " +
                      std::to_string(config_.max_len));
  auto p = std::make_unique<SeqAutoencoderProgram>();
  p->batch = B;
  p->seq = T;
  Graph& g = p->graph;
  p->pos = g.input("pos", {T}, DType::i32);
  // Mixed precision in the train program only (SeqAutoencoderConfig::compute says why).
  const Lowp lp = kind == Kind::train ? Lowp{g, &backend_, config_.compute} : Lowp::fp32(g);

  if (kind == Kind::decode) {
    p->latent_in = g.input("latent", {B, config_.latent}, DType::f32);
    p->dec_ids = g.input("dec_ids", {B, T}, DType::i32);
    p->logits = decoder(g, config_, lp, p->latent_in, p->dec_ids, p->pos);
    g.mark_output(p->logits);
    return p;
  }

  p->ids = g.input("ids", {B, T}, DType::i32);
  p->lengths = g.input("lengths", {B}, DType::i32);
  p->latent = encoder(g, config_, lp, p->ids, p->lengths, p->pos);
  if (kind == Kind::encode) {
    g.mark_output(p->latent);
    return p;
  }
  p->dec_ids = g.input("dec_ids", {B, T}, DType::i32);
  p->logits = decoder(g, config_, lp, p->latent, p->dec_ids, p->pos);
  g.mark_output(p->logits);
  if (kind == Kind::train) {
    // --- loss: mean cross-entropy over the real positions (targets -100 at padding)
    p->targets = g.input("targets", {B * T}, DType::i32);
    p->loss = ops::cross_entropy(g, ops::reshape(g, p->logits, {B * T, config_.vocab_size}), p->targets);
    g.mark_output(p->loss);
    p->loss_scale = g.input("loss_scale", Shape{}, DType::f32);
    core::backward(g, p->loss, {.seed = p->loss_scale});
    if (config_.recompute != "none") {  // train.recompute (block_recompute.h), both stacks
      core::RecomputeResult r = recompute_blocks(g, config_.recompute, {"enc.resid.", "dec.resid."}, config_.n_layer);
      remap_values(r, {&p->ids, &p->lengths, &p->pos, &p->dec_ids, &p->targets, &p->latent_in, &p->latent,
                       &p->logits, &p->loss, &p->loss_scale});
      p->graph = std::move(r.graph);
    }
  }
  return p;
}

SeqAutoencoderProgram& SeqAutoencoder::program(Kind kind, int64_t B, int64_t T) {
  auto& cache = caches_[int(kind)];
  return cache.get({Shape{B, T}}, [&] {
    auto p = build(kind, B, T);
    params_.adopt(p->graph);
    p->executor = std::make_unique<core::Executor>(p->graph, backend_, &arenas_[int(kind)]);
    p->executor->bind(params_);
    if (kind == Kind::train) p->executor->set_profiling(profile_train_);
    last_[int(kind)] = nullptr;  // attaching may have moved the shared arena: ready() writes the inputs
    return p;
  });
}

void SeqAutoencoder::write_positions(SeqAutoencoderProgram& p) {
  // Grows only with the widest program so far: rewriting positions when
  // the batch width changes allocates nothing in the steady state.
  for (int64_t t = int64_t(positions_.size()); t < p.seq; ++t) positions_.push_back(int32_t(t));
  p.executor->write(p.pos, positions_.data(), size_t(p.seq) * 4);
}

void SeqAutoencoder::set_train_profiling(bool on) {
  profile_train_ = on;
  caches_[int(Kind::train)].for_each([&](const SeqAutoencoderProgram& p) { p.executor->set_profiling(on); });
}

core::Executor::OpTimes SeqAutoencoder::train_op_times() const {
  core::Executor::OpTimes sum{};
  caches_[int(Kind::train)].for_each(
      [&](const SeqAutoencoderProgram& p) { core::add_op_times(sum, p.executor->op_times()); });
  return sum;
}

size_t SeqAutoencoder::cached_programs() const {
  size_t n = 0;
  for (const auto& c : caches_) n += c.size();
  return n;
}

void SeqAutoencoder::feed(SeqAutoencoderProgram& p, const int32_t* ids, const int32_t* lengths) {
  // Checked on the host for every backend: a device kernel cannot report a
  // bad id, and a length outside [1, T] would read past the row.
  const int64_t B = p.batch, T = p.seq;
  check_range(ids, B * T, 0, config_.vocab_size, "token id");
  check_range(lengths, B, 1, T + 1, "sequence length");
  p.executor->write(p.ids, ids, size_t(B * T) * 4);
  p.executor->write(p.lengths, lengths, size_t(B) * 4);
  if (p.dec_ids == core::kNoValue) return;
  // Teacher forcing: the decoder reads residue t-1 at position t (the start
  // token 0 at t = 0) and must predict residue t; padded positions predict nothing.
  dec_ids_.assign(size_t(B * T), 0);
  targets_.assign(size_t(B * T), -100);
  const bool drop = p.targets != core::kNoValue && input_dropout_ > 0;
  // splitmix64: a few lines, the same stream on every platform.
  auto uniform = [&] {
    uint64_t z = (dropout_state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return double((z ^ (z >> 31)) >> 11) * 0x1.0p-53;
  };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < lengths[b]; ++t) {
      if (t + 1 < T && !(drop && uniform() < input_dropout_)) dec_ids_[size_t(b * T + t + 1)] = ids[b * T + t];
      targets_[size_t(b * T + t)] = ids[b * T + t];
    }
  p.executor->write(p.dec_ids, dec_ids_.data(), dec_ids_.size() * 4);
  if (p.targets != core::kNoValue) p.executor->write(p.targets, targets_.data(), targets_.size() * 4);
}

const float* SeqAutoencoder::host(Kind kind, SeqAutoencoderProgram& p, ValueId v, size_t count) {
  if (backend_.device().is_host()) return static_cast<const float*>(p.executor->data(v));
  std::vector<float>& out = host_out_[int(kind)];
  out.resize(count);
  p.executor->read(v, out.data(), count * sizeof(float));
  return out.data();
}

SeqAutoencoderProgram& SeqAutoencoder::ready(Kind kind, int64_t B, int64_t T) {
  SeqAutoencoderProgram& p = program(kind, B, T);
  if (&p != last_[int(kind)]) {  // another width ran in the shared arena since: the inputs written once are gone
    write_positions(p);
    p.last_loss_scale = -1.f;
    last_[int(kind)] = &p;
  }
  return p;
}

double SeqAutoencoder::train_micro_step(const int32_t* ids, const int32_t* lengths, int64_t B, int64_t T,
                                        double loss_scale) {
  SeqAutoencoderProgram& p = ready(Kind::train, B, T);
  feed(p, ids, lengths);
  const float seed = float(loss_scale);
  if (seed != p.last_loss_scale) {
    p.executor->write(p.loss_scale, &seed, 4);
    p.last_loss_scale = seed;
  }
  p.executor->run();
  return p.executor->read_scalar(p.loss);
}

const float* SeqAutoencoder::encode(const int32_t* ids, const int32_t* lengths, int64_t B, int64_t T) {
  SeqAutoencoderProgram& p = ready(Kind::encode, B, T);
  feed(p, ids, lengths);
  p.executor->run();
  return host(Kind::encode, p, p.latent, size_t(B * config_.latent));
}

const float* SeqAutoencoder::logits(const int32_t* ids, const int32_t* lengths, int64_t B, int64_t T) {
  SeqAutoencoderProgram& p = ready(Kind::reconstruct, B, T);
  feed(p, ids, lengths);
  p.executor->run();
  return host(Kind::reconstruct, p, p.logits, size_t(B * T * config_.vocab_size));
}

void SeqAutoencoder::init_weights(uint64_t seed) {
  init_transformer_weights(params_, seed, config_.n_layer);
  // The latent starts at unit scale (std 1/sqrt(n_embd) on a LayerNormed
  // mean) instead of the 0.02 * sqrt(n_embd) the shared recipe gives: the
  // encoder is reached only through to_latent and from_latent in series, and
  // with both at 0.02 its gradient starts ~50x weaker than the decoder's,
  // which meanwhile learns to predict from the residues alone.
  auto& e = params_.entries().at("to_latent.weight");
  params_.upload(e.value, core::Tensor::randn(e.value.shape(), e.value.dtype(), seed * 1000003ull + 977, 0.f,
                                              1.f / std::sqrt(float(config_.n_embd))));
}

void SeqAutoencoder::set_input_dropout(double p, uint64_t seed) {
  if (!(p >= 0 && p < 1)) throw ConfigError("input dropout must be in [0, 1), got " + std::to_string(p));
  input_dropout_ = p;
  dropout_state_ = seed;
}

}  // namespace brisk::models
