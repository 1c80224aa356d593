// `brisk train`'s run record and `brisk report` end to end, through the CLI
// on the tiny model: a run leaves run_summary.json and recommendations.json
// and prints the recommendations; every judged rule cites the counter as
// metrics.jsonl measured it and the score follows the documented formula;
// a run with train.loader_workers = 0 and batch 1 records its workers and is
// judged on its own measured data wait; `brisk report` renders both runs
// and --compare answers with REGRESSION / exit codes as documented;
// unusable run directories end with exit code 2 naming the file.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "integration_util.h"

using namespace brisk::itest;
using nlohmann::json;

namespace {

class ReportIntegration : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string err;
    data_ = prepare_tiny_dataset(tmp_.path() / "corpus", &err);
    ASSERT_FALSE(data_.empty()) << "brisk data prepare failed:\n" << err;
  }

  // Trains `name` for `steps` steps through the CLI; returns the run directory.
  std::string train(const std::string& name, int steps, std::vector<std::string> extra = {}) {
    const std::string cfg = tmp_.file(name + ".toml");
    write_text(cfg, tiny_config_toml(data_, tmp_.file(name), steps, steps));
    std::vector<std::string> args = {"train", "--config", cfg, "--no-progress"};
    args.insert(args.end(), extra.begin(), extra.end());
    const CliResult r = run_cli(args);
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    last_out_ = r.out;
    return tmp_.file(name);
  }

  static json read_json(const std::string& path) { return json::parse(read_text(path)); }

  TempDir tmp_;
  std::string data_, last_out_;
};

// sum data_wait_ms / sum ms_per_step over the steps after the first.
double measured_wait_share(const std::string& dir) {
  double wait = 0, step = 0;
  bool first = true;
  std::ifstream in(fs::path(dir) / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const json j = json::parse(line);
    if (first) {
      first = false;
      continue;
    }
    wait += j["data_wait_ms"].get<double>();
    step += j["ms_per_step"].get<double>();
  }
  return wait / step;
}

const json& finding(const json& rec, const std::string& rule) {
  for (const json& f : rec["findings"])
    if (f["rule"] == rule) return f;
  throw std::runtime_error("no finding " + rule);
}

void check_record(const std::string& dir, int loader_workers) {
  const json s = json::parse(read_text(dir + "/run_summary.json"));
  EXPECT_EQ(s["kind"], "gpt");
  EXPECT_EQ(s["threads"], 2);
  EXPECT_GE(s["cores"].get<int>(), 1);
  EXPECT_EQ(s["loader_workers"], loader_workers);
  EXPECT_GT(s["peak_gflops"].get<double>(), 0);
  EXPECT_GT(s["machine_ram_bytes"].get<double>(), 0);
  EXPECT_GT(s["peak_rss_bytes"].get<double>(), 0);
  EXPECT_GT(s["memory_plan"]["total"].get<double>(), 0);
  EXPECT_EQ(s["precision_path"], "fp32");

  const json rec = json::parse(read_text(dir + "/recommendations.json"));
  const int score = rec["score"].get<int>();
  EXPECT_GE(score, 0);
  EXPECT_LE(score, 100);
  // The data-wait rule read what the steps measured.
  const json& wait = finding(rec, "data_wait");
  EXPECT_TRUE(wait["applies"].get<bool>());
  EXPECT_NEAR(wait["value"].get<double>(), measured_wait_share(dir), 1e-12);
  EXPECT_NE(wait["message"].get<std::string>().find("threshold 5.00%"), std::string::npos) << wait["message"];
  // The score is the documented formula of the findings.
  double total = 0, kept = 0;
  for (const json& f : rec["findings"]) {
    if (!f["applies"].get<bool>()) continue;
    total += f["weight"].get<double>();
    kept += f["weight"].get<double>() * (1 - f["severity"].get<double>());
  }
  EXPECT_EQ(score, int(std::lround(100 * kept / total)));
  EXPECT_FALSE(finding(rec, "loss_scale")["applies"].get<bool>());  // fp32: no loss scaling
}

}  // namespace

TEST_F(ReportIntegration, RunsLeaveARecordAndTheReportShowsBoth) {
  const std::string base = train("default", 16);
  EXPECT_NE(last_out_.find("== recommendations: score "), std::string::npos) << last_out_;
  EXPECT_NE(last_out_.find("brisk report " + base), std::string::npos) << last_out_;
  check_record(base, 2);
  const std::string starved = train("starved", 16, {"--set", "train.loader_workers=0", "--set", "train.batch=1"});
  check_record(starved, 0);

  const std::string html = tmp_.file("report.html");
  CliResult r = run_cli({"report", base, starved, "--out", html});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("default"), std::string::npos) << r.out;
  const std::string page = read_text(html);
  const size_t loss = page.find("id=\"plot-loss\"");
  ASSERT_NE(loss, std::string::npos);
  const std::string loss_svg = page.substr(loss, page.find("</svg>", loss) - loss);
  int series = 0;
  for (size_t p = loss_svg.find("class=\"series\""); p != std::string::npos; p = loss_svg.find("class=\"series\"", p + 1))
    ++series;
  EXPECT_EQ(series, 4);  // training and validation loss of each run
  EXPECT_NE(page.find("as the run recorded it (recommendations.json)"), std::string::npos);

  // --compare: exit 0 with or without a regression; --fail-on-regression: 1 exactly when the table says so.
  r = run_cli({"report", "--compare", base, starved, "--out", tmp_.file("cmp.html")});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("== B against A =="), std::string::npos) << r.out;
  const bool regressed = r.out.find("REGRESSION:") != std::string::npos;
  r = run_cli({"report", "--compare", base, starved, "--out", tmp_.file("cmp.html"), "--fail-on-regression"});
  EXPECT_EQ(r.exit_code, regressed ? 1 : 0) << r.out << r.err;
  // A run against itself never regresses.
  r = run_cli({"report", "--compare", base, base, "--out", tmp_.file("self.html"), "--fail-on-regression"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("no regression"), std::string::npos) << r.out;
}

TEST_F(ReportIntegration, ProfileTableIsRecorded) {
  const std::string dir = train("profiled", 4, {"--profile"});
  const json s = json::parse(read_text(dir + "/run_summary.json"));
  ASSERT_TRUE(s["profile"].is_array());
  ASSERT_GT(s["profile"].size(), 3u);
  double share = 0;
  for (const json& row : s["profile"]) share += row["share"].get<double>();
  EXPECT_NEAR(share, 1.0, 0.01);
  const CliResult r = run_cli({"report", dir, "--out", tmp_.file("p.html")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(read_text(tmp_.file("p.html")).find("id=\"profile\""), std::string::npos);
}

TEST_F(ReportIntegration, UnusableRunDirectoriesNameTheFile) {
  const std::string missing = tmp_.file("nope");
  CliResult r = run_cli({"report", missing, "--out", tmp_.file("x.html")});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find(missing + ": not a run directory"), std::string::npos) << r.err;

  fs::create_directories(tmp_.file("empty"));
  r = run_cli({"report", tmp_.file("empty"), "--out", tmp_.file("x.html")});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("no metrics.jsonl"), std::string::npos) << r.err;

  fs::create_directories(tmp_.file("damaged"));
  write_text(tmp_.file("damaged/metrics.jsonl"), "{\"step\":1,\"loss\":3}\n{\"step\":2,\"loss\n");
  r = run_cli({"report", tmp_.file("damaged"), "--out", tmp_.file("x.html")});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("damaged/metrics.jsonl line 2"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(tmp_.file("x.html")));

  r = run_cli({"report", tmp_.file("damaged"), "--fail-on-regression"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--fail-on-regression needs --compare"), std::string::npos) << r.err;
  r = run_cli({"report"});
  EXPECT_EQ(r.exit_code, 2);
  // --out naming a file of a run it reads replaced the run's metrics with HTML.
  fs::create_directories(tmp_.file("fine"));
  const std::string metrics = tmp_.file("fine/metrics.jsonl");
  write_text(metrics, "{\"step\":1,\"loss\":3}\n{\"step\":2,\"loss\":2.5}\n");
  r = run_cli({"report", tmp_.file("fine"), "--out", tmp_.file("fine.html")});
  ASSERT_EQ(r.exit_code, 0) << r.err;  // the run itself reads
  const std::string before = read_text(metrics);
  r = run_cli({"report", tmp_.file("fine"), "--out", metrics});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("is a file of the input"), std::string::npos) << r.err;
  EXPECT_EQ(read_text(metrics), before);
}
