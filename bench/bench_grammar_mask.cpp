// The grammar mask alone (infer::GrammarConstraint::mask) over GPT-2's
// 50,257 tokens: microseconds per mask at fixed points of a text, for GBNF
// grammars and regular expressions, first at a state (walking the token
// trie: "cold") and again at the same state (a kept mask: "kept"), against
// the peer the trie replaces: trying every token (accepts() per token).
// Each row's three timings run interleaved in every round; the table shows
// medians and their [min-max] over --reps rounds of --masks masks. One
// thread.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_cli.h"
#include "brisk/data/tokenizer.h"
#include "brisk/infer/grammar.h"
#include "brisk/infer/grammar_constraint.h"

using namespace brisk;
using bench_cli::median;

namespace {

struct Options {
  int reps = 9, masks = 5;
  std::string vocab_dir, json_path = "bench/results/grammar_mask.json";
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&] { return std::string(bench_cli::flag_value(argc, argv, i, "bench_grammar_mask")); };
    if (a == "--reps") o.reps = int(bench_cli::int_value(value().c_str(), "--reps", "bench_grammar_mask", 1));
    else if (a == "--masks") o.masks = int(bench_cli::int_value(value().c_str(), "--masks", "bench_grammar_mask", 1));
    else if (a == "--vocab-dir") o.vocab_dir = value();
    else if (a == "--json") o.json_path = value();
    else {
      std::fprintf(stderr, "usage: bench_grammar_mask [--reps 9] [--masks 5] [--vocab-dir DIR] [--json PATH]\n");
      std::exit(a == "--help" ? 0 : 2);
    }
  }
  return o;
}

// The peer: every token tried on the constraint.
int64_t mask_by_trying(const std::vector<std::string>& bytes, const infer::GrammarConstraint& g, float* row) {
  int64_t left = 0;
  for (size_t t = 0; t < bytes.size(); ++t) {
    if (!bytes[t].empty() && g.accepts(bytes[t])) ++left;
    else row[t] = -std::numeric_limits<float>::infinity();
  }
  return left;
}

struct Point {
  std::string name, text;
  const infer::Grammar* grammar;
};

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  std::unique_ptr<data::Tokenizer> tok;
  try {
    tok = data::make_tokenizer("gpt2", o.vocab_dir);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_grammar_mask: %s\n", e.what());
    return 2;
  }
  std::vector<std::string> bytes;
  for (int32_t id = 0; id < int32_t(tok->vocab_size()); ++id) bytes.push_back(tok->decode(std::span<const int32_t>(&id, 1)));
  const infer::GrammarVocabulary vocab(bytes);
  // llama.cpp's list grammar, shortened, and two regular expressions.
  const auto list = infer::Grammar::gbnf(R"(root ::= item+
item ::= "- " [^\r\n\x0b\x0c\x85\u2028\u2029]+ "\n"
)", "list");
  const auto date = infer::Grammar::regex(R"(\d{4}-(0[1-9]|1[0-2])-\d{2})", "date");
  const auto sentence = infer::Grammar::regex(R"([A-Z][a-z]+( [a-z]+){2,12}\.)", "sentence");
  const std::vector<Point> points = {
      {"list: an item's first byte", "", list.get()},
      {"list: inside an item", "- eggs and mi", list.get()},
      {"date: the month", "2026-", date.get()},
      {"sentence: after a word", "The cat", sentence.get()},
  };
  std::printf("bench_grammar_mask: %zu tokens (GPT-2), median [min-max] of %d rounds of %d masks, one thread\n",
              bytes.size(), o.reps, o.masks);
  std::printf("%-28s %7s %20s %20s %22s\n", "point", "left", "cold (us)", "kept (us)", "trying every token (us)");
  std::vector<float> row(bytes.size());
  nlohmann::json rows = nlohmann::json::array();
  for (const Point& p : points) {
    infer::GrammarConstraint start(*p.grammar);
    if (!start.feed(p.text)) {
      std::fprintf(stderr, "bench_grammar_mask: the grammar refuses %s\n", p.text.c_str());
      return 1;
    }
    infer::GrammarConstraint kept = start;
    std::vector<double> t[3];
    int64_t left[3] = {0, 0, 0};
    for (int rep = 0; rep <= o.reps; ++rep) {  // rep 0 warms up
      for (int which = 0; which < 3; ++which) {
        double us = 0;
        for (int m = 0; m < o.masks; ++m) {
          infer::GrammarConstraint cold = start;  // copied outside the timing: no kept mask
          std::fill(row.begin(), row.end(), 0.f);
          const auto t0 = std::chrono::steady_clock::now();
          left[which] = which == 0   ? cold.mask(vocab, row.data())
                        : which == 1 ? kept.mask(vocab, row.data())
                                     : mask_by_trying(bytes, start, row.data());
          us += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
        }
        if (rep > 0) t[which].push_back(us / o.masks);
      }
    }
    if (left[0] != left[2] || left[1] != left[2]) {
      std::fprintf(stderr, "bench_grammar_mask: %s: the mask leaves %lld tokens, trying each %lld\n", p.name.c_str(),
                   (long long)left[0], (long long)left[2]);
      return 1;
    }
    std::printf("%-28s %7lld", p.name.c_str(), (long long)left[0]);
    nlohmann::json r = {{"point", p.name}, {"text", p.text}, {"grammar", p.grammar->source()}, {"tokens_left", left[0]}};
    const char* names[3] = {"cold", "kept", "try_every_token"};
    for (int which = 0; which < 3; ++which) {
      const auto [lo, hi] = std::minmax_element(t[which].begin(), t[which].end());
      std::printf(" %8.0f [%4.0f-%5.0f]", median(t[which]), *lo, *hi);
      r[std::string(names[which]) + "_us"] = t[which];
      r[std::string(names[which]) + "_median_us"] = median(t[which]);
    }
    std::printf("\n");
    rows.push_back(r);
  }
  const nlohmann::json out = {{"benchmark", "bench_grammar_mask"}, {"tokens", bytes.size()}, {"reps", o.reps},
                              {"masks", o.masks}, {"rows", rows}};
  bench_cli::write_json(o.json_path, out.dump(2) + "\n", "bench_grammar_mask");
  std::printf("\nwrote %s\n", o.json_path.c_str());
  return 0;
}
