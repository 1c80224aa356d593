// Recommendations and a 0-100 performance score for a finished run: a pure
// function of its RunSummary (run_summary.h), so every rule can be tested on
// synthetic summaries. Each rule reads one measured counter, compares it
// with a documented threshold and, where it fires, says which setting to
// change; its message carries the value and the threshold. The score is the
// weighted share of what the applicable rules allow (docs/monitoring.md,
// "Recommendations and score"):
//
//   score = round(100 * sum_i w_i * (1 - s_i) / sum_i w_i)
//
// over the rules that apply to the run (their counter was measured), with
// s_i in [0, 1] the rule's severity. A rule that does not apply costs and
// earns nothing; no applicable rule at all gives no score (-1).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "brisk/monitor/run_summary.h"

namespace brisk::monitor {

struct Finding {
  std::string rule;       // "data_wait", "mfu", "memory", "loss_scale", "grad_spikes", "precision", "threads"
  double weight = 0;      // the rule's weight in the score
  bool applies = false;   // false: its counter was not measured (severity 0, not in the score)
  double severity = 0;    // [0, 1]: 0 fine, 1 the whole weight lost
  std::string counter;    // what was read, e.g. "metrics.jsonl data_wait_ms / ms_per_step"
  double value = 0;       // the counter's value
  std::string threshold;  // e.g. "> 5%"
  std::string message;    // value, threshold, and what to change
  double points_lost() const { return applies ? weight * severity : 0.0; }
  const char* level() const;  // "ok", "info", "warn", "bad" (from severity), "n/a"
};

struct Advice {
  std::vector<Finding> findings;  // every rule, in a fixed order
  int score = -1;                 // 0-100, -1 when no rule applies
};

// The rules' weights (sum 100), in the order advise() lists them.
struct RuleWeight {
  const char* rule;
  double weight;
};
const std::vector<RuleWeight>& rule_weights();

Advice advise(const RunSummary& s);

// The findings as text: a score line, then one line per rule (level, weight,
// points lost, message), the ones to act on first.
std::string format_advice(const Advice& a);

nlohmann::json to_json(const Advice& a);
// Throws IoError naming `path` when the JSON is not an advice document.
Advice advice_from_json(const nlohmann::json& j, const std::string& path);

// Computes the advice of run_dir (load_run_summary) and writes it to
// run_dir/recommendations.json (atomically). Returns it.
Advice write_recommendations(const std::string& run_dir);

}  // namespace brisk::monitor
