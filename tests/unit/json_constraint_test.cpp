// The JSON object automaton (infer::JsonConstraint) against nlohmann's
// parser: every document it lets through to the end is a JSON object the
// parser reads, it refuses what the parser refuses, and random walks over
// the bytes it allows always stay a prefix that closes into valid JSON.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "brisk/infer/json_constraint.h"
#include "json_mask_check.h"

namespace brisk {
namespace {

// Fed whole: accepted and closed.
bool complete(const std::string& text) {
  infer::JsonConstraint j;
  return j.feed(text) && j.done();
}

TEST(JsonConstraint, AcceptsObjectsTheParserReads) {
  const std::vector<std::string> good = {
      "{}", "{ }", "{\"a\":1}", "{\"a\": [1, 2.5, -0.25e+10, 0, -0, 1E3, true, false, null]}",
      "{\"k\":{\"n\":{\"m\":[[],[{}]]}}}", "{\"s\":\"tab\\t quote\\\" back\\\\ slash\\/ \\u00e9 \\uFFFD\"}",
      "{\"utf8\":\"\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80\"}", "\n{\n  \"a\": 1,\n  \"b\": \"x\"\n}",
      "{\"\":\"\"}", "{\"a\":0.5e-3}"};
  for (const std::string& g : good) {
    EXPECT_TRUE(nlohmann::json::accept(g)) << g;
    EXPECT_TRUE(complete(g)) << g;
  }
}

TEST(JsonConstraint, RefusesWhatIsNoJsonObject) {
  const std::vector<std::string> bad = {
      "[]", "1", "\"s\"", "{a:1}", "{\"a\" 1}", "{\"a\":1,}", "{\"a\":[1,]}", "{\"a\":01}", "{\"a\":1.}",
      "{\"a\":.5}", "{\"a\":1e}", "{\"a\":-}", "{\"a\":tru}", "{\"a\":True}", "{\"a\":\"\x01\"}",
      "{\"a\":\"\\x\"}", "{\"a\":\"\\u12G4\"}", "{\"a\":\"\\uD800\"}", "{\"a\":\"\xC0\xAF\"}",
      "{\"a\":\"\xED\xA0\x80\"}", "{\"a\":\"\xFF\"}", "{\"a\":1]", "{\"a\":[1}", "{}{}", "{} x"};
  for (const std::string& b : bad) {
    EXPECT_FALSE(nlohmann::json::accept(b) && nlohmann::json::parse(b).is_object()) << b;
    EXPECT_FALSE(complete(b)) << b;
  }
  // Not yet closed is not done; whitespace is limited.
  infer::JsonConstraint j;
  EXPECT_TRUE(j.feed("{\"a\": [1, {\"b\": \"c"));
  EXPECT_FALSE(j.done());
  EXPECT_TRUE(j.accepts(std::string(100, ' ')));  // inside a string: text
  infer::JsonConstraint w;
  // Between tokens: one space, or a newline and an indent (llama.cpp's rule).
  const std::string indent(infer::JsonConstraint::kMaxIndent, ' ');
  for (const std::string& ok : std::vector<std::string>{" {", "\n{", "\n" + indent + "{", "\n\t\t{"}) EXPECT_TRUE(w.accepts(ok)) << ok;
  for (const std::string& bad : std::vector<std::string>{"  {", "\n\n{", " \n{", "\t{", "\r\n{", "\n" + indent + " {"})
    EXPECT_FALSE(w.accepts(bad)) << ::testing::PrintToString(bad);
  infer::JsonConstraint pretty;
  EXPECT_TRUE(pretty.feed("{\n  \"a\": [\n    1,\n    2\n  ],\n  \"b\": { \"c\" : null }\n}"));
  EXPECT_TRUE(pretty.done());
  // A gap's whitespace comes from at most kMaxGapTokens tokens (feeds):
  // GPT-2 has no token of two spaces, and a model spent its tokens on
  // " " after " ".
  for (const std::vector<std::string>& tokens :
       {std::vector<std::string>{"{", "\n", "  "}, {"{", "\n  "}, {"{\n", " "}, {"{", " "}}) {
    infer::JsonConstraint g;
    for (const std::string& t : tokens) EXPECT_TRUE(g.feed(t)) << ::testing::PrintToString(t);
    EXPECT_TRUE(g.accepts("\"")) << "after " << ::testing::PrintToString(tokens.back());
  }
  infer::JsonConstraint g;
  ASSERT_TRUE(g.feed("{"));
  ASSERT_TRUE(g.feed("\n"));
  ASSERT_TRUE(g.feed(" "));
  EXPECT_FALSE(g.accepts(" "));        // a third token of the gap
  EXPECT_TRUE(g.accepts("\"a\""));   // the key may come
  ASSERT_TRUE(g.feed("\"a\":"));
  EXPECT_TRUE(g.accepts("\n"));       // a new gap counts anew
}

// Random walks: each step draws a byte among those the automaton allows
// (from an alphabet that makes closing likely). Every walk that closes is an
// object the parser reads; a walk cut anywhere is still a prefix, and the
// automaton itself never allows a byte after the close.
TEST(JsonConstraint, RandomWalksCloseIntoObjectsTheParserReads) {
  const std::string alphabet = "{}[]\":,  \n-0123456789.eE+tfnrualsx\\/bu\xC3\xA9\x80";
  std::mt19937 rng(7);
  int closed = 0;
  for (int walk = 0; walk < 3000; ++walk) {
    infer::JsonConstraint j;
    std::string text;
    for (int step = 0; step < 200 && !j.done(); ++step) {
      std::vector<char> allowed;
      for (char c : alphabet)
        if (j.accepts(std::string(1, c))) allowed.push_back(c);
      // Closing brackets and quotes twice as likely: walks end.
      for (char c : {'}', ']', '"'})
        if (j.accepts(std::string(1, c))) allowed.push_back(c);
      ASSERT_FALSE(allowed.empty()) << "stuck after: " << text;
      const char c = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
      ASSERT_TRUE(j.feed(std::string(1, c)));
      text += c;
    }
    if (!j.done()) continue;
    ++closed;
    ASSERT_TRUE(nlohmann::json::accept(text)) << text << "\n" << ::testing::PrintToString(text);
    EXPECT_TRUE(nlohmann::json::parse(text).is_object()) << text;
    for (int b = 0; b < 256; ++b) EXPECT_FALSE(j.accepts(std::string(1, char(b)))) << "after the close: " << b;
  }
  EXPECT_GT(closed, 300) << "too few walks closed to check much";
}

// The mask's shortcuts (plain text inside strings, the first byte) decide
// exactly what trying every token on the automaton decides, at states from
// random walks and for tokens of every kind: plain words, quotes, escapes,
// cut UTF-8, punctuation, whitespace, the empty token.
TEST(JsonVocabulary, MaskEqualsTryingEveryToken) {
  std::vector<std::string> tokens = {"", " ", "  ", "\n", "{", "}", "[", "]", "\"", "\":", "\",", ":", ",", " {",
                                     "\\", "\\n", "\\u00", "e9", "\\ud8", "1", "12", "-", "0.", ".5", "e+", "E9",
                                     "true", "tr", "ue", "null", "false", "fal", "the", " the", "\xC3", "\xA9",
                                     "\xC3\xA9", "\xE2\x82", "\xAC", "\xF0\x9F\x98\x80", "\x01", "a\"b", "}]", "\"}"};
  std::mt19937 rng(3);
  const std::string bytes = "{}[]\":, -0123456789.eEtrufalsn\\/bu\xC3\xA9\xE2\x82\xAC";
  for (int i = 0; i < 300; ++i) {  // random tokens too
    std::string t;
    for (int k = int(rng() % 4) + 1; k > 0; --k) t += bytes[rng() % bytes.size()];
    tokens.push_back(t);
  }
  const infer::JsonVocabulary vocab(tokens);
  int states = 0, allowed_inside = 0;
  for (int walk = 0; walk < 200; ++walk) {
    infer::JsonConstraint j;
    for (int step = 0; step < 60 && !j.done(); ++step) {
      const std::vector<size_t> ok = testing::mask_checked(vocab, tokens, j);
      ASSERT_FALSE(::testing::Test::HasFailure());
      ++states;
      if (j.in_plain_string()) allowed_inside += int(ok.size());
      ASSERT_FALSE(ok.empty());
      ASSERT_TRUE(j.feed(tokens[ok[rng() % ok.size()]]));
    }
  }
  EXPECT_GT(states, 2000);
  EXPECT_GT(allowed_inside, 0) << "no state inside a string was checked";
}

}  // namespace
}  // namespace brisk
