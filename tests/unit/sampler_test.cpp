// The sampler against a reference written the plain way: every candidate
// sorted (larger logit first, ties to the lower id), probabilities in double,
// the filters applied in order. The draws must stay inside the reference's
// kept set, reach all of it where it is small, and follow its probabilities.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "brisk/core/error.h"
#include "brisk/cpu/cpu_features.h"
#include "brisk/infer/sampler.h"

namespace brisk {
namespace {

std::vector<float> ramp(int n) {  // logit i = i / 4: token n-1 most likely
  std::vector<float> l(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) l[size_t(i)] = float(i) / 4.f;
  return l;
}

// The tokens `draws` seeded draws from `logits` produce under `p`.
std::set<int32_t> drawn(const std::vector<float>& logits, const infer::SamplingParams& p, int draws = 300) {
  const int64_t vocab = int64_t(logits.size());
  infer::SequenceHistory h(vocab);
  infer::SamplerScratch scratch;
  std::set<int32_t> seen;
  for (int i = 0; i < draws; ++i) {
    auto l = logits;  // sample() modifies its logits
    seen.insert(infer::sample(l.data(), vocab, p, h, uint64_t(i), scratch).token);
  }
  return seen;
}

// The reference: each token's probability after temperature, the 30-nat
// floor, top-k, min-p and top-p, by sorting every token.
std::vector<double> reference_probs(const std::vector<float>& l, const infer::SamplingParams& p) {
  const size_t n = l.size();
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return l[size_t(a)] > l[size_t(b)] || (l[size_t(a)] == l[size_t(b)] && a < b); });
  const float top = l[size_t(order[0])];
  size_t keep = n;
  if (p.top_k > 0) keep = std::min(keep, size_t(p.top_k));
  std::vector<double> w;
  for (size_t i = 0; i < keep; ++i) {
    const float li = l[size_t(order[i])];
    if (li < top - 30.f * p.temperature) break;
    w.push_back(std::exp(double(li - top) / p.temperature));
  }
  keep = w.size();
  if (p.min_p > 0) {
    size_t m = 1;
    while (m < keep && w[m] >= p.min_p * w[0]) ++m;
    keep = m;
  }
  if (p.top_p < 1) {
    double all = 0;
    for (size_t i = 0; i < keep; ++i) all += w[i];
    double cum = 0;
    size_t m = 0;
    while (m < keep && cum < p.top_p * all) cum += w[m++];
    keep = m;
  }
  double total = 0;
  for (size_t i = 0; i < keep; ++i) total += w[i];
  std::vector<double> prob(n, 0.0);
  for (size_t i = 0; i < keep; ++i) prob[size_t(order[i])] = w[i] / total;
  return prob;
}

std::set<int32_t> reference_set(const std::vector<float>& l, const infer::SamplingParams& p) {
  const std::vector<double> prob = reference_probs(l, p);
  std::set<int32_t> s;
  for (size_t i = 0; i < prob.size(); ++i)
    if (prob[i] > 0) s.insert(int32_t(i));
  return s;
}

infer::SamplingParams params(float temperature, int top_k, float top_p, float min_p) {
  infer::SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  return p;
}

TEST(Sampler, FiltersKeepOnlyWhatTheyShould) {
  const auto l = ramp(100);
  EXPECT_EQ(drawn(l, params(1, 3, 1, 0)), (std::set<int32_t>{97, 98, 99}));
  // min-p keeps p >= 0.5 p_top: logits within log 2 = 0.69 of the top: 97, 98, 99.
  EXPECT_EQ(drawn(l, params(1, 0, 1, 0.5f)), (std::set<int32_t>{97, 98, 99}));
  // The top token alone has ~0.22 of the mass, two have ~0.39.
  EXPECT_EQ(drawn(l, params(1, 0, 0.3f, 0)), (std::set<int32_t>{98, 99}));
}

// A full GPT-2 vocabulary: a dozen likely tokens at scattered ids, several
// of them tied, over 50k unlikely ones. Each filter's boundary falls inside
// the tied group, so the set drawn shows whether ties go to the lower id.
TEST(Sampler, TopKAndTopPKeepExactlyTheReferenceSetAtFullVocabulary) {
  constexpr int64_t kVocab = 50304;
  std::mt19937 rng(7);
  std::normal_distribution<float> background(0.f, 1.f);
  std::vector<float> l(static_cast<size_t>(kVocab));
  for (float& x : l) x = background(rng);
  const int32_t ids[] = {40001, 17, 3000, 50303, 9, 25000, 123, 44444, 7777, 31, 20000, 5};
  const float levels[] = {9.f, 9.f, 8.9f, 8.9f, 8.9f, 8.8f, 8.8f, 8.7f, 8.7f, 8.7f, 8.6f, 8.5f};
  for (size_t i = 0; i < std::size(ids); ++i) l[size_t(ids[i])] = levels[i];
  for (const infer::SamplingParams& p : {params(1, 4, 1, 0), params(1, 7, 1, 0), params(1, 0, 0.25f, 0),
                                         params(1, 0, 0.4f, 0), params(0.5f, 0, 0.9f, 0), params(1, 9, 0.6f, 0)}) {
    const std::set<int32_t> want = reference_set(l, p);
    ASSERT_GE(want.size(), 2u);
    ASSERT_LE(want.size(), 12u);
    EXPECT_EQ(drawn(l, p, 2000), want) << "top_k " << p.top_k << ", top_p " << p.top_p << ", T " << p.temperature;
  }
}

// Chi-square of the draws against the reference probabilities, the kept
// tokens grouped into bins of about equal expected mass: a filter that keeps
// the right set but weighs it wrongly fails here.
TEST(Sampler, DrawsFollowTheReferenceProbabilities) {
  constexpr int64_t kVocab = 1500;  // several of the draw's chunks of 512
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.f, 1.5f);
  std::vector<float> l(static_cast<size_t>(kVocab));
  for (float& x : l) x = normal(rng);
  for (int i = 0; i < 40; ++i) l[size_t(i * 37)] = std::round(l[size_t(i * 37)]);  // some ties
  constexpr int kDraws = 40000;
  for (const infer::SamplingParams& p : {params(1, 0, 1, 0), params(0.7f, 0, 0.8f, 0), params(1.3f, 0, 1, 0.02f),
                                         params(1, 50, 1, 0), params(0.9f, 200, 0.9f, 0.01f)}) {
    const std::vector<double> prob = reference_probs(l, p);
    std::vector<int64_t> count(static_cast<size_t>(kVocab), 0);
    infer::SequenceHistory h(kVocab);
    infer::SamplerScratch scratch;
    for (int i = 0; i < kDraws; ++i) {
      auto x = l;
      const int32_t t = infer::sample(x.data(), kVocab, p, h, uint64_t(i), scratch).token;
      ASSERT_GT(prob[size_t(t)], 0.0) << "token " << t << " is outside the kept set";
      ++count[size_t(t)];
    }
    // Bins of ~1/20 of the mass each, in id order (any fixed order does).
    std::vector<double> expected;
    std::vector<int64_t> observed;
    double e = 0;
    int64_t o = 0;
    for (size_t i = 0; i < prob.size(); ++i) {
      e += prob[i] * kDraws;
      o += count[i];
      if (e >= kDraws / 20.0) {
        expected.push_back(e);
        observed.push_back(o);
        e = 0;
        o = 0;
      }
    }
    if (e > 0) {
      expected.push_back(e);
      observed.push_back(o);
    }
    double chi2 = 0;
    for (size_t b = 0; b < expected.size(); ++b) chi2 += (observed[b] - expected[b]) * (observed[b] - expected[b]) / expected[b];
    // About 20 degrees of freedom: P(chi2 > 70) is below 1e-6.
    EXPECT_LT(chi2, 70.0) << "top_k " << p.top_k << ", top_p " << p.top_p << ", min_p " << p.min_p << ", "
                          << expected.size() << " bins";
  }
}

TEST(Sampler, LogprobsNameTheBestTokensAtFullVocabulary) {
  constexpr int64_t kVocab = 50304;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.f, 2.f);
  std::vector<float> l(static_cast<size_t>(kVocab));
  for (float& x : l) x = std::round(normal(rng) * 8.f) / 8.f;  // many ties
  infer::SamplingParams p;
  p.temperature = 0;
  p.logprobs = 20;
  infer::SequenceHistory h(kVocab);
  infer::SamplerScratch scratch;
  auto x = l;
  const infer::TokenChoice c = infer::sample(x.data(), kVocab, p, h, 0, scratch);
  std::vector<int32_t> order(static_cast<size_t>(kVocab));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return l[size_t(a)] > l[size_t(b)] || (l[size_t(a)] == l[size_t(b)] && a < b); });
  double s = 0;
  for (float v : l) s += std::exp(double(v) - double(l[size_t(order[0])]));
  const double lse = double(l[size_t(order[0])]) + std::log(s);
  EXPECT_EQ(c.token, order[0]);
  EXPECT_NEAR(c.logprob, double(l[size_t(order[0])]) - lse, 1e-5);
  ASSERT_EQ(c.top.size(), 20u);
  for (size_t i = 0; i < 20; ++i) {
    EXPECT_EQ(c.top[i].first, order[i]) << "place " << i;
    EXPECT_NEAR(c.top[i].second, double(l[size_t(order[i])]) - lse, 1e-5);
  }
}

// NaN logits (a broken model) must not take the sampler out of bounds: each
// setting still names a token of the vocabulary. The sanitizer build runs this.
TEST(Sampler, NanLogitsStillGiveATokenInRange) {
  constexpr int64_t kVocab = 3000;
  std::mt19937 rng(13);
  std::normal_distribution<float> normal(0.f, 2.f);
  for (const int nan_every : {7, 1}) {  // some NaNs; all NaN
    std::vector<float> l(static_cast<size_t>(kVocab));
    for (size_t i = 0; i < l.size(); ++i) l[i] = i % size_t(nan_every) == 0 ? std::nanf("") : normal(rng);
    for (const infer::SamplingParams& p : {params(0, 0, 1, 0), params(1, 0, 1, 0), params(1, 0, 0.9f, 0),
                                           params(1, 20, 1, 0), params(1, 0, 1, 0.1f), params(1, 20, 0.5f, 0.05f)}) {
      infer::SamplingParams q = p;
      q.logprobs = 5;
      infer::SequenceHistory h(kVocab);
      infer::SamplerScratch scratch;
      for (uint64_t i = 0; i < 20; ++i) {
        auto x = l;
        const infer::TokenChoice c = infer::sample(x.data(), kVocab, q, h, i, scratch);
        EXPECT_GE(c.token, 0);
        EXPECT_LT(c.token, kVocab);
        for (const auto& [id, lp] : c.top) {
          EXPECT_GE(id, 0);
          EXPECT_LT(id, kVocab);
        }
      }
    }
  }
}

TEST(Sampler, PenaltiesAndLogprobs) {
  infer::SamplerScratch scratch;
  infer::SequenceHistory h(10);
  h.add_generated(9);
  h.add_generated(9);
  infer::SamplingParams p;
  p.temperature = 0;
  p.frequency_penalty = 0.2f;  // 9: 2.25 - 0.4 < 8: 2.0? no: 1.85 < 2.0
  auto l = ramp(10);
  EXPECT_EQ(infer::sample(l.data(), 10, p, h, 0, scratch).token, 8);
  p = {};
  p.temperature = 0;
  p.repetition_penalty = 1.5f;  // 9: 2.25 / 1.5 = 1.5 < 8's 2.0
  l = ramp(10);
  EXPECT_EQ(infer::sample(l.data(), 10, p, h, 0, scratch).token, 8);
  p = {};
  p.temperature = 0;
  p.logprobs = 3;
  l = ramp(10);
  const infer::TokenChoice c = infer::sample(l.data(), 10, p, h, 0, scratch);
  ASSERT_EQ(c.top.size(), 3u);
  EXPECT_EQ(c.top[0].first, 9);
  EXPECT_FLOAT_EQ(c.top[0].second, c.logprob);
  double total = 0;
  for (int i = 0; i < 10; ++i) total += std::exp(double(i) / 4 - 2.25 + double(c.logprob));
  EXPECT_NEAR(total, 1.0, 1e-5);
  EXPECT_NEAR(c.top[0].second - c.top[1].second, 0.25, 1e-5);
}

// Logprobs are the plain softmax of the penalized logits, whatever the
// temperature (serving.md): a sampled and a greedy request report the same
// numbers. Temperatures below kGreedyBelow sample greedily: at 1e-39 the
// scaled logits overflowed and the logprobs came out NaN.
TEST(Sampler, LogprobsIgnoreTemperatureAndTinyTemperaturesAreGreedy) {
  infer::SamplerScratch scratch;
  infer::SequenceHistory h(10);
  std::vector<infer::TokenChoice> got;
  for (float t : {0.f, 0.5f, 1.f, 1.7f, 1e-39f, 1e-20f}) {
    infer::SamplingParams p;
    p.temperature = t;
    p.logprobs = 3;
    p.seed = 5;
    auto l = ramp(10);
    got.push_back(infer::sample(l.data(), 10, p, h, 0, scratch));
    ASSERT_EQ(got.back().top.size(), 3u) << t;
    for (int k = 0; k < 3; ++k) {
      EXPECT_TRUE(std::isfinite(got.back().top[size_t(k)].second)) << t;
      EXPECT_FLOAT_EQ(got.back().top[size_t(k)].second, got.front().top[size_t(k)].second) << "temperature " << t;
    }
  }
  EXPECT_EQ(got[4].token, 9) << "1e-39 is greedy";
  EXPECT_EQ(got[5].token, 9) << "1e-20 is greedy";
  infer::SamplingParams bad;
  bad.repetition_penalty = 1e-45f;
  EXPECT_THROW(infer::validate(bad, 10), core::ConfigError);
  bad.repetition_penalty = 1000.f;
  EXPECT_THROW(infer::validate(bad, 10), core::ConfigError);
}

// min_tokens: before draw number min_tokens a stop token cannot be drawn,
// greedy or sampled, and is in no logprobs list; from then on it can.
// Banned tokens are never drawn.
TEST(Sampler, MinTokensHoldsStopTokensBackAndBannedTokensNeverCome) {
  infer::SamplerScratch scratch;
  infer::SequenceHistory h(10);
  infer::SamplingParams p;
  p.max_tokens = 8;
  p.min_tokens = 3;
  p.stop_tokens = {9, 7};  // 9 is the most likely token of ramp(10)
  p.temperature = 0;
  p.logprobs = 4;
  for (uint64_t index = 0; index < 5; ++index) {
    auto l = ramp(10);
    const infer::TokenChoice c = infer::sample(l.data(), 10, p, h, index, scratch);
    if (index < 3) {
      EXPECT_EQ(c.token, 8) << "draw " << index;
      for (const auto& [t, lp] : c.top) EXPECT_TRUE(t != 9 && t != 7) << "draw " << index << " lists stop token " << t;
    } else {
      EXPECT_EQ(c.token, 9) << "draw " << index;
    }
  }
  p.temperature = 1;
  p.logprobs = -1;
  const auto flat = std::vector<float>(10, 0.f);  // every token equally likely
  for (uint64_t seed = 0; seed < 200; ++seed) {  // a draw is a function of (seed, index)
    p.seed = seed;
    for (uint64_t index = 0; index < 3; ++index) {
      auto l = flat;
      const int32_t t = infer::sample(l.data(), 10, p, h, index, scratch).token;
      EXPECT_TRUE(t != 9 && t != 7) << "seed " << seed << " draw " << index;
    }
  }
  std::set<int32_t> late;
  for (uint64_t index = 3; index < 300; ++index) {
    auto l = flat;
    late.insert(infer::sample(l.data(), 10, p, h, index, scratch).token);
  }
  EXPECT_TRUE(late.count(9) && late.count(7)) << "stop tokens are drawable after min_tokens";

  infer::SamplingParams b;
  b.banned_tokens = {9, 3};
  EXPECT_EQ(drawn(std::vector<float>(10, 0.f), b, 400), (std::set<int32_t>{0, 1, 2, 4, 5, 6, 7, 8}));
  b.temperature = 0;
  auto l = ramp(10);
  EXPECT_EQ(infer::sample(l.data(), 10, b, h, 0, scratch).token, 8);

  infer::SamplingParams bad;
  bad.max_tokens = 4;
  bad.min_tokens = 5;
  EXPECT_THROW(infer::validate(bad, 10), core::ConfigError);
  bad.min_tokens = -1;
  EXPECT_THROW(infer::validate(bad, 10), core::ConfigError);
  bad.min_tokens = 4;
  EXPECT_NO_THROW(infer::validate(bad, 10));
  bad.banned_tokens = {10};
  EXPECT_THROW(infer::validate(bad, 10), core::ConfigError);
}

}  // namespace
}  // namespace brisk

namespace brisk {
namespace {

// Each setting's tokens and top-5 logprobs for 200 seeded draws.
std::vector<infer::TokenChoice> choices(const std::vector<float>& logits, const infer::SamplingParams& p) {
  const int64_t vocab = int64_t(logits.size());
  infer::SequenceHistory h(vocab);
  infer::SamplerScratch scratch;
  std::vector<infer::TokenChoice> out;
  for (uint64_t i = 0; i < 200; ++i) {
    auto l = logits;
    out.push_back(infer::sample(l.data(), vocab, p, h, i, scratch));
  }
  return out;
}

}  // namespace

// The boundary search's compaction with AVX-512 (vcompress, 16 tokens a
// step) and the portable loop (BRISK_FEW_ROWS=portable) keep the same tokens
// in the same order, so every draw and every logprob is the same: at GPT-2's
// padded vocabulary, and at one that is not a multiple of 16 with NaN logits.
TEST(Sampler, Avx512AndPortableCompactionDrawTheSame) {
  if (cpu::cpu_features().packed != cpu::CpuFeatures::PackedPath::avx512) {
    std::printf("[ skip ] this CPU has no AVX-512: only the portable compaction runs here\n");
    GTEST_SKIP() << "no AVX-512";
  }
  std::mt19937 rng(21);
  std::normal_distribution<float> normal(0.f, 1.5f);
  for (const int64_t vocab : {50304L, 3001L}) {
    std::vector<float> l(static_cast<size_t>(vocab));
    for (size_t i = 0; i < l.size(); ++i) l[i] = vocab == 3001 && i % 997 == 5 ? std::nanf("") : normal(rng);
    // Top-k 1 and a tiny top-p keep the top token alone: the band starts at
    // the top logit itself.
    for (infer::SamplingParams p : {params(0.8f, 0, 0.95f, 0), params(1, 40, 1, 0), params(0.7f, 50, 0.9f, 0),
                                    params(0, 0, 1, 0), params(1, 1, 1, 0), params(0.5f, 0, 0.01f, 0)}) {
      p.logprobs = 5;
      const std::vector<infer::TokenChoice> simd = choices(l, p);
      setenv("BRISK_FEW_ROWS", "portable", 1);
      cpu::reload_cpu_features();
      const std::vector<infer::TokenChoice> portable = choices(l, p);
      unsetenv("BRISK_FEW_ROWS");
      cpu::reload_cpu_features();
      ASSERT_EQ(simd.size(), portable.size());
      for (size_t i = 0; i < simd.size(); ++i) {
        // (With NaN logits the logprobs are NaN on both paths.)
        const auto same = [](float a, float b) { return a == b || (std::isnan(a) && std::isnan(b)); };
        ASSERT_EQ(simd[i].token, portable[i].token) << "vocab " << vocab << ", draw " << i;
        ASSERT_TRUE(same(simd[i].logprob, portable[i].logprob)) << simd[i].logprob << " " << portable[i].logprob;
        ASSERT_EQ(simd[i].top.size(), portable[i].top.size());
        for (size_t j = 0; j < simd[i].top.size(); ++j) {
          ASSERT_EQ(simd[i].top[j].first, portable[i].top[j].first);
          ASSERT_TRUE(same(simd[i].top[j].second, portable[i].top[j].second));
        }
      }
    }
  }
}

}  // namespace brisk
