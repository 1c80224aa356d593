// Fuzz target: grammars compiled for constrained generation
// (infer::Grammar, src/infer/grammar.cpp: GBNF from `grammar` and
// `guided_grammar`, regular expressions from `guided_regex`), and the walk
// over them (infer::GrammarConstraint) with its vocabulary mask.
// Input: 'r' (a regular expression) or anything else (GBNF), the text, a
// NUL byte, then bytes fed one at a time until one is refused; the same
// bytes cut into tokens of 1-4 bytes make a vocabulary for the mask.
//
// It promises (grammar.h, grammar_constraint.h): a text compiles or is
// refused with a ConfigError, never a crash or a hang (left recursion,
// nullable loops, deep chains of rules, repetitions); accepts() answers
// what feed() then does; some byte always goes on until nothing may follow
// (at a cap on ambiguity too: the places kept can all go on); once done no
// byte is accepted; the mask leaves exactly the tokens accepts() takes.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "brisk/core/error.h"
#include "brisk/infer/grammar.h"
#include "brisk/infer/grammar_constraint.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace brisk;
  if (size == 0) return 0;
  const std::string input(reinterpret_cast<const char*>(data) + 1, size - 1);
  const size_t nul = input.find('\0');
  const std::string source = input.substr(0, nul);
  const std::string bytes = nul == std::string::npos ? std::string() : input.substr(nul + 1, 64);
  std::shared_ptr<const infer::Grammar> grammar;
  std::unique_ptr<infer::GrammarConstraint> walk;
  try {
    grammar = data[0] == 'r' ? infer::Grammar::regex(source, "fuzz") : infer::Grammar::gbnf(source, "fuzz");
    walk = std::make_unique<infer::GrammarConstraint>(*grammar);
  } catch (const core::ConfigError&) {
    return 0;  // refused, by name
  }
  std::vector<std::string> tokens;
  for (size_t i = 0; i < bytes.size();) {
    const size_t n = 1 + uint8_t(bytes[i]) % 4;
    tokens.push_back(bytes.substr(i, n));
    i += n;
  }
  for (int b = 0; b < 256; ++b) tokens.emplace_back(1, char(b));
  const infer::GrammarVocabulary vocab(tokens);
  std::vector<float> row(tokens.size());
  // Once a cap is met the walk is live but costly (thousands of places a
  // byte); the unit tests cover it, and here it would only slow the search.
  for (size_t i = 0; i < bytes.size() && !walk->capped(); ++i) {
    bool any = false;
    for (int b = 0; b < 256 && !any; ++b) any = walk->accepts(std::string(1, char(b)));
    FUZZ_CHECK(any != walk->done());
    if (i % 8 == 0) {  // the mask against trying each token
      std::fill(row.begin(), row.end(), 0.f);
      walk->mask(vocab, row.data());
      // Every token left fits; and, unless a cap cut the mask short (it
      // then leaves fewer, by design), every token that fits is left.
      const bool whole_mask = !walk->capped();
      for (size_t t = 0; t < tokens.size(); ++t) {
        if (row[t] == 0.f) FUZZ_CHECK(walk->accepts(tokens[t]));
        else if (whole_mask) FUZZ_CHECK(!walk->accepts(tokens[t]));
      }
      if (!whole_mask) break;
    }
    const std::string byte(1, bytes[i]);
    const bool ok = walk->accepts(byte);
    infer::GrammarConstraint fed = *walk;
    FUZZ_CHECK(fed.feed(byte) == ok);
    if (!ok) break;
    *walk = fed;
  }
  return 0;
}
