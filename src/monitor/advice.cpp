// The recommendation rules and the score (advice.h). Each rule is one small
// function of the summary: whether its counter was measured, the severity
// of what it read, and a message with the value, the threshold and the
// setting to change. The thresholds are the ones docs/monitoring.md lists;
// change both together.
#include "brisk/monitor/advice.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "brisk/core/error.h"
#include "brisk/core/safetensors.h"

namespace brisk::monitor {

using nlohmann::json;

namespace {

// Thresholds (docs/monitoring.md, "Recommendations and score").
constexpr double kDataWaitOk = 0.05, kDataWaitBad = 0.30;      // share of step time
constexpr double kMfuOk = 0.30, kMfuBad = 0.05;                // share of the measured peak
constexpr double kMemFull = 0.85, kMemBad = 0.95;              // planned (or peak RSS) / machine RAM
constexpr double kMemRoomy = 0.25, kMemRoomyMax = 0.2;         // below: headroom unused (at most 0.2: "info")
constexpr double kMemRecompute = 0.50;                         // below, with recomputation on: 0.5 severity
constexpr double kSkipOk = 0.01, kSkipBad = 0.10;              // skipped / steps
constexpr double kSpikeOk = 0.005, kSpikeBad = 0.05;           // spikes / judged steps
constexpr double kSlowOk = 0.10, kSlowBad = 0.30;              // 1 - late / early tokens/s
constexpr double kGrowOk = 0.10, kGrowBad = 0.50;              // late / early RSS - 1

double ramp(double x, double ok, double bad) {  // 0 at ok, 1 at bad, linear between (either direction)
  return std::clamp((x - ok) / (bad - ok), 0.0, 1.0);
}

std::string fmt(const char* f, double a) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, a);
  return buf;
}
std::string pct(double share) { return fmt(share < 0.1 ? "%.2f%%" : "%.1f%%", 100 * share); }
std::string gib(size_t bytes) {
  const double g = double(bytes) / double(size_t(1) << 30);
  return g >= 1 ? fmt("%.1f GiB", g) : fmt("%.1f MiB", double(bytes) / double(1 << 20));
}
std::string num(double v) { return fmt("%g", v); }

Finding make(const char* rule) {
  Finding f;
  f.rule = rule;
  for (const RuleWeight& w : rule_weights())
    if (f.rule == w.rule) f.weight = w.weight;
  return f;
}

Finding data_wait_rule(const RunSummary& s) {
  Finding f = make("data_wait");
  f.counter = "metrics.jsonl: sum data_wait_ms / sum ms_per_step, steps after the first";
  f.threshold = "> " + pct(kDataWaitOk) + " of step time (all weight lost at " + pct(kDataWaitBad) + ")";
  if (!s.counters.has_data_wait) {
    f.message = "no data_wait_ms in metrics.jsonl: not judged";
    return f;
  }
  f.applies = true;
  f.value = s.counters.data_wait_share;
  f.severity = ramp(f.value, kDataWaitOk, kDataWaitBad);
  const std::string now = s.loader_workers < 0   ? ""
                          : s.loader_workers == 0 ? " (now 0: every batch is built on the training thread)"
                                                  : " (now " + std::to_string(s.loader_workers) + ")";
  // Loader threads beside as many training threads as cores: a wait can be
  // the hand-over itself (a woken thread waiting for a core), not slow batches.
  const bool crowded = s.loader_workers > 0 && s.threads > 0 && s.cores > 0 && s.threads + s.loader_workers > s.cores;
  // The way out other than loader_workers = 0: with one training thread
  // there are no fewer to use, so fewer loader threads, one per free core.
  const int free_cores = s.cores - s.threads;
  const std::string otherwise =
      s.threads > 1     ? ", else fewer train.threads leaves the loader a core"
      : free_cores > 0 ? ", else train.loader_workers = " + std::to_string(free_cores) +
                             " gives each loader thread a core of its own"
                       : "";
  if (f.value > kDataWaitOk && crowded)
    f.message = "the steps waited for data " + pct(f.value) + " of their time (threshold " + pct(kDataWaitOk) + "): " +
                std::to_string(s.loader_workers) + " loader threads share " + std::to_string(s.cores) +
                " cores with " + std::to_string(s.threads) +
                " training threads, so handing over a batch waits for a core; where batches are cheap to build "
                "(token windows are a copy) train.loader_workers = 0 builds them on the training thread" + otherwise;
  else if (f.value > kDataWaitOk)
    f.message = "the steps waited for data " + pct(f.value) + " of their time (threshold " + pct(kDataWaitOk) +
                "): the loader does not keep up; raise train.loader_workers" + now;
  else
    f.message = "data wait " + pct(f.value) + " of step time (threshold " + pct(kDataWaitOk) + "): the loader keeps up";
  return f;
}

Finding mfu_rule(const RunSummary& s) {
  Finding f = make("mfu");
  f.counter = "metrics.jsonl: median mfu, steps after the first (against run_summary.json peak_gflops)";
  f.threshold = "< " + pct(kMfuOk) + " of the measured peak (all weight lost at " + pct(kMfuBad) + ")";
  if (!s.counters.has_mfu) {
    f.message = "no MFU in metrics.jsonl (no measured peak for this device): not judged";
    return f;
  }
  f.applies = true;
  f.value = s.counters.median_mfu;
  f.severity = ramp(f.value, kMfuOk, kMfuBad);
  const std::string peak = s.peak_gflops > 0 ? " of the measured peak " + fmt("%.0f", s.peak_gflops) + " GFLOP/s (" +
                                                   (s.peak_bf16 ? "bf16" : "fp32") + ")"
                                             : " of the measured peak";
  if (f.value >= kMfuOk) {
    f.message = "median MFU " + pct(f.value) + peak + " (threshold " + pct(kMfuOk) + ")";
    return f;
  }
  f.message = "median MFU " + pct(f.value) + peak + " (threshold " + pct(kMfuOk) + "):";
  if (!s.profile.empty()) {
    const ProfileRow& top = *std::max_element(s.profile.begin(), s.profile.end(),
                                              [](const ProfileRow& a, const ProfileRow& b) { return a.share < b.share; });
    f.message += " " + top.op + " takes " + pct(top.share) + " of the step (--profile);";
  } else {
    f.message += " run with --profile to see which ops take the step;";
  }
  if (s.batch > 0 && s.seq > 0)
    f.message += " a larger train.batch x train.seq (now " + std::to_string(s.batch) + " x " + std::to_string(s.seq) +
                 ") gives each matrix product more work";
  else
    f.message += " larger batches give each matrix product more work";
  if (s.bf16_native_available && s.precision == "fp32") f.message += "; train.precision = \"bf16\" raises the peak";
  return f;
}

Finding memory_rule(const RunSummary& s) {
  Finding f = make("memory");
  f.counter = "run_summary.json: max(memory_plan.total, peak_rss_bytes) / machine_ram_bytes";
  f.threshold = "> " + pct(kMemFull) + " (too full) or < " + pct(kMemRoomy) + " (headroom unused)";
  if (!s.has_memory_plan || s.machine_ram_bytes == 0 || s.device != "cpu") {
    f.message = s.device != "cpu" ? "a GPU run: host memory is not what limits it: not judged"
                                  : "no memory plan or machine memory recorded: not judged";
    return f;
  }
  f.applies = true;
  const size_t used = std::max(s.memory.total(), s.peak_rss_bytes);
  f.value = double(used) / double(s.machine_ram_bytes);
  const std::string what = "planned " + gib(s.memory.total()) + ", peak RSS " + gib(s.peak_rss_bytes) + ": " +
                           pct(f.value) + " of the machine's " + gib(s.machine_ram_bytes);
  if (f.value > kMemFull) {
    f.severity = ramp(f.value, kMemFull, kMemBad);
    f.message = what + " (threshold " + pct(kMemFull) + "): lower train.batch (now " + std::to_string(s.batch) + ")";
    if (s.recompute != "full") f.message += ", raise train.recompute (now " + s.recompute + ")";
    if (!s.fused_classifier) f.message += ", or set model.fused_classifier = true (no logits tensor)";
    return f;
  }
  if (s.recompute != "none" && f.value < kMemRecompute) {
    f.severity = 0.5;
    f.message = what + " with train.recompute = " + s.recompute + " (threshold " + pct(kMemRecompute) +
                "): recomputation spends compute to save memory the machine has; train.recompute = \"none\"";
    return f;
  }
  if (f.value < kMemRoomy) {
    f.severity = kMemRoomyMax * (kMemRoomy - f.value) / kMemRoomy;
    f.message = what + " (threshold " + pct(kMemRoomy) + "): room for a larger train.batch (now " +
                std::to_string(s.batch) + "; `brisk plan` shows what it would need)";
    return f;
  }
  f.message = what + ": within " + pct(kMemRoomy) + " to " + pct(kMemFull);
  return f;
}

Finding loss_scale_rule(const RunSummary& s) {
  Finding f = make("loss_scale");
  f.counter = "metrics.jsonl: rows with \"skipped\": true / steps";
  f.threshold = "> " + pct(kSkipOk) + " of steps (all weight lost at " + pct(kSkipBad) + ")";
  if (!s.counters.scaled || s.counters.steps == 0) {
    f.message = "no loss scaling in this run: not judged";
    return f;
  }
  f.applies = true;
  f.value = double(s.counters.skipped_steps) / double(s.counters.steps);
  f.severity = ramp(f.value, kSkipOk, kSkipBad);
  const std::string what = std::to_string(s.counters.skipped_steps) + " of " + std::to_string(s.counters.steps) +
                           " steps (" + pct(f.value) + ") skipped on gradient overflow (threshold " + pct(kSkipOk) + ")";
  if (f.value > kSkipOk)
    f.message = what + ": start lower, train.loss_scale_init" +
                (s.loss_scale_init > 0 ? " (now " + num(s.loss_scale_init) + ")" : std::string()) +
                ", or train.precision = \"bf16\", which needs no scaling";
  else
    f.message = what;
  return f;
}

Finding grad_spike_rule(const RunSummary& s) {
  Finding f = make("grad_spikes");
  f.counter = "metrics.jsonl: steps with grad_norm > " + num(kSpikeFactor) + "x the median of the previous " +
              std::to_string(kSpikeWindow) + " steps / steps judged";
  f.threshold = "> " + pct(kSpikeOk) + " of steps (all weight lost at " + pct(kSpikeBad) + ")";
  const StepCounters& c = s.counters;
  if (c.grad_norm_checked == 0) {
    f.message = "fewer than " + std::to_string(kSpikeMinHistory + 1) + " steps with a gradient norm: not judged";
    return f;
  }
  f.applies = true;
  f.value = double(c.grad_norm_spikes) / double(c.grad_norm_checked);
  f.severity = ramp(f.value, kSpikeOk, kSpikeBad);
  std::string what = std::to_string(c.grad_norm_spikes) + " of " + std::to_string(c.grad_norm_checked) +
                     " steps (" + pct(f.value) + ") had a gradient norm above " + num(kSpikeFactor) +
                     "x the running median (largest " + fmt("%.1fx", c.max_spike_ratio);
  if (!c.spike_steps.empty()) {
    what += "; steps";
    for (size_t i = 0; i < c.spike_steps.size(); ++i) what += (i ? ", " : " ") + std::to_string(c.spike_steps[i]);
    if (c.grad_norm_spikes > int64_t(c.spike_steps.size())) what += ", ...";
  }
  what += "; threshold " + pct(kSpikeOk) + ")";
  if (f.value > kSpikeOk) {
    what += ": lower train.lr";
    if (s.lr > 0) what += " (now " + num(s.lr) + ")";
    what += ", lengthen train.warmup";
    if (s.has_facts) what += " (now " + std::to_string(s.warmup) + ")";
    what += " or tighten train.grad_clip";
    if (s.grad_clip > 0) what += " (now " + num(s.grad_clip) + ")";
  }
  f.message = what;
  return f;
}

Finding precision_rule(const RunSummary& s) {
  Finding f = make("precision");
  f.counter = "run_summary.json: precision_path against cpu_flags (" +
              (s.cpu_flags.empty() ? std::string("none recorded") : s.cpu_flags) + ")";
  f.threshold = "a bf16 fast path left unused, or an emulated low-precision path";
  if (!s.has_facts) {
    f.message = "no run_summary.json: precision and CPU flags not recorded: not judged";
    return f;
  }
  f.applies = true;
  const bool emulated = s.precision_path.find("emulated") != std::string::npos;
  if (emulated) {
    f.value = f.severity = 1;
    f.message = "the run computed " + s.precision_path + " (no fast path; products widened to fp32, slower than fp32): "
                "train.precision = \"fp32\", or train.precision_fallback = true";
  } else if (s.device == "cpu" && s.precision == "fp32" && s.bf16_native_available) {
    f.value = f.severity = 1;
    f.message = "the CPU has bf16 dot products (" + s.cpu_flags + ") but the run computed in fp32: train.precision = "
                "\"bf16\" runs the matrix products natively";
  } else if (s.device == "cuda" && s.precision == "fp32") {
    f.value = f.severity = 1;
    f.message = "the GPU's tensor cores sat idle in fp32: train.precision = \"bf16\"";
  } else {
    f.message = "precision " + s.precision + " on the " + s.precision_path + " path" +
                (s.device == "cpu" && !s.bf16_native_available ? " (no bf16 fast path in this run: the CPU has none, or BRISK_BF16=emulated turned it off)" : "");
  }
  return f;
}

Finding threads_rule(const RunSummary& s) {
  Finding f = make("threads");
  f.counter = "run_summary.json: threads / cores";
  f.threshold = "threads > cores, or threads < cores / 2";
  if (!s.has_facts || s.device != "cpu" || s.threads <= 0 || s.cores <= 0) {
    f.message = "threads and cores not recorded (or a GPU run): not judged";
    return f;
  }
  if (s.world > 1) {
    f.message = std::to_string(s.world) + " ranks: how their threads share each machine's cores is not recorded: not judged";
    return f;
  }
  f.applies = true;
  f.value = double(s.threads) / double(s.cores);
  const std::string what = std::to_string(s.threads) + " threads on " + std::to_string(s.cores) + " cores";
  if (s.threads > s.cores) {
    f.severity = 1;
    f.message = what + " (threshold: no more than the cores): oversubscribed threads wait for each other at every "
                "parallel region; train.threads = 0 (all cores)";
  } else if (2 * s.threads < s.cores) {
    f.severity = std::clamp(1.0 - 2.0 * f.value, 0.0, 1.0);
    f.message = what + " (threshold: at least half): train.threads = 0 uses all cores";
  } else {
    f.message = what;
  }
  return f;
}

// A run that slows down, or whose memory keeps growing, as it goes: what a
// summary of medians hides (thermal throttling, another process, a loader
// falling behind, a leak).
Finding trend_rule(const RunSummary& s) {
  Finding f = make("trend");
  const StepCounters& c = s.counters;
  f.counter = "metrics.jsonl, steps after the first: median tokens_per_s and rss_mib of the last quarter against "
              "the second";
  f.threshold = "tokens/s " + pct(kSlowOk) + " lower (all weight lost at " + pct(kSlowBad) + "), or RSS " +
                pct(kGrowOk) + " higher (all lost at " + pct(kGrowBad) + ")";
  if (!c.has_trend || c.early_tokens_per_s <= 0) {
    f.message = "fewer than " + std::to_string(kTrendMinSteps + 1) + " steps with tokens/s: not judged";
    return f;
  }
  f.applies = true;
  const double slow = std::max(0.0, 1.0 - c.late_tokens_per_s / c.early_tokens_per_s);
  const double grow = c.has_rss_trend && c.early_rss_mib > 0 ? std::max(0.0, c.late_rss_mib / c.early_rss_mib - 1) : 0;
  f.value = slow;
  f.severity = std::max(ramp(slow, kSlowOk, kSlowBad), ramp(grow, kGrowOk, kGrowBad));
  std::string tps = "tokens/s " + fmt("%.0f", c.early_tokens_per_s) + " (second quarter) -> " +
                    fmt("%.0f", c.late_tokens_per_s) + " (last quarter)";
  std::string mem = c.has_rss_trend
                        ? "RSS " + fmt("%.0f", c.early_rss_mib) + " -> " + fmt("%.0f", c.late_rss_mib) + " MiB"
                        : "RSS not logged";
  std::vector<std::string> issues;
  if (slow > kSlowOk)
    issues.push_back("the run slowed down by " + pct(slow) + " (threshold " + pct(kSlowOk) +
                     "): another process on the cores, thermal or power limits, or a loader falling behind as the "
                     "data cache fills; compare --profile of an early and a late stretch");
  if (grow > kGrowOk)
    issues.push_back("resident memory grew by " + pct(grow) + " (threshold " + pct(kGrowOk) +
                     "): something keeps allocating step after step; the planned memory does not grow");
  f.message = tps + ", " + mem;
  for (const std::string& i : issues) f.message += ": " + i;
  return f;
}

}  // namespace

const char* Finding::level() const {
  if (!applies) return "n/a";
  if (severity <= 0) return "ok";
  if (severity < 0.25) return "info";
  if (severity < 0.75) return "warn";
  return "bad";
}

const std::vector<RuleWeight>& rule_weights() {
  static const std::vector<RuleWeight> w = {{"data_wait", 20},  {"mfu", 20},       {"memory", 15},  {"loss_scale", 10},
                                            {"grad_spikes", 10}, {"precision", 10}, {"threads", 5},  {"trend", 10}};
  return w;
}

Advice advise(const RunSummary& s) {
  Advice a;
  a.findings = {data_wait_rule(s),  mfu_rule(s),       memory_rule(s), loss_scale_rule(s),
                grad_spike_rule(s), precision_rule(s), threads_rule(s), trend_rule(s)};
  double total = 0, kept = 0;
  for (const Finding& f : a.findings) {
    if (!f.applies) continue;
    total += f.weight;
    kept += f.weight * (1.0 - f.severity);
  }
  a.score = total > 0 ? int(std::lround(100.0 * kept / total)) : -1;
  return a;
}

std::string format_advice(const Advice& a) {
  std::vector<const Finding*> order;
  for (const Finding& f : a.findings) order.push_back(&f);
  // The ones to act on first: most points lost, then the rest, n/a last.
  std::stable_sort(order.begin(), order.end(), [](const Finding* x, const Finding* y) {
    if (x->applies != y->applies) return x->applies;
    return x->points_lost() > y->points_lost();
  });
  std::string out = a.score >= 0 ? "== recommendations: score " + std::to_string(a.score) + "/100 ==\n"
                                  : "== recommendations: no score (no rule could be judged) ==\n";
  out += "score = 100 x sum(weight x (1 - severity)) / sum(weight), over the rules that apply\n";
  char buf[96];
  for (const Finding* f : order) {
    if (f->applies)
      std::snprintf(buf, sizeof buf, "[%-4s] %-11s weight %2.0f, -%4.1f  ", f->level(), f->rule.c_str(), f->weight,
                    f->points_lost());
    else
      std::snprintf(buf, sizeof buf, "[%-4s] %-11s weight %2.0f, n/a    ", f->level(), f->rule.c_str(), f->weight);
    out += buf + f->message + "\n";
  }
  return out;
}

json to_json(const Advice& a) {
  json findings = json::array();
  for (const Finding& f : a.findings)
    findings.push_back({{"rule", f.rule},
                        {"weight", f.weight},
                        {"applies", f.applies},
                        {"severity", f.severity},
                        {"level", f.level()},
                        {"points_lost", f.points_lost()},
                        {"counter", f.counter},
                        {"value", f.value},
                        {"threshold", f.threshold},
                        {"message", f.message}});
  return {{"score", a.score >= 0 ? json(a.score) : json(nullptr)},
          {"formula", "score = round(100 * sum(weight * (1 - severity)) / sum(weight)) over the rules that apply"},
          {"findings", findings}};
}

Advice advice_from_json(const json& j, const std::string& path) {
  auto bad = [&](const std::string& what) { return core::IoError(path + ": " + what); };
  if (!j.is_object() || !j.contains("findings") || !j["findings"].is_array())
    throw bad("not a recommendations document (no \"findings\" array)");
  Advice a;
  if (j.contains("score") && !j["score"].is_null()) {
    const json& s = j["score"];
    if (!s.is_number() || !(s.get<double>() >= 0 && s.get<double>() <= 100))
      throw bad("\"score\" must be a number from 0 to 100 or null, got " + s.dump());
    a.score = static_cast<int>(std::lround(s.get<double>()));
  }
  for (const json& r : j["findings"]) {
    if (!r.is_object() || !r.contains("rule") || !r["rule"].is_string()) throw bad("a finding without a \"rule\"");
    Finding f;
    try {
      f.rule = r.at("rule").get<std::string>();
      f.weight = r.value("weight", 0.0);
      f.applies = r.value("applies", false);
      f.severity = r.value("severity", 0.0);
      f.counter = r.value("counter", std::string());
      f.value = r.value("value", 0.0);
      f.threshold = r.value("threshold", std::string());
      f.message = r.value("message", std::string());
    } catch (const json::exception& e) {
      throw bad("finding \"" + f.rule + "\": a field of the wrong type (" + e.what() + ")");
    }
    a.findings.push_back(f);
  }
  return a;
}

Advice write_recommendations(const std::string& run_dir) {
  const Advice a = advise(load_run_summary(run_dir));
  core::write_file_atomic((std::filesystem::path(run_dir) / "recommendations.json").string(), to_json(a).dump(2) + "\n");
  return a;
}

}  // namespace brisk::monitor
