// The recommendation rules and the score (monitor/advice.h) on synthetic run
// summaries: each rule fires on its counter past its threshold and cites the
// value and threshold; a starved run (data wait) scores below a healthy one;
// rules without a measured counter neither cost nor earn; the gradient-norm
// spike detector and the step counters read metrics rows the way the
// trainers write them; recommendations.json reads back as written.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <unistd.h>

#include "brisk/core/error.h"
#include "brisk/monitor/advice.h"
#include "brisk/monitor/run_summary.h"
#include "brisk/train/config.h"

using namespace brisk;
using monitor::Advice;
using monitor::Finding;
using monitor::RunSummary;

namespace {

// A healthy CPU run: every rule applies and none fires.
RunSummary healthy() {
  RunSummary s;
  s.has_facts = true;
  s.device = "cpu";
  s.cpu_flags = "avx2 fma";
  s.bf16_native_available = false;
  s.threads = 8;
  s.cores = 8;
  s.loader_workers = 2;
  s.batch = 16;
  s.seq = 256;
  s.precision = "fp32";
  s.precision_path = "fp32";
  s.peak_gflops = 1000;
  s.lr = 3e-4;
  s.warmup = 100;
  s.grad_clip = 1;
  s.has_memory_plan = true;
  s.memory.params = 100 << 20;
  s.memory.grads = 100 << 20;
  s.memory.optimizer_state = 200 << 20;
  s.memory.arena = size_t(600) << 20;  // 1000 MiB in all
  s.machine_ram_bytes = size_t(2) << 30;  // ~49% used
  s.peak_rss_bytes = size_t(900) << 20;
  auto& c = s.counters;
  c.steps = 500;
  c.last_step = 500;
  c.has_data_wait = true;
  c.data_wait_share = 0.01;
  c.has_mfu = true;
  c.median_mfu = 0.45;
  c.median_tokens_per_s = 5000;
  c.has_grad_norm = true;
  c.grad_norm_checked = 490;
  c.scaled = true;  // dynamic loss scaling on, no step skipped
  c.has_trend = true;  // as fast and as large at the end as at the start
  c.early_tokens_per_s = c.late_tokens_per_s = 5000;
  c.has_rss_trend = true;
  c.early_rss_mib = c.late_rss_mib = 900;
  return s;
}

const Finding& rule(const Advice& a, const std::string& name) {
  for (const Finding& f : a.findings)
    if (f.rule == name) return f;
  throw std::runtime_error("no rule " + name);
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Every "section.key" a message names, e.g. train.batch in "lower train.batch (now 16)".
std::vector<std::string> config_keys_in(const std::string& message) {
  static const std::regex key(R"(\b(model|data|train|checkpoint|dist)\.[a-z_]+)");
  std::vector<std::string> keys;
  for (auto it = std::sregex_iterator(message.begin(), message.end(), key); it != std::sregex_iterator(); ++it)
    keys.push_back(it->str());
  return keys;
}

}  // namespace

TEST(Advice, WeightsSumTo100AndEveryRuleIsListed) {
  double sum = 0;
  for (const auto& w : monitor::rule_weights()) sum += w.weight;
  EXPECT_DOUBLE_EQ(sum, 100);
  const Advice a = monitor::advise(healthy());
  ASSERT_EQ(a.findings.size(), monitor::rule_weights().size());
  for (size_t i = 0; i < a.findings.size(); ++i) {
    EXPECT_EQ(a.findings[i].rule, monitor::rule_weights()[i].rule);
    EXPECT_EQ(a.findings[i].weight, monitor::rule_weights()[i].weight);
  }
}

TEST(Advice, HealthyRunScores100) {
  const Advice a = monitor::advise(healthy());
  EXPECT_EQ(a.score, 100) << monitor::format_advice(a);
  for (const Finding& f : a.findings) {
    EXPECT_TRUE(f.applies) << f.rule;
    EXPECT_EQ(f.severity, 0) << f.rule << ": " << f.message;
  }
}

TEST(Advice, StarvedRunGetsTheDataWaitFindingAndALowerScore) {
  RunSummary starved = healthy();
  starved.loader_workers = 0;
  starved.counters.data_wait_share = 0.42;
  const Advice a = monitor::advise(starved), base = monitor::advise(healthy());
  const Finding& f = rule(a, "data_wait");
  EXPECT_EQ(std::string(f.level()), "bad");
  EXPECT_DOUBLE_EQ(f.value, 0.42);
  EXPECT_TRUE(contains(f.message, "42.0%")) << f.message;              // the value
  EXPECT_TRUE(contains(f.message, "threshold 5.00%")) << f.message;    // the threshold
  EXPECT_TRUE(contains(f.message, "train.loader_workers")) << f.message;  // what to change
  EXPECT_TRUE(contains(f.message, "now 0")) << f.message;
  EXPECT_TRUE(contains(f.counter, "data_wait_ms")) << f.counter;
  EXPECT_LT(a.score, base.score);
  EXPECT_EQ(a.score, 80);  // the whole weight (20 of 100) lost
  // The text output puts it first.
  const std::string text = monitor::format_advice(a);
  EXPECT_TRUE(contains(text, "score 80/100")) << text;
  EXPECT_LT(text.find("data_wait"), text.find("mfu")) << text;
}

// Loader threads on top of a training thread per core: the advice is not
// "more loader threads" but fewer threads of one kind or the other.
TEST(Advice, DataWaitWithTheCoresFullSuggestsFewerThreads) {
  RunSummary s = healthy();
  s.threads = 8;
  s.cores = 8;
  s.loader_workers = 2;
  s.counters.data_wait_share = 0.14;
  const Finding f = rule(monitor::advise(s), "data_wait");
  EXPECT_GT(f.severity, 0) << f.message;
  EXPECT_TRUE(contains(f.message, "train.loader_workers = 0")) << f.message;
  EXPECT_TRUE(contains(f.message, "fewer train.threads")) << f.message;
  EXPECT_FALSE(contains(f.message, "raise train.loader_workers")) << f.message;
  s.threads = 6;  // a core left for each loader thread: then more loader threads is the advice
  EXPECT_TRUE(contains(rule(monitor::advise(s), "data_wait").message, "raise train.loader_workers"));
  // One training thread has no fewer to use: fewer loader threads, one per
  // free core, or none on a single core.
  s.threads = 1;
  s.cores = 2;
  std::string one = rule(monitor::advise(s), "data_wait").message;
  EXPECT_FALSE(contains(one, "fewer train.threads")) << one;
  EXPECT_TRUE(contains(one, "train.loader_workers = 1 gives each loader thread a core")) << one;
  s.cores = 1;
  one = rule(monitor::advise(s), "data_wait").message;
  EXPECT_FALSE(contains(one, "fewer train.threads")) << one;
  EXPECT_TRUE(contains(one, "train.loader_workers = 0 builds them on the training thread")) << one;
}

TEST(Advice, DataWaitSeverityRampsBetweenThresholds) {
  RunSummary s = healthy();
  s.counters.data_wait_share = 0.05;
  EXPECT_EQ(rule(monitor::advise(s), "data_wait").severity, 0);
  s.counters.data_wait_share = 0.175;  // half way from 5% to 30%
  EXPECT_NEAR(rule(monitor::advise(s), "data_wait").severity, 0.5, 1e-12);
  s.counters.data_wait_share = 0.9;
  EXPECT_EQ(rule(monitor::advise(s), "data_wait").severity, 1);
}

TEST(Advice, LowMfuCitesThePeakAndTheProfile) {
  RunSummary s = healthy();
  s.counters.median_mfu = 0.04;
  s.profile = {{"matmul", 10, 1.0, 0.2}, {"layernorm", 10, 3.0, 0.6}};
  const Finding f = rule(monitor::advise(s), "mfu");
  EXPECT_EQ(f.severity, 1);
  EXPECT_TRUE(contains(f.message, "4.00%")) << f.message;
  EXPECT_TRUE(contains(f.message, "1000 GFLOP/s")) << f.message;
  EXPECT_TRUE(contains(f.message, "threshold 30.0%")) << f.message;
  EXPECT_TRUE(contains(f.message, "layernorm takes 60.0%")) << f.message;
}

TEST(Advice, MemoryTooFullAndTooEmpty) {
  RunSummary s = healthy();
  s.machine_ram_bytes = size_t(1050) << 20;  // the plan is 95% of it
  Finding f = rule(monitor::advise(s), "memory");
  EXPECT_EQ(f.severity, 1) << f.message;
  EXPECT_TRUE(contains(f.message, "lower train.batch")) << f.message;
  EXPECT_TRUE(contains(f.message, "raise train.recompute")) << f.message;
  EXPECT_TRUE(contains(f.message, "model.fused_classifier = true")) << f.message;
  EXPECT_TRUE(contains(f.message, "threshold 85.0%")) << f.message;

  s.machine_ram_bytes = size_t(64) << 30;  // 1.5%: headroom unused
  f = rule(monitor::advise(s), "memory");
  EXPECT_GT(f.severity, 0);
  EXPECT_LE(f.severity, 0.2);
  EXPECT_TRUE(contains(f.message, "larger train.batch")) << f.message;

  s.recompute = "full";  // recomputing while memory is free
  f = rule(monitor::advise(s), "memory");
  EXPECT_EQ(f.severity, 0.5);
  EXPECT_TRUE(contains(f.message, "train.recompute = \"none\"")) << f.message;

  s.device = "cuda";  // host memory does not limit a GPU run
  EXPECT_FALSE(rule(monitor::advise(s), "memory").applies);
}

TEST(Advice, SkippedStepsOnlyWhenScaled) {
  RunSummary s = healthy();
  s.counters.scaled = false;
  EXPECT_FALSE(rule(monitor::advise(s), "loss_scale").applies);
  s.counters.scaled = true;
  s.counters.skipped_steps = 2;  // 0.4%: the usual few while the scale comes down
  EXPECT_EQ(rule(monitor::advise(s), "loss_scale").severity, 0);
  s.counters.skipped_steps = 60;  // 12%
  s.loss_scale_init = 65536;
  const Finding f = rule(monitor::advise(s), "loss_scale");
  EXPECT_EQ(f.severity, 1);
  EXPECT_TRUE(contains(f.message, "60 of 500 steps (12.0%)")) << f.message;
  EXPECT_TRUE(contains(f.message, "train.loss_scale_init (now 65536)")) << f.message;
}

TEST(Advice, GradientSpikes) {
  RunSummary s = healthy();
  s.counters.grad_norm_spikes = 10;  // 2% of 490
  s.counters.max_spike_ratio = 14;
  s.counters.spike_steps = {40, 77};
  const Finding f = rule(monitor::advise(s), "grad_spikes");
  EXPECT_GT(f.severity, 0.3);
  EXPECT_TRUE(contains(f.message, "10 of 490 steps")) << f.message;
  EXPECT_TRUE(contains(f.message, "14.0x")) << f.message;
  EXPECT_TRUE(contains(f.message, "steps 40, 77, ...")) << f.message;
  EXPECT_TRUE(contains(f.message, "train.lr (now 0.0003)")) << f.message;
  EXPECT_TRUE(contains(f.message, "train.grad_clip (now 1)")) << f.message;
}

TEST(Advice, PrecisionAgainstCpuFlags) {
  RunSummary s = healthy();
  s.cpu_flags = "avx2 fma avx512f avx512_bf16";
  s.bf16_native_available = true;
  Finding f = rule(monitor::advise(s), "precision");
  EXPECT_EQ(f.severity, 1);
  EXPECT_TRUE(contains(f.message, "avx512_bf16")) << f.message;
  EXPECT_TRUE(contains(f.message, "train.precision = \"bf16\"")) << f.message;

  s.precision = "bf16";
  s.precision_path = "bf16-native";
  EXPECT_EQ(rule(monitor::advise(s), "precision").severity, 0);

  s.bf16_native_available = false;
  s.precision_path = "bf16-emulated";
  f = rule(monitor::advise(s), "precision");
  EXPECT_EQ(f.severity, 1);
  EXPECT_TRUE(contains(f.message, "emulated")) << f.message;
}

TEST(Advice, ThreadsAgainstCores) {
  RunSummary s = healthy();
  s.threads = 16;
  Finding f = rule(monitor::advise(s), "threads");
  EXPECT_EQ(f.severity, 1);
  EXPECT_TRUE(contains(f.message, "16 threads on 8 cores")) << f.message;
  s.threads = 1;
  f = rule(monitor::advise(s), "threads");
  EXPECT_NEAR(f.severity, 0.75, 1e-12);
  EXPECT_TRUE(contains(f.message, "train.threads = 0")) << f.message;
  s.threads = 4;  // half the cores: fine
  EXPECT_EQ(rule(monitor::advise(s), "threads").severity, 0);
}

TEST(Advice, RulesWithoutCountersNeitherCostNorEarn) {
  // An encoder run: no run_summary.json, counters from metrics.jsonl only.
  RunSummary s;
  s.kind = "encoder";
  s.counters.steps = 100;
  s.counters.has_data_wait = true;
  s.counters.data_wait_share = 0.42;
  const Advice a = monitor::advise(s);
  int applying = 0;
  for (const Finding& f : a.findings) applying += f.applies;
  EXPECT_EQ(applying, 1);  // only data_wait
  EXPECT_EQ(a.score, 0);
  EXPECT_EQ(std::string(rule(a, "precision").level()), "n/a");
  EXPECT_EQ(monitor::advise(RunSummary{}).score, -1);
}

TEST(Advice, SpikeDetectorUsesTheRunningMedian) {
  std::vector<double> g(60, 1.0);
  for (size_t i = 0; i < g.size(); ++i) g[i] = 1.0 + 0.01 * double(i % 5);
  g[30] = 7.0;  // 7x
  g[5] = 100;   // before kSpikeMinHistory: not judged
  const std::vector<double> r = monitor::grad_norm_spike_ratios(g);
  EXPECT_EQ(r[5], 0);
  EXPECT_GT(r[30], monitor::kSpikeFactor);
  for (size_t i = 10; i < r.size(); ++i) {
    if (i != 30) {
      EXPECT_LT(r[i], 2) << i;
    }
  }
}

TEST(Advice, CountersFromMetricsRows) {
  std::vector<monitor::MetricsRow> rows;
  for (int i = 1; i <= 40; ++i) {
    monitor::MetricsRow r;
    r.step = i;
    r.values = {{"loss", 3.0}, {"lr", 1e-3}, {"grad_norm", i == 25 ? 50.0 : 1.0}, {"tokens_per_s", 1000.0 + i},
                {"ms_per_step", 10.0}, {"mfu", 0.2}, {"data_wait_ms", i == 1 ? 500.0 : 1.0}, {"loss_scale", 1024.0}};
    r.flags = {{"skipped", i == 3}};
    rows.push_back(r);
  }
  monitor::MetricsRow val;  // an encoder validation row: not a step
  val.step = 40;
  val.values = {{"val.loss", 2.0}};
  rows.push_back(val);
  const monitor::StepCounters c = monitor::summarize_steps(rows);
  EXPECT_EQ(c.steps, 40);
  EXPECT_EQ(c.last_step, 40);
  EXPECT_NEAR(c.data_wait_share, 0.1, 1e-12);  // the first step's 500 ms left out
  EXPECT_DOUBLE_EQ(c.median_mfu, 0.2);
  EXPECT_TRUE(c.scaled);
  EXPECT_EQ(c.skipped_steps, 1);
  EXPECT_EQ(c.grad_norm_spikes, 1);
  ASSERT_EQ(c.spike_steps.size(), 1u);
  EXPECT_EQ(c.spike_steps[0], 25);
  EXPECT_EQ(c.grad_norm_checked, 30);
  // Trends over steps 2-40: steps 11-19 (median: step 15's) against 32-40 (step 36's); no rss_mib logged.
  EXPECT_TRUE(c.has_trend);
  EXPECT_DOUBLE_EQ(c.early_tokens_per_s, 1015.0);
  EXPECT_DOUBLE_EQ(c.late_tokens_per_s, 1036.0);
  EXPECT_FALSE(c.has_rss_trend);
}

// A run that slows down or keeps growing in memory loses the trend rule's
// weight; a steady one keeps it; too short a run is not judged.
TEST(Advice, TrendRuleSeesSlowdownAndGrowth) {
  auto rows_of = [](int steps, double tps_end, double rss_end) {
    std::vector<monitor::MetricsRow> rows;
    for (int i = 1; i <= steps; ++i) {
      monitor::MetricsRow r;
      r.step = i;
      const double t = double(i - 1) / double(steps - 1);  // 0 .. 1 over the run
      r.values = {{"loss", 3.0}, {"tokens_per_s", 1000.0 + (tps_end - 1000.0) * t},
                  {"rss_mib", 500.0 + (rss_end - 500.0) * t}, {"ms_per_step", 10.0}, {"data_wait_ms", 0.0}};
      rows.push_back(r);
    }
    return rows;
  };
  RunSummary s = healthy();
  s.counters = monitor::summarize_steps(rows_of(41, 1000, 500));  // steady
  Finding f = rule(monitor::advise(s), "trend");
  EXPECT_TRUE(f.applies);
  EXPECT_EQ(f.severity, 0) << f.message;

  s.counters = monitor::summarize_steps(rows_of(41, 500, 500));  // tokens/s halves over the run
  f = rule(monitor::advise(s), "trend");
  EXPECT_GT(f.severity, 0.9) << f.message;
  EXPECT_TRUE(contains(f.message, "slowed down")) << f.message;
  EXPECT_FALSE(contains(f.message, "grew")) << f.message;

  s.counters = monitor::summarize_steps(rows_of(41, 1000, 1000));  // RSS doubles
  f = rule(monitor::advise(s), "trend");
  EXPECT_GT(f.severity, 0.5) << f.message;
  EXPECT_TRUE(contains(f.message, "resident memory grew")) << f.message;
  EXPECT_FALSE(contains(f.message, "slowed")) << f.message;

  s.counters = monitor::summarize_steps(rows_of(20, 500, 1000));  // 19 steps after the first: too few
  f = rule(monitor::advise(s), "trend");
  EXPECT_FALSE(f.applies) << f.message;
}

TEST(Advice, MetricsFileErrorsNameFileAndLine) {
  const std::string dir = std::filesystem::temp_directory_path() / ("brisk_advice_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/metrics.jsonl";
  std::ofstream(path) << "{\"step\":1,\"loss\":2}\n{\"step\":2,\"lo\n";
  try {
    monitor::read_metrics_jsonl(path);
    FAIL() << "a damaged row was accepted";
  } catch (const core::IoError& e) {
    EXPECT_TRUE(contains(e.what(), path + " line 2")) << e.what();
  }
  std::ofstream(path) << "{\"loss\":2}\n";
  EXPECT_THROW(monitor::read_metrics_jsonl(path), core::IoError);
  std::filesystem::remove(path);
  try {
    monitor::load_run_summary(dir);
    FAIL() << "a directory without metrics.jsonl was accepted";
  } catch (const core::IoError& e) {
    EXPECT_TRUE(contains(e.what(), "no metrics.jsonl")) << e.what();
  }
  std::filesystem::remove_all(dir);
}

TEST(Advice, JsonRoundTrips) {
  RunSummary s = healthy();
  s.counters.data_wait_share = 0.2;
  s.profile = {{"matmul", 12, 0.5, 0.7}};
  const Advice a = monitor::advise(s);
  const Advice b = monitor::advice_from_json(nlohmann::json::parse(monitor::to_json(a).dump()), "x.json");
  EXPECT_EQ(b.score, a.score);
  ASSERT_EQ(b.findings.size(), a.findings.size());
  for (size_t i = 0; i < a.findings.size(); ++i) {
    EXPECT_EQ(b.findings[i].rule, a.findings[i].rule);
    EXPECT_EQ(b.findings[i].message, a.findings[i].message);
    EXPECT_DOUBLE_EQ(b.findings[i].severity, a.findings[i].severity);
  }
  const RunSummary t = monitor::run_summary_from_json(monitor::to_json(s), "s.json");
  EXPECT_EQ(t.memory.total(), s.memory.total());
  EXPECT_EQ(t.threads, s.threads);
  ASSERT_EQ(t.profile.size(), 1u);
  EXPECT_EQ(t.profile[0].op, "matmul");
  EXPECT_THROW(monitor::advice_from_json(nlohmann::json::parse("{\"score\":3}"), "x.json"), core::IoError);
  nlohmann::json bad = monitor::to_json(s);
  bad["threads"] = "eight";
  try {
    monitor::run_summary_from_json(bad, "run_summary.json");
    FAIL();
  } catch (const core::IoError& e) {
    EXPECT_TRUE(contains(e.what(), "run_summary.json: field \"threads\"")) << e.what();
  }
}

// Advice that names a setting must name one the config accepts: a user who
// follows it must not get "unknown key" back.
TEST(Advice, EveryConfigKeyItNamesExists) {
  std::vector<RunSummary> runs;
  RunSummary s = healthy();
  s.machine_ram_bytes = size_t(1050) << 20;  // memory too full
  s.fused_classifier = false;
  runs.push_back(s);
  s.machine_ram_bytes = size_t(64) << 30;  // memory free, recomputing
  s.recompute = "full";
  runs.push_back(s);
  s = healthy();
  s.counters.data_wait_share = 0.5;  // a starved loader
  s.counters.median_mfu = 0.02;
  s.threads = 1;
  s.cpu_flags = "avx512f avx512_bf16";  // fp32 on a bf16 machine
  s.bf16_native_available = true;
  runs.push_back(s);
  int named = 0;
  for (const RunSummary& run : runs)
    for (const Finding& f : monitor::advise(run).findings)
      for (const std::string& key : config_keys_in(f.message)) {
        ++named;
        try {
          train::parse_train_config("", "advice", {key + "=1"});
        } catch (const core::ConfigError& e) {
          EXPECT_FALSE(contains(e.what(), "unknown")) << f.rule << " names " << key << ": " << e.what();
        }
      }
  EXPECT_GE(named, 5);  // the scenarios above do name settings
}
