// Reading a run directory's record (run_summary.h): metrics.jsonl rows, the
// step counters the recommendations read, and run_summary.json both ways.
// Errors name the file (and the line of a damaged row): a report built from
// half a file would mislead more than it helps.
#include "brisk/monitor/run_summary.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "brisk/core/error.h"

namespace brisk::monitor {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// A training step's row (the encoder's validation rows carry only epoch,
// step and "val"); a step whose loss was NaN still counts, by its timing.
bool is_step_row(const MetricsRow& r) { return r.has("loss") || r.has("ms_per_step") || r.has("lr"); }

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + long(mid), v.end());
  return v[mid];
}

// Numeric fields at top level and one level down ("val": {"loss": ...}
// becomes "val.loss"); strings and booleans kept apart.
void flatten(const json& j, const std::string& prefix, MetricsRow& row, int depth) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string key = prefix + it.key();
    const json& v = it.value();
    if (v.is_number()) {
      const double d = v.get<double>();
      if (std::isfinite(d)) row.values[key] = d;
    } else if (v.is_boolean()) {
      row.flags[key] = v.get<bool>();
    } else if (v.is_string()) {
      row.text[key] = v.get<std::string>();
    } else if (v.is_object() && depth == 0) {
      flatten(v, key + ".", row, depth + 1);
    }
  }
}

}  // namespace

std::vector<MetricsRow> read_metrics_jsonl(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw core::IoError(path + ": is a directory, not the metrics.jsonl file a trainer writes");
  std::ifstream in(path);
  if (!in) throw core::IoError(path + ": cannot open (a run directory holds the metrics.jsonl its trainer wrote)");
  std::vector<MetricsRow> rows;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object())
      throw core::IoError(path + " line " + std::to_string(n) + ": not a JSON object (a damaged or truncated row)");
    if (!j.contains("step") || !j["step"].is_number_integer())
      throw core::IoError(path + " line " + std::to_string(n) + ": no integer \"step\" field");
    MetricsRow row;
    row.step = j["step"].get<int64_t>();
    flatten(j, "", row, 0);
    row.values.erase("step");
    rows.push_back(std::move(row));
  }
  return rows;
}

std::vector<double> grad_norm_spike_ratios(const std::vector<double>& g) {
  std::vector<double> ratio(g.size(), 0.0);
  for (size_t i = size_t(kSpikeMinHistory); i < g.size(); ++i) {
    const size_t from = i > size_t(kSpikeWindow) ? i - size_t(kSpikeWindow) : 0;
    const double med = median_of(std::vector<double>(g.begin() + long(from), g.begin() + long(i)));
    if (med > 0 && std::isfinite(g[i])) ratio[i] = g[i] / med;
  }
  return ratio;
}

StepCounters summarize_steps(const std::vector<MetricsRow>& rows) {
  StepCounters c;
  double wait_ms = 0, step_ms = 0;
  std::vector<double> mfu, tps, grad, rss;
  std::vector<int64_t> grad_step;
  bool first = true;
  for (const MetricsRow& r : rows) {
    if (!is_step_row(r)) continue;  // a validation row
    ++c.steps;
    c.last_step = std::max(c.last_step, r.step);
    if (r.has("loss_scale")) c.scaled = true;
    if (auto it = r.flags.find("skipped"); it != r.flags.end() && it->second) ++c.skipped_steps;
    if (r.has("grad_norm")) {
      grad.push_back(r.values.at("grad_norm"));
      grad_step.push_back(r.step);
    }
    if (first) {
      first = false;
      continue;
    }
    if (r.has("data_wait_ms") && r.has("ms_per_step")) {
      c.has_data_wait = true;
      wait_ms += r.values.at("data_wait_ms");
      step_ms += r.values.at("ms_per_step");
    }
    if (r.has("mfu") && r.values.at("mfu") > 0) mfu.push_back(r.values.at("mfu"));
    if (r.has("tokens_per_s")) tps.push_back(r.values.at("tokens_per_s"));
    if (r.has("rss_mib")) rss.push_back(r.values.at("rss_mib"));
  }
  // Trends: the second quarter of the steps after the first against the
  // last. The first quarter is left out: caches, the allocator and the
  // machine's other work settle there, and a run's start is not its pace.
  auto quarters = [](const std::vector<double>& v, double& second, double& last) {
    const size_t q = v.size() / 4;
    auto med = [&](size_t from, size_t to) {
      return median_of(std::vector<double>(v.begin() + std::ptrdiff_t(from), v.begin() + std::ptrdiff_t(to)));
    };
    second = med(q, 2 * q);
    last = med(v.size() - q, v.size());
  };
  if (tps.size() >= size_t(kTrendMinSteps)) {
    c.has_trend = true;
    quarters(tps, c.early_tokens_per_s, c.late_tokens_per_s);
  }
  if (rss.size() >= size_t(kTrendMinSteps)) {
    c.has_rss_trend = true;
    quarters(rss, c.early_rss_mib, c.late_rss_mib);
  }
  // One step only: its figures are all there is.
  if (c.steps == 1) {
    for (const MetricsRow& r : rows) {
      if (!is_step_row(r)) continue;
      if (r.has("data_wait_ms") && r.has("ms_per_step")) {
        c.has_data_wait = true;
        wait_ms = r.values.at("data_wait_ms");
        step_ms = r.values.at("ms_per_step");
      }
      if (r.has("mfu") && r.values.at("mfu") > 0) mfu.push_back(r.values.at("mfu"));
      if (r.has("tokens_per_s")) tps.push_back(r.values.at("tokens_per_s"));
    }
  }
  c.data_wait_share = step_ms > 0 ? wait_ms / step_ms : 0.0;
  c.has_data_wait = c.has_data_wait && step_ms > 0;
  c.has_mfu = !mfu.empty();
  c.median_mfu = median_of(mfu);
  c.median_tokens_per_s = median_of(tps);
  c.has_grad_norm = !grad.empty();
  const std::vector<double> ratio = grad_norm_spike_ratios(grad);
  for (size_t i = 0; i < ratio.size(); ++i) {
    if (i < size_t(kSpikeMinHistory)) continue;
    ++c.grad_norm_checked;
    c.max_spike_ratio = std::max(c.max_spike_ratio, ratio[i]);
    if (ratio[i] > kSpikeFactor) {
      ++c.grad_norm_spikes;
      if (c.spike_steps.size() < 8) c.spike_steps.push_back(grad_step[i]);
    }
  }
  return c;
}

namespace {
// One "Key:   123 kB" line of /proc/meminfo, in bytes; 0 where missing.
size_t meminfo_bytes(const std::string& want) {
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream in(line);
    std::string key;
    size_t kib = 0;
    if (in >> key >> kib && key == want) return kib * 1024;
  }
  return 0;
}
}  // namespace

size_t machine_ram_bytes() { return meminfo_bytes("MemTotal:"); }
size_t available_ram_bytes() { return meminfo_bytes("MemAvailable:"); }

json to_json(const RunSummary& s) {
  json profile = json::array();
  for (const ProfileRow& r : s.profile)
    profile.push_back({{"op", r.op}, {"calls", r.calls}, {"seconds", r.seconds}, {"share", r.share}});
  json j = {
      {"kind", s.kind},
      {"device", s.device},
      {"device_name", s.device_name},
      {"cpu_flags", s.cpu_flags},
      {"bf16_native_available", s.bf16_native_available},
      {"threads", s.threads},
      {"cores", s.cores},
      {"loader_workers", s.loader_workers},
      {"world", s.world},
      {"batch", s.batch},
      {"seq", s.seq},
      {"grad_accum", s.grad_accum},
      {"steps_planned", s.steps_planned},
      {"precision_requested", s.precision_requested},
      {"precision", s.precision},
      {"precision_path", s.precision_path},
      {"peak_gflops", s.peak_gflops},
      {"peak_bf16", s.peak_bf16},
      {"lr", s.lr},
      {"warmup", s.warmup},
      {"grad_clip", s.grad_clip},
      {"loss_scale_init", s.loss_scale_init},
      {"recompute", s.recompute},
      {"fused_classifier", s.fused_classifier},
      {"machine_ram_bytes", s.machine_ram_bytes},
      {"peak_rss_bytes", s.peak_rss_bytes},
      {"profile", profile},
  };
  if (s.has_memory_plan)
    j["memory_plan"] = {{"params", s.memory.params},
                        {"grads", s.memory.grads},
                        {"optimizer_state", s.memory.optimizer_state},
                        {"arena", s.memory.arena},
                        {"activations", s.memory.activations},
                        {"workspace", s.memory.workspace},
                        {"total", s.memory.total()}};
  return j;
}

namespace {

// A key's value when present and of the type asked for; a present key of
// another type, or an integer below min_value or past T's range, is a
// damaged file.
template <class T>
void read_key(const json& j, const char* key, T& out, const std::string& path, int64_t min_value = 0) {
  if (!j.contains(key) || j[key].is_null()) return;
  const json& v = j[key];
  bool ok;
  if constexpr (std::is_same_v<T, bool>) ok = v.is_boolean();
  else if constexpr (std::is_same_v<T, std::string>) ok = v.is_string();
  else if constexpr (std::is_integral_v<T>) ok = v.is_number_integer();
  else ok = v.is_number();
  if (!ok) throw core::IoError(path + ": field \"" + key + "\" has the wrong type (" + v.type_name() + ")");
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    // Counts and sizes: what the trainer writes is never negative (but for
    // the "not recorded" -1 of loader_workers), and a value past the field's
    // range would wrap.
    const bool fits = v.is_number_unsigned() ? v.get<uint64_t>() <= uint64_t(std::numeric_limits<T>::max())
                                             : v.get<int64_t>() >= min_value;
    if (!fits)
      throw core::IoError(path + ": field \"" + key + "\" is out of range (" + v.dump() + ")");
  }
  out = v.get<T>();
}

}  // namespace

RunSummary run_summary_from_json(const json& j, const std::string& path) {
  if (!j.is_object()) throw core::IoError(path + ": not a JSON object");
  RunSummary s;
  s.has_facts = true;
  read_key(j, "kind", s.kind, path);
  read_key(j, "device", s.device, path);
  read_key(j, "device_name", s.device_name, path);
  read_key(j, "cpu_flags", s.cpu_flags, path);
  read_key(j, "bf16_native_available", s.bf16_native_available, path);
  read_key(j, "threads", s.threads, path);
  read_key(j, "cores", s.cores, path);
  read_key(j, "loader_workers", s.loader_workers, path, -1);
  read_key(j, "world", s.world, path);
  read_key(j, "batch", s.batch, path);
  read_key(j, "seq", s.seq, path);
  read_key(j, "grad_accum", s.grad_accum, path);
  read_key(j, "steps_planned", s.steps_planned, path);
  read_key(j, "precision_requested", s.precision_requested, path);
  read_key(j, "precision", s.precision, path);
  read_key(j, "precision_path", s.precision_path, path);
  read_key(j, "peak_gflops", s.peak_gflops, path);
  read_key(j, "peak_bf16", s.peak_bf16, path);
  read_key(j, "lr", s.lr, path);
  read_key(j, "warmup", s.warmup, path);
  read_key(j, "grad_clip", s.grad_clip, path);
  read_key(j, "loss_scale_init", s.loss_scale_init, path);
  read_key(j, "recompute", s.recompute, path);
  read_key(j, "fused_classifier", s.fused_classifier, path);
  read_key(j, "machine_ram_bytes", s.machine_ram_bytes, path);
  read_key(j, "peak_rss_bytes", s.peak_rss_bytes, path);
  if (j.contains("memory_plan")) {
    const json& m = j["memory_plan"];
    if (!m.is_object()) throw core::IoError(path + ": field \"memory_plan\" is not an object");
    s.has_memory_plan = true;
    read_key(m, "params", s.memory.params, path);
    read_key(m, "grads", s.memory.grads, path);
    read_key(m, "optimizer_state", s.memory.optimizer_state, path);
    read_key(m, "arena", s.memory.arena, path);
    read_key(m, "activations", s.memory.activations, path);
    read_key(m, "workspace", s.memory.workspace, path);
  }
  if (j.contains("profile")) {
    if (!j["profile"].is_array()) throw core::IoError(path + ": field \"profile\" is not an array");
    for (const json& r : j["profile"]) {
      if (!r.is_object()) throw core::IoError(path + ": a \"profile\" row is not an object");
      ProfileRow row;
      read_key(r, "op", row.op, path);
      read_key(r, "calls", row.calls, path);
      read_key(r, "seconds", row.seconds, path);
      read_key(r, "share", row.share, path);
      s.profile.push_back(row);
    }
  }
  return s;
}

RunSummary load_run_summary(const std::string& run_dir, std::vector<MetricsRow>* rows_out) {
  if (!fs::is_directory(run_dir)) throw core::IoError(run_dir + ": not a run directory (no such directory)");
  const std::string metrics = (fs::path(run_dir) / "metrics.jsonl").string();
  if (!fs::exists(metrics))
    throw core::IoError(run_dir + ": no metrics.jsonl (not a run directory written by brisk train, or the run has "
                                  "not logged a step yet)");
  RunSummary s;
  const std::string summary = (fs::path(run_dir) / "run_summary.json").string();
  if (fs::exists(summary)) {
    std::ifstream in(summary);
    const json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) throw core::IoError(summary + ": not valid JSON (damaged or truncated)");
    s = run_summary_from_json(j, summary);
  } else if (fs::exists(fs::path(run_dir) / "report.json")) {
    s.kind = "encoder";  // the classifier's run: its report.json, no summary
  }
  std::vector<MetricsRow> rows = read_metrics_jsonl(metrics);
  s.counters = summarize_steps(rows);
  if (rows_out) *rows_out = std::move(rows);
  return s;
}

}  // namespace brisk::monitor
