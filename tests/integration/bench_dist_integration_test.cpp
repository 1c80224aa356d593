// `brisk bench dist` end to end on a tiny model: two interleaved rounds of
// one process against two under mpirun, the table on stdout and the JSON
// report (dist_bench.h). Needs Open MPI's mpirun (scripts/install_deps.sh
// installs it); without it the test is a visible skip.
#include <gtest/gtest.h>

#include "integration_util.h"

namespace brisk::itest {
namespace {

const char* kMpirun = "/usr/bin/mpirun";

TEST(BenchDist, TwoRoundsOfOneAndTwoProcesses) {
  if (::access(kMpirun, X_OK) != 0) GTEST_SKIP() << "no " << kMpirun << ": install openmpi-bin (scripts/install_deps.sh)";
  TempDir dir;
  std::string err;
  const std::string data = prepare_tiny_dataset(dir.path() / "corpus", &err);
  ASSERT_FALSE(data.empty()) << err;
  // The bench sets steps, threads, checkpoint.dir/every and eval_every itself.
  const std::string config = dir.file("tiny.toml");
  write_text(config, tiny_config_toml(data, dir.file("unused_out"), 100, 50));
  const std::string report = dir.file("results/dist.json");  // the directory does not exist yet
  // The bench starts mpirun itself: its ranks inherit this (see asan_options_for_mpi_ranks).
  if (const std::string asan = asan_options_for_mpi_ranks(); !asan.empty()) ::setenv("ASAN_OPTIONS", asan.c_str(), 1);
  CliHooks hooks;
  hooks.timeout_s = 120;
  const CliResult r = run_cli({"bench", "dist", "--config", config, "--rounds", "2", "--steps", "6", "--warmup-steps",
                               "2", "--json", report},
                              hooks);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("1 process x 2 threads"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("2 processes x 1 thread"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tokens/s of 2 processes / 1 process, formed per round"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("shares these same cores"), std::string::npos) << r.out;

  const auto j = nlohmann::json::parse(read_text(report));
  ASSERT_EQ(j.at("rounds").size(), 2u) << j.dump(2);
  for (const auto& round : j.at("rounds")) {
    EXPECT_GT(round.at("single").at("tokens_per_s").get<double>(), 0) << round.dump(2);
    EXPECT_GT(round.at("multi").at("tokens_per_s").get<double>(), 0) << round.dump(2);
    EXPECT_EQ(round.at("single").at("counted_steps").get<int>(), 4) << round.dump(2);
    EXPECT_EQ(round.at("multi").at("world").get<int>(), 2) << round.dump(2);
    EXPECT_GT(round.at("multi").at("comm_ms").get<double>(), 0) << round.dump(2);
    const double hidden = round.at("multi").at("hidden_fraction").get<double>();
    EXPECT_GE(hidden, 0.0);
    EXPECT_LE(hidden, 1.0);
    EXPECT_GT(round.at("ratio_tokens_per_s").get<double>(), 0);
    EXPECT_FALSE(round.at("single").contains("comm_ms")) << "one process has no collectives";
  }
  // Interleaved: the second round starts with the configuration the first ended with.
  EXPECT_EQ(j.at("rounds")[0].at("order")[0], "single");
  EXPECT_EQ(j.at("rounds")[1].at("order")[0], "multi");
  const auto& ratio = j.at("ratio_tokens_per_s");
  EXPECT_LE(ratio.at("min").get<double>(), ratio.at("median").get<double>());
  EXPECT_LE(ratio.at("median").get<double>(), ratio.at("max").get<double>());
  // The run directories lived in a temporary directory that is gone now.
  EXPECT_FALSE(fs::exists(dir.file("unused_out")));
}

TEST(BenchDist, MissingMpirunSaysWhatToInstall) {
  TempDir dir;
  const std::string config = dir.file("tiny.toml");
  write_text(config, tiny_config_toml(dir.file("data"), dir.file("out"), 10, 0));
  const CliResult r = run_cli({"bench", "dist", "--config", config, "--mpirun", dir.file("no-such-mpirun")});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("openmpi-bin"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("install_deps.sh"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace brisk::itest
