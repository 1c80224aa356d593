// Grammars (infer::Grammar + GrammarConstraint): what the compilers refuse
// and how they name it; whole texts GBNF grammars accept and refuse;
// regular expressions checked against std::regex (ECMAScript) on random
// texts and on random walks of the constraint, with no walk ever left
// without a byte to go on; characters split across tokens; the cap on
// ambiguity; and the vocabulary mask against trying every token, GPT-2's
// included.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <random>
#include <regex>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "brisk/core/error.h"
#include "brisk/data/tokenizer.h"
#include "brisk/infer/grammar.h"
#include "brisk/infer/grammar_constraint.h"

namespace brisk {
namespace {

using infer::Grammar;
using infer::GrammarConstraint;
using infer::GrammarVocabulary;

std::shared_ptr<const Grammar> gbnf(const std::string& text) { return Grammar::gbnf(text, "grammar"); }
std::shared_ptr<const Grammar> regex(const std::string& text) { return Grammar::regex(text, "guided_regex"); }

bool whole(const Grammar& g, const std::string& text) {
  GrammarConstraint c(g);
  return c.feed(text) && c.can_end();
}

// GPT-2's 50,257 tokens' bytes, read once (empty, with a failure, when the
// vocabulary is missing).
const std::vector<std::string>& gpt2_tokens() {
  static const std::vector<std::string> tokens = [] {
    std::vector<std::string> out;
    try {
      const auto tok = data::load_gpt2_tokenizer(data::default_gpt2_vocab_dir());
      for (int32_t id = 0; id < int32_t(tok->vocab_size()); ++id)
        out.push_back(tok->decode(std::span<const int32_t>(&id, 1)));
    } catch (const core::Error& e) {
      ADD_FAILURE() << e.what();
    }
    return out;
  }();
  return tokens;
}

std::string refusal(const std::function<void()>& compile) {
  try {
    compile();
  } catch (const core::ConfigError& e) {
    return e.what();
  }
  return "(compiled)";
}

TEST(Grammar, RefusalsNameTheRuleOrThePlace) {
  const std::vector<std::pair<std::string, std::string>> gbnf_cases = {
      {"root ::= item\n", "rule 'item' is used but never defined"},
      {"item ::= \"a\"\n", "no rule 'root'"},
      {"root ::= \"a\"\nroot ::= \"b\"\n", "rule 'root' is defined twice"},
      {"root ::= root \"a\" | \"b\"\n", "rule 'root' is left-recursive (root -> root)"},
      {"root ::= a\na ::= b \"x\"\nb ::= \"y\" | a\n", "is left-recursive (a -> b -> a)"},
      {"root ::= x\nx ::= y? x \"a\" | \"b\"\ny ::= \"c\"\n", "rule 'x' is left-recursive"},
      {"root ::= \"a\" x | \"b\"\nx ::= \"c\" x\n", "rule 'x' can never end"},
      {"root ::= \"a\" (\"b\" root)\n", "can never end"},
      {"root ::= [^\\x00-\\U0010FFFF]\n", "a character class that matches nothing"},
      {"root ::= \"a\"{1001}\n", "a repetition count over 1000"},
      {"root ::= \"a\"{3,2}\n", "n < m"},
      {"root ::= \"\\q\"\n", "unknown escape \\q"},
      {"root ::= \"abc\n", "a literal without its closing \""},
      {"root ::= [a-\n", "a character class without its closing ]"},
      {"root ::= [z-a]\n", "runs backwards"},
      {"root = \"a\"\n", "expected ::= after the rule name 'root'"},
      {"root ::= \"\xff\"\n", "not UTF-8"},
      {"root ::= * \"a\"\n", "'*' repeats nothing"},
      {"root ::= (\"a\"\n", "expected ')'"},
      {"", "the grammar is empty"},
  };
  for (const auto& c : gbnf_cases) {  // (clang 14 cannot capture a structured binding)
    const std::string &text = c.first, &want = c.second;
    const std::string got = refusal([&] { gbnf(text); });
    EXPECT_NE(got.find(want), std::string::npos) << text << "\n=> " << got;
    EXPECT_EQ(got.rfind("grammar: ", 0), 0u) << got;
  }
  // Groups nest at most 256 deep: deeper, the recursive parse would
  // overflow a thread's stack (100,000 did).
  const std::string deep_open(100000, '('), deep_close(100000, ')');
  EXPECT_NE(refusal([&] { regex(deep_open + "a" + deep_close); }).find("groups nest more than 256 deep"),
            std::string::npos);
  EXPECT_NE(refusal([&] { gbnf("root ::= " + deep_open + "\"a\"" + deep_close); }).find("nest more than 256"),
            std::string::npos);
  EXPECT_TRUE(whole(*regex(std::string(256, '(') + "a" + std::string(256, ')')), "a"));
  // The symbol cap counts what repetitions write, once: 640 stars are some
  // 2,600 symbols, not 200,000.
  std::string stars;
  for (int i = 0; i < 640; ++i) stars += "[a-z]*";
  EXPECT_TRUE(whole(*regex(stars), "abc"));
  std::string large = "root ::= x0\n";
  for (int i = 0; i <= 200; ++i) large += "x" + std::to_string(i) + " ::= \"a\"{1000}\n";
  EXPECT_NE(refusal([&] { gbnf(large); }).find("more than 200000 symbols"), std::string::npos);
  const std::vector<std::pair<std::string, std::string>> regex_cases = {
      {"a(?=b)", "lookaround"},   {"(a)\\1", "backreferences"},  {"\\bword", "the anchor \\b"},
      {"(?i)abc", "inline flags"}, {"a*+", "possessive"},         {"a)", "an unmatched ')'"},
      {"a$b", "'$' anywhere but at the end"}, {"a^", "'^' anywhere but at the start"},
      {"(a$)", "'$' anywhere but at the end"}, {"(^a)", "'^' anywhere but at the start"},
      {"\\q", "unknown escape \\q"}, {"\\8", "backreferences"}, {"[\\d-z]", "begins with a class escape"},
      {"\\400", "backreferences"}, {"[\\400]", "octal escape past \\377"},
      {"\\q", "unknown escape \\q"}, {"[b-a]", "runs backwards"}, {"a{2000}", "over 1000"},
      {"(ab", "closing ')'"},      {"+a", "'+' repeats nothing"}, {"[^\\s\\S]", "matches nothing"},
  };
  for (const auto& c : regex_cases) {
    const std::string &text = c.first, &want = c.second;
    const std::string got = refusal([&] { regex(text); });
    EXPECT_NE(got.find(want), std::string::npos) << text << "\n=> " << got;
  }
}

// Python's re: escaped punctuation and non-ASCII characters stand for
// themselves, {,n}, octal escapes, \a, ^ and $ around alternatives.
TEST(Grammar, RegularExpressionsReadAsPythonDoes) {
  const std::vector<std::tuple<std::string, std::vector<std::string>, std::vector<std::string>>> cases = {
      {"[a-z\\-]+\\_\\/", {"a-b_/", "-_/"}, {"_/", "A-_/"}},
      {"a{,3}b", {"b", "aaab"}, {"aaaab", "a{,3}b"}},
      {"x{,}", {"", "xxxx"}, {"x{,}"}},
      {"\\012\\101\\0\\a", {std::string("\nA\0\a", 4)}, {"\n101\0\a"}},
      {"\\\xC3\xA9+", {"\xC3\xA9\xC3\xA9"}, {"\\\xC3\xA9"}},
      {"^a|^b$|c$", {"a", "b", "c"}, {"ab", ""}},
      {"[\\1\\12\\47]+", {"\x01\n'"}, {"1"}},
      {std::string("[\0-\0]", 5), {std::string(1, '\0')}, {"-"}},
  };
  for (const auto& [pattern, ok, bad] : cases) {
    const auto g = regex(pattern);
    for (const std::string& t : ok) EXPECT_TRUE(whole(*g, t)) << pattern << " " << ::testing::PrintToString(t);
    for (const std::string& t : bad) EXPECT_FALSE(whole(*g, t)) << pattern << " " << ::testing::PrintToString(t);
  }
}

TEST(Grammar, GbnfTextsAreTakenWholeOrNotAtAll) {
  const auto g = gbnf(R"(# a list of small numbers or quoted words
root  ::= item ("," ws item)*
item  ::= "\"" [a-z]+ "\"" | num
num   ::= [1-9] [0-9]{0,2} | "0"
ws    ::= [ \t\n]?
)");
  for (const std::string ok : {"0", "\"ab\"", "12,\"x\", 999,\n0", "100"}) EXPECT_TRUE(whole(*g, ok)) << ok;
  for (const std::string bad : {"", "01", "1000", "\"\"", "\"A\"", "1,", "1,  2", "1 ,2"})
    EXPECT_FALSE(whole(*g, bad)) << bad;

  // Alternatives on lines below the first, braces, escapes and `.`.
  const auto h = gbnf("root ::= \"x\"{2} a\n     | b{,2} \"!\" # comment\n"
                      "a ::= .{1,} \"\\u00e9\"\nb ::= [\\x41-\\x43\\]]\n");
  for (const std::string ok : {"xx\n\xC3\xA9", "xxyy\xC3\xA9", "!", "A]!", "CC!"}) EXPECT_TRUE(whole(*h, ok)) << ok;
  for (const std::string bad : {"xx\xC3\xA9", "x\xC3\xA9", "AAA!", "D!", "A"}) EXPECT_FALSE(whole(*h, bad)) << bad;

  const auto yes = gbnf("root ::= \"yes\" | \"yes!\"\n");
  GrammarConstraint c(*yes);
  ASSERT_TRUE(c.feed("yes"));
  EXPECT_TRUE(c.can_end());
  EXPECT_FALSE(c.done());  // "!" may still come
  ASSERT_TRUE(c.feed("!"));
  EXPECT_TRUE(c.done());
  EXPECT_FALSE(c.accepts("!"));
  EXPECT_FALSE(c.feed("!"));
  EXPECT_TRUE(c.done());  // a refused feed leaves the state as it was
}

// Random texts over an alphabet, judged by the constraint and by
// std::regex_match; random walks of the constraint that end where it can,
// matched by std::regex. The alphabet leaves out '\r' and non-ASCII:
// ECMAScript's `.` excludes '\r' and its \s is Unicode's.
TEST(Grammar, RegularExpressionsAgreeWithStdRegex) {
  const std::vector<std::string> patterns = {
      "[a-c]+",
      "ab|cd*",
      "(ab)*c?",
      "\\d{2,4}-\\w+",
      "x{3}|y{1,}|z{0,2}",
      "[^a]b.",
      "(a|b)*abb",
      "(?:[0-9]{1,3}\\.){3}[0-9]{1,3}",
      "\\{\"k\": (true|false)\\}",
      "[\\s,]*[-+]?[0-9]*\\.?[0-9]+",
      "^(a?){2}a{2}$",
      "(?P<year>\\d{4})-(?<m>0[1-9]|1[0-2])",
      "[a\\]]+[a-]",
      "\\x41\\u0042\\.\\t",
      "(a*)*b",
      "a+?b??",
  };
  std::mt19937 rng(7);
  const std::string alphabet = "abcdkxyz019-_.{}\": tfrueals,+\t\n]AB";
  for (const std::string& p : patterns) {
    SCOPED_TRACE(p);
    const auto g = regex(p);
    // std::regex has no named groups: write them plain for it.
    std::string ecma = p;
    for (const std::string named : {"?P<year>", "?<m>"})
      if (const size_t at = ecma.find(named); at != std::string::npos) ecma.erase(at, named.size());
    const std::regex oracle(ecma);
    int matched = 0;
    for (int i = 0; i < 3000; ++i) {
      std::string s;
      const int len = int(rng() % 9);
      for (int k = 0; k < len; ++k) s += alphabet[rng() % alphabet.size()];
      if (i % 3 == 0 && !s.empty()) {  // texts near a match: a walk's prefix with noise
        GrammarConstraint w(*g);
        std::string walk;
        for (int k = 0, walk_len = int(rng() % 24); k < walk_len; ++k) {
          std::vector<char> next;
          for (char c : alphabet)
            if (w.accepts(std::string(1, c))) next.push_back(c);
          if (next.empty()) break;
          walk += next[rng() % next.size()];
          w.feed(walk.substr(walk.size() - 1));
        }
        s = walk;
      }
      const bool want = std::regex_match(s, oracle);
      matched += want;
      EXPECT_EQ(whole(*g, s), want) << ::testing::PrintToString(s);
    }
    EXPECT_GT(matched, 0) << "no random text matched: the comparison says little";
    // Walks over every byte: each step has a byte to go on (or the text may
    // end), and each text ended where the constraint allows matches.
    for (int i = 0; i < 200; ++i) {
      GrammarConstraint w(*g);
      std::string text;
      for (int step = 0; step < 40; ++step) {
        if (w.can_end() && (w.done() || rng() % 4 == 0)) break;
        std::vector<unsigned char> next;
        for (int b = 0; b < 256; ++b)
          if (w.accepts(std::string(1, char(b)))) next.push_back(uint8_t(b));
        ASSERT_FALSE(next.empty()) << "dead end after " << ::testing::PrintToString(text);
        // ASCII only, where std::regex and the grammar agree on classes.
        std::vector<unsigned char> ascii;
        for (unsigned char b : next)
          if (b < 0x80 && b != '\r') ascii.push_back(b);
        if (ascii.empty()) break;
        text += char(ascii[rng() % ascii.size()]);
        ASSERT_TRUE(w.feed(text.substr(text.size() - 1)));
      }
      if (w.can_end()) {
        EXPECT_TRUE(std::regex_match(text, oracle)) << ::testing::PrintToString(text);
      }
    }
  }
}

// A grammar that nests: random walks close into balanced texts.
TEST(Grammar, RecursiveRulesNestAndClose) {
  const auto g = gbnf("root ::= pair+\npair ::= \"(\" inner \")\" | \"[\" inner \"]\"\ninner ::= pair*\n");
  std::mt19937 rng(3);
  int closed = 0;
  for (int i = 0; i < 300; ++i) {
    GrammarConstraint w(*g);
    std::string text;
    for (int step = 0; step < 60 && !(w.can_end() && rng() % 3 == 0); ++step) {
      std::string next;
      for (char c : std::string("()[]x"))
        if (w.accepts(std::string(1, c))) next += c;
      ASSERT_FALSE(next.empty()) << text;
      EXPECT_EQ(next.find('x'), std::string::npos);
      text += next[rng() % next.size()];
      ASSERT_TRUE(w.feed(text.substr(text.size() - 1)));
    }
    if (!w.can_end()) continue;
    ++closed;
    std::string open;
    for (char c : text) {
      if (c == '(' || c == '[') open += c;
      else {
        ASSERT_FALSE(open.empty()) << text;
        EXPECT_EQ(open.back(), c == ')' ? '(' : '[') << text;
        open.pop_back();
      }
    }
    EXPECT_TRUE(open.empty()) << text;
  }
  EXPECT_GT(closed, 50);
  // Deep chains of rules expand without recursion on the C++ stack.
  std::string chain = "root ::= r0\n";
  for (int i = 0; i < 20000; ++i) chain += "r" + std::to_string(i) + " ::= r" + std::to_string(i + 1) + " \"x\"\n";
  chain += "r20000 ::= \"y\"\n";
  const auto deep = gbnf(chain);
  EXPECT_TRUE(whole(*deep, "y" + std::string(20000, 'x')));
  EXPECT_FALSE(whole(*deep, "y" + std::string(19999, 'x')));
}

// A character split across tokens is allowed exactly when one of its
// completions is.
TEST(Grammar, CharactersSplitAcrossTokens) {
  const auto g = gbnf("root ::= [\\u03b1-\\u03c9]+ \"\\u00e9\"\n");  // Greek small letters, then é
  GrammarConstraint c(*g);
  EXPECT_TRUE(c.accepts("\xCE"));       // α (CE B1) .. ο (CE BF)
  EXPECT_TRUE(c.accepts("\xCF"));       // π (CF 80) .. ω (CF 89)
  EXPECT_FALSE(c.accepts("\xC3"));      // é may not come first
  EXPECT_FALSE(c.accepts("\xCE\xB0"));  // ΰ, just before α
  EXPECT_FALSE(c.accepts("\xCF\x8A"));  // ϊ, just after ω
  EXPECT_FALSE(c.accepts("\xE0"));
  ASSERT_TRUE(c.feed("\xCE"));
  ASSERT_TRUE(c.feed("\xB1"));
  EXPECT_TRUE(c.accepts("\xC3"));
  EXPECT_FALSE(c.can_end());
  ASSERT_TRUE(c.feed("\xC3"));
  EXPECT_FALSE(c.can_end());  // inside é
  ASSERT_TRUE(c.feed("\xA9"));
  EXPECT_TRUE(c.done());
  // Strict UTF-8 under `.`: overlong forms, surrogates and bytes past
  // U+10FFFF are refused.
  const auto any = gbnf("root ::= .*\n");
  for (const std::string bad : {"\xC0\x80", "\xE0\x80\x80", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xF5", "\x80"})
    EXPECT_FALSE(GrammarConstraint(*any).accepts(bad)) << ::testing::PrintToString(bad);
  for (const std::string ok : {"\xED\x9F\xBF", "\xF4\x8F\xBF\xBF", "\xE0\xA0\x80", "\xF0\x90\x80\x80"})
    EXPECT_TRUE(whole(*any, ok)) << ::testing::PrintToString(ok);
}

// An ambiguous grammar whose places multiply is cut at kMaxStacks: the
// first are kept, so the walk goes on and can still end; and a grammar of
// many alternatives (an enum of words) is read whole.
TEST(Grammar, AmbiguityIsCappedNotExploded) {
  // After n a's, 2^n ways to read the b's to come (p or q for each).
  const auto g = gbnf("root ::= \"a\" root p | \"a\" root q | \"\"\np ::= \"b\"\nq ::= \"b\"\n");
  // 60 steps of 16,384 places make some 2 million stack nodes: the first
  // mask rebuilds the arena from the current places (kMaxNodes), and the
  // walk and its mask go on as before.
  GrammarConstraint c(*g);
  const std::vector<std::string> tokens = {"a", "b", "ab", "ba", "bb", "aab", "c", ""};
  const GrammarVocabulary vocab(tokens);
  for (int i = 0; i < 60; ++i) ASSERT_TRUE(c.feed("a")) << i;
  EXPECT_TRUE(c.capped());
  int b = 0;
  while (!c.can_end() && b < 60) {
    std::vector<float> row(tokens.size(), 0.f);
    c.mask(vocab, row.data());
    for (size_t t = 0; t < tokens.size(); ++t) ASSERT_EQ(row[t] == 0.f, !tokens[t].empty() && c.accepts(tokens[t])) << t;
    ASSERT_TRUE(c.feed("b"));
    ++b;
  }
  EXPECT_EQ(b, 60);  // what is kept still closes, and as the grammar says
  EXPECT_TRUE(c.done());
  std::string words = "root ::= w0";
  for (int i = 1; i < 3000; ++i) words += " | w" + std::to_string(i);
  words += "\n";
  for (int i = 0; i < 3000; ++i) words += "w" + std::to_string(i) + " ::= \"word" + std::to_string(i) + "\"\n";
  const auto many = gbnf(words);
  for (const std::string w : {"word0", "word2999", "word1234"}) EXPECT_TRUE(whole(*many, w)) << w;
  EXPECT_FALSE(whole(*many, "word3000"));
  GrammarConstraint m(*many);
  EXPECT_FALSE(m.capped());
}

// The mask leaves exactly the tokens whose bytes accepts() takes, at every
// step of random walks, with states that recur (its kept masks) included.
void check_mask(const Grammar& g, const std::vector<std::string>& tokens, int walks, int steps, uint32_t seed) {
  const GrammarVocabulary vocab(tokens);
  std::mt19937 rng(seed);
  for (int w = 0; w < walks; ++w) {
    GrammarConstraint c(g);
    for (int s = 0; s < steps; ++s) {
      std::vector<float> row(tokens.size(), 0.f);
      const int64_t left = c.mask(vocab, row.data());
      std::vector<size_t> ok;
      for (size_t t = 0; t < tokens.size(); ++t) {
        const bool brute = !tokens[t].empty() && c.accepts(tokens[t]);
        ASSERT_EQ(row[t] == 0.f, brute) << "token " << ::testing::PrintToString(tokens[t]) << " at step " << s;
        if (brute) ok.push_back(t);
      }
      ASSERT_EQ(left, int64_t(ok.size()));
      if (ok.empty() || (c.can_end() && rng() % 8 == 0)) break;
      ASSERT_TRUE(c.feed(tokens[ok[rng() % ok.size()]]));
    }
  }
}

TEST(Grammar, MaskEqualsTryingEveryToken) {
  // Tokens of 1-4 pieces: ASCII, whole and partial multi-byte characters.
  const std::vector<std::string> pieces = {"a", "b", "1", "9", " ", "\"", ",", "{", "}", "\n", "x",
                                           "\xCE", "\xB1", "\xCE\xB1", "\xC3\xA9", "\xE2\x82", "\xAC", "\xF0\x9F\x98"};
  std::mt19937 rng(11);
  std::vector<std::string> tokens = {""};
  for (int i = 0; i < 3000; ++i) {
    std::string t;
    for (int k = 0, n = 1 + int(rng() % 4); k < n; ++k) t += pieces[rng() % pieces.size()];
    tokens.push_back(t);
  }
  const auto json_ish = gbnf(R"(root ::= "{" ws (pair ("," ws pair)*)? "}"
pair ::= "\"" [a-z\u00e9\u03b1-\u03c9]* "\"" ws ":" ws num ws
num ::= "-"? [0-9]+
ws ::= [ \n]{0,2}
)");
  check_mask(*json_ish, tokens, 30, 25, 1);
  check_mask(*regex("(\\w|\xCE\xB1| )*[19]{2,}"), tokens, 30, 25, 2);
  check_mask(*regex("[^\"]*\""), tokens, 10, 20, 3);
}

// A grammar of thousands of places that give every trie node a state of
// its own: the mask stops at kMaxMaskWork, leaves only tokens that fit
// (never none), and says it was capped.
TEST(Grammar, AnAmbiguousGrammarsMaskIsBounded) {
  const std::vector<std::string>& tokens = gpt2_tokens();
  ASSERT_FALSE(tokens.empty()) << "no GPT-2 vocabulary (run scripts/fetch_data.sh)";
  const GrammarVocabulary vocab(tokens);
  const auto g = gbnf("root ::= s\ns ::= [a-z] s [b-y] | [a-z] s \"z\" | [a-z] s \"1\" | \"\"\n");
  GrammarConstraint c(*g);
  ASSERT_TRUE(c.feed("abcdefghijkl"));
  std::vector<float> row(tokens.size(), 0.f);
  const int64_t left = c.mask(vocab, row.data());
  EXPECT_TRUE(c.capped());
  EXPECT_GT(left, 0);
  int64_t finite = 0;
  for (size_t t = 0; t < tokens.size(); ++t)
    if (row[t] == 0.f) {
      ++finite;
      if (finite % 50 == 1) {
        EXPECT_TRUE(c.accepts(tokens[t])) << ::testing::PrintToString(tokens[t]);
      }
    }
  EXPECT_EQ(finite, left);
}

// A grammar whose places fan out (one rule of 30,000 alternatives) costs
// 30,000 expansions a byte: the mask's budget counts them too.
TEST(Grammar, AWideGrammarsMaskIsBounded) {
  const std::vector<std::string>& tokens = gpt2_tokens();
  ASSERT_FALSE(tokens.empty()) << "no GPT-2 vocabulary (run scripts/fetch_data.sh)";
  const GrammarVocabulary vocab(tokens);
  std::string wide = "root ::= x x x x x\nx ::= s";
  for (int i = 1; i < 30000; ++i) wide += " | s";
  wide += "\ns ::= .\n";
  const auto g = gbnf(wide);
  GrammarConstraint c(*g);
  for (int step = 0; step < 3; ++step) {
    std::vector<float> row(tokens.size(), 0.f);
    EXPECT_GT(c.mask(vocab, row.data()), 0);
    EXPECT_TRUE(c.capped());
    ASSERT_TRUE(c.feed("a"));
  }
  std::string wider = "root ::= x\nx ::= s";
  for (int i = 1; i < 70000; ++i) wider += " | s";
  wider += "\ns ::= .\n";
  const auto too_wide = gbnf(wider);
  EXPECT_THROW(GrammarConstraint{*too_wide}, core::ConfigError);
}

TEST(Grammar, MaskEqualsTryingEveryGpt2Token) {
  const std::vector<std::string>& tokens = gpt2_tokens();
  ASSERT_FALSE(tokens.empty()) << "no GPT-2 vocabulary (run scripts/fetch_data.sh)";
  check_mask(*gbnf("root ::= \"The answer is \" (\"yes\" | \"no\") \".\" [ \\n]{0,1}\n"), tokens, 3, 8, 5);
  check_mask(*regex("[A-Z][a-z]+( [a-z]+){0,6}\\."), tokens, 3, 6, 6);
}

}  // namespace
}  // namespace brisk
