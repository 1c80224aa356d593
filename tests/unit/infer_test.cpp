// The inference engine (src/infer/): KV-cache decoding against the
// recompute path and Gpt::logits, batching and seeds, quantization error
// and file round trips, the sampler's filters, and the errors bad input gets.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <numeric>
#include <regex>
#include <set>

#include "brisk/core/error.h"
#include "brisk/core/safetensors.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/data/tokenizer.h"
#include "brisk/infer/engine.h"
#include "brisk/infer/grammar.h"
#include "brisk/infer/json_constraint.h"
#include "brisk/models/generate.h"
#include "brisk/train/checkpoint.h"
#include "../common/tiny_gpt.h"

namespace brisk {
namespace {

namespace fs = std::filesystem;

models::GptConfig small_config() {
  models::GptConfig c;
  c.vocab_size = 256;
  c.n_layer = 2;
  c.n_embd = 64;
  c.n_head = 2;
  c.block_size = 64;
  return c;
}

// A random small GPT saved as a brisk checkpoint (once per process, under a
// directory removed at exit: ctest runs every test in a process of its own).
const std::string& checkpoint() {
  static const struct Saved {
    fs::path root = fs::temp_directory_path() / ("brisk_infer_test_" + std::to_string(::getpid()));
    std::string dir = save(root);
    static std::string save(const fs::path& root) {
      fs::remove_all(root);
      const models::GptConfig c = small_config();
      testing::TinyGpt t;
      t.layers = c.n_layer, t.width = c.n_embd, t.heads = c.n_head, t.context = c.block_size, t.vocab = c.vocab_size;
      t.seed = 7;
      t.scale = 4.f;  // logits far from uniform: greedy choices well separated
      return testing::save_tiny_gpt(root.string(), t);
    }
    ~Saved() {
      std::error_code ec;
      fs::remove_all(root, ec);
    }
  } saved;
  return saved.dir;
}

std::vector<int32_t> prompt_of(int n, int salt = 0) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(int32_t((i * 37 + salt * 11 + 5) % 256));
  return p;
}

infer::EngineOptions opts(int seqs = 4) {
  infer::EngineOptions o;
  o.max_seqs = seqs;
  o.threads = 2;
  o.max_step_tokens = 64;
  return o;
}

// One sequence and a pool of one full context: 4 blocks of 16.
infer::EngineOptions one_context() {
  infer::EngineOptions o = opts(1);
  o.kv_block = 16;
  o.kv_mb = 0;
  return o;
}

infer::SamplingParams greedy(int64_t max_tokens) {
  infer::SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = max_tokens;
  return sp;
}

// Every token of every sequence, by id, until the engine is idle.
std::map<int64_t, std::vector<int32_t>> drain(infer::Engine& e) {
  std::map<int64_t, std::vector<int32_t>> out;
  while (!e.idle())
    for (const auto& ev : e.step())
      if (ev.choice.token >= 0) out[ev.seq].push_back(ev.choice.token);
  return out;
}

// The recompute path's teacher-forced NLL of ids[1..] (nats, summed) and its
// top token at each position, from Gpt::logits.
std::pair<double, std::vector<int32_t>> teacher_forced(models::Gpt& gpt, const std::vector<int32_t>& ids, int vocab) {
  const float* logits = gpt.logits(ids.data(), 1, int64_t(ids.size()));
  double nll = 0;
  std::vector<int32_t> top;
  for (size_t i = 0; i + 1 < ids.size(); ++i) {
    const float* row = logits + i * vocab;
    const float m = *std::max_element(row, row + vocab);
    double s = 0;
    for (int j = 0; j < vocab; ++j) s += std::exp(double(row[j]) - m);
    nll += m + std::log(s) - row[ids[i + 1]];
    top.push_back(int32_t(std::max_element(row, row + vocab) - row));
  }
  return {nll, top};
}

TEST(InferEngine, GreedyMatchesTheRecomputePath) {
  cpu::CpuBackend be(2);
  models::Gpt gpt(small_config(), be);
  train::load_checkpoint(checkpoint(), gpt, nullptr);
  models::SampleOptions so;
  so.temperature = 0;
  so.max_new_tokens = 40;
  const std::vector<int32_t> prompt = prompt_of(9);
  const auto all = models::generate(gpt, prompt, so);
  const std::vector<int32_t> want(all.begin() + 9, all.end());

  infer::Engine e(infer::load_model(checkpoint()), opts());
  infer::SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = 40;
  const int64_t id = e.add(prompt, sp);
  EXPECT_EQ(drain(e)[id], want);
}

TEST(InferEngine, ScoreMatchesGptLogits) {
  cpu::CpuBackend be(2);
  models::Gpt gpt(small_config(), be);
  train::load_checkpoint(checkpoint(), gpt, nullptr);
  const std::vector<int32_t> ids = prompt_of(33, 3);
  const auto [nll, top] = teacher_forced(gpt, ids, 256);
  infer::EngineOptions o = opts();
  o.max_step_tokens = 8;  // the window goes through in chunks of 8 rows
  infer::Engine e(infer::load_model(checkpoint()), o);
  const infer::ScoreResult r = e.score(ids);
  EXPECT_EQ(r.count, 32);
  EXPECT_NEAR(r.nll_sum, nll, 1e-3 * std::abs(nll));
  EXPECT_EQ(r.argmax, top);
}

// prompt_logprobs: a sequence's first event carries every prompt token's
// log-probability given the ones before it, the same numbers score() gives
// (and so the recompute path's), in chunks of a few rows, beside other
// sequences and with a prefix another sequence has cached; max_tokens 0
// then scores without generating, and generating as well changes nothing
// of what is generated.
TEST(InferEngine, PromptLogprobsMatchScoring) {
  const std::vector<int32_t> ids = prompt_of(33, 3);
  infer::EngineOptions o = opts();
  o.max_step_tokens = 8;  // the prompt is fed in chunks of at most 8 rows, with another sequence beside it
  infer::Engine e(infer::load_model(checkpoint()), o);
  const infer::ScoreResult want = e.score(ids);

  infer::SamplingParams greedy;
  greedy.temperature = 0;
  greedy.max_tokens = 6;
  const int64_t plain = e.add(ids, greedy);  // caches the prompt's whole blocks
  const std::vector<int32_t> plain_tokens = drain(e)[plain];

  infer::SamplingParams scored = greedy;
  scored.prompt_logprobs = 2;
  infer::SamplingParams only = scored;
  only.max_tokens = 0;
  const int64_t a = e.add(ids, scored), b = e.add(ids, only), other = e.add(prompt_of(20, 5), greedy);
  std::map<int64_t, std::vector<infer::TokenEvent>> events;
  while (!e.idle())
    for (auto& ev : e.step()) events[ev.seq].push_back(std::move(ev));
  ASSERT_EQ(events[b].size(), 1u);
  EXPECT_EQ(events[b][0].choice.token, -1);
  EXPECT_EQ(events[b][0].finish, infer::Finish::length);
  EXPECT_EQ(events[b][0].cached_prompt_tokens, 0);  // scoring computes every position
  std::vector<int32_t> a_tokens;
  for (const auto& ev : events[a]) a_tokens.push_back(ev.choice.token);
  EXPECT_EQ(a_tokens, plain_tokens);
  EXPECT_EQ(events[other].size(), 6u);
  EXPECT_TRUE(events[other][0].prompt_logprobs.empty());
  for (int64_t id : {a, b}) {
    const std::vector<infer::TokenChoice>& lp = events[id][0].prompt_logprobs;
    ASSERT_EQ(lp.size(), ids.size() - 1) << id;
    double nll = 0;
    for (size_t i = 0; i < lp.size(); ++i) {
      EXPECT_EQ(lp[i].token, ids[i + 1]);
      ASSERT_EQ(lp[i].top.size(), 2u);
      EXPECT_EQ(lp[i].top[0].first, want.argmax[i]) << "position " << i;
      EXPECT_GE(lp[i].top[0].second, lp[i].top[1].second);
      EXPECT_LE(lp[i].logprob, lp[i].top[0].second);
      nll -= lp[i].logprob;
    }
    EXPECT_NEAR(nll, want.nll_sum, 1e-4 * want.nll_sum);
    for (size_t k = 1; k < events[id].size(); ++k) EXPECT_TRUE(events[id][k].prompt_logprobs.empty());
  }

  // max_tokens 0 without prompt_logprobs: the prompt is fed, and that is all.
  infer::SamplingParams prefill_only = greedy;
  prefill_only.max_tokens = 0;
  const int64_t c = e.add(ids, prefill_only);
  std::vector<infer::TokenEvent> last;
  while (!e.idle())
    for (auto& ev : e.step()) last.push_back(std::move(ev));
  ASSERT_EQ(last.size(), 1u);
  EXPECT_EQ(last[0].seq, c);
  EXPECT_EQ(last[0].choice.token, -1);
  EXPECT_EQ(last[0].finish, infer::Finish::length);
  EXPECT_TRUE(last[0].prompt_logprobs.empty());
  EXPECT_TRUE(e.idle());
  scored.prompt_logprobs = 21;
  EXPECT_THROW(e.add(ids, scored), core::ConfigError);
}

// The engine repacks fp32 Linears into panels of 16 outputs
// (pack_f32_linears). A vocabulary of 250 leaves the LM head's last panel
// partial: the packed model embeds every token as the plain one does,
// scores a window with the same argmax and likelihood, and a packed model
// is not taken for quantization.
TEST(InferEngine, PackedWeightsKeepTheModelsFunction) {
  const fs::path root = fs::temp_directory_path() / ("brisk_infer_packed_" + std::to_string(::getpid()));
  fs::remove_all(root);
  testing::TinyGpt t;
  t.layers = 2, t.width = 64, t.heads = 2, t.context = 64, t.vocab = 250, t.seed = 11, t.scale = 4.f;
  const std::string dir = testing::save_tiny_gpt(root.string(), t);
  const infer::Model plain = infer::load_model(dir);
  infer::Model packed = plain;
  infer::pack_f32_linears(packed);
  ASSERT_TRUE(packed.head.packed);
  EXPECT_EQ(packed.head.w.shape(), (core::Shape{16, 64, 16}));  // 250 outputs in 16 panels
  EXPECT_FALSE(plain.head.packed);
  std::vector<float> a(64), b(64);
  for (int32_t id : {0, 1, 15, 16, 200, 240, 249}) {
    plain.embed(id, 3, a.data());
    packed.embed(id, 3, b.data());
    EXPECT_EQ(a, b) << "token " << id;
  }
  EXPECT_THROW(infer::quantize(packed, infer::Scheme::int8), core::ConfigError);
  // int8 and int4 in linear_q8_packed's / linear_q4_packed's panels: the
  // embedding rows are the same.
  const infer::Model q8 = infer::quantize(plain, infer::Scheme::int8), q4 = infer::quantize(plain, infer::Scheme::int4);
  infer::Model q8_packed = q8, q4_packed = q4;
  infer::pack_quantized_linears(q8_packed);
  infer::pack_quantized_linears(q4_packed);
  ASSERT_TRUE(q8_packed.head.packed && q4_packed.head.packed);
  EXPECT_EQ(q8_packed.head.w.shape(), (core::Shape{16, 16, 64}));  // 250 outputs in 16 panels, 64 = 16 groups of 4
  EXPECT_EQ(q8_packed.layers[0].fc.w.shape(), (core::Shape{16, 16, 64}));  // 256 outputs
  EXPECT_EQ(q4_packed.head.w.shape(), (core::Shape{16, 2, 256}));  // 2 groups of 32
  EXPECT_EQ(q4_packed.head.scale.shape(), (core::Shape{16, 2, 16}));
  EXPECT_FALSE(q8.head.packed || q4.head.packed);
  for (int32_t id : {0, 1, 15, 16, 200, 240, 249}) {
    q8.embed(id, 3, a.data());
    q8_packed.embed(id, 3, b.data());
    EXPECT_EQ(a, b) << "int8 token " << id;
    q4.embed(id, 3, a.data());
    q4_packed.embed(id, 3, b.data());
    EXPECT_EQ(a, b) << "int4 token " << id;
  }

  cpu::CpuBackend be(2);
  models::GptConfig c = small_config();
  c.vocab_size = 250;
  models::Gpt gpt(c, be);
  train::load_checkpoint(dir, gpt, nullptr);
  std::vector<int32_t> ids;
  for (int i = 0; i < 24; ++i) ids.push_back(int32_t((i * 41 + 7) % 250));
  const auto [nll, top] = teacher_forced(gpt, ids, 250);
  infer::Engine e(plain, opts());
  const infer::ScoreResult r = e.score(ids);
  EXPECT_NEAR(r.nll_sum, nll, 1e-3 * std::abs(nll));
  EXPECT_EQ(r.argmax, top);
  fs::remove_all(root);
}

// A sequence samples the same tokens alone, with others, and when it joins
// a batch that is already decoding (continuous batching).
TEST(InferEngine, SeededSamplingIgnoresBatchComposition) {
  for (infer::Scheme scheme : {infer::Scheme::f32, infer::Scheme::int8, infer::Scheme::int4}) {
    SCOPED_TRACE(infer::scheme_name(scheme));
    infer::Model m = infer::load_model(checkpoint());
    if (scheme != infer::Scheme::f32) m = infer::quantize(m, scheme);
    infer::SamplingParams sp;
    sp.temperature = 0.9f;
    sp.top_k = 50;
    sp.max_tokens = 30;
    sp.seed = 42;
    infer::Engine alone(m, opts());
    const int64_t a = alone.add(prompt_of(7), sp);
    const std::vector<int32_t> want = drain(alone)[a];
    ASSERT_EQ(want.size(), 30u);

    infer::Engine crowd(m, opts());
    infer::SamplingParams other = sp;
    other.seed = 7;
    crowd.add(prompt_of(12, 1), other);
    crowd.add(prompt_of(3, 2), other);
    for (int i = 0; i < 5; ++i) crowd.step();  // the others are decoding when ours joins
    const int64_t b = crowd.add(prompt_of(7), sp);
    EXPECT_EQ(drain(crowd)[b], want);
  }
}

TEST(InferEngine, DifferentSeedsDiffer) {
  infer::Engine e(infer::load_model(checkpoint()), opts());
  infer::SamplingParams sp;
  sp.temperature = 1.0f;
  sp.max_tokens = 30;
  sp.seed = 1;
  const int64_t a = e.add(prompt_of(5), sp);
  sp.seed = 2;
  const int64_t b = e.add(prompt_of(5), sp);
  auto out = drain(e);
  EXPECT_NE(out[a], out[b]);
}

// A model whose embedding is padded past its tokenizer's tokens (as GPT-2's
// 50,257 are padded to 50,304): with the tokenizer, no draw is a padded id,
// whose text does not exist (`brisk serve` once died decoding one); without
// it, the draws span the model's whole vocabulary.
TEST(InferEngine, DrawsStayInsideTheTokenizersVocabulary) {
  const fs::path root = fs::temp_directory_path() / ("brisk_infer_padded_" + std::to_string(::getpid()));
  fs::remove_all(root);
  testing::TinyGpt t;
  t.vocab = 320;  // 64 ids past the byte tokenizer's 256
  const infer::Model model = infer::load_model(testing::save_tiny_gpt(root.string(), t));
  auto tok = data::make_byte_tokenizer();
  infer::SamplingParams sp;
  sp.temperature = 5.f;  // near uniform: a fifth of each draw's mass is on padded ids
  sp.max_tokens = 40;
  int32_t highest_with = 0, highest_without = 0;
  for (const bool with_tokenizer : {true, false}) {
    infer::Engine e(model, opts(), with_tokenizer ? tok.get() : nullptr);
    for (int i = 0; i < 4; ++i) {
      sp.seed = uint64_t(i);
      e.add(prompt_of(5, i), sp);
    }
    for (const auto& [seq, tokens] : drain(e))
      for (int32_t id : tokens) (with_tokenizer ? highest_with : highest_without) = std::max(with_tokenizer ? highest_with : highest_without, id);
  }
  fs::remove_all(root);
  EXPECT_LT(highest_with, 256);
  EXPECT_GE(highest_without, 256);  // 160 draws, each ~1/5 padded: the test would see a broken filter
}

TEST(InferEngine, StopsAtContextMaxTokensStopTokenAndStopString) {
  auto tok = data::make_byte_tokenizer();
  infer::Engine e(infer::load_model(checkpoint()), opts(), tok.get());
  infer::SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = 1000;
  const int64_t id = e.add(prompt_of(60), sp);  // 4 positions left in a context of 64
  std::vector<infer::TokenEvent> last;
  int64_t n = 0;
  while (!e.idle())
    for (auto& ev : e.step()) {
      ++n;
      last = {ev};
    }
  EXPECT_EQ(n, 5);  // tokens at positions 60..63 are fed; the 5th is sampled from position 63
  EXPECT_EQ(last[0].seq, id);
  EXPECT_EQ(last[0].finish, infer::Finish::length);
  EXPECT_TRUE(last[0].context_full);

  // The greedy continuation, then the same with its 6th token as a stop token / its text as a stop string.
  sp.max_tokens = 12;
  const int64_t g = e.add(prompt_of(4), sp);
  const std::vector<int32_t> free_run = drain(e)[g];
  ASSERT_EQ(free_run.size(), 12u);
  infer::SamplingParams st = sp;
  st.stop_tokens = {free_run[5]};
  const size_t first = size_t(std::find(free_run.begin(), free_run.end(), free_run[5]) - free_run.begin());
  const int64_t s1 = e.add(prompt_of(4), st);
  EXPECT_EQ(drain(e)[s1].size(), first + 1);
  infer::SamplingParams ss = sp;
  ss.stop = {tok->decode(std::vector<int32_t>{free_run[6], free_run[7]})};
  const int64_t s2 = e.add(prompt_of(4), ss);
  infer::TokenEvent end;
  std::vector<int32_t> got;
  while (!e.idle())
    for (auto& ev : e.step())
      if (ev.seq == s2) got.push_back(ev.choice.token), end = ev;
  EXPECT_EQ(end.finish, infer::Finish::stop);
  EXPECT_EQ(end.stop_matched, ss.stop[0]);
  EXPECT_LE(got.size(), 8u);
}

// min_tokens (vLLM's): no stop token among the first min_tokens tokens,
// and a stop string ending before the min_tokens-th token does not stop.
TEST(InferEngine, MinTokensDefersStopTokensAndStopStrings) {
  auto tok = data::make_byte_tokenizer();
  infer::Engine e(infer::load_model(checkpoint()), opts(), tok.get());
  const infer::SamplingParams sp = greedy(12);
  const int64_t g = e.add(prompt_of(4), sp);
  const std::vector<int32_t> free_run = drain(e)[g];
  ASSERT_EQ(free_run.size(), 12u);
  // Runs one sequence; its tokens and how it ended.
  auto run = [&](const infer::SamplingParams& p) {
    const int64_t id = e.add(prompt_of(4), p);
    std::pair<std::vector<int32_t>, infer::TokenEvent> out;
    while (!e.idle())
      for (auto& ev : e.step())
        if (ev.seq == id) out.first.push_back(ev.choice.token), out.second = ev;
    return out;
  };

  // The stop token is free_run[5]: with min_tokens past its first place the
  // greedy run draws something else there, and no stop token comes early.
  infer::SamplingParams st = sp;
  st.stop_tokens = {free_run[5]};
  const size_t first = size_t(std::find(free_run.begin(), free_run.end(), free_run[5]) - free_run.begin());
  st.min_tokens = int64_t(first) + 3;
  const auto [held, end] = run(st);
  ASSERT_GT(held.size(), first + 3);
  for (size_t i = 0; i < first + 3; ++i) EXPECT_NE(held[i], free_run[5]) << "token " << i;
  EXPECT_TRUE(std::equal(free_run.begin(), free_run.begin() + std::ptrdiff_t(first), held.begin()));
  if (end.finish == infer::Finish::stop) EXPECT_EQ(held.back(), free_run[5]);
  else EXPECT_EQ(held.size(), 12u);

  // A stop string: where it first ends at or after the min_tokens-th token.
  const std::string stop = tok->decode(std::vector<int32_t>{free_run[6], free_run[7]});
  auto stops_after = [&](int64_t min_tokens) -> size_t {
    for (size_t k = size_t(std::max<int64_t>(min_tokens, 1)); k <= 12; ++k) {
      const std::string before = tok->decode(std::vector<int32_t>(free_run.begin(), free_run.begin() + std::ptrdiff_t(k - 1)));
      const std::string text = before + tok->decode(std::vector<int32_t>{free_run[k - 1]});
      if (text.find(stop, before.size() + 1 > stop.size() ? before.size() + 1 - stop.size() : 0) != std::string::npos) return k;
    }
    return 0;
  };
  for (int64_t min_tokens : {0, 8, 9, 12}) {
    infer::SamplingParams ss = sp;
    ss.stop = {stop};
    ss.min_tokens = min_tokens;
    const auto [got, last] = run(ss);
    const size_t k = stops_after(min_tokens);
    EXPECT_EQ(got.size(), k ? k : 12u) << "min_tokens " << min_tokens;
    EXPECT_EQ(last.finish, k ? infer::Finish::stop : infer::Finish::length) << "min_tokens " << min_tokens;
    EXPECT_TRUE(std::equal(got.begin(), got.end(), free_run.begin())) << "min_tokens " << min_tokens;
  }
  EXPECT_GT(stops_after(9), 8u);  // the run at 9 went on past the string's first end
}

// json_object: every token's bytes continue one JSON object, no stop token
// comes before it closes, and the token that closes it ends the sequence
// (constraint_closed: its text is the object's last byte). Without a tokenizer the
// engine cannot know a token's bytes: refused.
TEST(InferEngine, JsonObjectSequencesCloseIntoObjects) {
  auto tok = data::make_byte_tokenizer();
  infer::Engine e(infer::load_model(checkpoint()), opts(), tok.get());
  int closed = 0;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    infer::SamplingParams sp = greedy(40);
    sp.temperature = 0.9f;
    sp.seed = seed;
    sp.json_object = true;
    sp.stop_tokens = {int32_t('a'), int32_t(' ')};  // text inside an object: held back until it closes
    sp.logit_bias = {{int32_t('"'), 4.f}, {int32_t('}'), 4.f}};
    const int64_t id = e.add(prompt_of(4), sp);
    std::string text;
    infer::TokenEvent last;
    while (!e.idle())
      for (auto& ev : e.step())
        if (ev.seq == id) text += char(ev.choice.token), last = ev;
    infer::JsonConstraint prefix;
    ASSERT_TRUE(prefix.feed(text)) << text;
    EXPECT_EQ(text.find_first_of("a "), std::string::npos) << text;
    if (last.finish == infer::Finish::stop) {
      ++closed;
      EXPECT_TRUE(last.constraint_closed) << text;
      EXPECT_FALSE(last.ended_by_stop_token());
      EXPECT_TRUE(prefix.done()) << text;
      EXPECT_TRUE(nlohmann::json::accept(text) && nlohmann::json::parse(text).is_object()) << text;
    } else {
      EXPECT_EQ(text.size(), 40u);
    }
  }
  EXPECT_GT(closed, 0);

  // Logprobs list only tokens that may come next: never a -inf (JSON's null).
  infer::SamplingParams lp = greedy(12);
  lp.json_object = true;
  lp.logprobs = 20;
  const int64_t scored = e.add(prompt_of(4), lp);
  size_t shortest = 99;
  while (!e.idle())
    for (auto& ev : e.step())
      if (ev.seq == scored) {
        EXPECT_TRUE(std::isfinite(ev.choice.logprob));
        for (const auto& [t, v] : ev.choice.top) EXPECT_TRUE(std::isfinite(v)) << "token " << t;
        shortest = std::min(shortest, ev.choice.top.size());
      }
  EXPECT_LT(shortest, 20u) << "some step had fewer than 20 tokens that fit";

  // Stop tokens covering every byte that may follow '{' (whitespace, '"',
  // '}'): masking them too left nothing to draw (token 0, a NaN logprob,
  // the object broken). They are let through there and one ends the
  // sequence: the text stays "{", a prefix of an object.
  infer::SamplingParams stuck = greedy(12);
  stuck.json_object = true;
  for (int b = 0; b < 256; ++b)
    if (b != '{') stuck.stop_tokens.push_back(int32_t(b));
  const int64_t sid = e.add(prompt_of(4), stuck);
  std::string text;
  infer::TokenEvent end;
  while (!e.idle())
    for (auto& ev : e.step())
      if (ev.seq == sid) end = ev, text += char(ev.choice.token);
  EXPECT_EQ(text.substr(0, 1), "{");
  EXPECT_EQ(text.size(), 2u) << "'{' and the stop token after it";
  EXPECT_TRUE(end.ended_by_stop_token());
  EXPECT_TRUE(std::isfinite(end.choice.logprob));
  EXPECT_NE(std::string(" \t\n\r\"}").find(text[1]), std::string::npos) << int(text[1]);

  infer::Engine bare(infer::load_model(checkpoint()), opts());
  infer::SamplingParams sp = greedy(4);
  sp.json_object = true;
  EXPECT_THROW(bare.add(prompt_of(4), sp), core::ConfigError);
}

// grammar: every token's bytes continue a text of the grammar, a stop token
// comes only where the text so far is a whole one (however strongly the
// model wants it earlier), and where nothing may follow the sequence ends
// on its last token (constraint_closed). With JSON too: refused.
TEST(InferEngine, GrammarSequencesStopOnlyWhereTheTextIsWhole) {
  auto tok = data::make_byte_tokenizer();
  infer::Engine e(infer::load_model(checkpoint()), opts(), tok.get());
  const auto g = infer::Grammar::regex("[a-c]{2,4}(!|\\?\\?)?", "test");
  const std::regex whole("[a-c]{2,4}(!|\\?\\?)?");
  int stopped = 0, closed = 0;
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    infer::SamplingParams sp = greedy(20);
    sp.temperature = 0.9f;
    sp.seed = seed;
    sp.grammar = g;
    sp.stop_tokens = {int32_t('x')};
    // The stop token first wherever it may come; '!' or '?' after it.
    sp.logit_bias = {{int32_t('x'), seed % 2 ? 30.f : 0.f}, {int32_t('!'), 3.f}, {int32_t('?'), 3.f}};
    const int64_t id = e.add(prompt_of(4), sp);
    std::string text;
    infer::TokenEvent last;
    while (!e.idle())
      for (auto& ev : e.step())
        if (ev.seq == id) last = ev, text += ev.ended_by_stop_token() ? std::string() : std::string(1, char(ev.choice.token));
    ASSERT_EQ(last.finish, infer::Finish::stop) << text;
    EXPECT_TRUE(std::regex_match(text, whole)) << text;
    if (last.ended_by_stop_token()) {
      ++stopped;
      EXPECT_EQ(last.choice.token, int32_t('x'));
      if (seed % 2) {
        EXPECT_EQ(text.size(), 2u) << "the favoured stop token waits for the shortest whole text";
      }
    } else {
      ++closed;
      EXPECT_TRUE(last.constraint_closed) << text;
      EXPECT_TRUE(text.back() == '!' || text.back() == '?' || text.size() == 4u) << text;
    }
  }
  EXPECT_GT(stopped, 0);
  EXPECT_GT(closed, 0);
  infer::SamplingParams both = greedy(4);
  both.grammar = g;
  both.json_object = true;
  EXPECT_THROW(e.add(prompt_of(4), both), core::ConfigError);
}

// Of two stop strings ending in one token, the one starting first is
// reported (where the server cuts the text).
TEST(InferEngine, TheStopStringStartingFirstIsReported) {
  auto tok = data::make_byte_tokenizer();
  infer::Engine e(infer::load_model(checkpoint()), opts(), tok.get());
  int checked = 0;
  for (int salt = 0; salt < 8; ++salt) {
    const int64_t g = e.add(prompt_of(4, salt), greedy(8));
    const std::vector<int32_t> run = drain(e)[g];
    ASSERT_EQ(run.size(), 8u);
    // Token 4's byte must not come earlier: that would stop the run there.
    if (std::find(run.begin(), run.begin() + 3, run[3]) != run.begin() + 3) continue;
    infer::SamplingParams sp = greedy(8);
    const std::string two = tok->decode(std::vector<int32_t>{run[2], run[3]});
    sp.stop = {tok->decode(std::vector<int32_t>{run[3]}), two};  // both end in token 4; `two` starts first
    const int64_t id = e.add(prompt_of(4, salt), sp);
    infer::TokenEvent last;
    while (!e.idle())
      for (auto& ev : e.step())
        if (ev.seq == id) last = ev;
    EXPECT_EQ(last.finish, infer::Finish::stop);
    EXPECT_EQ(last.stop_matched, two) << "salt " << salt;
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

TEST(InferEngine, PoolLimitsAdmissionAndFreesBlocks) {
  infer::EngineOptions o = opts(4);
  o.kv_block = 16;
  // One block holds 2 layers x (k, v) x 16 positions x 64 floats = 16 KiB: 1 MiB is 64 blocks.
  o.kv_mb = 1;
  infer::Engine e(infer::load_model(checkpoint()), o);
  EXPECT_EQ(e.kv_blocks_free(), 64);
  infer::SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = 40;  // 8 + 40 positions: 3 blocks
  for (int i = 0; i < 4; ++i) EXPECT_GE(e.add(prompt_of(8, i), sp), 0);
  EXPECT_EQ(e.add(prompt_of(8), sp), -1);  // no free slot
  EXPECT_EQ(e.kv_blocks_free(), 64 - 4 * 3);
  drain(e);
  EXPECT_EQ(e.kv_blocks_free(), 64);

  infer::EngineOptions tiny = opts(4);
  tiny.kv_mb = 0;
  tiny.max_seqs = 1;
  infer::Engine t(infer::load_model(checkpoint()), tiny);  // one full context: 4 blocks
  EXPECT_GE(t.add(prompt_of(8), sp), 0);

  // The last new token is sampled, never fed: 8 + 25 tokens reach 32
  // positions, two whole blocks, and the sequence generates all 25.
  infer::EngineOptions two = opts(4);
  two.kv_mb = 1;
  infer::Engine b(infer::load_model(checkpoint()), two);
  sp.max_tokens = 25;
  const int64_t before = b.kv_blocks_free();
  const int64_t id = b.add(prompt_of(8), sp);
  ASSERT_GE(id, 0);
  EXPECT_EQ(before - b.kv_blocks_free(), 2);
  int64_t generated = 0;
  while (!b.idle())
    for (const infer::TokenEvent& ev : b.step()) generated += ev.choice.token >= 0;
  EXPECT_EQ(generated, 25);
}

// A bf16 key/value pool: twice the positions in the same --kv-mb, and the
// model's function kept. Teacher-forced NLL within 0.5% of the f32 pool's
// (and not equal to it: the keys and values were rounded), and the same
// greedy tokens from three sequences decoding together (this model's logits
// are well separated). Any other element type is refused.
TEST(InferEngine, Bf16KvPoolHoldsTwiceThePositionsAndKeepsTheFunction) {
  infer::EngineOptions o = opts(4);
  o.kv_block = 16;
  o.kv_mb = 1;  // 64 blocks of 16 KiB in f32 (PoolLimitsAdmissionAndFreesBlocks)
  infer::Engine f(infer::load_model(checkpoint()), o);
  o.kv_dtype = core::DType::bf16;
  infer::Engine b(infer::load_model(checkpoint()), o);
  EXPECT_EQ(f.kv_blocks_free(), 64);
  EXPECT_EQ(b.kv_blocks_free(), 128);
  EXPECT_EQ(b.kv_bytes(), f.kv_bytes());

  const std::vector<int32_t> ids = prompt_of(48, 5);
  const infer::ScoreResult sf = f.score(ids), sb = b.score(ids);
  EXPECT_NEAR(sb.nll_sum, sf.nll_sum, 5e-3 * std::abs(sf.nll_sum));
  EXPECT_NE(sb.nll_sum, sf.nll_sum);
  EXPECT_EQ(sb.argmax, sf.argmax);

  std::vector<int64_t> fid, bid;
  for (int i = 0; i < 3; ++i) {
    fid.push_back(f.add(prompt_of(7 + 5 * i, i), greedy(30)));
    bid.push_back(b.add(prompt_of(7 + 5 * i, i), greedy(30)));
  }
  auto fo = drain(f), bo = drain(b);
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(fo[fid[size_t(i)]].size(), 30u);
    EXPECT_EQ(bo[bid[size_t(i)]], fo[fid[size_t(i)]]) << "sequence " << i;
  }

  o.kv_dtype = core::DType::f16;
  EXPECT_THROW(infer::Engine(infer::load_model(checkpoint()), o), core::ConfigError);
}

// A prompt that starts like an earlier one takes that one's whole blocks
// from the prefix cache, and decodes exactly what it decodes without it.
TEST(InferEngine, PrefixCacheSharesWholePromptBlocksAndChangesNothing) {
  infer::EngineOptions on = opts(4), off = opts(4);
  on.kv_block = off.kv_block = 16;
  off.prefix_cache = false;
  infer::Engine cached(infer::load_model(checkpoint()), on), plain(infer::load_model(checkpoint()), off);
  infer::SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = 12;
  const std::vector<int32_t> a = prompt_of(40, 1);
  std::vector<int32_t> same_start = a;  // the first 35 tokens of a, then others
  same_start.resize(35);
  for (int i = 0; i < 5; ++i) same_start.push_back(int32_t(200 + i));
  std::vector<int32_t> other_first = a;
  other_first[0] = (a[0] + 1) % 256;
  auto run = [&](infer::Engine& e, const std::vector<int32_t>& p) {
    const int64_t before = e.stats().cached_prompt_tokens;
    const int64_t id = e.add(p, sp);
    EXPECT_GE(id, 0);
    std::vector<int32_t> tokens = drain(e)[id];
    return std::make_pair(tokens, e.stats().cached_prompt_tokens - before);
  };
  const auto first = run(cached, a);
  EXPECT_EQ(first.second, 0);                // nothing cached yet
  EXPECT_EQ(cached.kv_blocks_cached(), 2);   // a's two whole prompt blocks (tokens 0..31)
  const auto again = run(cached, a);
  EXPECT_EQ(again.second, 32);               // (40 - 1) / 16 = 2 blocks: the last prompt token is always fed
  EXPECT_EQ(again.first, first.first);
  const auto partial = run(cached, same_start);
  EXPECT_EQ(partial.second, 32);             // 35 shared tokens: 2 whole blocks
  const auto none = run(cached, other_first);
  EXPECT_EQ(none.second, 0);                 // the chain differs from its first token on
  EXPECT_EQ(run(plain, a).first, first.first);
  EXPECT_EQ(run(plain, same_start).first, partial.first);
  EXPECT_EQ(run(plain, other_first).first, none.first);
  EXPECT_EQ(plain.stats().cached_prompt_tokens, 0);
  EXPECT_EQ(plain.kv_blocks_cached(), 0);

  // Shared while both run: two sequences hold the same two blocks.
  const int64_t free_before = cached.kv_blocks_free();
  const int64_t x = cached.add(a, sp), y = cached.add(a, sp);
  ASSERT_GE(x, 0);
  ASSERT_GE(y, 0);
  // Each needs (40 + 12) / 16 -> 4 blocks: 2 new ones each, and the 2
  // shared ones once (idle cached blocks count as free until taken).
  EXPECT_EQ(cached.kv_blocks_free(), free_before - 2 * 2 - 2);
  auto both = drain(cached);
  EXPECT_EQ(both[x], first.first);
  EXPECT_EQ(both[y], first.first);
  EXPECT_EQ(cached.kv_blocks_free(), free_before);
}

// Cached blocks nobody holds are reused when free ones run out (least
// recently released first), so the cache never refuses a sequence.
TEST(InferEngine, PrefixCacheGivesWayWhenThePoolIsShort) {
  infer::Engine e(infer::load_model(checkpoint()), one_context());
  const infer::SamplingParams sp = greedy(20);
  for (int salt = 0; salt < 6; ++salt) {  // 6 different 40-token prompts, 4 blocks each
    const int64_t id = e.add(prompt_of(40, salt + 10), sp);
    ASSERT_GE(id, 0) << salt;
    drain(e);
    EXPECT_LE(e.kv_blocks_cached(), 4);
    EXPECT_EQ(e.kv_blocks_free(), 4);
  }
  EXPECT_EQ(e.stats().cached_prompt_tokens, 0);
}

// max_tokens is capped at the context before it is added to the prompt's
// length: near 2^63 the sum wrapped negative, the sequence reserved no
// blocks and wrote its keys and values into blocks it did not own (two
// such sequences decoded each other's garbage).
TEST(InferEngine, AHugeMaxTokensReservesTheContextAndDecodesAsAnyLimitPastIt) {
  infer::SamplingParams capped, huge;
  capped.temperature = huge.temperature = 0;
  capped.max_tokens = 1000;
  huge.max_tokens = std::numeric_limits<int64_t>::max();
  infer::Engine alone(infer::load_model(checkpoint()), opts(2));
  const int64_t a = alone.add(prompt_of(5, 1), capped);
  const std::vector<int32_t> want_a = drain(alone)[a];
  const int64_t b = alone.add(prompt_of(9, 2), capped);
  const std::vector<int32_t> want_b = drain(alone)[b];
  ASSERT_EQ(want_a.size(), 64u - 5 + 1);  // to the end of the context

  infer::Engine both(infer::load_model(checkpoint()), opts(2));
  const int64_t free_before = both.kv_blocks_free();
  const int64_t x = both.add(prompt_of(5, 1), huge), y = both.add(prompt_of(9, 2), huge);
  ASSERT_GE(x, 0);
  ASSERT_GE(y, 0);
  EXPECT_EQ(free_before - both.kv_blocks_free(), 2 * 4) << "each holds a whole context: 4 blocks of 16";
  auto got = drain(both);
  EXPECT_EQ(got[x], want_a);
  EXPECT_EQ(got[y], want_b);
}

// When the pool runs short, a released prompt's blocks are evicted from its
// last one back: the prompt keeps its first blocks and a later request that
// starts the same way still finds them (evicting the first block cut the
// chain there, and its other blocks stayed cached out of every lookup's reach).
TEST(InferEngine, EvictionTakesAPromptsLastBlocksFirst) {
  infer::Engine e(infer::load_model(checkpoint()), one_context());
  const infer::SamplingParams sp = greedy(1);
  const std::vector<int32_t> a = prompt_of(49, 3);  // 3 whole prompt blocks cached, 4 blocks held
  auto cached_tokens = [&](const std::vector<int32_t>& p) {
    const int64_t before = e.stats().cached_prompt_tokens;
    EXPECT_GE(e.add(p, sp), 0);
    drain(e);
    return e.stats().cached_prompt_tokens - before;
  };
  EXPECT_EQ(cached_tokens(a), 0);
  EXPECT_EQ(e.kv_blocks_cached(), 3);
  EXPECT_EQ(cached_tokens(prompt_of(17, 9)), 0);  // 2 blocks: the free one and one of a's, evicted
  EXPECT_EQ(cached_tokens(a), 32) << "a's first two blocks are still cached and reachable";
}

// A request that needs more blocks than the whole pool holds is refused at
// once (a ConfigError, which the server answers with 400), rather than
// waiting at the head of the queue for running requests that cannot make
// room for it.
TEST(InferEngine, ARequestLargerThanThePoolIsRefusedAtOnce) {
  const fs::path root = fs::temp_directory_path() / ("brisk_infer_long_" + std::to_string(::getpid()));
  testing::TinyGpt t;
  t.layers = 2, t.width = 64, t.heads = 2, t.context = 2048, t.vocab = 256, t.seed = 3;
  const std::string dir = testing::save_tiny_gpt(root.string(), t);
  infer::EngineOptions o = opts(2);
  o.kv_block = 16;
  o.kv_mb = 1;  // 1 KiB per position (2 layers x k, v x 64 floats): 1024 positions, 64 blocks
  infer::Engine e(infer::load_model(dir), o);
  EXPECT_EQ(e.kv_blocks_free(), 64);
  infer::SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = 1500;
  try {
    e.add(prompt_of(10), sp);
    ADD_FAILURE() << "a request reaching 1509 positions was admitted to a pool of 1024";
  } catch (const core::ConfigError& err) {
    EXPECT_NE(std::string(err.what()).find("--kv-mb"), std::string::npos) << err.what();
  }
  sp.max_tokens = 900;  // 909 positions, 57 blocks: fits
  EXPECT_GE(e.add(prompt_of(10), sp), 0);
  sp.max_tokens = 2;
  EXPECT_GE(e.add(prompt_of(10), sp), 0);
  // Every slot busy: still refused at once, not put off until a slot frees.
  sp.max_tokens = 1500;
  EXPECT_THROW(e.add(prompt_of(10), sp), core::ConfigError);
  std::error_code ec;
  fs::remove_all(root, ec);
}

// A prompt as long as the context: its last position's logits exist, so it
// is scored whole (max_tokens 0, as evaluation harnesses send full windows)
// or gives exactly one token, the recompute path's greedy choice there.
TEST(InferEngine, APromptMayFillTheContext) {
  const std::vector<int32_t> ids = prompt_of(64, 3);
  infer::Engine e(infer::load_model(checkpoint()), opts());
  const infer::ScoreResult want = e.score(ids);
  infer::SamplingParams scored;
  scored.temperature = 0;
  scored.max_tokens = 0;
  scored.prompt_logprobs = 0;
  infer::SamplingParams greedy;
  greedy.temperature = 0;
  greedy.max_tokens = 5;
  const int64_t a = e.add(ids, scored), b = e.add(ids, greedy);
  std::map<int64_t, std::vector<infer::TokenEvent>> events;
  while (!e.idle())
    for (auto& ev : e.step()) events[ev.seq].push_back(std::move(ev));
  ASSERT_EQ(events[a].size(), 1u);
  const std::vector<infer::TokenChoice>& lp = events[a][0].prompt_logprobs;
  ASSERT_EQ(lp.size(), 63u);
  double nll = 0;
  for (const auto& c : lp) nll -= c.logprob;
  EXPECT_NEAR(nll, want.nll_sum, 1e-4 * want.nll_sum);

  cpu::CpuBackend be(2);
  models::Gpt gpt(small_config(), be);
  train::load_checkpoint(checkpoint(), gpt, nullptr);
  const float* last = gpt.logits(ids.data(), 1, 64) + 63 * 256;
  ASSERT_EQ(events[b].size(), 1u);
  EXPECT_EQ(events[b][0].choice.token, int32_t(std::max_element(last, last + 256) - last));
  EXPECT_EQ(events[b][0].finish, infer::Finish::length);
  EXPECT_TRUE(events[b][0].context_full);
}

TEST(InferEngine, BadInputIsAClearError) {
  infer::Engine e(infer::load_model(checkpoint()), opts());
  infer::SamplingParams sp;
  EXPECT_THROW(e.add(prompt_of(65), sp), core::ConfigError);  // longer than the context
  EXPECT_THROW(e.add({}, sp), core::ConfigError);
  EXPECT_THROW(e.add({1, 256}, sp), core::ConfigError);
  sp.top_p = 0;
  EXPECT_THROW(e.add({1}, sp), core::ConfigError);
  sp = {};
  sp.stop_tokens = {999};
  EXPECT_THROW(e.add({1}, sp), core::ConfigError);
  try {
    e.add(prompt_of(70), {});
    FAIL();
  } catch (const core::ConfigError& err) {
    EXPECT_NE(std::string(err.what()).find("context is 64"), std::string::npos) << err.what();
  }
  EXPECT_THROW(infer::parse_scheme("int3"), core::ConfigError);
  EXPECT_THROW(infer::load_model("/nonexistent/model"), core::IoError);
  // The default pool (a full context per sequence) for 2^24 sequences is
  // 512 GiB here: refused before it is zero-filled.
  infer::EngineOptions many = opts();
  many.max_seqs = 1 << 24;
  many.max_step_tokens = many.max_seqs;
  try {
    infer::Engine big(infer::load_model(checkpoint()), many);
    FAIL() << "a 512 GiB pool";
  } catch (const core::ConfigError& err) {
    EXPECT_NE(std::string(err.what()).find("more than the machine's memory"), std::string::npos) << err.what();
  }
}

// Quantized logits stay close to fp32 ones; int4 further than int8; both
// survive a save / load round trip bit for bit.
TEST(InferQuantize, ErrorIsSmallAndFilesRoundTrip) {
  const infer::Model fp = infer::load_model(checkpoint());
  const std::vector<int32_t> ids = prompt_of(40, 9);
  auto nll = [&](const infer::Model& m) {
    infer::Engine e(m, opts());
    return e.score(ids);
  };
  const infer::ScoreResult base = nll(fp);
  double prev = 0;
  for (infer::Scheme s : {infer::Scheme::int8, infer::Scheme::int4}) {
    SCOPED_TRACE(infer::scheme_name(s));
    const infer::Model q = infer::quantize(fp, s);
    EXPECT_LT(q.weight_bytes(), fp.weight_bytes() / (s == infer::Scheme::int8 ? 3 : 5));
    const infer::ScoreResult r = nll(q);
    const double rel = std::abs(r.nll_sum - base.nll_sum) / base.nll_sum;
    EXPECT_LT(rel, s == infer::Scheme::int8 ? 0.01 : 0.08);
    EXPECT_GT(rel, prev);  // int4 loses more than int8
    prev = rel;
    int agree = 0;
    for (size_t i = 0; i < r.argmax.size(); ++i) agree += r.argmax[i] == base.argmax[i];
    EXPECT_GE(agree, int(r.argmax.size()) * (s == infer::Scheme::int8 ? 9 : 5) / 10);  // a random 64-wide model; W1: 99.5% and 96.9% (docs/inference.md)

    const std::string path = (fs::path(checkpoint()).parent_path() / (std::string("q_") + infer::scheme_name(s) + ".safetensors")).string();
    infer::save_quantized(q, path);
    const infer::Model back = infer::load_model(path);
    EXPECT_EQ(back.scheme, s);
    EXPECT_EQ(nll(back).nll_sum, r.nll_sum);
    EXPECT_THROW(infer::quantize(back, infer::Scheme::int8), core::ConfigError);  // already quantized
  }
}

TEST(InferQuantize, AwqCalibrationKeepsTheFunctionAndHelpsInt4) {
  const infer::Model fp = infer::load_model(checkpoint());
  std::vector<int32_t> calib;
  for (int i = 0; i < 256; ++i) calib.push_back(int32_t((i * 91 + 17) % 256));
  const infer::Model plain = infer::quantize(fp, infer::Scheme::int4);
  const infer::Model awq = infer::quantize(fp, infer::Scheme::int4, calib);
  EXPECT_NE(awq.quant_note.find("AWQ"), std::string::npos);
  const std::vector<int32_t> ids = prompt_of(48, 4);
  auto nll = [&](const infer::Model& m) {
    infer::Engine e(m, opts());
    return e.score(ids).nll_sum;
  };
  const double base = nll(fp);
  // Scaling chosen on calibration activations never makes a layer's own
  // error worse there; on other text it should at least not hurt much.
  EXPECT_LT(std::abs(nll(awq) - base), std::abs(nll(plain) - base) * 1.5 + 1e-3 * base);
}

// A Hugging Face GPT-2 file: "transformer." names, Conv1D weights, config.json.
TEST(InferLoad, HuggingFaceSafetensorsLoadLikeTheCheckpoint) {
  const fs::path dir = fs::path(checkpoint()).parent_path() / "hf";
  fs::create_directories(dir);
  core::SafetensorsFile f = core::load_safetensors((fs::path(checkpoint()) / "model.safetensors").string());
  std::vector<core::NamedTensor> named;
  for (auto& [name, t] : f.tensors) named.push_back({"transformer." + name, t.as_view()});
  core::save_safetensors((dir / "model.safetensors").string(), named);
  std::ofstream(dir / "config.json") << R"({"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 2,
                                           "n_positions": 64, "vocab_size": 256})";
  const infer::Model hf = infer::load_model(dir.string());
  EXPECT_EQ(hf.tokenizer, "gpt2");
  infer::Engine a(hf, opts()), b(infer::load_model(checkpoint()), opts());
  const std::vector<int32_t> ids = prompt_of(20);
  EXPECT_EQ(a.score(ids).nll_sum, b.score(ids).nll_sum);

  // Another architecture's file is refused by name.
  const fs::path other = dir / "llama.safetensors";
  core::Tensor w = core::Tensor::zeros(core::Shape{4, 4}, core::DType::f32);
  core::save_safetensors(other.string(), {{"model.layers.0.self_attn.q_proj.weight", w.as_view()}});
  try {
    infer::load_model(other.string());
    FAIL();
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a GPT-2 model"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace brisk
