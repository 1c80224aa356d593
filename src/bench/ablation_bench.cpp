// `brisk bench train --ablation` (train_bench.h): what each speed technique
// is worth, measured in one run beside the PyTorch peer.
//
// Every row is a brisk worker process (`brisk bench train --worker
// --variant ...`) on the same data, seed and windows, so the rows differ only
// in the techniques they switch on and each has its own peak RSS. The
// baseline switches everything off (fp32, plain attention, no fusion, one
// AdamW call per parameter, no recomputation); each technique then runs
// alone on top of the baseline, so its speed-up is its own and not an
// artefact of the order techniques were stacked in; "all on" combines them.
// Rows run one after another, never together: two trainings at once on a
// 2-core machine would measure the scheduler. Every row runs once per round
// and rounds are interleaved (peer, every row; peer, every row; ...), so a
// slow spell of the machine lands on all rows alike; the ratios are formed
// within each round, then their median and range are reported.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "brisk/core/error.h"
#include "brisk/core/safetensors.h"
#include "brisk/data/shards.h"
#include "brisk/monitor/machine.h"
#include "brisk/train/config.h"
#include "train_common.h"

namespace brisk::bench {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct Variant {
  std::string name;  // the table's first column
  std::string spec;  // apply_variant's key=value list
};

constexpr const char* kBaseline =
    "attention=plain,fused_classifier=0,fuse_bias_gelu=0,fuse_residual_layernorm=0,fuse_layernorm_backward=off,"
    "fuse_gelu_backward=off,fuse_bias_backward=off,fuse_weight_casts=off,fused_adamw=0,"
    "recompute=none,precision=fp32";

std::vector<Variant> variants(bool bf16_fast) {
  const std::string base = kBaseline;
  std::vector<Variant> v = {
      {"fp32 baseline", base},
      {"+ flash attention", base + ",attention=flash"},
      {"+ fused classifier", base + ",fused_classifier=1"},
      {"+ bias+GELU epilogue", base + ",fuse_bias_gelu=1"},
      {"+ residual+LayerNorm", base + ",fuse_residual_layernorm=1"},
      {"+ LayerNorm backward+residual", base + ",fuse_layernorm_backward=on"},
      {"+ GELU backward in the product", base + ",fuse_gelu_backward=on"},
      {"+ bias gradient in the product", base + ",fuse_bias_backward=on"},
      {"+ fused AdamW", base + ",fused_adamw=1"},
      {"+ recompute selective", base + ",recompute=selective"},
      {"+ recompute full", base + ",recompute=full"},
      {bf16_fast ? "+ bf16" : "+ bf16 (emulated: no fast path)", base + ",precision=bf16"},
      // The weight-cast fusion acts only on bf16 steps (fp32 has no casts).
      {bf16_fast ? "+ bf16 + fused weight casts" : "+ bf16 (emulated) + fused weight casts",
       base + ",precision=bf16,fuse_weight_casts=on"},
  };
  // All on: every technique, bf16 only where this machine has a fast path
  // for it (elsewhere the trainer itself would fall back to fp32).
  v.push_back({"all on", base + ",attention=flash,fused_classifier=1,fuse_bias_gelu=1,fuse_residual_layernorm=1,"
                                "fuse_layernorm_backward=on,fuse_gelu_backward=on,fuse_bias_backward=on,fused_adamw=1,"
                                "recompute=selective" +
                                (bf16_fast ? ",precision=bf16" : "")});  // (the weight-cast fusion does not combine with recompute)
  v.push_back({"brisk defaults", ""});
  return v;
}

double mib(double bytes) { return bytes / double(1 << 20); }

double planned_mib(const Row& r) {
  if (!r.ok() || !r.report.contains("planned_bytes")) return 0;
  return mib(r.report["planned_bytes"].value("total", 0.0));
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// A row's rounds as one: the first failure, or the medians over rounds of
// tokens/s, ms/step and GFLOP/s, the largest RSS growth, and the rest from
// the first round (losses and plans are the same in every round: same seed,
// same windows).
Row over_rounds(const std::vector<Row>& rounds) {
  for (const Row& r : rounds)
    if (!r.ok()) return r;
  Row m = rounds.front();
  std::vector<double> tps, ms, gf;
  for (const Row& r : rounds) {
    tps.push_back(r.tokens_per_s), ms.push_back(r.ms_per_step), gf.push_back(r.gflops);
    m.keep_largest_growth(r);
    m.others_pct = std::max(m.others_pct, r.others_pct);
  }
  m.tokens_per_s = median(tps), m.ms_per_step = median(ms), m.gflops = median(gf);
  return m;
}

// Per-round ratios of two rows' tokens/s: median, min, max.
struct Ratio {
  double median = 0, lo = 0, hi = 0;
  bool ok = false;
};
Ratio ratio_over_rounds(const std::vector<Row>& a, const std::vector<Row>& b) {
  Ratio q;
  std::vector<double> v;
  for (size_t r = 0; r < a.size() && r < b.size(); ++r) {
    if (!a[r].ok() || !b[r].ok() || !(b[r].tokens_per_s > 0)) return q;
    v.push_back(a[r].tokens_per_s / b[r].tokens_per_s);
  }
  if (v.empty()) return q;
  q.ok = true;
  q.median = median(v);
  q.lo = *std::min_element(v.begin(), v.end());
  q.hi = *std::max_element(v.begin(), v.end());
  return q;
}

std::string ratio_text(const Ratio& q, int rounds) {
  if (!q.ok) return "-";
  return rounds > 1 ? fmt("%.2fx", q.median) + fmt(" [%.2f", q.lo) + fmt("-%.2f]", q.hi) : fmt("%.2fx", q.median);
}

}  // namespace

int run_ablation_bench(const TrainBenchOptions& options) {
  if (is_encoder_workload(options.workload)) return run_e1_bench(options);  // which refuses --ablation by name
  TrainBenchOptions o = options;
  const Workload w = workload_of(o.workload);
  if (o.json_path.empty()) o.json_path = shown(repo_root() / "bench" / "results" / ("ablation_" + w.id + ".json"));
  o = resolve_options(o);
  require_data(o);
  if (o.peer && !fs::exists(o.peer_script))
    throw core::IoError("PyTorch peer " + o.peer_script + " not found (run from the brisk checkout, or --no-peer)");
  if (o.peer && ::access(o.python.c_str(), X_OK) != 0)
    throw core::IoError("the peer's Python " + o.python + " is missing (apt-get install python3-torch), or --no-peer");
  if (o.rounds < 1) throw core::ConfigError("--rounds must be at least 1, got " + std::to_string(o.rounds));
  if (!o.variant.empty())  // the ablation's rows are its own variants: one given here would go unused
    throw core::ConfigError("--ablation runs its own fixed variants; --variant is for a single brisk bench train row");
  if (o.peer_bf16)
    throw core::ConfigError("--bf16 adds bf16 rows to `bench train`; the ablation has its own bf16 row and an fp32 peer");

  const models::GptConfig cfg = models::GptConfig::preset(o.workload);
  const int64_t B = o.batch, T = cfg.block_size, tokens_per_step = B * T;
  const double fpt = cfg.flops_per_token(T);
  const train::PrecisionChoice bf16 = train::resolve_precision(train::Precision::bf16, true);
  const bool bf16_fast = bf16.effective == train::Precision::bf16;
  const std::vector<Variant> vs = variants(bf16_fast);
  double peak = monitor::peak_fp32_gflops(o.threads, 0.5);

  std::printf("brisk bench train --ablation: %s (%s) | batch %lld x seq %lld | median of %d steps after %d warm-up | "
              "%d threads | %zu brisk rows%s | %d interleaved round%s\n\n",
              w.id.c_str(), w.name.c_str(), (long long)B, (long long)T, o.steps, o.warmup, o.threads, vs.size(),
              o.peer ? " + PyTorch fp32" : "", o.rounds, o.rounds == 1 ? "" : "s");
  std::fflush(stdout);

  const std::vector<std::string> common = {"--workload", o.workload, "--steps", std::to_string(o.steps), "--warmup",
                                           std::to_string(o.warmup), "--threads", std::to_string(o.threads),
                                           "--seed", std::to_string(o.seed), "--data", o.data_dir};
  std::vector<std::vector<Row>> runs(vs.size());  // [row][round]
  std::vector<Row> peer_runs;
  for (int round = 0; round < o.rounds; ++round) {
    if (o.rounds > 1) std::fprintf(stderr, "round %d/%d\n", round + 1, o.rounds);
    if (o.peer) {
      std::vector<std::string> argv = {o.python, o.peer_script, "--batch", std::to_string(B)};
      argv.insert(argv.end(), common.begin(), common.end());
      if (o.fix_blas) argv.push_back("--fix-blas");
      peer_runs.push_back(make_row("PyTorch fp32 (peer)", run_child(argv), o, tokens_per_step, fpt, peak));
    }
    for (size_t i = 0; i < vs.size(); ++i) {
      std::fprintf(stderr, "%s\n", vs[i].name.c_str());
      std::vector<std::string> argv = {self_exe(), "bench", "train", "--worker", "--variant", vs[i].spec};
      argv.insert(argv.end(), common.begin(), common.end());
      const ChildResult c = run_child(argv);
      if (auto rep = report_of(c.out); rep && rep->contains("peak_fp32_gflops"))
        peak = std::max(peak, (*rep)["peak_fp32_gflops"].get<double>());
      runs[i].push_back(make_row(vs[i].name, c, o, tokens_per_step, fpt, peak));
    }
  }
  std::vector<Row> rows;
  std::vector<std::string> specs;
  for (size_t i = 0; i < vs.size(); ++i) rows.push_back(over_rounds(runs[i])), specs.push_back(vs[i].spec);
  Row peer_row = o.peer ? over_rounds(peer_runs) : Row{};
  const bool have_peer = o.peer && peer_row.ok();
  // One peak for every row: the best reading of the run.
  for (Row& r : rows)
    if (r.ok()) r.pct_peak = 100.0 * r.gflops / peak;
  if (have_peer) peer_row.pct_peak = 100.0 * peer_row.gflops / peak;

  // ---- the Markdown table
  std::ostringstream md;
  md << "| " << w.id << " (" << w.name << "), " << o.threads << " threads | tokens/s | ms/step | % of fp32 peak | "
     << "RSS growth MiB | planned MiB | speed-up vs baseline | vs PyTorch | final loss |\n"
     << "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  std::vector<Ratio> vs_base(rows.size()), vs_peer(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    vs_base[i] = ratio_over_rounds(runs[i], runs.front());
    if (have_peer) vs_peer[i] = ratio_over_rounds(runs[i], peer_runs);
  }
  auto line = [&](const Row& r, const std::vector<Row>* per_round, const Ratio* to_base, const Ratio* to_peer) {
    md << "| " << r.name << " | ";
    if (!r.ok()) {
      md << "failed: " << r.error << " | | | | | | | |\n";
      return;
    }
    std::string tps = fmt("%.0f", r.tokens_per_s);
    if (o.rounds > 1) {
      double lo = per_round->front().tokens_per_s, hi = lo;
      for (const Row& x : *per_round) lo = std::min(lo, x.tokens_per_s), hi = std::max(hi, x.tokens_per_s);
      tps += fmt(" [%.0f", lo) + fmt("-%.0f]", hi);
    }
    md << tps << " | " << fmt("%.0f", r.ms_per_step) << " | " << fmt("%.1f%%", r.pct_peak) << " | "
       << fmt("%.0f", r.rss_mib) << " | " << (to_base ? fmt("%.0f", planned_mib(r)) : std::string("-")) << " | "
       << (to_base ? ratio_text(*to_base, o.rounds) : std::string("-")) << " | "
       << (to_peer ? ratio_text(*to_peer, o.rounds) : (have_peer ? std::string("1.00x") : std::string("-"))) << " | "
       << fmt("%.4f", r.loss_last) << " |\n";
  };
  if (o.peer) line(peer_row, &peer_runs, nullptr, nullptr);
  for (size_t i = 0; i < rows.size(); ++i) line(rows[i], &runs[i], &vs_base[i], have_peer ? &vs_peer[i] : nullptr);
  double worst_load = o.peer ? std::max(0.0, peer_row.others_pct) : 0.0;
  for (const Row& r : rows) worst_load = std::max(worst_load, r.others_pct);
  std::ostringstream notes;
  notes << "\n" << o.rounds << " interleaved round" << (o.rounds == 1 ? "" : "s")
        << (o.rounds > 1 ? ": tokens/s is the median over rounds [min-max], and each ratio the median of the rounds' "
                           "own ratios [min-max]; RSS growth the largest over rounds. "
                         : ". ")
        << "Each round's figure is the median of " << o.steps << " steps after " << o.warmup
        << " warm-up steps, batch " << B << " x seq " << T
        << ", seed " << o.seed << ", same windows for every row. fp32 peak " << fmt("%.1f", peak)
        << " GFLOP/s (FMA loop, best reading of the run). Planned = params + grads + AdamW state + activation arena."
        << " Final loss = the last step's training loss. Highest CPU load from other processes during a row: "
        << fmt("%.0f%%", worst_load) << ".\n";
  if (!bf16_fast) notes << "bf16: " << bf16.warning.substr(bf16.warning.find("(")) << ".\n";
  md << notes.str();
  std::printf("%s", md.str().c_str());

  // ---- JSON and Markdown beside each other
  json out = {{"bench", "train_ablation"}, {"workload", w.id},   {"time", now_iso()},
              {"batch", B},                {"seq", T},           {"steps", o.steps},
              {"warmup", o.warmup},        {"threads", o.threads}, {"peak_fp32_gflops", peak},
              {"rounds", o.rounds},        {"cpu", monitor::cpu_model()}};
  auto with_rounds = [](json j, const std::vector<Row>& per_round) {
    j["rounds"] = json::array();
    for (const Row& x : per_round)
      j["rounds"].push_back({{"ok", x.ok()}, {"tokens_per_s", x.tokens_per_s}, {"rss_growth_mib", x.rss_mib}});
    return j;
  };
  auto ratio_json = [](const Ratio& q) { return json{{"median", q.median}, {"min", q.lo}, {"max", q.hi}}; };
  if (o.peer) out["peer"] = with_rounds(row_json(peer_row), peer_runs);
  for (size_t i = 0; i < rows.size(); ++i) {
    json j = with_rounds(row_json(rows[i]), runs[i]);
    j["variant"] = specs[i];
    j["planned_mib"] = planned_mib(rows[i]);
    if (vs_base[i].ok) j["speedup_vs_baseline"] = ratio_json(vs_base[i]);
    if (vs_peer[i].ok) j["ratio_vs_pytorch"] = ratio_json(vs_peer[i]);
    out["rows"].push_back(j);
  }
  const fs::path jp(o.json_path);
  if (jp.has_parent_path()) fs::create_directories(jp.parent_path());
  core::write_file_atomic(o.json_path, out.dump(2) + "\n");
  fs::path mdp = jp;
  mdp.replace_extension(".md");
  core::write_file_atomic(mdp.string(), md.str());
  std::printf("\nwrote %s and %s\n", o.json_path.c_str(), mdp.string().c_str());

  bool all_ok = !o.peer || peer_row.ok();
  for (const Row& r : rows) all_ok = all_ok && r.ok();
  return all_ok ? 0 : 1;
}

}  // namespace brisk::bench
