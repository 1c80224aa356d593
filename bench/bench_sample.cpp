// The sampler alone (infer::sample): microseconds per draw over a GPT-2
// vocabulary (50,304 logits) under the settings clients ask for, on two
// distributions: "broad" (normal logits, sd 1.5: most tokens within the
// filters' reach, like a small or early model, or any model at a high
// temperature) and "peaked" (the same plus a few tokens far above: a
// confident model). Greedy, one vectorised pass, is the floor.
//
// Times are medians over --reps blocks of --draws draws each (a new draw
// index per draw, the logits unchanged: no penalties are set, and logprobs
// only with greedy, so sample() does not modify them); the settings run
// interleaved within each block round.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "brisk/infer/sampler.h"
#include "bench_cli.h"

using brisk::bench_cli::median;

using namespace brisk;

namespace {

struct Options {
  int reps = 15, draws = 200;
  std::string json_path = "bench/results/sample.json";
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&] { return std::string(bench_cli::flag_value(argc, argv, i, "bench_sample")); };
    if (a == "--reps") o.reps = int(bench_cli::int_value(value().c_str(), "--reps", "bench_sample", 1));
    else if (a == "--draws") o.draws = int(bench_cli::int_value(value().c_str(), "--draws", "bench_sample", 1));
    else if (a == "--json") o.json_path = value();
    else {
      std::fprintf(stderr, "usage: bench_sample [--reps 15] [--draws 200] [--json PATH]\n");
      std::exit(a == "--help" ? 0 : 2);
    }
  }
  if (o.reps < 1 || o.draws < 1) {
    std::fprintf(stderr, "bench_sample: --reps and --draws must be >= 1\n");
    std::exit(2);
  }
  return o;
}

struct Setting {
  const char* name;
  infer::SamplingParams p;
};

infer::SamplingParams params(float temperature, int top_k, float top_p, float min_p, int logprobs = -1) {
  infer::SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  p.logprobs = logprobs;
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  constexpr int64_t kVocab = 50304;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.f, 1.5f);
  std::vector<float> broad(static_cast<size_t>(kVocab));
  for (float& x : broad) x = normal(rng);
  std::vector<float> peaked = broad;
  for (int i = 0; i < 8; ++i) peaked[size_t(rng() % kVocab)] = 14.f - float(i) * 0.5f;
  const std::vector<Setting> settings = {
      {"greedy", params(0, 0, 1, 0)},
      {"greedy, logprobs 5", params(0, 0, 1, 0, 5)},
      {"T 0.8", params(0.8f, 0, 1, 0)},
      {"T 0.8, top-p 0.95", params(0.8f, 0, 0.95f, 0)},
      {"T 0.8, top-k 40", params(0.8f, 40, 1, 0)},
      {"T 1, min-p 0.05", params(1, 0, 1, 0.05f)},
      {"T 0.7, top-k 50, top-p 0.9", params(0.7f, 50, 0.9f, 0)},
  };
  std::printf("bench_sample: %lld logits, median of %d blocks of %d draws, one thread\n", (long long)kVocab, o.reps,
              o.draws);
  std::printf("%-28s %14s %14s\n", "setting (us per draw)", "broad", "peaked");
  nlohmann::json rows = nlohmann::json::array();
  infer::SamplerScratch scratch;
  infer::SequenceHistory history(kVocab);
  uint64_t index = 0;
  volatile int32_t sink = 0;
  // times[setting][distribution][rep]
  std::vector<std::vector<std::vector<double>>> times(settings.size(), std::vector<std::vector<double>>(2));
  for (int rep = 0; rep < o.reps + 1; ++rep) {  // rep 0 warms up
    for (size_t d = 0; d < 2; ++d) {
      std::vector<float>& logits = d == 0 ? broad : peaked;
      for (size_t s = 0; s < settings.size(); ++s) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < o.draws; ++i)
          sink = infer::sample(logits.data(), kVocab, settings[s].p, history, index++, scratch).token;
        const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / o.draws;
        if (rep > 0) times[s][d].push_back(us);
      }
    }
  }
  for (size_t s = 0; s < settings.size(); ++s) {
    const char* name = settings[s].name;
    const double b = median(times[s][0]), p = median(times[s][1]);
    const auto [blo, bhi] = std::minmax_element(times[s][0].begin(), times[s][0].end());
    const auto [plo, phi] = std::minmax_element(times[s][1].begin(), times[s][1].end());
    std::printf("%-28s %6.1f [%.1f-%.1f] %6.1f [%.1f-%.1f]\n", name, b, *blo, *bhi, p, *plo, *phi);
    rows.push_back({{"setting", name}, {"broad_us", times[s][0]}, {"peaked_us", times[s][1]},
                    {"broad_median_us", b}, {"peaked_median_us", p}});
  }
  (void)sink;
  const nlohmann::json out = {{"benchmark", "bench_sample"}, {"vocab", kVocab}, {"reps", o.reps},
                              {"draws", o.draws}, {"rows", rows}};
  const std::filesystem::path path(o.json_path);
  bench_cli::write_json(path.string(), out.dump(2) + "\n", "bench_sample");
  std::printf("\nwrote %s\n", o.json_path.c_str());
  return 0;
}
