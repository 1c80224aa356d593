// The engine (engine.h): the key/value block pool, the step scheduler and
// the forward pass over (sequence, position) rows.
#include "brisk/infer/engine.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <list>
#include <new>
#include <optional>
#include <unordered_map>

#include "brisk/core/error.h"
#include "brisk/core/op.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/cpu/cpu_features.h"
#include "brisk/data/tokenizer.h"
#include "brisk/infer/grammar_constraint.h"
#include "brisk/infer/json_constraint.h"
#include "brisk/ops/ops.h"

namespace brisk::infer {

using core::DType;
using core::OpKind;
using core::Shape;
using core::Tensor;
using core::TensorMeta;
using core::TensorView;

const char* finish_name(Finish f) {
  switch (f) {
    case Finish::none: return "";
    case Finish::length: return "length";
    case Finish::stop: return "stop";
    case Finish::cancelled: return "cancelled";
  }
  return "?";
}

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

TensorView view(const void* p, Shape s, DType t = DType::f32) {
  return TensorView{const_cast<void*>(p), TensorMeta{std::move(s), t}};
}

// Keys and values of every layer in blocks of `block` positions; a block
// table row per sequence slot.
//
// Prefix cache: a block that holds `block` prompt tokens, all written, is
// registered under the hash of every token up to its end (a chain: the
// previous block's hash and its own tokens). A later prompt with the same
// first tokens takes those blocks instead of computing them again: blocks
// are shared (a reference count), never written by the sharer (only whole
// blocks before the prompt's last token are shared, and a sequence writes
// only from its first unshared position on). When no sequence holds a
// registered block it stays cached, reusable, until a new block is needed
// and no free one is left: then the least recently released goes.
class KvPool {
 public:
  KvPool(const models::GptConfig& c, const EngineOptions& o) : block_(o.kv_block) {
    const int64_t per_block = 2 * c.n_layer * block_ * c.n_embd * int64_t(core::dtype_size(o.kv_dtype));
    blocks_per_seq_ = (c.block_size + block_ - 1) / block_;
    // A pool past the machine's memory is a typo, not a request: say so before
    // the size overflows or the allocation throws std::bad_alloc.
    const int64_t ram_mb = int64_t(::sysconf(_SC_PHYS_PAGES)) * int64_t(::sysconf(_SC_PAGESIZE)) >> 20;
    if (o.kv_mb > 0 && ram_mb > 0 && o.kv_mb > ram_mb)
      throw core::ConfigError("--kv-mb " + std::to_string(o.kv_mb) + " is more than the machine's memory (" +
                              std::to_string(ram_mb) + " MiB); 0 sizes the pool for a full context per sequence");
    const int64_t want = o.kv_mb > 0 ? (o.kv_mb << 20) / per_block : blocks_per_seq_ * o.max_seqs;
    if (want < 1)
      throw core::ConfigError("--kv-mb " + std::to_string(o.kv_mb) + " holds no block of " + std::to_string(block_) +
                              " positions (" + std::to_string(per_block) + " bytes each)");
    // The default pool (a full context per sequence) grows with the number
    // of sequences: past the machine's memory, zero-filling it would end in
    // the OOM killer rather than std::bad_alloc.
    if (o.kv_mb == 0 && ram_mb > 0 && (want * per_block >> 20) > ram_mb)
      throw core::ConfigError("the key/value pool for " + std::to_string(o.max_seqs) + " full contexts would take " +
                              std::to_string(want * per_block >> 20) + " MiB, more than the machine's memory (" +
                              std::to_string(ram_mb) + " MiB); lower the number of sequences or set --kv-mb");
    blocks_ = want;
    // Written now, so the pool's pages are the process's before the first
    // request: no page faults inside decoding steps (they were two thirds of
    // a fresh engine's kv_attention time at 16 sequences), and a pool the
    // machine cannot hold fails at start-up, not in the middle of a request.
    try {
      for (int64_t l = 0; l < c.n_layer; ++l) {
        k_.push_back(Tensor::zeros(Shape{blocks_, block_, c.n_embd}, o.kv_dtype));
        v_.push_back(Tensor::zeros(Shape{blocks_, block_, c.n_embd}, o.kv_dtype));
      }
    } catch (const std::bad_alloc&) {
      throw core::ConfigError("cannot allocate the key/value pool: " + std::to_string((blocks_ * per_block) >> 20) +
                              " MiB for " + std::to_string(o.max_seqs) + " sequences" +
                              (o.kv_mb > 0 ? " (--kv-mb " + std::to_string(o.kv_mb) + ")" : "") +
                              "; lower --kv-mb or the number of sequences");
    }
    table_ = Tensor::empty(Shape{o.max_seqs, blocks_per_seq_}, DType::i32);
    std::fill_n(table_.data_as<int32_t>(), table_.numel(), 0);
    held_.assign(size_t(o.max_seqs), 0);
    info_.resize(size_t(blocks_));
    for (int64_t b = blocks_ - 1; b >= 0; --b) free_.push_back(int32_t(b));
  }
  int64_t bytes() const { return int64_t(k_.size()) * 2 * int64_t(k_[0].bytes()); }
  // Blocks a new sequence can get: free ones and cached ones nobody holds.
  int64_t free_blocks() const { return int64_t(free_.size() + released_.size()); }
  int64_t cached_blocks() const { return int64_t(by_hash_.size()); }
  int64_t blocks_for(int64_t positions) const { return (positions + block_ - 1) / block_; }
  int64_t blocks() const { return blocks_; }

  struct Reserved {
    int64_t cached = -1;  // prompt positions already in the cache; -1: the pool is short, nothing taken
    int64_t blocks = 0;   // of them, whole blocks (registered already)
    uint64_t hash = 0;    // chain hash after those blocks
  };
  // Gives slot `s` enough blocks for `positions`, sharing the cached blocks
  // that hold the prompt's first tokens when `share`.
  Reserved reserve(int s, const std::vector<int32_t>& prompt, int64_t positions, bool share) {
    Reserved r;
    std::vector<int32_t> shared;
    uint64_t h = kSeed;
    const int64_t shareable = share ? (int64_t(prompt.size()) - 1) / block_ : 0;  // the last token is always fed
    for (int64_t j = 0; j < shareable; ++j) {
      const int32_t* tokens = prompt.data() + j * block_;
      const uint64_t next = chain(h, tokens);
      auto it = by_hash_.find(next);
      if (it == by_hash_.end()) break;
      const Block& b = info_[size_t(it->second)];
      if (b.parent != h || !std::equal(tokens, tokens + block_, b.tokens.begin())) break;  // a hash collision
      shared.push_back(it->second);
      h = next;
    }
    int64_t idle_shared = 0;  // shared blocks that no sequence holds now (counted in free_blocks)
    for (int32_t b : shared) idle_shared += info_[size_t(b)].refs == 0;
    const int64_t need = blocks_for(positions) - int64_t(shared.size());
    if (need > free_blocks() - idle_shared) return r;
    int32_t* row = table_.data_as<int32_t>() + s * blocks_per_seq_;
    int64_t i = 0;
    for (int32_t b : shared) {
      Block& blk = info_[size_t(b)];
      if (blk.refs++ == 0) released_.erase(blk.where);
      row[i++] = b;
    }
    for (int64_t k = 0; k < need; ++k) row[i++] = take_block();
    held_[size_t(s)] = i;
    r.blocks = int64_t(shared.size());
    r.cached = r.blocks * block_;
    r.hash = h;
    return r;
  }
  // Registers slot `s`'s blocks that hold only prompt tokens and are all
  // written (the first `filled` positions), from block `registered` on.
  void register_prompt(int s, const std::vector<int32_t>& prompt, int64_t filled, int64_t& registered, uint64_t& hash) {
    const int32_t* row = table_.data_as<int32_t>() + s * blocks_per_seq_;
    const int64_t limit = std::min<int64_t>(filled, int64_t(prompt.size())) / block_;
    for (; registered < limit; ++registered) {
      const int32_t* tokens = prompt.data() + registered * block_;
      const uint64_t next = chain(hash, tokens);
      Block& b = info_[size_t(row[registered])];
      if (!b.cached && !by_hash_.count(next)) {  // the same prefix may be cached already by another sequence
        b.cached = true;
        b.hash = next;
        b.parent = hash;
        b.tokens.assign(tokens, tokens + block_);
        by_hash_[next] = row[registered];
      }
      hash = next;
    }
  }
  // Cached blocks join the eviction order tail first: a prompt's later
  // blocks go before its earlier ones, since a lookup walks the chain from
  // the first block and stops at the first one missing (evicting the first
  // would leave the rest cached but out of reach).
  void release(int s) {
    int32_t* row = table_.data_as<int32_t>() + s * blocks_per_seq_;
    for (int64_t i = held_[size_t(s)] - 1; i >= 0; --i) {
      Block& b = info_[size_t(row[i])];
      if (--b.refs > 0) continue;
      if (b.cached) b.where = released_.insert(released_.end(), row[i]);
      else free_.push_back(row[i]);
    }
    held_[size_t(s)] = 0;
  }
  const Tensor& k(int64_t l) const { return k_[size_t(l)]; }
  const Tensor& v(int64_t l) const { return v_[size_t(l)]; }
  const Tensor& table() const { return table_; }

 private:
  struct Block {
    int32_t refs = 0;
    bool cached = false;
    uint64_t hash = 0, parent = 0;              // when cached: its chain hash and the one before it
    std::vector<int32_t> tokens;                // when cached: its tokens (checked on a hash match)
    std::list<int32_t>::iterator where;         // in released_ while cached and held by nobody
  };
  static constexpr uint64_t kSeed = 0x9e3779b97f4a7c15ull;
  uint64_t chain(uint64_t h, const int32_t* tokens) const {
    for (int64_t i = 0; i < block_; ++i) {  // splitmix64 steps over (hash, token)
      uint64_t z = h ^ (uint64_t(uint32_t(tokens[i])) + kSeed + (h << 6) + (h >> 2));
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      h = z ^ (z >> 31);
    }
    return h;
  }
  // A free block, else the least recently released cached one (forgotten).
  int32_t take_block() {
    int32_t b;
    if (!free_.empty()) {
      b = free_.back();
      free_.pop_back();
    } else {
      b = released_.front();
      released_.pop_front();
      by_hash_.erase(info_[size_t(b)].hash);
    }
    Block& blk = info_[size_t(b)];
    blk.refs = 1;
    blk.cached = false;
    blk.tokens.clear();
    return b;
  }

  int64_t block_, blocks_ = 0, blocks_per_seq_ = 0;
  std::vector<Tensor> k_, v_;
  Tensor table_;
  std::vector<int32_t> free_;       // never written, or not cached
  std::list<int32_t> released_;     // cached, held by nobody; least recently released first
  std::vector<Block> info_;
  std::unordered_map<uint64_t, int32_t> by_hash_;
  std::vector<int64_t> held_;
};

struct Seq {
  int64_t id = 0;
  int slot = 0;
  std::vector<int32_t> prompt;
  SamplingParams params;
  SequenceHistory history;
  int64_t fed = 0;       // positions in the cache
  int32_t next = -1;     // sampled, not yet fed
  int64_t generated = 0;
  int64_t reserved = 0;  // positions the slot's blocks cover
  int64_t cached = 0;    // prompt positions taken from the prefix cache
  int64_t registered = 0;  // prompt blocks registered in the prefix cache (or taken from it)
  uint64_t chain = 0;      // the prefix cache's chain hash after those blocks
  bool cancelled = false;
  bool done = false;     // finished this step: leaves before the next
  std::string text;      // generated text so far (stop strings)
  std::optional<JsonConstraint> json;  // SamplingParams::json_object: where in the object the text is
  std::optional<GrammarConstraint> grammar;  // SamplingParams::grammar: where in the grammar the text is
  std::vector<TokenChoice> prompt_choices;  // SamplingParams::prompt_logprobs: scored so far
};

}  // namespace

struct Engine::Impl {
  Model model;
  EngineOptions opt;
  const data::Tokenizer* tokenizer;
  // Tokens a draw may produce: the tokenizer's, where the model's embedding
  // is padded past them (GPT-2's 50,257 padded to 50,304). A padded id has a
  // trained, finite logit, so sampling could draw one, and it has no text.
  int64_t drawable_vocab;
  // Each drawable token's bytes, for SamplingParams::json_object and
  // ::grammar (decoded on the first such request), and the two masks' forms
  // of them.
  std::vector<std::string> token_text;
  std::optional<JsonVocabulary> json_vocab;
  std::optional<GrammarVocabulary> grammar_vocab;  // a trie, for SamplingParams::grammar
  cpu::CpuBackend backend;
  KvPool pool;
  std::vector<std::unique_ptr<Seq>> seqs;  // active, in admission order
  std::vector<int> free_slots;
  int64_t next_id = 0;
  EngineStats stats;
  ActivationObserver observer;

  // Buffers for max_step_tokens rows.
  int64_t max_rows;
  std::vector<float> x, a, qkv, att, t, h, h2;
  std::vector<float> mean;  // LayerNorm's mean and rstd outputs (unused by inference), 2 per row
  std::vector<int32_t> rows;              // (slot, position) per row
  std::vector<float> gathered, normed, logits, stat;
  std::vector<unsigned char> workspace;
  std::vector<SamplerScratch> scratch;  // one per thread
  std::vector<TokenChoice> choices;      // per sampled row of a step

  Impl(Model m, const EngineOptions& o, const data::Tokenizer* tok)
      : model(std::move(m)),
        opt(o),
        tokenizer(tok),
        drawable_vocab(tok ? std::min(model.config.vocab_size, tok->vocab_size()) : model.config.vocab_size),
        backend(o.threads),
        pool(model.config, o) {
    const int64_t c = model.config.n_embd;
    max_rows = opt.max_step_tokens;
    for (auto* b : {&x, &a, &att, &t}) b->resize(size_t(max_rows * c));
    qkv.resize(size_t(max_rows * 3 * c));
    h.resize(size_t(max_rows * 4 * c));
    h2.resize(h.size());
    mean.resize(size_t(2 * max_rows));
    rows.resize(size_t(max_rows * 2));
    gathered.resize(size_t(opt.max_seqs * c));
    normed.resize(gathered.size());
    stat.resize(size_t(2 * opt.max_seqs));
    logits.resize(size_t(opt.max_seqs * model.config.vocab_size));
    for (int s = opt.max_seqs - 1; s >= 0; --s) free_slots.push_back(s);
  }

  void run(OpKind op, std::initializer_list<TensorView> in, std::initializer_list<TensorView> out,
           const core::OpParams& params = {}) {
    const core::OpDef& def = core::op_def(op);
    size_t ws = 0;
    if (def.workspace_bytes) {
      TensorMeta metas[8];  // no op here takes more than 5 inputs; a stack array keeps steps allocation-free
      size_t k = 0;
      for (const TensorView& v : in) metas[k++] = v.meta;
      ws = def.workspace_bytes(std::span<const TensorMeta>(metas, k), params);
      if (ws > workspace.size()) workspace.resize(ws);
    }
    core::run_op(backend, op, std::span<const TensorView>(in.begin(), in.size()),
                 std::span<const TensorView>(out.begin(), out.size()), params, workspace.data(), ws);
  }

  void linear(const QLinear& l, const float* in, int64_t n, float* out) {
    const TensorView xv = view(in, Shape{n, l.in}), yv = view(out, Shape{n, l.out});
    if (l.scheme == Scheme::f32) {
      const core::PackedLinearParams params{l.out};
      if (l.bias.defined()) run(OpKind::linear_packed, {xv, l.w.as_view(), l.bias.as_view()}, {yv}, params);
      else run(OpKind::linear_packed, {xv, l.w.as_view()}, {yv}, params);
      return;
    }
    if (l.packed) {  // int8 / int4 in linear_q8_packed's / linear_q4_packed's panels
      const core::PackedLinearParams params{l.out};
      const OpKind op = l.scheme == Scheme::int8 ? OpKind::linear_q8_packed : OpKind::linear_q4_packed;
      if (l.bias.defined()) run(op, {xv, l.w.as_view(), l.scale.as_view(), l.bias.as_view()}, {yv}, params);
      else run(op, {xv, l.w.as_view(), l.scale.as_view()}, {yv}, params);
      return;
    }
    const OpKind op = l.scheme == Scheme::int8 ? OpKind::linear_q8 : OpKind::linear_q4;
    if (l.bias.defined()) run(op, {xv, l.w.as_view(), l.scale.as_view(), l.bias.as_view()}, {yv});
    else run(op, {xv, l.w.as_view(), l.scale.as_view()}, {yv});
  }

  void layernorm(const float* in, int64_t n, const Tensor& w, const Tensor& b, float* out, float* stats) {
    const int64_t c = model.config.n_embd;
    run(OpKind::layernorm, {view(in, Shape{n, c}), w.as_view(), b.as_view()},
        {view(out, Shape{n, c}), view(stats, Shape{n}), view(stats + n, Shape{n})}, core::LayerNormParams{1e-5f});
  }

  void observe(int64_t layer, int which, const float* p, int64_t n, int64_t width) {
    if (observer) observer(layer, which, p, n, width);
  }

  // The blocks over rows [0, n) (embeddings already in x); the final hidden
  // states stay in x.
  void forward(int64_t n) {
    const models::GptConfig& cfg = model.config;
    const int64_t c = cfg.n_embd;
    const TensorView rows_v = view(rows.data(), Shape{n, 2}, DType::i32);
    for (int64_t l = 0; l < cfg.n_layer; ++l) {
      const Layer& L = model.layers[size_t(l)];
      const TensorView xv = view(x.data(), Shape{n, c});
      layernorm(x.data(), n, L.ln1_w, L.ln1_b, a.data(), mean.data());
      observe(l, 0, a.data(), n, c);
      linear(L.qkv, a.data(), n, qkv.data());
      run(OpKind::kv_attention,
          {view(qkv.data(), Shape{n, 3 * c}), pool.k(l).as_view(), pool.v(l).as_view(), rows_v, pool.table().as_view()},
          {view(att.data(), Shape{n, c}), pool.k(l).as_view(), pool.v(l).as_view()},
          core::AttentionParams{int(cfg.n_head), 0.f});
      observe(l, 1, att.data(), n, c);
      linear(L.proj, att.data(), n, t.data());
      run(OpKind::add, {xv, view(t.data(), Shape{n, c})}, {xv});
      layernorm(x.data(), n, L.ln2_w, L.ln2_b, a.data(), mean.data());
      observe(l, 2, a.data(), n, c);
      linear(L.fc, a.data(), n, h.data());
      run(OpKind::gelu, {view(h.data(), Shape{n, 4 * c})}, {view(h2.data(), Shape{n, 4 * c})});
      observe(l, 3, h2.data(), n, 4 * c);
      linear(L.fc_proj, h2.data(), n, t.data());
      run(OpKind::add, {xv, view(t.data(), Shape{n, c})}, {xv});
    }
  }

  // Final LayerNorm and LM head of the listed rows of x into `out` (k, vocab).
  void head(const std::vector<int64_t>& which, float* gather, float* norm, float* out) {
    const int64_t c = model.config.n_embd, k = int64_t(which.size());
    for (int64_t i = 0; i < k; ++i) std::memcpy(gather + i * c, x.data() + which[size_t(i)] * c, size_t(c) * sizeof(float));
    layernorm(gather, k, model.lnf_w, model.lnf_b, norm, stat.data());  // k <= max_seqs rows
    linear(model.head, norm, k, out);
  }

  int64_t add(const std::vector<int32_t>& prompt, const SamplingParams& p) {
    const models::GptConfig& cfg = model.config;
    validate(p, cfg.vocab_size);
    if (prompt.empty()) throw core::ConfigError("the prompt is empty: give at least one token");
    if ((p.json_object || p.grammar) && !tokenizer)
      throw core::ConfigError("a JSON- or grammar-constrained sequence needs the engine's tokenizer (the bytes of each token)");
    if (p.json_object && p.grammar)
      throw core::ConfigError("a sequence is constrained to JSON or to a grammar, not both");
    for (size_t i = 0; i < prompt.size(); ++i)
      if (prompt[i] < 0 || prompt[i] >= cfg.vocab_size)
        throw core::ConfigError("prompt token " + std::to_string(prompt[i]) + " at position " + std::to_string(i) +
                                " is outside the model's vocabulary [0, " + std::to_string(cfg.vocab_size) + ")");
    // A prompt may fill the context: its last position's logits give one
    // token (sampled, never fed) or, with max_tokens 0, score it whole.
    if (int64_t(prompt.size()) > cfg.block_size)
      throw core::ConfigError("the prompt has " + std::to_string(prompt.size()) + " tokens; this model's context is " +
                              std::to_string(cfg.block_size) + " tokens");
    // Every position this sequence can reach: the prompt, then the first
    // max_tokens - 1 new tokens (the last one is sampled but never fed),
    // within the context.
    // (Capped before the sum: a max_tokens near 2^63 must not wrap.)
    const int64_t reach = std::min<int64_t>(
        cfg.block_size, int64_t(prompt.size()) + std::clamp<int64_t>(p.max_tokens - 1, 0, cfg.block_size));
    if (pool.blocks_for(reach) > pool.blocks())
      throw core::ConfigError("the request reaches " + std::to_string(reach) + " positions (prompt and max_tokens), " +
                              std::to_string(pool.blocks_for(reach)) + " key/value blocks of " +
                              std::to_string(opt.kv_block) + "; the pool holds " + std::to_string(pool.blocks()) +
                              ": raise --kv-mb or lower max_tokens");
    if (free_slots.empty()) return -1;
    const int slot = free_slots.back();
    // A scored prompt computes every position: none may come from the prefix cache.
    const KvPool::Reserved got = pool.reserve(slot, prompt, reach, opt.prefix_cache && p.prompt_logprobs < 0);
    if (got.cached < 0) return -1;
    free_slots.pop_back();
    auto s = std::make_unique<Seq>();
    s->id = next_id++;
    s->slot = slot;
    s->prompt = prompt;
    s->params = p;
    s->history = SequenceHistory(cfg.vocab_size);
    s->history.add_prompt(prompt);
    if (p.json_object) {
      if (p.json_schema) s->json.emplace(*p.json_schema);  // s->params holds the schema
      else s->json.emplace();
      if (!json_vocab) json_vocab.emplace(token_bytes());
    }
    if (p.grammar) {
      s->grammar.emplace(*p.grammar);  // s->params holds the grammar
      if (!grammar_vocab) grammar_vocab.emplace(token_bytes());
    }
    s->reserved = reach;
    s->fed = s->cached = got.cached;
    s->registered = got.blocks;
    s->chain = got.hash;
    stats.cached_prompt_tokens += got.cached;
    seqs.push_back(std::move(s));
    return seqs.back()->id;
  }

  const std::vector<std::string>& token_bytes() {
    for (int32_t id = int32_t(token_text.size()); id < int32_t(drawable_vocab); ++id)
      token_text.push_back(tokenizer->decode(std::span<const int32_t>(&id, 1)));
    return token_text;
  }

  void finish(size_t i) {
    pool.release(seqs[i]->slot);
    free_slots.push_back(seqs[i]->slot);
    seqs.erase(seqs.begin() + std::ptrdiff_t(i));
  }

  // Appends the token's text and reports the stop string now in it that
  // ends in it (first_stop_string's choice, where serve::TextStream cuts).
  std::string stop_string_hit(Seq& s, int32_t token) {
    if (s.params.stop.empty() || !tokenizer) return {};
    const size_t before = s.text.size();
    s.text += tokenizer->decode(std::span<const int32_t>(&token, 1));
    const StopMatch m = first_stop_string(s.text, s.params.stop, 0, before);
    return m.stop ? *m.stop : std::string();
  }

  // SamplingParams::json_object: -inf for every token whose bytes cannot
  // come next (one pass over the vocabulary, JsonVocabulary::mask), and for
  // the stop tokens, which wait for the object to close; unless they are
  // all that may come next (stop_token_ids covering every byte that fits):
  // then one of them ends the sequence, its text still a prefix of an
  // object, where masking them too left nothing to draw.
  void constrain(const JsonConstraint& json, const std::vector<int32_t>& stop_tokens, float* row) const {
    constexpr float never = -std::numeric_limits<float>::infinity();
    const int64_t left = json_vocab->mask(json, row);
    std::vector<std::pair<int32_t, float>> held;
    for (int32_t t : stop_tokens)
      if (t < drawable_vocab && row[t] != never) held.emplace_back(t, row[t]), row[t] = never;
    if (int64_t(held.size()) == left)
      for (const auto& [t, v] : held) row[t] = v;
  }

  // SamplingParams::grammar: -inf for every token whose bytes cannot come
  // next (GrammarConstraint::mask); the stop tokens, whatever their bytes,
  // only where the text is a whole one (llama.cpp's rule for its end of
  // generation token), or where nothing else is left (a byte refused at the
  // cap on ambiguity): then one of them ends the sequence.
  void constrain(const GrammarConstraint& grammar, const std::vector<int32_t>& stop_tokens, float* row) const {
    constexpr float never = -std::numeric_limits<float>::infinity();
    std::vector<std::pair<int32_t, float>> stops;
    for (int32_t t : stop_tokens)
      if (t < drawable_vocab) stops.emplace_back(t, row[t]);
    int64_t left = grammar.mask(*grammar_vocab, row);
    for (const auto& [t, v] : stops)
      if (row[t] != never) row[t] = never, --left;
    if (grammar.can_end() || left == 0)
      for (const auto& [t, v] : stops) row[t] = v;
  }

  // Each sampled row's token, rows across threads: a row's choice depends
  // only on its logits, parameters, history and seed, so the result is the
  // same on any number of threads. (One thread sampling 16 rows of a 50k
  // vocabulary was ~5% of a batched decoding step, the other thread idle.)
  void sample_all(const std::vector<Seq*>& samplers) {
    const int64_t vocab = model.config.vocab_size, n = int64_t(samplers.size());
    choices.assign(samplers.size(), TokenChoice{});
    const int threads = int(std::min<int64_t>(omp_get_max_threads(), n));
    if (scratch.size() < size_t(std::max(threads, 1))) scratch.resize(size_t(std::max(threads, 1)));
    auto one = [&](int64_t i, SamplerScratch& work) {
      const Seq& s = *samplers[size_t(i)];
      if (s.json) constrain(*s.json, s.params.stop_tokens, logits.data() + i * vocab);
      if (s.grammar) constrain(*s.grammar, s.params.stop_tokens, logits.data() + i * vocab);
      choices[size_t(i)] =
          sample(logits.data() + i * vocab, drawable_vocab, s.params, s.history, uint64_t(s.generated), work);
    };
    if (threads <= 1) {
      for (int64_t i = 0; i < n; ++i) one(i, scratch[0]);
      return;
    }
    std::exception_ptr error;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (int64_t i = 0; i < n; ++i) {
      try {
        one(i, scratch[size_t(omp_get_thread_num())]);
      } catch (...) {
#pragma omp critical(brisk_sample_error)
        if (!error) error = std::current_exception();
      }
    }
    if (error) std::rethrow_exception(error);
  }

  // SamplingParams::prompt_logprobs: row rows_at[i] of x holds the next
  // unscored prompt position of of[i] (a sequence's rows in order); each is
  // scored against the prompt token after it, through the head in chunks
  // of its buffers' size (max_seqs rows). Like a drawn token's logprobs,
  // they are over the drawable ids: the same distribution, and top entries
  // the tokenizer can decode.
  void score_prompt_rows(const std::vector<int64_t>& rows_at, const std::vector<Seq*>& of) {
    const int64_t vocab = model.config.vocab_size;
    if (scratch.empty()) scratch.resize(1);
    for (size_t i0 = 0; i0 < rows_at.size(); i0 += size_t(opt.max_seqs)) {
      const size_t k = std::min(rows_at.size() - i0, size_t(opt.max_seqs));
      const std::vector<int64_t> which(rows_at.begin() + std::ptrdiff_t(i0), rows_at.begin() + std::ptrdiff_t(i0 + k));
      head(which, gathered.data(), normed.data(), logits.data());
      for (size_t i = 0; i < k; ++i) {
        Seq& s = *of[i0 + i];
        const int32_t target = s.prompt[s.prompt_choices.size() + 1];
        s.prompt_choices.push_back(
            score_token(logits.data() + int64_t(i) * vocab, drawable_vocab, target, s.params.prompt_logprobs,
                        scratch[0]));
      }
    }
  }

  // OpenMP's thread count is the calling thread's own setting: the backend
  // set it on the thread that built the engine, and a server steps the
  // engine on its scheduler thread, whose kernels otherwise ran on OpenMP's
  // default team (every core, or OMP_NUM_THREADS) whatever --threads said.
  void use_own_thread_count() {
    if (omp_get_max_threads() != backend.num_threads()) cpu::set_num_threads(backend.num_threads());
  }

  std::vector<TokenEvent> step() {
    use_own_thread_count();
    std::vector<TokenEvent> events;
    for (size_t i = 0; i < seqs.size();) {
      if (seqs[i]->cancelled) {
        TokenEvent e;
        e.seq = seqs[i]->id;
        e.choice.token = -1;
        e.finish = Finish::cancelled;
        events.push_back(e);
        finish(i);
      } else {
        ++i;
      }
    }
    if (seqs.empty()) return events;
    const double t0 = now();
    const int64_t c = model.config.n_embd;
    // Rows: every decoding sequence's token first, then prompt chunks.
    int64_t n = 0, prompt_rows = 0;
    std::vector<int64_t> sample_rows;
    std::vector<Seq*> samplers;
    auto put = [&](Seq& s, int32_t token) {
      model.embed(token, s.fed, x.data() + n * c);
      rows[size_t(2 * n)] = s.slot;
      rows[size_t(2 * n + 1)] = int32_t(s.fed);
      ++s.fed;
      ++n;
    };
    for (auto& s : seqs)
      if (s->next >= 0 && n < max_rows) {
        put(*s, s->next);
        s->next = -1;
        sample_rows.push_back(n - 1);
        samplers.push_back(s.get());
      }
    std::vector<int64_t> scored_rows;  // prompt rows to score (prompt_logprobs), and whose
    std::vector<Seq*> scored_of;
    std::vector<Seq*> unsampled;  // max_tokens 0: the prompt is done, nothing to generate
    for (auto& s : seqs) {
      const int64_t left = int64_t(s->prompt.size()) - s->fed;
      if (left <= 0 || s->next >= 0) continue;
      const int64_t take = std::min(left, max_rows - n);
      if (take <= 0) break;
      for (int64_t i = 0; i < take; ++i) {
        if (s->params.prompt_logprobs >= 0 && s->fed + 1 < int64_t(s->prompt.size())) {
          scored_rows.push_back(n);
          scored_of.push_back(s.get());
        }
        put(*s, s->prompt[size_t(s->fed)]);
      }
      prompt_rows += take;
      if (take == left && s->params.max_tokens == 0) {
        unsampled.push_back(s.get());
      } else if (take == left) {
        sample_rows.push_back(n - 1);
        samplers.push_back(s.get());
      }
    }
    forward(n);
    if (!scored_rows.empty()) score_prompt_rows(scored_rows, scored_of);
    for (Seq* s : unsampled) {
      TokenEvent e;
      e.seq = s->id;
      e.choice.token = -1;
      e.finish = Finish::length;
      e.cached_prompt_tokens = s->cached;
      e.prompt_logprobs = std::move(s->prompt_choices);
      s->done = true;
      events.push_back(std::move(e));
    }
    if (opt.prefix_cache)  // the prompt blocks this step completed become shareable
      for (auto& s : seqs)
        if ((s->registered + 1) * opt.kv_block <= int64_t(s->prompt.size()))
          pool.register_prompt(s->slot, s->prompt, s->fed, s->registered, s->chain);
    head(sample_rows, gathered.data(), normed.data(), logits.data());
    sample_all(samplers);
    for (size_t i = 0; i < samplers.size(); ++i) {
      Seq& s = *samplers[i];
      TokenEvent e;
      e.seq = s.id;
      e.choice = std::move(choices[i]);
      if (s.generated == 0) {
        e.cached_prompt_tokens = s.cached;
        e.prompt_logprobs = std::move(s.prompt_choices);
      }
      const int32_t tok = e.choice.token;
      s.history.add_generated(tok);
      ++s.generated;
      // min_tokens: the sampler drew no stop token before it, and a stop
      // string may end no earlier than the token that reaches it (vLLM's
      // rule); the text still grows, so a later search starts at the end.
      const bool may_stop = s.generated >= s.params.min_tokens;
      // A token the automaton refuses (only where later masks, min_tokens'
      // or banned tokens, left no token at all) ends the sequence as a stop
      // token does: its bytes stay out of the text, which stays a prefix.
      // A stop token is never fed to a grammar: it ends a whole text.
      const bool is_stop =
          std::find(s.params.stop_tokens.begin(), s.params.stop_tokens.end(), tok) != s.params.stop_tokens.end();
      const bool refused = (s.json && !s.json->feed(token_text[size_t(tok)])) ||
                           (s.grammar && !is_stop && !s.grammar->feed(token_text[size_t(tok)]));
      if (refused || is_stop) {
        e.finish = Finish::stop;
      } else if ((s.json && s.json->done()) || (s.grammar && s.grammar->done())) {
        e.finish = Finish::stop;  // the object or the grammar's text is complete: nothing may follow it
        e.constraint_closed = true;
      } else if (std::string hit = stop_string_hit(s, tok); may_stop && !hit.empty()) {
        e.finish = Finish::stop;
        e.stop_matched = hit;
      } else if (s.generated >= s.params.max_tokens) {
        e.finish = Finish::length;
      } else if (s.fed >= model.config.block_size) {
        e.finish = Finish::length;  // no position left to feed this token at
        e.context_full = true;
      } else {
        s.next = tok;
      }
      s.done = e.finish != Finish::none;
      events.push_back(std::move(e));
    }
    for (size_t i = 0; i < seqs.size();) {
      if (seqs[i]->done) finish(i);
      else ++i;
    }
    const double dt = now() - t0;
    ++stats.steps;
    stats.prefill_tokens += prompt_rows;
    if (prompt_rows > 0) {
      stats.prefill_seconds += dt;
    } else {
      stats.decode_seconds += dt;
      stats.decode_tokens += int64_t(samplers.size());
    }
    return events;
  }
};

Engine::Engine(Model model, const EngineOptions& options, const data::Tokenizer* tokenizer) {
  ops::register_ops();
  if (options.max_seqs < 1) throw core::ConfigError("max_seqs must be at least 1");
  if (options.max_step_tokens < options.max_seqs)
    throw core::ConfigError("max_step_tokens must be at least max_seqs (" + std::to_string(options.max_seqs) + ")");
  if (options.kv_block < 1) throw core::ConfigError("kv_block must be at least 1");
  if (options.kv_mb < 0) throw core::ConfigError("--kv-mb must not be negative");
  if (options.kv_dtype != core::DType::f32 && options.kv_dtype != core::DType::bf16)
    throw core::ConfigError(std::string("the key/value pool holds f32 or bf16, not ") +
                            std::string(core::dtype_name(options.kv_dtype)));
  if (model.scheme == Scheme::int4 && model.config.n_embd % 32 != 0)
    throw core::ConfigError("int4 needs n_embd to be a multiple of 32");
  pack_f32_linears(model);
  if (cpu::cpu_features().int8 == cpu::Int8Dot::avx512_vnni) pack_quantized_linears(model);
  impl_ = std::make_unique<Impl>(std::move(model), options, tokenizer);
}

Engine::~Engine() = default;
const Model& Engine::model() const { return impl_->model; }
const EngineOptions& Engine::options() const { return impl_->opt; }
int64_t Engine::add(const std::vector<int32_t>& prompt, const SamplingParams& params) { return impl_->add(prompt, params); }
void Engine::cancel(int64_t id) {
  for (auto& s : impl_->seqs)
    if (s->id == id) s->cancelled = true;
}
std::vector<TokenEvent> Engine::step() { return impl_->step(); }
bool Engine::idle() const { return impl_->seqs.empty(); }
int Engine::active() const { return int(impl_->seqs.size()); }
int64_t Engine::kv_bytes() const { return impl_->pool.bytes(); }
int64_t Engine::kv_blocks_free() const { return impl_->pool.free_blocks(); }
int64_t Engine::kv_blocks_cached() const { return impl_->pool.cached_blocks(); }
const EngineStats& Engine::stats() const { return impl_->stats; }
void Engine::reset_stats() { impl_->stats = {}; }
void Engine::set_observer(ActivationObserver obs) { impl_->observer = std::move(obs); }

ScoreResult Engine::score(const std::vector<int32_t>& ids) {
  Impl& m = *impl_;
  if (!idle()) throw core::Error("Engine::score needs an idle engine");
  m.use_own_thread_count();
  const models::GptConfig& cfg = m.model.config;
  if (ids.size() < 2 || int64_t(ids.size()) > cfg.block_size)
    throw core::ConfigError("score takes 2 to " + std::to_string(cfg.block_size) + " tokens, got " +
                            std::to_string(ids.size()));
  for (int32_t id : ids)
    if (id < 0 || id >= cfg.vocab_size) throw core::ConfigError("token " + std::to_string(id) + " outside the vocabulary");
  const int slot = m.free_slots.back();
  // Not shared with the prefix cache (nor registered in it): scoring computes every position itself.
  if (m.pool.reserve(slot, ids, int64_t(ids.size()), false).cached < 0)
    throw core::Error("Engine::score: the key/value pool is too small");
  ScoreResult r;
  const int64_t c = cfg.n_embd, vocab = cfg.vocab_size;
  std::vector<float> gather, norm, out;
  // Chunks of at most max_seqs rows through the head (its buffers' size).
  int64_t fed = 0;
  while (fed < int64_t(ids.size()) - 1) {
    const int64_t n = std::min<int64_t>(m.max_rows, int64_t(ids.size()) - 1 - fed);
    for (int64_t i = 0; i < n; ++i) {
      m.model.embed(ids[size_t(fed + i)], fed + i, m.x.data() + i * c);
      m.rows[size_t(2 * i)] = slot;
      m.rows[size_t(2 * i + 1)] = int32_t(fed + i);
    }
    m.forward(n);
    for (int64_t i0 = 0; i0 < n; i0 += m.opt.max_seqs) {
      const int64_t k = std::min<int64_t>(m.opt.max_seqs, n - i0);
      std::vector<int64_t> which;
      for (int64_t i = 0; i < k; ++i) which.push_back(i0 + i);
      gather.resize(size_t(k * c));
      norm.resize(size_t(k * c));
      out.resize(size_t(k * vocab));
      m.head(which, gather.data(), norm.data(), out.data());
      for (int64_t i = 0; i < k; ++i) {
        const float* row = out.data() + i * vocab;
        const float top = *std::max_element(row, row + vocab);
        double s = 0;
        for (int64_t j = 0; j < vocab; ++j) s += std::exp(double(row[j]) - top);
        const int32_t target = ids[size_t(fed + i0 + i + 1)];
        r.nll_sum += top + std::log(s) - row[target];
        r.argmax.push_back(int32_t(std::max_element(row, row + vocab) - row));
        ++r.count;
      }
    }
    fed += n;
  }
  m.pool.release(slot);
  return r;
}

}  // namespace brisk::infer
