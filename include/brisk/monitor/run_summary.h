// What one training run was and what its steps measured, in one struct: the
// input of the recommendations (advice.h) and of `brisk report`. The trainer
// fills the facts it alone knows (measured peak, CPU flags, threads, memory
// plan, precision path, loader workers, the --profile table) and writes them
// to run_summary.json at the end of a run; the step counters (data-wait
// share, median MFU, skipped steps, gradient-norm spikes) are computed from
// metrics.jsonl by summarize_steps(), so a run directory written by another
// trainer (the encoder classifier's, which writes no run_summary.json) gets
// the counters its rows support and nothing made up.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace brisk::monitor {

// The planner's figures for one train step (core::MemoryReport), in bytes.
struct PlannedMemory {
  size_t params = 0, grads = 0, optimizer_state = 0, arena = 0, activations = 0, workspace = 0;
  size_t total() const { return params + grads + optimizer_state + arena; }
};

// One row of the --profile table: an op's calls, seconds and share of the step.
struct ProfileRow {
  std::string op;
  int64_t calls = 0;
  double seconds = 0, share = 0;  // share in [0, 1]
};

// Counters over a run's metrics rows (summarize_steps). "Steps after the
// first": the first step carries one-off costs (the loader's first batch,
// page faults, kernel caches) that say nothing about the steady state.
struct StepCounters {
  int64_t steps = 0;                 // metrics rows of training steps
  int64_t last_step = 0;
  bool has_data_wait = false;        // rows carry data_wait_ms and ms_per_step
  double data_wait_share = 0;        // sum data_wait_ms / sum ms_per_step, steps after the first
  bool has_mfu = false;              // rows carry a nonzero mfu
  double median_mfu = 0;             // steps after the first
  double median_tokens_per_s = 0;    // steps after the first
  bool scaled = false;               // rows carry loss_scale (dynamic loss scaling was on)
  int64_t skipped_steps = 0;         // rows with "skipped": true
  bool has_grad_norm = false;
  int64_t grad_norm_checked = 0;     // steps with enough history to be judged
  int64_t grad_norm_spikes = 0;      // of those, steps above kSpikeFactor x the running median
  double max_spike_ratio = 0;        // the largest grad_norm / running median seen
  std::vector<int64_t> spike_steps;  // the first few spikes' step numbers
  // Trends, over runs of at least kTrendMinSteps steps after the first:
  // median tokens/s and rss_mib (where logged) of the second quarter of
  // those steps ("early") and of the last quarter ("late").
  bool has_trend = false;
  double early_tokens_per_s = 0, late_tokens_per_s = 0;
  bool has_rss_trend = false;
  double early_rss_mib = 0, late_rss_mib = 0;
};

// Steps after the first a run needs for its trends to be judged.
constexpr int kTrendMinSteps = 20;

// The spike rule's parameters, shared by summarize_steps and the docs.
constexpr double kSpikeFactor = 5.0;   // a spike: grad_norm > 5 x the running median
constexpr int kSpikeWindow = 50;       // the median of up to the previous 50 steps
constexpr int kSpikeMinHistory = 10;   // steps before the first one judged

struct RunSummary {
  std::string kind = "gpt";           // "gpt" | "encoder"
  bool has_facts = false;             // false: no run_summary.json; only the counters are known
  std::string device = "cpu";         // "cpu" | "cuda"
  std::string device_name;            // CPU model, or the GPU's name
  std::string cpu_flags;              // monitor::cpu_flags(): avx2 fma avx512f avx512_bf16 amx_bf16
  bool bf16_native_available = false; // the CPU (or GPU) has a bf16 fast path brisk uses (false under BRISK_BF16=emulated)
  int threads = 0, cores = 0, loader_workers = -1, world = 1;
  int64_t batch = 0, seq = 0, grad_accum = 1, steps_planned = 0;
  std::string precision_requested, precision = "fp32", precision_path = "fp32";
  double peak_gflops = 0;             // what MFU is measured against (0: unknown)
  bool peak_bf16 = false;             // that peak is the bf16 dot-product one
  double grad_clip = 0, lr = 0;
  int64_t warmup = 0;
  double loss_scale_init = 0;
  std::string recompute = "none";
  bool fused_classifier = false;
  bool has_memory_plan = false;
  PlannedMemory memory;
  size_t machine_ram_bytes = 0;       // MemTotal of the machine the run used
  size_t peak_rss_bytes = 0;          // VmHWM of the training process at its end
  std::vector<ProfileRow> profile;    // empty unless --profile
  StepCounters counters;
};

// One metrics.jsonl row: its numeric fields (nested objects flattened as
// "val.loss"; null -- NaN or infinity -- left out) and its flags.
struct MetricsRow {
  int64_t step = 0;
  std::map<std::string, double> values;
  std::map<std::string, bool> flags;    // "skipped"
  std::map<std::string, std::string> text;  // "precision", "precision_path"
  bool has(const std::string& k) const { return values.count(k) != 0; }
};

// Reads a metrics.jsonl. Throws IoError naming the file when it is missing
// and naming file and line for a row that is not a JSON object with an
// integer "step" (a damaged or foreign file).
std::vector<MetricsRow> read_metrics_jsonl(const std::string& path);

// The counters of the rows (rows with none of loss, lr and ms_per_step --
// the encoder's validation rows -- are not steps).
StepCounters summarize_steps(const std::vector<MetricsRow>& rows);

// Steps whose grad_norm exceeds kSpikeFactor x the median of up to
// kSpikeWindow steps before it (at least kSpikeMinHistory of them).
// Returns, per step index, the ratio to that median (0 where not judged).
std::vector<double> grad_norm_spike_ratios(const std::vector<double>& grad_norms);

// MemTotal from /proc/meminfo, bytes (0 where unreadable).
size_t machine_ram_bytes();
// MemAvailable from /proc/meminfo: what can be allocated now without
// swapping, page cache it may reclaim included; bytes (0 where unreadable).
size_t available_ram_bytes();

// JSON both ways; from_json tolerates missing keys (older files) but throws
// IoError naming `path` for keys of the wrong type.
nlohmann::json to_json(const RunSummary& s);
RunSummary run_summary_from_json(const nlohmann::json& j, const std::string& path);

// Reads run_dir/run_summary.json when it exists (has_facts) and the counters
// of run_dir/metrics.jsonl (which must exist); `rows`, when given, receives
// the metrics rows read on the way.
RunSummary load_run_summary(const std::string& run_dir, std::vector<MetricsRow>* rows = nullptr);

}  // namespace brisk::monitor
