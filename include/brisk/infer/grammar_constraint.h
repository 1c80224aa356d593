// Generation constrained to a grammar (grammar.h): llama.cpp's GBNF,
// vLLM's guided_grammar and guided_regex.
//
// The walk is llama.cpp's: the text so far may stand at several places in
// the grammar at once, each a stack of positions (the next symbol to match
// on top, where to go on when its rule is done below it). A character keeps
// the stacks whose top set holds it, moves each past that symbol and
// expands rule references on top until a character set is on top again; an
// empty stack means the grammar is done there. Stacks are linked lists of
// interned nodes, so equal stacks are one id, a state is a sorted list of
// ids, and copying one is cheap.
//
// Bytes are fed one at a time; a character's UTF-8 bytes before its last
// keep the stacks whose top set holds some character that can still
// complete it (those form one range of code points), so a token that ends
// inside a character is allowed exactly when one of its completions is.
// Since every set holds a character and every rule can end (grammar.h), a
// state with a stack can always go on, and one with the empty stack can end:
// the walk has no dead ends.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "brisk/infer/grammar.h"

namespace brisk::infer {

class GrammarVocabulary;

class GrammarConstraint {
 public:
  // Places in the grammar the text may stand at once: an ambiguous grammar
  // can multiply them; past this the first are kept (settle()).
  static constexpr size_t kMaxStacks = 1 << 14;
  // Stacks expanded in one step; past this the step keeps those done.
  static constexpr size_t kMaxExpansions = 1 << 16;

  // `grammar` must outlive the constraint. Throws core::ConfigError when
  // the grammar's start alone meets a cap.
  explicit GrammarConstraint(const Grammar& grammar);

  // A step, probe or mask met a cap: texts only the dropped places (or the
  // tokens a mask did not reach) allowed may have been refused since (the
  // walk is still live and in the grammar).
  bool capped() const { return capped_; }

  // Whether `bytes` may come next (the state is left as it is).
  bool accepts(std::string_view bytes) const;
  // Feeds `bytes`; false (and the state unchanged) if they may not come next.
  bool feed(std::string_view bytes);
  // The text so far is a whole one: a stop token may end it here.
  bool can_end() const { return state_.need == 0 && !state_.stacks.empty() && state_.stacks.front() == kEmpty; }
  // It is a whole one and nothing may follow.
  bool done() const { return can_end() && state_.stacks.size() == 1; }

  // row[t] = -inf for every token t of `vocab` whose bytes cannot come next
  // (tokens without bytes included: they would add nothing); returns how
  // many tokens are left. Equal states recur (a loop such as [a-z]* comes
  // back to where it was after each character), so the last few states'
  // masks are kept.
  int64_t mask(const GrammarVocabulary& vocab, float* row) const;

 private:
  static constexpr uint32_t kEmpty = 0;  // the empty stack's id
  struct State {
    std::vector<uint32_t> stacks;  // sorted stack ids
    uint32_t cp = 0;               // a character's bits so far
    uint8_t need = 0;              // its continuation bytes still to come
    uint8_t next_lo = 0x80, next_hi = 0xBF;  // the next one's allowed range
  };

  // mask's states: an id into states_ (-1: too many, `value` holds it).
  struct Level {
    int32_t id = -1;
    State value;
  };
  static constexpr int32_t kUnknown = -2, kDead = -1;
  static constexpr size_t kMaxStates = 2048;  // moves_ is 1 KiB a state
  static constexpr size_t kMaxStateWords = 1 << 20;  // stack ids in states_, all told
  static constexpr size_t kMaxNodes = 1 << 20;       // stack nodes before compact()
  // Stacks one mask may step and expand, all told (about 50 ms): a grammar
  // whose places fan out gave every trie node a state of its own, and one
  // mask ran for minutes.
  static constexpr size_t kMaxMaskWork = 1 << 20;

  bool step(const State& from, uint8_t byte, State& to) const;
  bool child(const Level& from, uint8_t byte, Level& to) const;
  uint32_t intern_state(const State& s, std::string key) const;  // key: key(s)
  bool advance(const State& from, uint32_t cp, State& to) const;
  bool expand(uint32_t id, std::vector<uint32_t>& out, size_t& budget) const;
  void settle(std::vector<uint32_t>& stacks) const;
  uint32_t intern(uint32_t pos, uint32_t below) const;
  // Forgets the nodes made after `mark` (by probes: accepts, mask).
  void rollback(size_t mark) const;
  void next_epoch() const;
  void compact() const;
  std::string key(const State& s) const;

  const Grammar* g_;
  mutable State state_;  // compact() renumbers its stacks
  // Each stack node: a symbol's index over the node below (0: none). Probes
  // add nodes and take them back; the constraint is one thread's at a time.
  mutable std::vector<std::pair<uint32_t, uint32_t>> nodes_;
  mutable std::unordered_map<uint64_t, uint32_t> ids_;
  mutable std::vector<uint32_t> work_;
  // seen_[id] == epoch_: the stack was expanded in this step (a nullable
  // loop such as (a*)* comes back to it).
  mutable std::vector<uint32_t> seen_;
  mutable uint32_t epoch_ = 0;
  mutable bool capped_ = false;
  mutable std::vector<Level> levels_;  // mask: the state at each depth of the token trie
  // The states masks have met and their moves by byte (kUnknown, kDead or
  // a state): within a mask, equal states recur under many trie nodes (in
  // [a-z]+ after every letter), and across masks too, so a move is worked
  // out once. At kMaxStates the table starts again.
  mutable std::vector<State> states_;
  mutable std::unordered_map<std::string, uint32_t> state_ids_;
  mutable std::vector<int32_t> moves_;
  mutable size_t state_words_ = 0;
  mutable size_t mask_work_ = 0;   // stacks stepped and expanded in this mask
  mutable size_t expansions_ = 0;  // expand()'s, all told
  mutable std::unordered_map<std::string, std::vector<uint64_t>> masks_;  // by state
};

// A vocabulary's token bytes as a trie, so a mask walks each shared prefix
// once and drops every token under a byte the grammar refuses.
class GrammarVocabulary {
 public:
  explicit GrammarVocabulary(const std::vector<std::string>& token_bytes);
  int64_t size() const { return size_; }

 private:
  friend class GrammarConstraint;
  struct Node {
    uint32_t first_edge = 0, edges = 0;    // into edges_
    uint32_t first_token = 0, tokens = 0;  // into tokens_: those whose bytes end here
  };
  uint32_t build(const std::vector<std::string>& bytes, std::vector<int32_t>& order, size_t lo, size_t hi,
                 size_t depth);
  int64_t size_ = 0;
  size_t depth_ = 0;  // the longest token's bytes
  std::vector<Node> nodes_;
  std::vector<std::pair<uint8_t, uint32_t>> edges_;  // (byte, child)
  std::vector<int32_t> tokens_;
};

}  // namespace brisk::infer
