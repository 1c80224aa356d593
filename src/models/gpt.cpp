// GPT-2, read top to bottom. The model is a function from (batch, seq) to a
// graph: embeddings, n_layer pre-LN blocks (attention, MLP, residual adds),
// final LayerNorm, and the LM head as a Linear whose weight *is* the token
// embedding (tied: one parameter, two uses, gradients summed by autograd).
// One graph is built and planned per shape and mode, then cached, so a
// training run builds exactly one train program and one eval program.
#include "brisk/models/gpt.h"

#include <cmath>
#include <string>

#include "brisk/core/autograd.h"
#include "brisk/core/error.h"
#include "brisk/core/passes.h"
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
  if (n_embd % n_head != 0)
    throw ConfigError("model.n_embd (" + std::to_string(n_embd) + ") must be divisible by model.n_head (" +
                      std::to_string(n_head) + ")");
  if (attention != "flash" && attention != "plain")
    throw ConfigError("model.attention: unknown value '" + attention + "' (allowed: flash, plain)");
}

bool GptConfig::same_shape(const GptConfig& o) const {
  return vocab_size == o.vocab_size && n_layer == o.n_layer && n_embd == o.n_embd && n_head == o.n_head &&
         block_size == o.block_size;
}

int64_t GptConfig::num_params() const {
  const int64_t C = n_embd;
  const int64_t per_layer = 2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (4 * C * C + 4 * C) + (4 * C * C + C);
  return vocab_size * C + block_size * C + n_layer * per_layer + 2 * C;
}

double GptConfig::flops_per_token(int64_t seq) const {
  return 6.0 * double(num_params()) + 12.0 * double(n_layer) * double(seq) * double(n_embd);
}

// ---- the model --------------------------------------------------------------------

Gpt::Gpt(const GptConfig& config, core::Backend& backend) : config_(config), backend_(backend) {
  config_.validate();
  // Build a tiny program once so the store knows every parameter.
  auto probe = build(Mode::eval, 1, 1);
  params_.adopt(probe->graph);
}

namespace {

// One pre-LN transformer block.                                 x: (B, T, C)
ValueId block(Graph& g, ValueId x, const std::string& p, int64_t C, int n_head, bool flash) {
  auto param = [&](const std::string& name, Shape s) { return g.param(p + name, s); };
  // --- attention: x + proj(attn(ln_1(x)))
  auto ln1 = ops::layernorm(g, x, param("ln_1.weight", {C}), param("ln_1.bias", {C}));
  ValueId qkv = ops::linear(g, ln1.y, param("attn.c_attn.weight", {3 * C, C}), param("attn.c_attn.bias", {3 * C}));
  ValueId att = flash ? ops::flash_attention(g, qkv, n_head) : ops::attention(g, qkv, n_head);  // (B, T, C)
  att = ops::linear(g, att, param("attn.c_proj.weight", {C, C}), param("attn.c_proj.bias", {C}));
  x = ops::add(g, x, att);
  // --- MLP: x + proj(gelu(fc(ln_2(x))))
  auto ln2 = ops::layernorm(g, x, param("ln_2.weight", {C}), param("ln_2.bias", {C}));
  ValueId h = ops::linear(g, ln2.y, param("mlp.c_fc.weight", {4 * C, C}), param("mlp.c_fc.bias", {4 * C}));
  h = ops::gelu(g, h);                                                        // (B, T, 4C)
  h = ops::linear(g, h, param("mlp.c_proj.weight", {C, 4 * C}), param("mlp.c_proj.bias", {C}));
  return ops::add(g, x, h);
}

// The fusion pass on a train program's forward graph: linear + cross_entropy
// become ops::classifier_train seeded by loss_scale, the (B*T, V) logits gone.
void fuse_classifier(GptProgram& p) {
  core::RewriteResult r = core::rewrite(p.graph, {ops::classifier_fusion("loss_scale")});
  for (ValueId* v : {&p.ids, &p.pos, &p.targets, &p.logits, &p.loss, &p.loss_scale})
    if (*v != core::kNoValue) *v = r.map[size_t(*v)];
  p.graph = std::move(r.graph);
}

}  // namespace

std::unique_ptr<GptProgram> Gpt::build(Mode mode, int64_t B, int64_t T) {
  if (T > config_.block_size)
    throw ConfigError("sequence length " + std::to_string(T) + " exceeds model.block_size " +
                      std::to_string(config_.block_size));
  const int64_t C = config_.n_embd, V = config_.vocab_size;
  auto p = std::make_unique<GptProgram>();
  p->batch = B;
  p->seq = T;
  Graph& g = p->graph;

  // --- inputs
  p->ids = g.input("ids", {B, T}, DType::i32);
  p->pos = g.input("pos", {T}, DType::i32);
  ValueId wte = g.param("wte.weight", {V, C});
  ValueId wpe = g.param("wpe.weight", {config_.block_size, C});

  // --- token + position embeddings                               (B, T, C)
  ValueId x = ops::add(g, ops::embedding(g, p->ids, wte), ops::embedding(g, p->pos, wpe));

  // --- the blocks
  for (int64_t l = 0; l < config_.n_layer; ++l)
    x = block(g, x, "h." + std::to_string(l) + ".", C, int(config_.n_head), config_.attention == "flash");

  // --- final LayerNorm and the tied LM head                      (B*T, V)
  auto lnf = ops::layernorm(g, x, g.param("ln_f.weight", {C}), g.param("ln_f.bias", {C}));
  p->logits = ops::linear(g, ops::reshape(g, lnf.y, {B * T, C}), wte);

  if (mode == Mode::logits) {
    g.mark_output(p->logits);
  } else {
    // --- loss: mean cross-entropy over all positions
    p->targets = g.input("targets", {B * T}, DType::i32);
    p->loss = ops::cross_entropy(g, p->logits, p->targets);
    g.mark_output(p->loss);
    if (mode == Mode::train) {
      p->loss_scale = g.input("loss_scale", Shape{}, DType::f32);
      if (config_.fused_classifier) fuse_classifier(*p);
      core::backward(g, p->loss, {.seed = p->loss_scale});
    }
  }
  return p;
}

GptProgram& Gpt::get(Mode mode, int64_t B, int64_t T) {
  auto& cache = mode == Mode::train ? train_cache_ : mode == Mode::eval ? eval_cache_ : logits_cache_;
  return cache.get(core::ShapeCache<GptProgram>::key_of({Shape{B, T}}), [&] {
    auto p = build(mode, B, T);
    params_.adopt(p->graph);
    p->executor = std::make_unique<core::Executor>(p->graph, backend_);
    p->executor->bind(params_);
    std::vector<int32_t> pos(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) pos[size_t(t)] = int32_t(t);
    p->executor->write(p->pos, pos.data(), pos.size() * 4);
    return p;
  });
}

GptProgram& Gpt::program(bool train, int64_t batch, int64_t seq) {
  return get(train ? Mode::train : Mode::eval, batch, seq);
}

void Gpt::feed(GptProgram& p, const int32_t* x, const int32_t* y) {
  const size_t n = size_t(p.batch * p.seq);
  p.executor->write(p.ids, x, n * 4);
  if (y && p.targets != core::kNoValue) p.executor->write(p.targets, y, n * 4);
}

double Gpt::train_micro_step(const int32_t* x, const int32_t* y, int64_t B, int64_t T, double loss_scale) {
  GptProgram& p = get(Mode::train, B, T);
  feed(p, x, y);
  const float seed = float(loss_scale);
  p.executor->write(p.loss_scale, &seed, 4);
  p.executor->run();
  return p.executor->read_scalar(p.loss);
}

double Gpt::eval_loss(const int32_t* x, const int32_t* y, int64_t B, int64_t T) {
  GptProgram& p = get(Mode::eval, B, T);
  feed(p, x, y);
  p.executor->run();
  return p.executor->read_scalar(p.loss);
}

const float* Gpt::logits(const int32_t* x, int64_t B, int64_t T) {
  GptProgram& p = get(Mode::logits, B, T);
  feed(p, x, nullptr);
  p.executor->run();
  return static_cast<const float*>(p.executor->data(p.logits));
}

void Gpt::init_weights(uint64_t seed) {
  const float residual_std = 0.02f / std::sqrt(2.0f * float(config_.n_layer));
  uint64_t k = 0;
  for (auto& [name, e] : params_.entries()) {
    ++k;  // entries are ordered by name: the same seed gives the same weights
    const bool is_bias = name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    const bool is_ln = name.find(".ln_") != std::string::npos || name.rfind("ln_f", 0) == 0;
    const bool is_residual = name.find("c_proj.weight") != std::string::npos;
    if (is_bias) e.value.fill(0.0);
    else if (is_ln) e.value.fill(1.0);
    else
      e.value.copy_from(core::Tensor::randn(e.value.shape(), e.value.dtype(), seed * 1000003ull + k, 0.f,
                                            is_residual ? residual_std : 0.02f));
  }
}

}  // namespace brisk::models
