// Grammars for constrained generation: llama.cpp's GBNF (its server's
// `grammar`, vLLM's `guided_grammar`) and regular expressions (vLLM's
// `guided_regex`), compiled into one form: rules whose alternatives are
// sequences of character sets and references to rules. GrammarConstraint
// (grammar_constraint.h) walks it as the text is generated, so every text
// it lets through is a prefix of one the grammar derives, and a text that
// ends (a stop token, or nothing more may follow) is a whole one.
//
// GBNF (docs/serving.md, Grammars, for users):
//   root  ::= item ("," ws item)*      # the start rule is `root`
//   item  ::= "\"" [a-z]+ "\"" | num
//   num   ::= [0-9]{1,3}
//   ws    ::= [ \t\n]?
// Literals "..." and classes [...] / [^...] (escapes \n \r \t \\ \" \[ \]
// \xHH \uHHHH \UHHHHHHHH), `.` (any character), groups ( ), the
// repetitions * + ? {m} {m,} {m,n} {,n}, `#` comments; a rule continues on
// the next line inside parentheses or after `|` or `::=`.
//
// Regular expressions match the whole text (as vLLM's guided_regex does):
// literals, escapes (\d \w \s and their negations, \n \t \r \f \v \xHH
// \uHHHH, an escaped punctuation character), classes with ranges, `.` (any
// character but a newline), groups ((...), (?:...), (?<name>...),
// (?P<name>...)), |, and the repetitions * + ? {m} {m,} {m,n} (a lazy `?`
// after one changes nothing a whole match can be); ^ at the start and $ at
// the end. What a language of texts cannot hold (lookaround, backreferences,
// \b, flags, possessive repetition) is refused by name.
//
// Refused, each with a message naming the rule or the place: a reference to
// an undefined rule, a rule defined twice, left recursion (the matcher would
// expand it forever; llama.cpp refuses it too), a rule that can never end
// (`x ::= "a" x`), an empty class, a repetition count over kMaxRepeat, a
// grammar of more than kMaxSymbols symbols once its repetitions are written
// out, and text that is not UTF-8.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace brisk::infer {

// A set of Unicode code points: sorted, disjoint, non-adjacent ranges.
struct CodePointSet {
  std::vector<std::pair<uint32_t, uint32_t>> ranges;  // [first, last]
  bool contains(uint32_t cp) const;
  // Some code point in [lo, hi] is in the set.
  bool intersects(uint32_t lo, uint32_t hi) const;
};

struct GrammarSymbol {
  enum Kind : uint8_t { kEnd, kChars, kRule };
  Kind kind = kEnd;
  uint32_t arg = 0;  // kChars: an index into sets; kRule: a rule's index
};

class Grammar {
 public:
  static constexpr int kMaxRepeat = 1000;       // m and n of {m,n}
  static constexpr size_t kMaxSymbols = 200000;  // after repetitions are written out
  static constexpr uint32_t kMaxCodePoint = 0x10FFFF;

  // Throws core::ConfigError naming `where` and the rule or byte offset.
  static std::shared_ptr<const Grammar> gbnf(std::string_view text, const std::string& where);
  static std::shared_ptr<const Grammar> regex(std::string_view pattern, const std::string& where);

  // What it was compiled from ("gbnf:" or "regex:", then the source): the
  // response cache's key.
  const std::string& source() const { return source_; }

  // The compiled form. symbols holds every alternative's symbols, each
  // alternative ended by a kEnd; rules[r] the index of each of rule r's
  // alternatives' first symbol.
  const std::vector<GrammarSymbol>& symbols() const { return symbols_; }
  const std::vector<std::vector<uint32_t>>& rules() const { return rules_; }
  const std::vector<CodePointSet>& sets() const { return sets_; }
  const std::vector<std::string>& rule_names() const { return rule_names_; }
  uint32_t root() const { return root_; }

 private:
  friend class GrammarBuilder;
  std::string source_;
  std::vector<GrammarSymbol> symbols_;
  std::vector<std::vector<uint32_t>> rules_;
  std::vector<CodePointSet> sets_;
  std::vector<std::string> rule_names_;
  uint32_t root_ = 0;
};

}  // namespace brisk::infer
