// The HTML page of `brisk report` (report.h). Sections, in order: the runs
// at a glance, the comparison (--compare), the plots over steps (every run
// on the same axes, one colour per run), the recommendations and score, the
// memory plan, the per-op profile, the configs verbatim, the encoder's
// report.json. A plot is drawn only for a counter some run recorded, so an
// encoder run shows its padding and cache figures and no MFU. Nothing is
// fetched: no external script, style sheet, font or image.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "brisk/monitor/compare.h"
#include "brisk/monitor/report.h"
#include "svg_plot.h"

namespace brisk::monitor {

namespace {

// Tableau 10: distinct on screen and in print.
const char* const kColors[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                               "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
const char* color_of(size_t run) { return kColors[run % (sizeof kColors / sizeof kColors[0])]; }
std::string run_class(size_t run) { return "run-" + std::to_string(run); }

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}
std::string mib(size_t bytes) { return fmt("%.1f", double(bytes) / double(1 << 20)); }

// (step, value) of `key` over a run's rows, times `scale`.
std::vector<std::pair<double, double>> points_of(const RunData& r, const std::string& key, double scale = 1) {
  std::vector<std::pair<double, double>> p;
  for (const MetricsRow& row : r.rows)
    if (auto it = row.values.find(key); it != row.values.end()) p.emplace_back(double(row.step), it->second * scale);
  return p;
}

// The validation loss: the GPT trainer's "val_loss", the classifier's "val.loss".
std::vector<std::pair<double, double>> val_points(const RunData& r) {
  auto p = points_of(r, "val_loss");
  return p.empty() ? points_of(r, "val.loss") : p;
}

const MetricsRow* last_with(const RunData& r, const std::string& key) {
  for (auto it = r.rows.rbegin(); it != r.rows.rend(); ++it)
    if (it->has(key)) return &*it;
  return nullptr;
}

struct KnownPlot {
  const char* key;
  const char* title;
  const char* unit;
  double scale;
  bool log_y;
};
// The counters brisk's trainers log, in the order the page shows them.
const KnownPlot kKnown[] = {
    {"loss", "Training loss (solid) and validation loss (dashed)", "loss", 1, false},
    {"tokens_per_s", "Throughput", "tokens/s", 1, false},
    {"mfu", "MFU: share of the measured peak FLOP/s", "%", 100, false},
    {"data_wait_ms", "Data wait per step (loader)", "ms", 1, false},
    {"lr", "Learning rate", "lr", 1, false},
    {"grad_norm", "Gradient norm (open circles: spikes above 5x the running median)", "norm", 1, false},
    {"loss_scale", "Loss scale (dynamic loss scaling)", "scale", 1, true},
    {"ms_per_step", "Step time", "ms", 1, false},
};
// Titles of other counters brisk writes; anything else is shown under its key.
const std::map<std::string, std::pair<const char*, const char*>> kTitles = {
    {"padding_waste", {"Padding waste (share of batch cells)", "share"}},
    {"cache_hit_rate", {"Record cache hit rate", "share"}},
    {"batch_width", {"Batch width (padded tokens per row)", "tokens"}},
    {"comm_ms", {"Gradient communication per step", "ms"}},
    {"comm_exposed_ms", {"Exposed gradient communication per step", "ms"}},
    {"comm_hidden_ms", {"Hidden gradient communication per step", "ms"}},
    {"val.accuracy", {"Validation accuracy", "accuracy"}},
    {"val.f1", {"Validation F1", "F1"}},
    {"val.precision", {"Validation precision", "precision"}},
    {"val.recall", {"Validation recall", "recall"}},
    {"val.roc_auc", {"Validation ROC AUC", "AUC"}},
};
// Keys that are bookkeeping, not counters over steps.
// (rss_mib is in the memory plot.)
const std::set<std::string> kNotPlotted = {"time_s", "world", "epoch", "val.count", "val_loss", "val.loss", "rss_mib"};

std::string plots_section(const std::vector<RunData>& runs) {
  std::vector<PlotSpec> specs;
  for (const KnownPlot& k : kKnown) {
    PlotSpec spec{std::string("plot-") + k.key, k.title, k.unit, k.log_y, {}};
    for (size_t i = 0; i < runs.size(); ++i) {
      auto pts = points_of(runs[i], k.key, k.scale);
      // An MFU of 0 throughout means no peak was known (an unlisted GPU): nothing to show.
      if (std::string(k.key) == "mfu" &&
          std::all_of(pts.begin(), pts.end(), [](const auto& p) { return p.second == 0; }))
        pts.clear();
      if (!pts.empty()) spec.series.push_back({runs[i].name + ": " + k.key, run_class(i), color_of(i), pts});
      if (std::string(k.key) == "loss") {
        auto val = val_points(runs[i]);
        if (!val.empty())
          spec.series.push_back({runs[i].name + ": validation loss", run_class(i), color_of(i), val, true, true, true});
      }
      if (std::string(k.key) == "grad_norm" && !pts.empty()) {
        std::vector<double> g;
        for (const auto& p : pts) g.push_back(p.second);
        const std::vector<double> ratio = grad_norm_spike_ratios(g);
        std::vector<std::pair<double, double>> spikes;
        for (size_t s = 0; s < ratio.size(); ++s)
          if (ratio[s] > kSpikeFactor) spikes.push_back(pts[s]);
        if (!spikes.empty())
          spec.series.push_back(
              {runs[i].name + ": gradient-norm spike", run_class(i), color_of(i), spikes, false, false, true});
      }
    }
    if (!spec.series.empty()) specs.push_back(std::move(spec));
  }
  // Memory: the planned total (once per run, dashed across its steps) and
  // the resident memory after each step (metrics.jsonl's rss_mib); runs
  // logged before rss_mib existed show their peak RSS as a flat line.
  PlotSpec memory{"plot-memory-steps", "Memory: planned total (dashed) and RSS after each step (solid)", "MiB",
                  false, {}};
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunSummary& s = runs[i].summary;
    if (runs[i].rows.empty()) continue;
    const double x0 = double(runs[i].rows.front().step), x1 = double(runs[i].rows.back().step);
    const double mb = 1.0 / double(1 << 20);
    if (s.has_memory_plan)
      memory.series.push_back({runs[i].name + ": planned total MiB", run_class(i), color_of(i),
                               {{x0, double(s.memory.total()) * mb}, {x1, double(s.memory.total()) * mb}}, true, true});
    std::vector<std::pair<double, double>> rss;
    for (const MetricsRow& r : runs[i].rows)
      if (r.has("rss_mib")) rss.push_back({double(r.step), r.values.at("rss_mib")});
    if (!rss.empty())
      memory.series.push_back({runs[i].name + ": RSS MiB", run_class(i), color_of(i), rss});
    else if (s.peak_rss_bytes > 0)
      memory.series.push_back({runs[i].name + ": peak RSS MiB", run_class(i), color_of(i),
                               {{x0, double(s.peak_rss_bytes) * mb}, {x1, double(s.peak_rss_bytes) * mb}}});
  }
  if (!memory.series.empty()) {
    auto at = std::find_if(specs.begin(), specs.end(), [](const PlotSpec& p) { return p.id == "plot-data_wait_ms"; });
    specs.insert(at, std::move(memory));
  }
  // Everything else the runs logged, by key.
  std::set<std::string> keys;
  for (const RunData& r : runs)
    for (const MetricsRow& row : r.rows)
      for (const auto& [k, v] : row.values) keys.insert(k);
  for (const KnownPlot& k : kKnown) keys.erase(k.key);
  for (const std::string& k : kNotPlotted) keys.erase(k);
  for (const std::string& key : keys) {
    const auto t = kTitles.find(key);
    PlotSpec spec{"plot-" + key, t != kTitles.end() ? t->second.first : key,
                  t != kTitles.end() ? t->second.second : key, false, {}};
    for (size_t i = 0; i < runs.size(); ++i) {
      auto pts = points_of(runs[i], key);
      if (!pts.empty()) spec.series.push_back({runs[i].name + ": " + key, run_class(i), color_of(i), pts});
    }
    if (!spec.series.empty()) specs.push_back(std::move(spec));
  }
  std::string o = "<section id=\"plots\"><h2>Over steps</h2><div class=\"grid\">";
  for (const PlotSpec& s : specs) o += "<figure>" + svg_line_plot(s) + "</figure>";
  return o + "</div></section>";
}

std::string legend(const std::vector<RunData>& runs) {
  std::string o = "<div class=\"legend\">";
  for (size_t i = 0; i < runs.size(); ++i)
    o += "<span class=\"item\" data-run=\"" + run_class(i) + "\" title=\"click: hide or show this run\"><span "
         "class=\"swatch\" style=\"background:" + std::string(color_of(i)) + "\"></span>" + html_escape(runs[i].name) +
         (runs[i].dir == runs[i].name ? "" : " <small>" + html_escape(runs[i].dir) + "</small>") + "</span>";
  return o + "</div>";
}

std::string overview(const std::vector<RunData>& runs) {
  std::string o = "<section id=\"overview\"><h2>Runs</h2><table><tr><th>run</th><th>kind</th><th>steps</th>"
                  "<th>final loss</th><th>final val loss</th><th>median tokens/s</th><th>median MFU</th>"
                  "<th>data wait</th><th>precision</th><th>device</th><th>score</th></tr>";
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunData& r = runs[i];
    const RunSummary& s = r.summary;
    const StepCounters& c = s.counters;
    const MetricsRow* last = last_with(r, "loss");
    const auto val = val_points(r);
    std::string device = s.has_facts ? s.device : "-";
    if (s.has_facts && s.device == "cpu") device += ", " + std::to_string(s.threads) + " of " + std::to_string(s.cores) + " cores";
    o += "<tr><td><span class=\"swatch\" style=\"background:" + std::string(color_of(i)) + "\"></span>" +
         html_escape(r.name) + "</td><td>" + html_escape(s.kind) + "</td><td>" + std::to_string(c.last_step) +
         "</td><td>" + (last ? fmt("%.4f", last->values.at("loss")) : "-") + "</td><td>" +
         (val.empty() ? "-" : fmt("%.4f", val.back().second)) + "</td><td>" + short_number(c.median_tokens_per_s) +
         "</td><td>" + (c.has_mfu ? fmt("%.1f%%", 100 * c.median_mfu) : "-") + "</td><td>" +
         (c.has_data_wait ? fmt("%.2f%%", 100 * c.data_wait_share) : "-") + "</td><td>" +
         html_escape(s.has_facts ? s.precision + " (" + s.precision_path + ")" : "-") + "</td><td>" +
         html_escape(device) + "</td><td>" + (r.advice.score >= 0 ? std::to_string(r.advice.score) : "-") +
         "</td></tr>";
  }
  return o + "</table></section>";
}

std::string comparison_section(const Comparison& c) {
  std::string o = "<section id=\"comparison\"><h2>B against A</h2><p>A: <b>" + html_escape(c.a_name) + "</b>, B: <b>" +
                  html_escape(c.b_name) + "</b>. " +
                  (c.any_regression() ? "<span class=\"regression\">REGRESSION</span>: B falls behind A beyond A's own "
                                        "spread."
                                      : "<span class=\"ok\">no regression</span> of B against A.") +
                  "</p><table><tr><th>metric</th><th>A</th><th>B</th><th>change</th><th>A spread (IQR)</th>"
                  "<th>allowed</th><th>verdict</th><th>how</th></tr>";
  for (const MetricComparison& m : c.rows) {
    if (!m.available) {
      o += "<tr><td>" + html_escape(m.metric) + "</td><td colspan=\"6\">n/a</td><td>" + html_escape(m.basis) +
           "</td></tr>";
      continue;
    }
    o += std::string("<tr") + (m.regression ? " class=\"regression-row\"" : "") + "><td>" + html_escape(m.metric) +
         "</td><td>" + fmt("%.6g", m.a) + "</td><td>" + fmt("%.6g", m.b) + "</td><td>" + fmt("%+.1f%%", 100 * m.change()) +
         "</td><td>" + fmt("%.4g", m.a_spread) + "</td><td>" + fmt("%.4g", m.tolerance) + "</td><td>" +
         (m.regression ? "<span class=\"regression\">REGRESSION</span>" : "ok") + "</td><td>" + html_escape(m.basis) +
         "</td></tr>";
  }
  return o + "</table></section>";
}

std::string recommendations_section(const std::vector<RunData>& runs) {
  std::string o = "<section id=\"recommendations\"><h2>Recommendations and score</h2><p class=\"note\">score = "
                  "round(100 &times; &Sigma; weight &times; (1 &minus; severity) / &Sigma; weight) over the rules "
                  "that apply; each rule's weight is shown, and n/a rules count for nothing.</p>";
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunData& r = runs[i];
    const int score = r.advice.score;
    const char* band = score < 0 ? "none" : score >= 80 ? "good" : score >= 50 ? "fair" : "poor";
    o += "<h3><span class=\"swatch\" style=\"background:" + std::string(color_of(i)) + "\"></span>" +
         html_escape(r.name) + " <span class=\"score " + band + "\">" +
         (score >= 0 ? std::to_string(score) + "/100" : "no score") + "</span></h3><p class=\"note\">" +
         (r.advice_recorded ? "as the run recorded it (recommendations.json)"
                            : "computed by brisk report (the run wrote no recommendations.json)") +
         "</p><table><tr><th>level</th><th>rule</th><th>weight</th><th>points lost</th><th>finding</th>"
         "<th>counter</th><th>value</th><th>threshold</th></tr>";
    for (const Finding& f : r.advice.findings)
      o += "<tr class=\"level-" + std::string(f.level() == std::string("n/a") ? "na" : f.level()) + "\"><td>" +
           f.level() + "</td><td>" + html_escape(f.rule) + "</td><td>" + fmt("%.0f", f.weight) + "</td><td>" +
           (f.applies ? fmt("%.1f", f.points_lost()) : "-") + "</td><td>" + html_escape(f.message) + "</td><td>" +
           html_escape(f.counter) + "</td><td>" + (f.applies ? fmt("%.4g", f.value) : "-") + "</td><td>" +
           html_escape(f.threshold) + "</td></tr>";
    o += "</table>";
  }
  return o + "</section>";
}

// One horizontal stacked bar per run: the plan's parts, and peak RSS as a tick.
std::string memory_bars(const std::vector<RunData>& runs) {
  struct Part {
    const char* name;
    const char* color;
    size_t PlannedMemory::*field;
  };
  const Part parts[] = {{"params", "#4e79a7", &PlannedMemory::params},
                        {"grads", "#f28e2b", &PlannedMemory::grads},
                        {"optimizer state", "#59a14f", &PlannedMemory::optimizer_state},
                        {"arena (activations + workspace)", "#b07aa1", &PlannedMemory::arena}};
  double most = 0;
  std::vector<size_t> shown;
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunSummary& s = runs[i].summary;
    if (!s.has_memory_plan) continue;
    shown.push_back(i);
    most = std::max({most, double(s.memory.total()), double(s.peak_rss_bytes)});
  }
  if (shown.empty() || !(most > 0)) return "";
  // Drawn at the size it is shown (figure.wide is 900 px wide): text stays the page's size.
  const double left = 170, width = 700, row_h = 26, top = 30;
  const double h = top + row_h * double(shown.size()) + 40;
  std::string o = "<svg class=\"bars\" id=\"plot-memory\" viewBox=\"0 0 900 " + fmt("%.0f", h) +
                  "\" role=\"img\" aria-label=\"memory plan\"><text class=\"title\" x=\"10\" y=\"18\">Memory: the "
                  "plan of one train step (bars) and peak RSS (black tick), MiB</text>";
  for (size_t k = 0; k < shown.size(); ++k) {
    const RunData& r = runs[shown[k]];
    const double y = top + row_h * double(k);
    o += "<text class=\"tick y\" x=\"" + fmt("%.0f", left - 6) + "\" y=\"" + fmt("%.1f", y + 15) + "\">" +
         html_escape(r.name) + "</text>";
    double x = left;
    for (const Part& p : parts) {
      const double w = width * double(r.summary.memory.*p.field) / most;
      o += "<rect x=\"" + fmt("%.1f", x) + "\" y=\"" + fmt("%.1f", y + 4) + "\" width=\"" + fmt("%.1f", w) +
           "\" height=\"16\" fill=\"" + p.color + "\"><title>" + html_escape(r.name) + ": " + p.name + " " +
           mib(r.summary.memory.*p.field) + " MiB</title></rect>";
      x += w;
    }
    if (r.summary.peak_rss_bytes > 0) {
      const double xr = left + width * double(r.summary.peak_rss_bytes) / most;
      o += "<line class=\"rss\" x1=\"" + fmt("%.1f", xr) + "\" x2=\"" + fmt("%.1f", xr) + "\" y1=\"" + fmt("%.1f", y) +
           "\" y2=\"" + fmt("%.1f", y + 24) + "\"><title>" + html_escape(r.name) + ": peak RSS " +
           mib(r.summary.peak_rss_bytes) + " MiB</title></line>";
    }
  }
  double lx = 10;
  const double ly = top + row_h * double(shown.size()) + 20;
  for (const Part& p : parts) {
    o += "<rect x=\"" + fmt("%.0f", lx) + "\" y=\"" + fmt("%.0f", ly - 9) + "\" width=\"10\" height=\"10\" fill=\"" +
         p.color + "\"/><text class=\"key\" x=\"" + fmt("%.0f", lx + 14) + "\" y=\"" + fmt("%.0f", ly) + "\">" + p.name +
         "</text>";
    lx += 40 + 6.5 * double(std::string(p.name).size());
  }
  return o + "</svg>";
}

std::string memory_section(const std::vector<RunData>& runs) {
  const std::string bars = memory_bars(runs);
  std::string o = "<section id=\"memory\"><h2>Memory plan</h2>";
  if (bars.empty()) return o + "<p class=\"note\">No run recorded a memory plan (run_summary.json).</p></section>";
  o += "<figure class=\"wide\">" + bars + "</figure><table><tr><th>run</th><th>params</th><th>grads</th>"
       "<th>optimizer state</th><th>arena</th><th>(activations peak)</th><th>(workspace)</th><th>planned total</th>"
       "<th>peak RSS</th><th>machine RAM</th><th>recompute</th><th>fused classifier</th></tr>";
  for (const RunData& r : runs) {
    const RunSummary& s = r.summary;
    if (!s.has_memory_plan) continue;
    const PlannedMemory& m = s.memory;
    o += "<tr><td>" + html_escape(r.name) + "</td><td>" + mib(m.params) + "</td><td>" + mib(m.grads) + "</td><td>" +
         mib(m.optimizer_state) + "</td><td>" + mib(m.arena) + "</td><td>" + mib(m.activations) + "</td><td>" +
         mib(m.workspace) + "</td><td><b>" + mib(m.total()) + "</b></td><td>" + mib(s.peak_rss_bytes) + "</td><td>" +
         mib(s.machine_ram_bytes) + "</td><td>" + html_escape(s.recompute) + "</td><td>" +
         (s.fused_classifier ? "on" : "off") + "</td></tr>";
  }
  return o + "</table><p class=\"note\">MiB. The plan is the planner's, before anything ran (brisk plan shows "
             "it for every recompute level); peak RSS is the training process's VmHWM at its end.</p></section>";
}

std::string profile_section(const std::vector<RunData>& runs) {
  std::string o;
  for (const RunData& r : runs) {
    if (r.summary.profile.empty()) continue;
    o += "<h3>" + html_escape(r.name) + "</h3><table class=\"profile\"><tr><th>op</th><th>calls</th><th>seconds</th>"
         "<th>share</th><th></th></tr>";
    for (const ProfileRow& p : r.summary.profile)
      o += "<tr><td>" + html_escape(p.op) + "</td><td>" + std::to_string(p.calls) + "</td><td>" + fmt("%.3f", p.seconds) +
           "</td><td>" + fmt("%.1f%%", 100 * p.share) + "</td><td><span class=\"share\" style=\"width:" +
           fmt("%.1f", 300 * std::clamp(p.share, 0.0, 1.0)) + "px\"></span></td></tr>";
    o += "</table>";
  }
  if (o.empty()) return "";
  return "<section id=\"profile\"><h2>Time per op (--profile)</h2>" + o + "</section>";
}

std::string config_section(const std::vector<RunData>& runs) {
  std::string o = "<section id=\"config\"><h2>Configuration</h2>";
  for (const RunData& r : runs) {
    if (r.config_toml.empty()) {
      o += "<p class=\"note\">" + html_escape(r.name) + ": no config.toml</p>";
      continue;
    }
    o += "<details open><summary>" + html_escape(r.name) + ": config.toml</summary><pre class=\"config\">" +
         html_escape(r.config_toml) + "</pre></details>";
  }
  for (const RunData& r : runs)
    if (!r.encoder_report.empty())
      o += "<details><summary>" + html_escape(r.name) + ": report.json (the classifier's test and validation "
           "metrics)</summary><pre>" + html_escape(r.encoder_report) + "</pre></details>";
  return o + "</section>";
}

const char* kStyle = R"(
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;margin:24px;color:#222;background:#fff;max-width:1400px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:18px;border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:28px} h3{font-size:15px}
table{border-collapse:collapse;font-size:13px;margin:8px 0} th,td{border:1px solid #ddd;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#f4f4f4} .note{color:#666;font-size:13px}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(520px,1fr));gap:12px}
figure{margin:0;border:1px solid #e4e4e4;border-radius:4px;padding:4px} figure.wide{max-width:900px}
svg{width:100%;height:auto;display:block} svg text{font-size:11px;fill:#333}
svg .title{font-size:13px;font-weight:600} svg .frame{fill:none;stroke:#bbb} svg .grid{stroke:#eee}
svg .tick.y{text-anchor:end} svg .tick.x,svg .axis.x{text-anchor:middle} svg .axis.y{text-anchor:middle}
svg .empty{text-anchor:middle;fill:#999} svg .series{fill:none;stroke-width:1.6;stroke-linejoin:round}
svg .rss{stroke:#000;stroke-width:2.5}
.legend{margin:8px 0 12px}.legend .item{display:inline-block;margin-right:16px;cursor:pointer;user-select:none;font-size:14px}
.legend .item.off{opacity:.35} .legend small{color:#888}
.swatch{display:inline-block;width:12px;height:12px;border-radius:2px;margin-right:5px;vertical-align:-1px}
.score{padding:2px 8px;border-radius:10px;color:#fff;font-size:13px;margin-left:8px}
.score.good{background:#3a8f3a}.score.fair{background:#c98a00}.score.poor{background:#c0392b}.score.none{background:#888}
tr.level-bad td:first-child{color:#c0392b;font-weight:600} tr.level-warn td:first-child{color:#c98a00;font-weight:600}
tr.level-ok td:first-child{color:#3a8f3a} tr.level-na{color:#888}
.regression{color:#fff;background:#c0392b;padding:1px 6px;border-radius:3px;font-weight:600} .ok{color:#3a8f3a;font-weight:600}
tr.regression-row td{background:#fdecea}
pre{background:#f8f8f8;border:1px solid #e4e4e4;padding:8px;font-size:12px;overflow:auto;max-height:480px}
.share{display:inline-block;height:10px;background:#4e79a7}
)";

// Legend clicks hide or show one run in every plot; the attribute it sets
// last tells a headless browser check that the script ran to its end.
const char* kScript = R"(
(function () {
  var items = document.querySelectorAll('.legend .item');
  for (var i = 0; i < items.length; i++) {
    items[i].addEventListener('click', function (ev) {
      var item = ev.currentTarget, run = item.getAttribute('data-run');
      var off = item.classList.toggle('off');
      var groups = document.querySelectorAll('.series-group.' + run);
      for (var k = 0; k < groups.length; k++) groups[k].style.display = off ? 'none' : '';
    });
  }
  document.body.setAttribute('data-brisk-plots', String(document.querySelectorAll('svg.plot').length));
})();
)";

}  // namespace

std::string html_report(const std::vector<RunData>& runs, const Comparison* comparison) {
  std::string names;
  for (const RunData& r : runs) names += (names.empty() ? "" : ", ") + r.name;
  std::string o = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" "
                  "content=\"width=device-width,initial-scale=1\"><title>brisk report: " + html_escape(names) +
                  "</title><style>" + kStyle + "</style></head><body>";
  o += "<h1>brisk report</h1><p class=\"note\">" + std::to_string(runs.size()) +
       (runs.size() == 1 ? " run" : " runs") + ". Hover a line or point for its values; click a run in the legend to "
       "hide or show it.</p>";
  o += legend(runs);
  o += overview(runs);
  if (comparison) o += comparison_section(*comparison);
  o += plots_section(runs);
  o += recommendations_section(runs);
  o += memory_section(runs);
  o += profile_section(runs);
  o += config_section(runs);
  o += std::string("<script>") + kScript + "</script></body></html>\n";
  return o;
}

}  // namespace brisk::monitor
