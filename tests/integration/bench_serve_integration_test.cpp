// `brisk bench serve` end to end: it starts `brisk serve` on a tiny random
// model, drives streaming requests through it, and writes a report whose
// numbers are consistent (every request done, no errors, ordered
// percentiles, a clean server exit).
#include <gtest/gtest.h>

#include "../common/tiny_gpt.h"
#include "integration_util.h"

namespace brisk::itest {
namespace {

using nlohmann::json;

// Byte-level, so the prompts (token windows of the tiny byte dataset) are in
// its vocabulary; the context holds 32 prompt + 16 new tokens.
std::string tiny_checkpoint(const TempDir& dir) {
  testing::TinyGpt t;
  t.seed = 5;
  return testing::save_tiny_gpt(dir.file("run"), t);
}

TEST(BenchServeCli, I2ShapeOnATinyModelReportsConsistentNumbers) {
  TempDir dir;
  std::string err;
  const std::string data = prepare_tiny_dataset(dir.path() / "corpus", &err);
  ASSERT_FALSE(data.empty()) << err;
  const std::string report = dir.file("serve.json");
  CliHooks hooks;
  hooks.timeout_s = 180;
  const CliResult r = run_cli({"bench", "serve", "--workload", "I2", "--checkpoint", tiny_checkpoint(dir), "--data",
                               data, "--concurrency", "4", "--requests", "8", "--new", "16", "--threads", "1",
                               "--rounds", "2", "--json", report},
                              hooks);
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const json j = json::parse(read_text(report));
  EXPECT_EQ(j["rounds"], 2);
  EXPECT_EQ(j["completed"], 2 * 8) << j.dump(2);  // --requests per round
  EXPECT_EQ(j["errors"], 0) << j.dump(2);
  EXPECT_EQ(j["output_tokens"], 2 * 8 * 16);
  EXPECT_EQ(j["single_stream"]["requests"], 2 * 3);
  ASSERT_EQ(j["round_vs_single_stream"].size(), 2u);
  // The headline ratio is the median of the per-round ones (of 2: their mean).
  const double r0 = j["round_vs_single_stream"][0], r1 = j["round_vs_single_stream"][1];
  EXPECT_DOUBLE_EQ(j["vs_single_stream"].get<double>(), 0.5 * (r0 + r1));
  EXPECT_EQ(j["server_exit_code"], 0) << j["server_exit"];
  for (const char* metric : {"ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"}) {
    const json& p = j[metric];
    // ITL's lower percentiles may be 0: chunks that arrive in one read.
    if (std::string(metric) != "itl_ms") {
      EXPECT_GT(p["p50"].get<double>(), 0) << metric;
    }
    EXPECT_GT(p["p99"].get<double>(), 0) << metric;
    EXPECT_LE(p["p50"].get<double>(), p["p90"].get<double>()) << metric;
    EXPECT_LE(p["p90"].get<double>(), p["p99"].get<double>()) << metric;
  }
  EXPECT_GT(j["output_tokens_per_s"].get<double>(), 0);
  EXPECT_GT(j["single_stream"]["output_tokens_per_s"].get<double>(), 0);
  EXPECT_GT(j["rss_mib"]["start"].get<double>(), 0);
  EXPECT_NE(r.out.find("TTFT"), std::string::npos) << r.out;
}

TEST(BenchServeCli, UnknownWorkloadIsAClearError) {
  const CliResult r = run_cli({"bench", "serve", "--workload", "I9"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("I9"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace brisk::itest
