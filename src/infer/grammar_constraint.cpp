// Walking a grammar as text is generated; see
// brisk/infer/grammar_constraint.h.
#include "brisk/infer/grammar_constraint.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "brisk/core/error.h"

namespace brisk::infer {

using Sym = GrammarSymbol;

GrammarConstraint::GrammarConstraint(const Grammar& grammar) : g_(&grammar) {
  nodes_.emplace_back(0, 0);  // id 0: the empty stack
  next_epoch();
  size_t budget = kMaxExpansions;
  for (uint32_t alt : g_->rules()[g_->root()])
    if (!expand(g_->symbols()[alt].kind == Sym::kEnd ? kEmpty : intern(alt, kEmpty), state_.stacks, budget))
      break;
  settle(state_.stacks);
  if (capped_)
    throw core::ConfigError("the grammar's start is too wide: more than " + std::to_string(kMaxStacks) +
                            " places or " + std::to_string(kMaxExpansions) +
                            " rule expansions at once; make its alternatives fewer or less ambiguous");
}

uint32_t GrammarConstraint::intern(uint32_t pos, uint32_t below) const {
  const uint64_t k = uint64_t(pos) << 32 | below;
  auto [it, added] = ids_.try_emplace(k, uint32_t(nodes_.size()));
  if (added) nodes_.emplace_back(pos, below);
  return it->second;
}

void GrammarConstraint::next_epoch() const {
  if (++epoch_ == 0) {  // wrapped: no stamp may look current
    std::fill(seen_.begin(), seen_.end(), 0);
    epoch_ = 1;
  }
}

void GrammarConstraint::rollback(size_t mark) const {
  for (size_t i = mark; i < nodes_.size(); ++i) ids_.erase(uint64_t(nodes_[i].first) << 32 | nodes_[i].second);
  nodes_.resize(mark);
}

// Appends to `out` the stacks `id` stands for once the rules on its top are
// expanded (each then has a character set on top, or is empty). Iterative:
// rules may lead into rules thousands deep. False (and what is in `out`
// kept: each is a whole stack) once `budget` expansions are spent.
bool GrammarConstraint::expand(uint32_t id, std::vector<uint32_t>& out, size_t& budget) const {
  const std::vector<Sym>& sym = g_->symbols();
  work_.assign(1, id);
  while (!work_.empty()) {
    const uint32_t s = work_.back();
    work_.pop_back();
    if (s >= seen_.size()) seen_.resize(nodes_.size() * 2);
    if (seen_[s] == epoch_) continue;  // expanded already in this step: the same stacks again
    seen_[s] = epoch_;
    if (budget == 0) return capped_ = true, false;
    --budget;
    ++expansions_;
    const auto [pos, below] = nodes_[s];
    if (s == kEmpty || sym[pos].kind == Sym::kChars) {
      out.push_back(s);
      continue;
    }
    // A rule on top: each of its alternatives, over what follows the rule.
    const uint32_t after = sym[pos + 1].kind == Sym::kEnd ? below : intern(pos + 1, below);
    for (uint32_t alt : g_->rules()[sym[pos].arg])
      work_.push_back(sym[alt].kind == Sym::kEnd ? after : intern(alt, after));
  }
  return true;
}

// Sorted, without duplicates, at most kMaxStacks: past it the first are
// kept. Each is a whole parse that can go on and end, so the walk stays
// live and what it lets through stays in the grammar; texts only the
// dropped ones allowed are refused.
void GrammarConstraint::settle(std::vector<uint32_t>& stacks) const {
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
  if (stacks.size() > kMaxStacks) stacks.resize(kMaxStacks), capped_ = true;
}

// A whole character: the stacks whose top set holds it, each moved past it.
bool GrammarConstraint::advance(const State& from, uint32_t cp, State& to) const {
  const std::vector<Sym>& sym = g_->symbols();
  next_epoch();
  to.stacks.clear();
  size_t budget = kMaxExpansions;
  for (uint32_t id : from.stacks) {
    if (id == kEmpty) continue;
    const auto [pos, below] = nodes_[id];
    if (!g_->sets()[sym[pos].arg].contains(cp)) continue;
    if (!expand(sym[pos + 1].kind == Sym::kEnd ? below : intern(pos + 1, below), to.stacks, budget)) break;
  }
  settle(to.stacks);
  to.cp = 0, to.need = 0;  // a whole character: nothing of it is state
  return !to.stacks.empty();
}

bool GrammarConstraint::step(const State& from, uint8_t b, State& to) const {
  uint32_t cp;
  uint8_t need;
  to.next_lo = 0x80, to.next_hi = 0xBF;
  if (from.need == 0) {
    if (b < 0x80) return advance(from, b, to);
    // A lead byte (strict UTF-8: no overlong forms, surrogates or code
    // points past U+10FFFF, so the next byte's range depends on it).
    if (b >= 0xC2 && b <= 0xDF) cp = b & 0x1F, need = 1;
    else if (b >= 0xE0 && b <= 0xEF) cp = b & 0x0F, need = 2;
    else if (b >= 0xF0 && b <= 0xF4) cp = b & 0x07, need = 3;
    else return false;
    if (b == 0xE0) to.next_lo = 0xA0;
    if (b == 0xED) to.next_hi = 0x9F;
    if (b == 0xF0) to.next_lo = 0x90;
    if (b == 0xF4) to.next_hi = 0x8F;
  } else {
    if (b < from.next_lo || b > from.next_hi) return false;
    cp = from.cp << 6 | (b & 0x3F);
    need = uint8_t(from.need - 1);
    if (need == 0) return advance(from, cp, to);
  }
  // Inside a character: the code points it can still become form one range.
  const int shift = 6 * need;
  uint32_t lo = cp << shift, hi = lo | ((1u << shift) - 1);
  // The least code point of a sequence this long: the lead byte's bits
  // alone allow overlong forms (after 0xE0, 0..0xFFF); later bytes' ranges
  // already exclude them.
  static constexpr uint32_t kLeast[] = {0, 0x80, 0x800, 0x10000};
  lo = std::max(lo, kLeast[need]);
  hi = std::min(hi, Grammar::kMaxCodePoint);
  if (lo <= 0xDFFF && hi >= 0xD800) hi = std::min(hi, 0xD7FFu);  // after 0xED: below the surrogates
  to.stacks.clear();
  for (uint32_t id : from.stacks)
    if (id != kEmpty && g_->sets()[g_->symbols()[nodes_[id].first].arg].intersects(lo, hi)) to.stacks.push_back(id);
  to.cp = cp;
  to.need = need;
  return !to.stacks.empty();
}

bool GrammarConstraint::accepts(std::string_view bytes) const {
  const size_t mark = nodes_.size();
  State a = state_, b;
  bool ok = true;
  for (char c : bytes) {
    if (!(ok = step(a, uint8_t(c), b))) break;
    std::swap(a, b);
  }
  rollback(mark);
  return ok;
}

// The arena only grows (a mask's states stand on the nodes it made); past
// kMaxNodes it is rebuilt from the current state's stacks alone, and what
// was kept by node id (the table, the masks) goes with it. Only mask()
// calls it, before its walk: the feed that follows a mask then meets the
// very nodes the mask made, so where a cap keeps the first places by id it
// keeps the same ones, and a token the mask allowed is never refused.
void GrammarConstraint::compact() const {
  if (nodes_.size() <= kMaxNodes) return;
  const std::vector<std::pair<uint32_t, uint32_t>> old = std::move(nodes_);
  nodes_.assign(1, {0, 0});
  ids_.clear();
  std::unordered_map<uint32_t, uint32_t> moved{{kEmpty, kEmpty}};
  std::vector<uint32_t> chain;
  for (uint32_t& id : state_.stacks) {
    chain.clear();
    uint32_t at = id;
    while (!moved.count(at)) chain.push_back(at), at = old[at].second;
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) moved[*it] = intern(old[*it].first, moved[old[*it].second]);
    id = moved[id];
  }
  std::sort(state_.stacks.begin(), state_.stacks.end());
  states_.clear();
  state_ids_.clear();
  moves_.clear();
  state_words_ = 0;
  masks_.clear();
  std::fill(seen_.begin(), seen_.end(), 0);
  epoch_ = 0;
}

bool GrammarConstraint::feed(std::string_view bytes) {
  State a = state_, b;
  for (char c : bytes) {
    if (!step(a, uint8_t(c), b)) return false;
    std::swap(a, b);
  }
  state_ = std::move(a);
  return true;
}

std::string GrammarConstraint::key(const State& s) const {
  std::string k(s.stacks.size() * sizeof(uint32_t) + 7, '\0');
  std::memcpy(k.data(), s.stacks.data(), s.stacks.size() * sizeof(uint32_t));
  char* tail = k.data() + s.stacks.size() * sizeof(uint32_t);
  std::memcpy(tail, &s.cp, 4);
  tail[4] = char(s.need), tail[5] = char(s.next_lo), tail[6] = char(s.next_hi);
  return k;
}

uint32_t GrammarConstraint::intern_state(const State& st, std::string k) const {
  auto [it, added] = state_ids_.try_emplace(std::move(k), uint32_t(states_.size()));
  if (added) {
    state_words_ += st.stacks.size();
    states_.push_back(st);
    moves_.resize(states_.size() * 256, kUnknown);
  }
  return it->second;
}

// The state after byte b from `from`, through the table where both are in it.
bool GrammarConstraint::child(const Level& from, uint8_t b, Level& to) const {
  if (from.id >= 0) {
    const int32_t known = moves_[size_t(from.id) * 256 + b];
    if (known == kDead) return false;
    if (known >= 0) return to.id = known, true;
  }
  const State& at = from.id >= 0 ? states_[size_t(from.id)] : from.value;
  const size_t expanded = expansions_;
  const bool ok = step(at, b, to.value);
  mask_work_ += at.stacks.size() + (expansions_ - expanded) + 1;
  if (!ok) {
    if (from.id >= 0) moves_[size_t(from.id) * 256 + b] = kDead;
    return false;
  }
  to.id = -1;
  if (from.id >= 0 && states_.size() < kMaxStates && state_words_ + to.value.stacks.size() <= kMaxStateWords) {
    to.id = int32_t(intern_state(to.value, key(to.value)));
    moves_[size_t(from.id) * 256 + b] = to.id;
  }
  return true;
}

int64_t GrammarConstraint::mask(const GrammarVocabulary& vocab, float* row) const {
  constexpr size_t kKeptMasks = 32;
  compact();
  const std::string k = key(state_);
  auto it = masks_.find(k);
  if (it == masks_.end()) {
    if (masks_.size() >= kKeptMasks) masks_.clear();
    if (states_.size() >= kMaxStates || state_words_ >= kMaxStateWords / 2) {  // full: start the table again
      state_words_ = 0;
      states_.clear();
      state_ids_.clear();
      moves_.clear();
    }
    std::vector<uint64_t> allowed(size_t(vocab.size() + 63) / 64);
    auto allow = [&](const GrammarVocabulary::Node& n) {
      for (uint32_t i = 0; i < n.tokens; ++i) {
        const auto t = size_t(vocab.tokens_[n.first_token + i]);
        allowed[t / 64] |= uint64_t(1) << (t % 64);
      }
    };
    if (levels_.size() < vocab.depth_ + 1) levels_.resize(vocab.depth_ + 1);
    levels_[0].id = int32_t(intern_state(state_, k));
    mask_work_ = 0;
    // The tokens of one byte first: were the walk below cut short, they
    // are what keeps a live state from a mask of nothing (past the budget
    // only until one is found).
    const GrammarVocabulary::Node& root = vocab.nodes_[0];
    bool any = false;
    for (uint32_t e = 0; e < root.edges && !(any && mask_work_ > kMaxMaskWork); ++e) {
      const auto [byte, next] = vocab.edges_[root.first_edge + e];
      if (vocab.nodes_[next].tokens && child(levels_[0], byte, levels_[1])) allow(vocab.nodes_[next]), any = true;
    }
    // Depth first over the trie: (node, its next edge), the state after
    // each node's bytes in levels_[depth]. The nodes made here stay: the
    // table's states stand on them. Past kMaxMaskWork stacks stepped (an
    // ambiguous grammar whose thousands of places give every trie node a
    // state of its own) the walk stops: the tokens it has not reached are
    // refused, as at the other caps.
    std::vector<std::pair<uint32_t, uint32_t>> path{{0, 0}};
    while (!path.empty()) {
      if (mask_work_ > kMaxMaskWork) {
        capped_ = true;
        break;
      }
      auto& [node, edge] = path.back();
      const GrammarVocabulary::Node& n = vocab.nodes_[node];
      if (edge == n.edges) {
        path.pop_back();
        continue;
      }
      const auto [byte, next] = vocab.edges_[n.first_edge + edge++];
      const size_t depth = path.size();
      if (!child(levels_[depth - 1], byte, levels_[depth])) continue;
      const GrammarVocabulary::Node& c = vocab.nodes_[next];
      allow(c);
      if (c.edges) path.emplace_back(next, 0);
    }
    it = masks_.emplace(k, std::move(allowed)).first;
  }
  const std::vector<uint64_t>& allowed = it->second;
  int64_t left = 0;
  for (int64_t t = 0; t < vocab.size(); ++t) {
    if (allowed[size_t(t) / 64] >> (t % 64) & 1) ++left;
    else row[t] = -std::numeric_limits<float>::infinity();
  }
  return left;
}

GrammarVocabulary::GrammarVocabulary(const std::vector<std::string>& token_bytes)
    : size_(int64_t(token_bytes.size())) {
  std::vector<int32_t> order;
  for (int32_t t = 0; t < int32_t(token_bytes.size()); ++t)
    if (!token_bytes[size_t(t)].empty()) order.push_back(t);  // a token of no bytes is never allowed
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return token_bytes[size_t(a)] < token_bytes[size_t(b)]; });
  for (int32_t t : order) depth_ = std::max(depth_, token_bytes[size_t(t)].size());
  build(token_bytes, order, 0, order.size(), 0);
}

// The node for order[lo, hi) (sorted, sharing their first `depth` bytes):
// the tokens that end there, then a child for each next byte.
uint32_t GrammarVocabulary::build(const std::vector<std::string>& bytes, std::vector<int32_t>& order, size_t lo,
                                  size_t hi, size_t depth) {
  const auto id = uint32_t(nodes_.size());
  nodes_.emplace_back();
  auto at = [&](size_t i) -> const std::string& { return bytes[size_t(order[i])]; };
  size_t i = lo;
  nodes_[id].first_token = uint32_t(tokens_.size());
  while (i < hi && at(i).size() == depth) tokens_.push_back(order[i++]);
  nodes_[id].tokens = uint32_t(tokens_.size()) - nodes_[id].first_token;
  std::vector<std::pair<uint8_t, uint32_t>> children;
  while (i < hi) {
    const auto b = uint8_t(at(i)[depth]);
    size_t j = i;
    while (j < hi && uint8_t(at(j)[depth]) == b) ++j;
    children.emplace_back(b, build(bytes, order, i, j, depth + 1));
    i = j;
  }
  nodes_[id].first_edge = uint32_t(edges_.size());
  nodes_[id].edges = uint32_t(children.size());
  edges_.insert(edges_.end(), children.begin(), children.end());
  return id;
}

}  // namespace brisk::infer
