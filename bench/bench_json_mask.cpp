// The JSON mask alone (infer::JsonVocabulary::mask) over GPT-2's 50,257
// tokens: microseconds per mask at fixed points of a text, for
// response_format json_object and for a schema, against the peer the
// shortcuts replace: trying every token on the automaton (accepts() per
// token). Each row's two timings run interleaved in every round; the table
// shows medians and their [min-max] over --reps rounds of --masks masks.
// One thread.
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
#include "brisk/infer/json_constraint.h"
#include "brisk/infer/json_schema.h"

using namespace brisk;
using bench_cli::median;

namespace {

struct Options {
  int reps = 9, masks = 10;
  std::string vocab_dir, json_path = "bench/results/json_mask.json";
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&] { return std::string(bench_cli::flag_value(argc, argv, i, "bench_json_mask")); };
    if (a == "--reps") o.reps = int(bench_cli::int_value(value().c_str(), "--reps", "bench_json_mask", 1));
    else if (a == "--masks") o.masks = int(bench_cli::int_value(value().c_str(), "--masks", "bench_json_mask", 1));
    else if (a == "--vocab-dir") o.vocab_dir = value();
    else if (a == "--json") o.json_path = value();
    else {
      std::fprintf(stderr, "usage: bench_json_mask [--reps 9] [--masks 10] [--vocab-dir DIR] [--json PATH]\n");
      std::exit(a == "--help" ? 0 : 2);
    }
  }
  return o;
}

// The peer: every token tried on a copy of the automaton.
int64_t mask_by_trying(const infer::JsonVocabulary& vocab, const infer::JsonConstraint& json, float* row) {
  int64_t left = 0;
  for (int32_t t = 0; t < int32_t(vocab.size()); ++t) {
    const bool fits = !vocab.bytes(t).empty() && json.accepts(vocab.bytes(t));
    if (fits) ++left;
    else row[t] = -std::numeric_limits<float>::infinity();
  }
  return left;
}

struct Point {
  std::string name, text;
  const infer::JsonSchema* schema;  // null: json_object
};

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  std::unique_ptr<data::Tokenizer> tok;
  try {
    tok = data::make_tokenizer("gpt2", o.vocab_dir);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_json_mask: %s\n", e.what());
    return 2;
  }
  std::vector<std::string> bytes;
  for (int32_t id = 0; id < int32_t(tok->vocab_size()); ++id) bytes.push_back(tok->decode(std::span<const int32_t>(&id, 1)));
  const infer::JsonVocabulary vocab(bytes);
  const auto schema = infer::JsonSchema::compile_text(
      R"({"type":"object","properties":{"name":{"type":"string","maxLength":20},"age":{"type":"integer"},)"
      R"("tags":{"type":"array","items":{"enum":["red","green","blue"]}}},"required":["name","age"]})");
  const std::vector<Point> points = {
      {"object: before the first key", "{", nullptr},
      {"object: inside a string", R"({"name": "Jo)", nullptr},
      {"object: a nested value", R"({"name": "Jo", "a": [1, {"b":)", nullptr},
      {"object: inside a number", R"({"a": 12)", nullptr},
      {"schema: before the first key", "{", schema.get()},
      {"schema: a maxLength string", R"({"name": "Jo)", schema.get()},
      {"schema: after a value", R"({"name": "Jo")", schema.get()},
      {"schema: an enum's array", R"({"name": "Jo", "age": 3, "tags": [)", schema.get()},
  };
  std::printf("bench_json_mask: %lld tokens (GPT-2), median [min-max] of %d rounds of %d masks, one thread\n",
              (long long)vocab.size(), o.reps, o.masks);
  std::printf("%-32s %8s %22s %22s %8s\n", "point", "left", "mask (us)", "trying every token (us)", "speedup");
  std::vector<float> row(size_t(vocab.size()));
  nlohmann::json rows = nlohmann::json::array();
  for (const Point& p : points) {
    infer::JsonConstraint json = p.schema ? infer::JsonConstraint(*p.schema) : infer::JsonConstraint();
    if (!json.feed(p.text)) {
      std::fprintf(stderr, "bench_json_mask: the automaton refuses %s\n", p.text.c_str());
      return 1;
    }
    std::vector<double> fast, slow;
    int64_t left_fast = 0, left_slow = 0;
    for (int rep = 0; rep <= o.reps; ++rep) {  // rep 0 warms up
      for (int which = 0; which < 2; ++which) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int m = 0; m < o.masks; ++m) {
          std::fill(row.begin(), row.end(), 0.f);
          (which == 0 ? left_fast : left_slow) =
              which == 0 ? vocab.mask(json, row.data()) : mask_by_trying(vocab, json, row.data());
        }
        const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
                          o.masks;
        if (rep > 0) (which == 0 ? fast : slow).push_back(us);
      }
    }
    if (left_fast != left_slow) {
      std::fprintf(stderr, "bench_json_mask: %s: the mask leaves %lld tokens, trying each %lld\n", p.name.c_str(),
                   (long long)left_fast, (long long)left_slow);
      return 1;
    }
    const auto [flo, fhi] = std::minmax_element(fast.begin(), fast.end());
    const auto [slo, shi] = std::minmax_element(slow.begin(), slow.end());
    const double f = median(fast), s = median(slow);
    std::printf("%-32s %8lld %8.0f [%5.0f-%5.0f] %8.0f [%5.0f-%5.0f] %7.1fx\n", p.name.c_str(), (long long)left_fast,
                f, *flo, *fhi, s, *slo, *shi, s / f);
    rows.push_back({{"point", p.name}, {"text", p.text}, {"tokens_left", left_fast}, {"mask_us", fast},
                    {"try_every_token_us", slow}, {"mask_median_us", f}, {"try_every_token_median_us", s}});
  }
  const nlohmann::json out = {{"benchmark", "bench_json_mask"}, {"tokens", vocab.size()}, {"reps", o.reps},
                              {"masks", o.masks}, {"schema", schema->text()}, {"rows", rows}};
  bench_cli::write_json(o.json_path, out.dump(2) + "\n", "bench_json_mask");
  std::printf("\nwrote %s\n", o.json_path.c_str());
  return 0;
}
