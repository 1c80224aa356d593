// `brisk report`'s library side (monitor/report.h, monitor/compare.h) on
// synthetic run directories: the page has one SVG plot per recorded counter
// with one path per run, nothing external, the config escaped; an encoder
// run's counters render and absent ones are skipped; runs get distinct
// legend names; the comparison flags a slower B beyond A's spread and not
// one within it; unreadable run directories are refused naming the file.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>

#include "brisk/core/error.h"
#include "brisk/monitor/compare.h"
#include "brisk/monitor/report.h"

using namespace brisk;
namespace fs = std::filesystem;

namespace {

class Dir {
 public:
  Dir() {
    static int n = 0;
    path_ = fs::temp_directory_path() / ("brisk_report_test_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~Dir() { fs::remove_all(path_); }
  std::string sub(const std::string& name) const {
    fs::create_directories(path_ / name);
    return (path_ / name).string();
  }

 private:
  fs::path path_;
};

// A GPT-like run: `steps` rows around `tps` tokens/s (+-1%), loss falling to
// `final_loss`; with `rss`, resident memory growing from 200 MiB by 1 MiB a step.
void write_gpt_run(const std::string& dir, int steps, double tps, double final_loss, bool summary = true,
                   bool rss = false) {
  std::ofstream m(dir + "/metrics.jsonl");
  for (int i = 1; i <= steps; ++i) {
    nlohmann::json r = {{"step", i},
                        {"loss", final_loss + 3.0 / i},
                        {"lr", 1e-3},
                        {"grad_norm", 1.0 + 0.1 * (i % 3)},
                        {"tokens_per_s", tps * (1.0 + 0.01 * ((i % 5) - 2) / 2.0)},
                        {"ms_per_step", 10.0},
                        {"mfu", tps / 1e5},
                        {"data_wait_ms", 0.05},
                        {"precision", "fp32"},
                        {"precision_path", "fp32"},
                        {"time_s", 0.01 * i}};
    if (i % 10 == 0) r["val_loss"] = final_loss + 0.2;
    if (rss) r["rss_mib"] = 200.0 + i;
    m << r.dump() << "\n";
  }
  std::ofstream(dir + "/config.toml") << "[train]\nbatch = 4\n# <b>not markup</b> & more\n";
  if (!summary) return;
  nlohmann::json s = {{"kind", "gpt"}, {"device", "cpu"}, {"threads", 2}, {"cores", 2}, {"loader_workers", 2},
                      {"batch", 4}, {"seq", 32}, {"precision", "fp32"}, {"precision_path", "fp32"},
                      {"peak_gflops", 100.0}, {"machine_ram_bytes", 8ull << 30}, {"peak_rss_bytes", 300ull << 20},
                      {"memory_plan", {{"params", 1 << 20}, {"grads", 1 << 20}, {"optimizer_state", 2 << 20},
                                       {"arena", 4 << 20}}},
                      {"profile", {{{"op", "matmul"}, {"calls", 10}, {"seconds", 0.5}, {"share", 0.6}}}}};
  std::ofstream(dir + "/run_summary.json") << s.dump(2);
}

int count(const std::string& s, const std::string& part) {
  int n = 0;
  for (size_t p = s.find(part); p != std::string::npos; p = s.find(part, p + 1)) ++n;
  return n;
}

// load_run's error for a run directory, or "(accepted)".
std::string message(const std::string& dir) {
  try {
    monitor::load_run(dir);
  } catch (const core::IoError& e) {
    return std::string(e.what());
  }
  return std::string("(accepted)");
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The <svg ...>...</svg> element with this id.
std::string svg_with_id(const std::string& html, const std::string& id) {
  const size_t at = html.find("id=\"" + id + "\"");
  if (at == std::string::npos) return "";
  const size_t open = html.rfind("<svg", at), close = html.find("</svg>", at);
  return html.substr(open, close - open);
}

}  // namespace

TEST(Report, TwoGptRunsOverlayInEveryPlot) {
  Dir d;
  const std::string a = d.sub("x/run"), b = d.sub("y/run");
  write_gpt_run(a, 60, 1000, 1.5);
  write_gpt_run(b, 40, 800, 1.6);
  std::vector<monitor::RunData> runs = {monitor::load_run(a), monitor::load_run(b)};
  monitor::name_runs(runs);
  EXPECT_EQ(runs[0].name, "x/run");
  EXPECT_EQ(runs[1].name, "y/run");
  EXPECT_FALSE(runs[0].advice_recorded);  // computed: the synthetic run wrote no recommendations.json
  EXPECT_GE(runs[0].advice.score, 0);

  const std::string html = monitor::html_report(runs, nullptr);
  for (const char* id : {"plot-loss", "plot-tokens_per_s", "plot-mfu", "plot-memory-steps", "plot-data_wait_ms",
                         "plot-lr", "plot-grad_norm", "plot-ms_per_step"}) {
    const std::string svg = svg_with_id(html, id);
    ASSERT_FALSE(svg.empty()) << id;
    EXPECT_GE(count(svg, "<path class=\"series\""), 2) << id;  // one per run (the loss plot: val too)
    EXPECT_TRUE(std::regex_search(svg, std::regex("d=\"M[0-9.]+ [0-9.]+ L"))) << id;
  }
  EXPECT_EQ(count(svg_with_id(html, "plot-loss"), "stroke-dasharray"), 2);  // validation loss, dashed, per run
  EXPECT_TRUE(svg_with_id(html, "plot-loss_scale").empty());  // not recorded: not drawn
  EXPECT_FALSE(svg_with_id(html, "plot-memory").empty());     // the plan's bars
  EXPECT_EQ(html.find("plot-time_s"), std::string::npos);
  // Self-contained: nothing to fetch.
  EXPECT_EQ(html.find("http://"), std::string::npos);
  EXPECT_EQ(html.find("https://"), std::string::npos);
  EXPECT_EQ(html.find("src="), std::string::npos);
  EXPECT_EQ(html.find("<link"), std::string::npos);
  // The config verbatim, escaped.
  EXPECT_NE(html.find("# &lt;b&gt;not markup&lt;/b&gt; &amp; more"), std::string::npos);
  EXPECT_EQ(html.find("<b>not markup</b>"), std::string::npos);
  EXPECT_NE(html.find("id=\"recommendations\""), std::string::npos);
  EXPECT_NE(html.find("id=\"profile\""), std::string::npos);
  EXPECT_NE(html.find(">matmul<"), std::string::npos);
}

TEST(Report, EncoderRunPlotsWhatItRecorded) {
  Dir d;
  const std::string dir = d.sub("enc");
  std::ofstream m(dir + "/metrics.jsonl");
  for (int i = 1; i <= 20; ++i)
    m << nlohmann::json({{"step", i}, {"epoch", 0}, {"loss", 1.0 / i}, {"lr", 1e-3}, {"grad_norm", 0.5},
                         {"ms_per_step", 3.0}, {"tokens_per_s", 5000.0}, {"batch_width", 64}, {"padding_waste", 0.1},
                         {"cache_hit_rate", 0.5}, {"data_wait_ms", 0.01}})
                .dump()
      << "\n";
  m << R"({"epoch":1,"step":20,"val":{"count":10,"accuracy":0.9,"loss":0.3,"f1":0.8,"confusion":[[1,2],[3,4]]}})" << "\n";
  m.close();
  std::ofstream(dir + "/report.json") << R"({"test": {"accuracy": 0.9}})";
  std::vector<monitor::RunData> runs = {monitor::load_run(dir)};
  monitor::name_runs(runs);
  EXPECT_EQ(runs[0].summary.kind, "encoder");
  EXPECT_EQ(runs[0].summary.counters.steps, 20);
  const std::string html = monitor::html_report(runs, nullptr);
  for (const char* id : {"plot-loss", "plot-tokens_per_s", "plot-padding_waste", "plot-cache_hit_rate",
                         "plot-batch_width", "plot-val.accuracy", "plot-val.f1", "plot-grad_norm"})
    EXPECT_FALSE(svg_with_id(html, id).empty()) << id;
  for (const char* id : {"plot-mfu", "plot-loss_scale", "plot-memory", "plot-val.count", "plot-epoch"})
    EXPECT_TRUE(svg_with_id(html, id).empty()) << id;
  EXPECT_EQ(count(svg_with_id(html, "plot-loss"), "stroke-dasharray"), 1);  // val.loss
  EXPECT_NE(html.find("report.json"), std::string::npos);
}

TEST(Report, CompareFlagsASlowerRunBeyondTheSpread) {
  Dir d;
  const std::string a = d.sub("a"), slow = d.sub("slow"), same = d.sub("same");
  write_gpt_run(a, 50, 1000, 1.5);
  write_gpt_run(slow, 50, 900, 1.5);
  write_gpt_run(same, 50, 995, 1.5);
  const monitor::RunData ra = monitor::load_run(a), rs = monitor::load_run(slow), rq = monitor::load_run(same);
  const monitor::Comparison bad = monitor::compare_runs(ra, rs);
  EXPECT_TRUE(bad.any_regression());
  EXPECT_TRUE(bad.rows[0].regression);  // tokens/s
  EXPECT_TRUE(bad.rows[1].regression);  // MFU follows tokens/s here
  EXPECT_FALSE(bad.rows[2].regression);  // the same loss
  EXPECT_NEAR(bad.rows[0].change(), -0.1, 0.01);
  const std::string table = monitor::format_comparison(bad);
  EXPECT_NE(table.find("REGRESSION"), std::string::npos) << table;
  const monitor::Comparison fine = monitor::compare_runs(ra, rq);
  EXPECT_FALSE(fine.any_regression()) << monitor::format_comparison(fine);
  // The page carries the table and the marker.
  std::vector<monitor::RunData> runs = {ra, rs};
  monitor::name_runs(runs);
  const std::string html = monitor::html_report(runs, &bad);
  EXPECT_NE(html.find("id=\"comparison\""), std::string::npos);
  EXPECT_NE(html.find(">REGRESSION<"), std::string::npos);
}

TEST(Report, CompareFinalLossAtTheCommonLastStep) {
  Dir d;
  const std::string a = d.sub("a"), worse = d.sub("worse"), longer = d.sub("longer");
  write_gpt_run(a, 50, 1000, 1.5);
  write_gpt_run(worse, 50, 1000, 1.8);
  write_gpt_run(longer, 200, 1000, 1.5);  // same curve, more steps: judged at step 50
  const monitor::RunData ra = monitor::load_run(a);
  const monitor::Comparison c = monitor::compare_runs(ra, monitor::load_run(worse));
  EXPECT_TRUE(c.rows[2].regression) << monitor::format_comparison(c);
  const monitor::Comparison l = monitor::compare_runs(ra, monitor::load_run(longer));
  EXPECT_FALSE(l.rows[2].regression) << monitor::format_comparison(l);
  EXPECT_NEAR(l.rows[2].a, l.rows[2].b, 1e-9);
}

TEST(Report, QuantileInterpolates) {
  EXPECT_DOUBLE_EQ(monitor::quantile({1, 2, 3, 4}, 0.5), 2.5);
  EXPECT_DOUBLE_EQ(monitor::quantile({4, 1, 3, 2}, 0.25), 1.75);
  EXPECT_DOUBLE_EQ(monitor::quantile({}, 0.5), 0);
}

TEST(Report, UnreadableRunDirectoriesNameTheFile) {
  Dir d;
  const std::string missing = d.sub("x") + "/nope";
  EXPECT_NE(message(missing).find(missing + ": not a run directory"), std::string::npos) << message(missing);
  const std::string empty = d.sub("empty");
  EXPECT_NE(message(empty).find("no metrics.jsonl"), std::string::npos) << message(empty);
  const std::string damaged = d.sub("damaged");
  write_gpt_run(damaged, 5, 1000, 1.5);
  std::ofstream(damaged + "/recommendations.json") << "{\"score\": 7, \"findi";
  EXPECT_NE(message(damaged).find(damaged + "/recommendations.json: not valid JSON"), std::string::npos)
      << message(damaged);
  std::ofstream(damaged + "/recommendations.json") << "{}";
  std::ofstream(damaged + "/run_summary.json") << "[1, 2]";
  EXPECT_NE(message(damaged).find("run_summary.json: not a JSON object"), std::string::npos) << message(damaged);
}

TEST(Report, SameNamesAreMadeDistinct) {
  std::vector<monitor::RunData> runs(3);
  runs[0].dir = "/tmp/a/run/";
  runs[1].dir = "/tmp/b/run";
  runs[2].dir = "/tmp/b/run";
  monitor::name_runs(runs);
  EXPECT_EQ(runs[0].name, "a/run");
  EXPECT_NE(runs[1].name, runs[2].name);
}

// The memory plot draws each step's resident memory where the run logged it
// (rss_mib), and the peak as a flat line for a run from before it did;
// rss_mib gets no plot of its own.
TEST(Report, MemoryPlotFollowsResidentMemoryPerStep) {
  Dir d;
  const std::string a = d.sub("with/run"), b = d.sub("without/run");
  write_gpt_run(a, 30, 1000, 1.5, true, true);
  write_gpt_run(b, 30, 1000, 1.5, true, false);
  std::vector<monitor::RunData> runs = {monitor::load_run(a), monitor::load_run(b)};
  monitor::name_runs(runs);
  const std::string svg = svg_with_id(monitor::html_report(runs, nullptr), "plot-memory-steps");
  ASSERT_FALSE(svg.empty());
  EXPECT_NE(svg.find("with/run: RSS MiB"), std::string::npos);
  EXPECT_NE(svg.find("without/run: peak RSS MiB"), std::string::npos);
  EXPECT_EQ(svg.find("with/run: peak RSS MiB"), std::string::npos);
  // A line through a point per step.
  EXPECT_NE(svg.find("data-points=\"30\"><title>with/run: RSS MiB: 30 points"), std::string::npos) << svg;
  EXPECT_TRUE(svg_with_id(monitor::html_report(runs, nullptr), "plot-rss_mib").empty());
}

// Values at the edges of what a double holds gave plots whose tick loops
// never ended (steps near 1e17 a few apart; loss_scale 0 or near the largest
// double on the log axis); each now draws, and in a few milliseconds.
TEST(Report, PlotsOfExtremeValuesFinish) {
  Dir d;
  const std::vector<std::string> rows[] = {
      {R"({"step":100000000000000000,"loss":1})", R"({"step":100000000000000016,"loss":2})"},
      {R"({"step":1,"loss":1,"loss_scale":0})", R"({"step":2,"loss":1,"loss_scale":0})"},
      {R"({"step":1,"loss":1,"loss_scale":1.7e308})", R"({"step":2,"loss":1,"loss_scale":1})"},
      {R"({"step":1,"loss":1,"loss_scale":5e-324})", R"({"step":2,"loss":-1.7e308})", R"({"step":3,"loss":1.7e308})"}};
  int k = 0;
  for (const auto& lines : rows) {
    const std::string dir = d.sub("extreme" + std::to_string(k++));
    std::ofstream m(dir + "/metrics.jsonl");
    for (const std::string& l : lines) m << l << "\n";
    m.close();
    std::vector<monitor::RunData> runs = {monitor::load_run(dir)};
    monitor::name_runs(runs);
    const std::string html = monitor::html_report(runs, nullptr);
    EXPECT_NE(html.find("id=\"plot-loss\""), std::string::npos) << dir;
    EXPECT_EQ(html.find("nan"), std::string::npos) << dir;
  }
}

// Numbers just under a unit's boundary are written in the next unit once
// rounded: 999700 tokens/s is "1M", not "1e+03k".
TEST(Report, NumbersRoundIntoTheNextUnit) {
  Dir d;
  const std::string a = d.sub("fast");
  write_gpt_run(a, 12, 999700, 1.5);
  std::vector<monitor::RunData> runs = {monitor::load_run(a)};
  monitor::name_runs(runs);
  const std::string html = monitor::html_report(runs, nullptr);
  EXPECT_EQ(html.find("e+0"), std::string::npos) << "a number in exponent form";
  EXPECT_NE(html.find(">1M<"), std::string::npos);
}

// An MFU of 0 means the peak was unknown: not recorded, whichever side of
// the comparison it is on (it read as a 100% regression when on B's).
TEST(Report, CompareTakesAnMfuOfZeroAsNotRecorded) {
  Dir d;
  const std::string a = d.sub("a"), b = d.sub("b");
  write_gpt_run(a, 30, 1000, 1.5);
  write_gpt_run(b, 30, 1000, 1.5);
  const std::string text =
      std::regex_replace(read_text(b + "/metrics.jsonl"), std::regex(R"("mfu":[0-9.e-]+)"), "\"mfu\":0");
  std::ofstream(b + "/metrics.jsonl") << text;
  const monitor::RunData ra = monitor::load_run(a), rb = monitor::load_run(b);
  for (const auto& c : {monitor::compare_runs(ra, rb), monitor::compare_runs(rb, ra)}) {
    EXPECT_FALSE(c.rows[1].available) << monitor::format_comparison(c);
    EXPECT_FALSE(c.any_regression()) << monitor::format_comparison(c);
  }
}

// Damaged run files end with an error naming the file and field, not a page
// of wrapped numbers: negative or overflowing counts, a score outside 0..100,
// a metrics.jsonl that is a directory.
TEST(Report, DamagedNumbersAndFilesAreNamed) {
  Dir d;
  const std::string run = d.sub("run");
  write_gpt_run(run, 5, 1000, 1.5);
  const std::string summary = read_text(run + "/run_summary.json");
  const auto summary_with = [&](const std::string& key, const std::string& value) {
    nlohmann::json j = nlohmann::json::parse(summary);
    j[key] = nlohmann::json::parse(value);
    std::ofstream(run + "/run_summary.json") << j.dump();
  };
  summary_with("peak_rss_bytes", "-1");
  EXPECT_NE(message(run).find("\"peak_rss_bytes\" is out of range (-1)"), std::string::npos) << message(run);
  summary_with("cores", "4294967297");
  EXPECT_NE(message(run).find("\"cores\" is out of range"), std::string::npos) << message(run);
  summary_with("loader_workers", "-1");  // "not recorded"
  EXPECT_EQ(message(run), "(accepted)");
  std::ofstream(run + "/run_summary.json") << summary;
  for (const char* score : {"150", "-3", "1e30", "\"90\""}) {
    std::ofstream(run + "/recommendations.json") << "{\"score\": " << score << ", \"findings\": []}";
    EXPECT_NE(message(run).find("\"score\" must be a number from 0 to 100"), std::string::npos) << score;
  }
  std::ofstream(run + "/recommendations.json") << "{\"score\": null, \"findings\": []}";
  EXPECT_EQ(message(run), "(accepted)");
  const std::string dir_metrics = d.sub("dirmetrics");
  fs::create_directories(dir_metrics + "/metrics.jsonl");
  EXPECT_NE(message(dir_metrics).find("metrics.jsonl: is a directory"), std::string::npos) << message(dir_metrics);
}
