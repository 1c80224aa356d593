// The sampler (sampler.h). A draw is a few passes over the vocabulary, and
// nothing sorts it:
//  - the weights exp((logit - top) / T) in one vectorised pass
//    (core/fast_math.h), zero below the filters' floor (30 nats under the
//    top, where nothing any filter keeps can be, and min-p's cut);
//  - top-k selects the k best logits by value (std::nth_element) and sorts
//    only those;
//  - top-p finds the smallest set of best tokens whose weight reaches p of
//    the total by a weighted quickselect (linear on average), not a sort;
//  - the draw walks chunk sums of the weights, then one chunk.
// Sorting every candidate, as this file once did, is n log n over a whole
// 50k vocabulary when the distribution is broad (docs/inference.md has the
// cost). Greedy is one pass.
#include "brisk/infer/sampler.h"

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <random>

#include "brisk/core/error.h"
#include "brisk/core/fast_math.h"
#include "brisk/cpu/cpu_features.h"

namespace brisk::infer {

void validate(const SamplingParams& p, int64_t vocab) {
  using core::ConfigError;
  if (p.max_tokens < 0) throw ConfigError("max_tokens must not be negative, got " + std::to_string(p.max_tokens));
  if (p.min_tokens < 0) throw ConfigError("min_tokens must not be negative, got " + std::to_string(p.min_tokens));
  if (p.min_tokens > p.max_tokens)
    throw ConfigError("min_tokens (" + std::to_string(p.min_tokens) + ") must be at most max_tokens (" +
                      std::to_string(p.max_tokens) + ")");
  if (!(p.temperature >= 0) || !std::isfinite(p.temperature)) throw ConfigError("temperature must be a finite number >= 0 (0 = greedy)");
  if (p.top_k < 0) throw ConfigError("top_k must be >= 0, got " + std::to_string(p.top_k));
  if (p.json_schema && !p.json_object) throw ConfigError("a json_schema constrains only with json_object set");
  if (!(p.top_p > 0 && p.top_p <= 1)) throw ConfigError("top_p must be in (0, 1]");
  if (!(p.min_p >= 0 && p.min_p <= 1)) throw ConfigError("min_p must be in [0, 1]");
  // Penalized logits are divided or multiplied by it: past these bounds they overflow.
  if (!(p.repetition_penalty >= 0.01f && p.repetition_penalty <= 100.f))
    throw ConfigError("repetition_penalty must be in [0.01, 100] (1 = off)");
  if (!std::isfinite(p.frequency_penalty) || std::fabs(p.frequency_penalty) > 2)
    throw ConfigError("frequency_penalty must be in [-2, 2]");
  if (!std::isfinite(p.presence_penalty) || std::fabs(p.presence_penalty) > 2)
    throw ConfigError("presence_penalty must be in [-2, 2]");
  if (p.logprobs > 20) throw ConfigError("logprobs must be at most 20, got " + std::to_string(p.logprobs));
  if (p.prompt_logprobs > 20)
    throw ConfigError("prompt_logprobs must be at most 20, got " + std::to_string(p.prompt_logprobs));
  for (const auto& [t, bias] : p.logit_bias) {
    if (t < 0 || t >= vocab)
      throw ConfigError("logit_bias token " + std::to_string(t) + " is outside the vocabulary [0, " +
                        std::to_string(vocab) + ")");
    if (!(bias >= -100 && bias <= 100))
      throw ConfigError("logit_bias of token " + std::to_string(t) + " must be in [-100, 100]");
  }
  for (int32_t t : p.stop_tokens)
    if (t < 0 || t >= vocab)
      throw ConfigError("stop token " + std::to_string(t) + " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
  for (int32_t t : p.banned_tokens)
    if (t < 0 || t >= vocab)
      throw ConfigError("banned token " + std::to_string(t) + " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
  for (const std::string& s : p.stop)
    if (s.empty()) throw ConfigError("a stop string must not be empty");
}

StopMatch first_stop_string(std::string_view text, const std::vector<std::string>& stops, size_t start_from,
                            size_t end_after) {
  StopMatch m;
  for (const std::string& s : stops) {
    const size_t from = std::max(start_from, end_after + 1 > s.size() ? end_after + 1 - s.size() : 0);
    const size_t at = text.find(s, from);
    if (at != std::string::npos && (at < m.at || (at == m.at && s.size() < m.stop->size()))) m.at = at, m.stop = &s;
  }
  return m;
}

void SequenceHistory::add_prompt(const std::vector<int32_t>& ids) {
  for (int32_t id : ids)
    if (!seen_[size_t(id)]) {
      seen_[size_t(id)] = 1;
      distinct_.push_back(id);
    }
}

void SequenceHistory::add_generated(int32_t id) {
  ++counts_[size_t(id)];
  generated_.push_back(id);
  if (!seen_[size_t(id)]) {
    seen_[size_t(id)] = 1;
    distinct_.push_back(id);
  }
}

namespace {

// `index`: how many tokens the sequence has generated before this one.
void apply_penalties(float* logits, const SamplingParams& p, const SequenceHistory& h, uint64_t index) {
  if (p.repetition_penalty != 1.f)
    for (int32_t t : h.distinct()) {
      float& l = logits[t];
      l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
    }
  if (p.frequency_penalty != 0.f || p.presence_penalty != 0.f)
    for (int32_t t : h.distinct())
      if (const int32_t n = h.count(t); n > 0) logits[t] -= float(n) * p.frequency_penalty + p.presence_penalty;
  for (const auto& [t, bias] : p.logit_bias) logits[t] += bias;
  constexpr float never = -std::numeric_limits<float>::infinity();
  for (int32_t t : p.banned_tokens) logits[t] = never;
  if (index < uint64_t(p.min_tokens))  // too early to stop: a stop token cannot be drawn (nor shown in logprobs)
    for (int32_t t : p.stop_tokens) logits[t] = never;
}

float max_logit(const float* logits, int64_t vocab) {
  float top = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : top)
  for (int64_t i = 0; i < vocab; ++i) top = core::max_step(top, logits[i]);
  return top;
}

// The first index of the largest logit, in one pass over memory: a
// vectorised max per chunk of 1024, and a search only in a chunk that raises
// it (that chunk is still in L1). std::max_element's compare-and-track chain
// was ~4x slower over a 50k vocabulary, and a max pass followed by a search
// pass read batched decoding's logits (16 rows x 200 KB, past L2) twice.
// (NaN logits are not expected; with one, the result is some index rather
// than the NaN's.)
int32_t argmax(const float* logits, int64_t vocab) {
  constexpr int64_t kChunk = 1024;
  float best = -std::numeric_limits<float>::infinity();
  int64_t at = 0;
  for (int64_t c0 = 0; c0 < vocab; c0 += kChunk) {
    const float* chunk = logits + c0;
    const int64_t n = std::min(kChunk, vocab - c0);
    const float top = max_logit(chunk, n);
    if (top > best) {
      best = top;
      at = c0 + (std::find(chunk, chunk + n, top) - chunk);
    }
  }
  return int32_t(at);
}

// The order of "more likely": the larger logit, ties to the lower id.
bool better(float la, int32_t a, float lb, int32_t b) { return la > lb || (la == lb && a < b); }

// Tokens at or above a logit value: how many, and (given weights) their weight.
struct Above {
  int64_t count = 0;
  double mass = 0;
};

Above above(const float* logits, const float* w, int64_t vocab, float t) {
  Above a;
  if (!w) {
    int64_t n = 0;
#pragma omp simd reduction(+ : n)
    for (int64_t i = 0; i < vocab; ++i) n += logits[i] >= t;
    a.count = n;
    return a;
  }
  // Weights summed in float within chunks (16 lanes, 32 terms each: a few
  // 1e-6 of error at worst), the chunks in double.
  constexpr int64_t kFloatSum = 512;
  for (int64_t c0 = 0; c0 < vocab; c0 += kFloatSum) {
    const int64_t c1 = std::min(vocab, c0 + kFloatSum);
    int64_t n = 0;
    float m = 0;
#pragma omp simd reduction(+ : n, m)
    for (int64_t i = c0; i < c1; ++i) {
      const bool in = logits[i] >= t;
      n += in;
      m += in ? w[i] : 0.f;
    }
    a.count += n;
    a.mass += double(m);
  }
  return a;
}

// One pass of the boundary search's narrowing: the tokens of (l, w, ids)
// with lo <= l < hi go to (nl, nw, ni), in order (in place when they are
// the same arrays), and the ids of those at or above hi are appended to
// over. Branch-free: every token is written and the cursors advance by the
// tests; with a branch per token (mispredicted whenever the band is a
// sizeable share) this pass was most of a top-p draw. kWhole: the tokens
// are the vocabulary itself, ids 0, 1, ...
//
// With AVX-512, 16 tokens a step: each of the four streams is compressed
// into a register (vcompress) and stored whole, the lanes past the kept
// ones to be overwritten by the next step (the buffers have kSlack slots
// past the vocabulary for the last step). Compressing straight to memory is
// slow on AMD's Zen 4 and 5. The same tokens in the same order as the loop
// below. In place, a step writes at most up to its own last lane, which it
// has read.
constexpr size_t kSlack = 16;

template <bool kWhole>
__attribute__((target("avx512f"))) int64_t compact_avx512(const float* l, const float* w, const int32_t* ids, int64_t n,
                                                          float lo, float hi, float* nl, float* nw, int32_t* ni,
                                                          int32_t* over, int64_t& n_over) {
  int64_t m = 0, o = n_over;
  const __m512 vlo = _mm512_set1_ps(lo), vhi = _mm512_set1_ps(hi);
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 live = n - j >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - j)) - 1);
    const __m512 x = _mm512_maskz_loadu_ps(live, l + j);
    const __m512 wv = _mm512_maskz_loadu_ps(live, w + j);
    const __m512i id = kWhole ? _mm512_add_epi32(lane, _mm512_set1_epi32(int32_t(j))) : _mm512_maskz_loadu_epi32(live, ids + j);
    const __mmask16 at_lo = _mm512_mask_cmp_ps_mask(live, x, vlo, _CMP_GE_OQ);  // false for NaN, as x >= lo
    const __mmask16 at_hi = _mm512_mask_cmp_ps_mask(live, x, vhi, _CMP_GE_OQ);
    const __mmask16 band = __mmask16(at_lo & ~at_hi);
    _mm512_storeu_ps(nl + m, _mm512_maskz_compress_ps(band, x));
    _mm512_storeu_ps(nw + m, _mm512_maskz_compress_ps(band, wv));
    _mm512_storeu_si512(ni + m, _mm512_maskz_compress_epi32(band, id));
    _mm512_storeu_si512(over + o, _mm512_maskz_compress_epi32(at_hi, id));
    m += std::popcount(unsigned(band));
    o += std::popcount(unsigned(at_hi));
  }
  n_over = o;
  return m;
}

template <bool kWhole>
int64_t compact(bool avx512, const float* l, const float* w, const int32_t* ids, int64_t n, float lo, float hi,
                float* nl, float* nw, int32_t* ni, int32_t* over, int64_t& n_over) {
  if (avx512) return compact_avx512<kWhole>(l, w, ids, n, lo, hi, nl, nw, ni, over, n_over);
  constexpr int64_t kBlock = 64;
  int64_t m = 0, o = n_over;
  for (int64_t j0 = 0; j0 < n; j0 += kBlock) {
    const int64_t j1 = std::min(n, j0 + kBlock);
    // A block with nothing at or above lo is skipped after one vectorised test
    // (most of them when the band is high: top-k, logprobs).
    int64_t any = 0;
#pragma omp simd reduction(+ : any)
    for (int64_t j = j0; j < j1; ++j) any += l[j] >= lo;
    if (any == 0) continue;
    for (int64_t j = j0; j < j1; ++j) {
      const float x = l[j];
      const int32_t id = kWhole ? int32_t(j) : ids[j];
      nl[m] = x;
      nw[m] = w[j];
      ni[m] = id;
      over[o] = id;
      m += int64_t(x >= lo) & int64_t(x < hi);
      o += int64_t(x >= hi);
    }
  }
  n_over = o;
  return m;
}

// The last token (in the order of `better`) of the smallest set of best
// tokens that holds k of them, or (given weights w) weight `need`: the
// boundary of top-k and of top-p. Bisection on the logit value, one
// vectorised pass per step, narrows a band [lo, hi) that holds the boundary
// to a few tokens (the tokens >= hi fall short of the goal, those >= lo reach
// it); then the band's tokens alone are sorted and walked. `bottom` is a value
// no candidate is below; at_top and at_bottom are above() at top and bottom,
// which the caller has from a pass of its own. A sort of all candidates (a broad distribution's
// whole 50k vocabulary) was n log n per drawn token.
struct Boundary {
  float logit = 0.f;
  int32_t id = 0;
  bool found = false;  // false: no token reaches the goal (NaN logits); keep every candidate
  // When found: the kept tokens are work.over[0, over) (those above the
  // band, in id order) and work.band[0, in_band) (the band's, best first).
  size_t over = 0, in_band = 0;
};

Boundary boundary_of(const float* logits, const float* w, int64_t vocab, float top, float bottom, int64_t k,
                     double need, const Above& at_top, const Above& at_bottom, SamplerScratch& work) {
  constexpr int64_t kBand = 64;
  const auto reached = [&](const Above& a) { return w ? a.mass >= need : a.count >= k; };
  // The tokens still in play: the whole vocabulary, then (once the band is
  // an eighth of them) copies of the band's logits, weights and ids, so
  // that later passes read only the band. `base` counts the tokens above
  // the copies.
  const float* cl = logits;
  const float* cw = w;
  int64_t cn = vocab;
  bool whole = true;
  Above base;
  const auto above_all = [&](float t) {
    Above a = above(cl, cw, cn, t);
    a.count += base.count;
    a.mass += base.mass;
    return a;
  };
  float lo = top, hi = std::numeric_limits<float>::infinity();
  Above at_lo = at_top, at_hi;
  // Keeps the tokens in [lo, hi) (in place once they are copies) and adds
  // those at or above hi to work.over.
  if (work.band.size() < size_t(vocab) + kSlack) {
    work.band_logits.resize(size_t(vocab) + kSlack);
    work.band_weights.resize(size_t(vocab) + kSlack);
    work.band.resize(size_t(vocab) + kSlack);
    work.over.resize(size_t(vocab) + kSlack);
  }
  float* const nl = work.band_logits.data();
  float* const nw = work.band_weights.data();
  int32_t* const ni = work.band.data();
  int64_t n_over = 0;
  // Read once per search (cpu_features() takes a lock).
  const bool avx512 = cpu::cpu_features().packed == cpu::CpuFeatures::PackedPath::avx512;
  const auto narrow = [&] {
    // Without weights the logits stand in for them: copied, never read.
    const float* weights = cw ? cw : cl;
    cn = whole ? compact<true>(avx512, cl, weights, ni, cn, lo, hi, nl, nw, ni, work.over.data(), n_over)
               : compact<false>(avx512, cl, weights, ni, cn, lo, hi, nl, nw, ni, work.over.data(), n_over);
    cl = nl, cw = w ? nw : nullptr, whole = false, base = at_hi;
  };
  if (!reached(at_lo)) {  // the boundary is below the top: bisect [bottom, top)
    hi = top;
    at_hi = at_lo;
    lo = bottom;
    at_lo = at_bottom;
    while (at_lo.count - at_hi.count > kBand) {
      if (8 * (at_lo.count - at_hi.count) <= cn) narrow();  // the band is an eighth of the tokens in play
      const float mid = lo + (hi - lo) / 2;
      if (!(mid > lo && mid < hi)) break;  // the band is one value wide: ties
      const Above at_mid = above_all(mid);
      if (reached(at_mid)) {
        lo = mid;
        at_lo = at_mid;
      } else {
        hi = mid;
        at_hi = at_mid;
      }
    }
  }
  narrow();
  std::sort(ni, ni + cn, [&](int32_t a, int32_t b) { return better(logits[a], a, logits[b], b); });
  Above acc = at_hi;
  for (int64_t j = 0; j < cn; ++j) {
    acc.count += 1;
    if (w) acc.mass += w[ni[j]];
    if (reached(acc) || j + 1 == cn)  // the last: rounding left the goal short, keep the whole band
      return {logits[ni[j]], ni[j], true, size_t(n_over), size_t(j + 1)};
  }
  return {};
}

// Whether token (l, i) is the boundary or better than it.
bool kept_by(const Boundary& b, float l, int32_t i) { return !b.found || l > b.logit || (l == b.logit && i <= b.id); }

// The min(k, vocab) best tokens, best first, into ids; top = the largest logit.
void top_ids(const float* logits, int64_t vocab, float top, int64_t k, SamplerScratch& work) {
  std::vector<int32_t>& ids = work.ids;
  ids.clear();
  k = std::min(k, vocab);
  if (k <= 0) return;
  // The smallest logit, and how many are at or above it (all but NaNs), in one pass.
  float bottom = top;
  int64_t numbers = 0;
#pragma omp simd reduction(min : bottom) reduction(+ : numbers)
  for (int64_t i = 0; i < vocab; ++i) {
    bottom = logits[i] < bottom ? logits[i] : bottom;
    numbers += logits[i] == logits[i];
  }
  Above at_bottom;
  at_bottom.count = numbers;
  const Boundary b =
      boundary_of(logits, nullptr, vocab, top, bottom, k, 0, above(logits, nullptr, vocab, top), at_bottom, work);
  if (b.found) {
    ids.assign(work.over.begin(), work.over.begin() + std::ptrdiff_t(b.over));
    ids.insert(ids.end(), work.band.begin(), work.band.begin() + std::ptrdiff_t(b.in_band));
  } else {  // NaN logits only: the others, best first, then the first k
    for (int32_t i = 0; i < vocab; ++i)
      if (logits[i] == logits[i]) ids.push_back(i);
  }
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return better(logits[a], a, logits[b], b); });
  if (ids.size() > size_t(k)) ids.resize(size_t(k));
}

// log(sum(exp(logits))) over the whole vocabulary (top = its largest logit):
// float exps, summed in double.
double log_sum_exp(const float* logits, int64_t vocab, float top) {
  double s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < vocab; ++i) s += double(core::fast_exp(logits[i] - top));
  return top + std::log(s);
}

void fill_logprobs(const float* logits, int64_t vocab, int n, TokenChoice& c, SamplerScratch& work) {
  const float top = max_logit(logits, vocab);
  const double lse = log_sum_exp(logits, vocab, top);
  c.logprob = float(double(logits[c.token]) - lse);
  if (n <= 0) return;
  top_ids(logits, vocab, top, n, work);
  // A token that cannot be drawn (-inf: banned, held back by min_tokens or a
  // JSON object) is no alternative: fewer than n then, as vLLM lists them,
  // never a -inf that JSON would carry as null.
  for (int32_t id : work.ids)
    if (logits[id] != -std::numeric_limits<float>::infinity()) c.top.push_back({id, float(double(logits[id]) - lse)});
}

// Tokens per chunk sum of the draw.
constexpr size_t kDrawChunk = 512;

// The place in [0, n) where the running sum of weight(j) first reaches u,
// skipping zero weights. Chunk sums find the chunk, then one chunk is
// walked; where rounding leaves u above every sum, the last weighted place.
// Returns n when no weight is positive.
template <class Weight>
size_t draw_place(size_t n, const Weight& weight, double u, std::vector<double>& chunk_sums) {
  size_t c0 = 0;
  for (; c0 < chunk_sums.size() && u > chunk_sums[c0]; ++c0) u -= chunk_sums[c0];
  size_t last = n;
  for (size_t j = std::min(n, c0 * kDrawChunk); j < n; ++j)
    if (const float w = weight(j); w > 0) {
      last = j;
      u -= w;
      if (u <= 0) return j;
    }
  for (size_t j = std::min(n, c0 * kDrawChunk); j-- > 0 && last == n;)  // u was past the end: the last weighted place
    if (weight(j) > 0) last = j;
  return last;
}

// Fills chunk_sums (of kDrawChunk weights each) and returns their total.
template <class Weight>
double chunk_totals(size_t n, const Weight& weight, std::vector<double>& chunk_sums) {
  chunk_sums.clear();
  double total = 0;
  for (size_t c0 = 0; c0 < n; c0 += kDrawChunk) {
    const size_t c1 = std::min(n, c0 + kDrawChunk);
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (size_t j = c0; j < c1; ++j) s += double(weight(j));
    chunk_sums.push_back(s);
    total += s;
  }
  return total;
}

}  // namespace

TokenChoice score_token(const float* logits, int64_t vocab, int32_t token, int n, SamplerScratch& work) {
  TokenChoice c;
  c.token = token;
  fill_logprobs(logits, vocab, n, c, work);
  return c;
}

TokenChoice sample(float* logits, int64_t vocab, const SamplingParams& p, const SequenceHistory& history,
                   uint64_t index, SamplerScratch& work) {
  apply_penalties(logits, p, history, index);
  TokenChoice c;
  if (p.greedy()) {
    c.token = argmax(logits, vocab);
    if (p.logprobs >= 0) fill_logprobs(logits, vocab, p.logprobs, c, work);
    return c;
  }
  const float top = max_logit(logits, vocab);
  const float inv_t = 1.f / p.temperature;
  // exp(-30) ~ 1e-13 of the top: nothing any filter keeps, and nothing a draw can reach.
  const float floor = top - 30.f * p.temperature;
  const float min_w = p.min_p;  // the top token's weight is exp(0) = 1
  std::vector<SampleCandidate>& cand = work.candidates;
  // A counter-based draw: (seed, index) -> u, the same wherever the sequence runs.
  std::mt19937_64 rng(p.seed * 0x9e3779b97f4a7c15ull ^ (index + 1) * 0xbf58476d1ce4e5b9ull);
  const auto uniform = [&](double total) { return std::uniform_real_distribution<double>(0, total)(rng); };
  const auto draw_candidate = [&](size_t keep) {
    const auto weight = [&](size_t j) { return cand[j].weight; };
    const double total = chunk_totals(keep, weight, work.chunk_sums);
    const size_t at = draw_place(keep, weight, uniform(total), work.chunk_sums);
    return at < keep ? cand[at].id : cand.front().id;
  };

  if (p.top_k > 0 && p.top_k < vocab) {
    // The k best, best first; then min-p and top-p on that order.
    top_ids(logits, vocab, top, p.top_k, work);
    cand.clear();
    for (int32_t id : work.ids) {
      const float w = core::fast_exp((logits[id] - top) * inv_t);
      if (logits[id] >= floor && w >= min_w) cand.push_back({logits[id], w, id});
    }
    if (cand.empty()) {  // NaN logits only
      const int32_t id = work.ids.empty() ? 0 : work.ids.front();
      cand.push_back({logits[id], 1.f, id});
    }
    size_t keep = cand.size();
    if (p.top_p < 1.f) {
      double all = 0;
      for (const SampleCandidate& x : cand) all += x.weight;
      double cum = 0;
      size_t n = 0;
      while (n < keep && cum < double(p.top_p) * all) cum += cand[n++].weight;
      keep = std::max<size_t>(1, n);
    }
    c.token = draw_candidate(keep);
  } else {
    // Every token's weight, zero where a filter drops it, with the draw's
    // chunk sums and the counts the top-p search starts from, in one
    // vectorised pass.
    work.values.resize(size_t(vocab));
    float* w = work.values.data();
    work.chunk_sums.clear();
    Above at_top, at_floor;  // tokens tied at the top; tokens at or above the floor (all the weight)
    for (int64_t c0 = 0; c0 < vocab; c0 += int64_t(kDrawChunk)) {
      const int64_t c1 = std::min(vocab, c0 + int64_t(kDrawChunk));
      double s = 0;
      int64_t n_top = 0, n_floor = 0;
#pragma omp simd reduction(+ : s, n_top, n_floor)
      for (int64_t i = c0; i < c1; ++i) {
        const float e = core::fast_exp((logits[i] - top) * inv_t);
        const float wi = logits[i] >= floor && e >= min_w ? e : 0.f;
        w[i] = wi;
        s += double(wi);
        n_top += logits[i] == top;
        n_floor += logits[i] >= floor;
      }
      work.chunk_sums.push_back(s);
      at_floor.mass += s;
      at_top.count += n_top;
      at_floor.count += n_floor;
    }
    at_top.mass = double(at_top.count);  // each weighs exp(0) = 1, which min-p (<= 1) keeps
    const auto draw_token = [&](const auto& weight, double total) {
      const size_t at = draw_place(size_t(vocab), weight, uniform(total), work.chunk_sums);
      return at < size_t(vocab) ? int32_t(at) : argmax(logits, vocab);  // argmax: NaN logits only
    };
    if (p.top_p < 1.f) {
      const Boundary b =
          boundary_of(logits, w, vocab, top, floor, 0, double(p.top_p) * at_floor.mass, at_top, at_floor, work);
      const auto weight = [&](size_t j) { return kept_by(b, logits[j], int32_t(j)) ? w[j] : 0.f; };
      c.token = draw_token(weight, chunk_totals(size_t(vocab), weight, work.chunk_sums));
    } else {
      c.token = draw_token([&](size_t j) { return w[j]; }, at_floor.mass);
    }
  }
  // Log-probabilities under the plain softmax of the penalized logits,
  // before temperature and filtering (TokenChoice; serving.md): the same
  // for a greedy and a sampled request, whatever the temperature.
  if (p.logprobs >= 0) fill_logprobs(logits, vocab, p.logprobs, c, work);
  return c;
}

}  // namespace brisk::infer
