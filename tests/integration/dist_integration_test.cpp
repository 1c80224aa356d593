// Data-parallel training over processes, end to end: `mpirun -np 2 brisk
// train` on this machine against one process on the same global batch, with
// and without ZeRO-1, resumes across world sizes, a rank that dies or hangs,
// ranks started with different configs, and a stop signal on one rank
// (docs/distributed.md). Needs Open MPI's mpirun (scripts/install_deps.sh
// installs it); without it every test here is a visible skip.
#include <dirent.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>

#include "brisk/core/safetensors.h"
#include "integration_util.h"

namespace brisk::itest {
namespace {

const char* kMpirun = "/usr/bin/mpirun";

bool have_mpirun() { return ::access(kMpirun, X_OK) == 0; }

#define REQUIRE_MPIRUN() \
  if (!have_mpirun()) GTEST_SKIP() << "no " << kMpirun << ": install openmpi-bin (scripts/install_deps.sh)"

// mpirun on this machine: two ranks on shared memory, as root too (CI runs
// as root), more ranks than cores allowed.
std::vector<std::string> mpirun_args(int np) {
  ::setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  ::setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  std::vector<std::string> args{"-np", std::to_string(np), "--oversubscribe", "--bind-to", "none", "--mca", "btl",
                                "self,vader", "--mca", "btl_vader_single_copy_mechanism", "none"};
  if (const std::string asan = asan_options_for_mpi_ranks(); !asan.empty())
    args.insert(args.end(), {"-x", "ASAN_OPTIONS=" + asan});
  return args;
}

struct DistRun {
  TempDir dir;
  std::string data;
  explicit DistRun(const std::string& corpus = tiny_corpus()) {
    std::string err;
    data = prepare_tiny_dataset(dir.path() / "corpus", &err, corpus);
    EXPECT_FALSE(data.empty()) << err;
  }
  // A config file for a run writing into out/<name>.
  std::string config(const std::string& name, int steps, int every, const std::string& extra = "") {
    const std::string out = out_dir(name);
    // 1 thread per rank: both sides of a comparison do the same arithmetic per sample.
    std::string toml = tiny_config_toml(data, out, steps, every, "cosine", 1);
    toml += "\n[dist]\nbucket_mb = 0.01\ntimeout_s = 20\n" + extra;  // 0.01 MiB: several buckets
    const std::string path = dir.file(name + ".toml");
    write_text(path, toml);
    return path;
  }
  std::string out_dir(const std::string& name) const { return dir.file("out_" + name); }
};

CliResult train(int np, const std::string& config, const std::vector<std::string>& more = {}, CliHooks hooks = {}) {
  std::vector<std::string> args;
  if (np > 0) {
    args = mpirun_args(np);
    args.push_back(cli_path());
  }
  args.insert(args.end(), {"train", "--config", config, "--no-progress"});
  args.insert(args.end(), more.begin(), more.end());
  if (hooks.timeout_s == 90) hooks.timeout_s = 180;
  return np > 0 ? run_program(kMpirun, args, hooks) : run_cli(args, hooks);
}

void expect_losses_close(const std::vector<MetricRow>& a, const std::vector<MetricRow>& b, double rel,
                         const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].step, b[i].step) << what;
    EXPECT_NEAR(a[i].loss, b[i].loss, rel * std::abs(b[i].loss)) << what << ": step " << a[i].step;
  }
}

// (step, val_loss) of the rows that have one.
std::vector<std::pair<int64_t, double>> val_losses(const std::string& out_dir) {
  std::vector<std::pair<int64_t, double>> out;
  std::ifstream in(fs::path(out_dir) / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line);
    if (j.contains("val_loss")) out.emplace_back(j.at("step").get<int64_t>(), j.at("val_loss").get<double>());
  }
  return out;
}

std::vector<MetricRow> rows_after(const std::vector<MetricRow>& rows, int64_t step) {
  std::vector<MetricRow> out;
  for (const MetricRow& r : rows)
    if (r.step > step) out.push_back(r);
  return out;
}

// The pid of rank `rank` among mpirun's children (they carry OMPI_COMM_WORLD_RANK).
pid_t rank_pid(pid_t mpirun, int rank) {
  DIR* d = ::opendir("/proc");
  if (!d) return -1;
  pid_t found = -1;
  while (dirent* e = ::readdir(d)) {
    const pid_t pid = pid_t(std::atoi(e->d_name));
    if (pid <= 0) continue;
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string s;
    std::getline(stat, s);
    const size_t close = s.rfind(')');
    if (close == std::string::npos) continue;
    char state = 0;
    int ppid = 0;
    if (std::sscanf(s.c_str() + close + 1, " %c %d", &state, &ppid) != 2 || ppid != mpirun) continue;
    const std::string env = read_text("/proc/" + std::to_string(pid) + "/environ");
    const std::string want = "OMPI_COMM_WORLD_RANK=" + std::to_string(rank);
    for (size_t at = 0; at < env.size();) {
      const size_t end = env.find('\0', at);
      if (env.compare(at, (end == std::string::npos ? env.size() : end) - at, want) == 0) found = pid;
      if (end == std::string::npos) break;
      at = end + 1;
    }
  }
  ::closedir(d);
  return found;
}

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Hooks that send `sig` to rank 1 once rank 0 reports step 3; *pid gets
// rank 1's pid (-1 if it was not found) and *when the moment.
CliHooks signal_rank1_at_step3(int sig, pid_t* pid, double* when = nullptr, double timeout_s = 60) {
  *pid = -1;
  CliHooks hooks;
  hooks.timeout_s = timeout_s;
  hooks.on_err_line = [=](const std::string& line, pid_t mpirun) {
    if (*pid >= 0 || line.rfind("step 3/", 0) != 0) return;
    *pid = rank_pid(mpirun, 1);
    if (*pid > 0) ::kill(*pid, sig);
    if (when) *when = seconds_now();
  };
  return hooks;
}

std::map<std::string, std::vector<float>> tensors_of(const std::string& file) {
  std::map<std::string, std::vector<float>> out;
  const auto f = core::load_safetensors(file);
  for (const auto& [name, t] : f.tensors) {
    const float* p = t.data_as<float>();
    out[name].assign(p, p + t.numel());
  }
  return out;
}

// The largest difference between two files' tensors, relative to each
// tensor's largest magnitude (an element near 0 says nothing on its own:
// AdamW's first steps move every weight by about lr, whatever its gradient).
double max_rel_diff(const std::string& a, const std::string& b) {
  const auto ta = tensors_of(a), tb = tensors_of(b);
  EXPECT_EQ(ta.size(), tb.size());
  double worst = 0;
  for (const auto& [name, va] : ta) {
    const auto it = tb.find(name);
    if (it == tb.end() || it->second.size() != va.size()) {
      ADD_FAILURE() << name << " differs in presence or size between " << a << " and " << b;
      continue;
    }
    double scale = 1e-30, diff = 0;
    for (size_t i = 0; i < va.size(); ++i) {
      scale = std::max(scale, double(std::abs(it->second[i])));
      diff = std::max(diff, double(std::abs(va[i] - it->second[i])));
    }
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

// The fused classifier sums the tied head's weight gradient into the
// gradient in place, in the forward pass: the bucket holding it must still
// leave only after the embedding's piece is added (the chain's last write).
TEST(Dist, TwoRanksMatchOneRankWithTheFusedClassifier) {
  REQUIRE_MPIRUN();
  DistRun run;
  const std::vector<std::string> fused = {"--set", "model.fused_classifier=true"};
  const CliResult one = train(0, run.config("one", 6, 6), fused);
  ASSERT_EQ(one.exit_code, 0) << one.err;
  const CliResult two = train(2, run.config("two", 6, 6), fused);
  ASSERT_EQ(two.exit_code, 0) << two.err;
  expect_losses_close(read_metrics(run.out_dir("two")), read_metrics(run.out_dir("one")), 1e-5, "2 ranks vs 1");
  EXPECT_EQ(read_metrics(run.out_dir("one")).size(), 6u);
}

// Each rank draws its own dropout masks: the rank is part of the dropout key
// (models::dropout_key). On a corpus of one repeated byte every batch row is
// the same, and at lr 1e-30 the weights never move, so without dropout two
// ranks (global batch 4) each compute exactly one process's batch-2 step
// and log its loss, bit for bit (asserted); with dropout they log something
// else only if rank 1's masks are not rank 0's.
TEST(Dist, EachRankDrawsItsOwnDropoutMasks) {
  REQUIRE_MPIRUN();
  DistRun run(std::string(6000, 'a'));
  ASSERT_FALSE(run.data.empty());
  auto losses = [&](int np, const std::string& name, const std::string& setting) {
    std::vector<std::string> more = {"--set", "train.lr=1e-30", "--set", "train.eval_every=0"};
    if (np == 0) more.insert(more.end(), {"--set", "train.batch=2"});
    if (!setting.empty()) more.insert(more.end(), {"--set", setting});
    const CliResult r = train(np, run.config(name, 3, 3), more);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    std::vector<double> out;
    for (const MetricRow& row : read_metrics(run.out_dir(name))) out.push_back(row.loss);
    return out;
  };
  const std::vector<double> one = losses(0, "one", ""), two = losses(2, "two", "");
  ASSERT_EQ(one.size(), 3u);
  ASSERT_EQ(two.size(), 3u);
  for (size_t i = 0; i < one.size(); ++i)
    ASSERT_EQ(two[i], one[i]) << "step " << i + 1 << ": the test's premise fails";
  for (const char* setting : {"model.dropout=0.1", "model.attention_dropout=0.1"}) {
    SCOPED_TRACE(setting);
    const std::string tag = setting[6] == 'd' ? "drop" : "attn";
    const std::vector<double> d1 = losses(0, "one-" + tag, setting), d2 = losses(2, "two-" + tag, setting);
    ASSERT_EQ(d1.size(), 3u);
    ASSERT_EQ(d2.size(), 3u);
    for (size_t i = 0; i < d1.size(); ++i) {
      EXPECT_NE(d1[i], one[i]) << "step " << i + 1 << ": dropout changed nothing";
      EXPECT_NE(d2[i], d1[i]) << "step " << i + 1 << ": rank 1 repeated rank 0's masks";
    }
  }
}

TEST(Dist, TwoRanksMatchOneRankOnTheSameGlobalBatch) {
  REQUIRE_MPIRUN();
  DistRun run;
  const CliResult one = train(0, run.config("one", 10, 10));
  ASSERT_EQ(one.exit_code, 0) << one.err;
  const CliResult two = train(2, run.config("two", 10, 10));
  ASSERT_EQ(two.exit_code, 0) << two.err;
  EXPECT_NE(two.err.find("data parallel: 2 ranks (mpi) x batch 2"), std::string::npos) << two.err;
  EXPECT_NE(two.err.find("comm "), std::string::npos) << "progress lines report communication: " << two.err;
  expect_losses_close(read_metrics(run.out_dir("two")), read_metrics(run.out_dir("one")), 1e-5, "2 ranks vs 1");
  EXPECT_EQ(read_metrics(run.out_dir("one")).size(), 10u);
  // Validation: each rank evaluates its half of every validation batch.
  const auto v1 = val_losses(run.out_dir("one")), v2 = val_losses(run.out_dir("two"));
  ASSERT_EQ(v1.size(), 3u) << "eval_every = 4 over 10 steps: steps 4, 8, 10";
  ASSERT_EQ(v2.size(), v1.size());
  for (size_t i = 0; i < v1.size(); ++i) {
    EXPECT_EQ(v2[i].first, v1[i].first);
    EXPECT_NEAR(v2[i].second, v1[i].second, 1e-5 * v1[i].second) << "val loss at step " << v1[i].first;
  }
  // One checkpoint, written once (rank 0), with the weights and moments of
  // one process's. Two half-batch gradients summed round differently from
  // one whole-batch gradient, and AdamW turns a near-zero gradient's
  // rounding into an update of up to lr: 1e-3 of a tensor's scale (seen: 1.6e-4).
  const std::string a = run.out_dir("one") + "/step_0000010", b = run.out_dir("two") + "/step_0000010";
  EXPECT_LT(max_rel_diff(b + "/model.safetensors", a + "/model.safetensors"), 1e-3);
  EXPECT_LT(max_rel_diff(b + "/optimizer.safetensors", a + "/optimizer.safetensors"), 1e-3);
  // Metrics carry the communication split.
  const std::string line = read_text(run.out_dir("two") + "/metrics.jsonl");
  EXPECT_NE(line.find("\"comm_hidden_ms\""), std::string::npos) << line.substr(0, 400);
}

TEST(Dist, ZeroOneMatchesZeroZeroWithAccumulation) {
  REQUIRE_MPIRUN();
  DistRun run;
  const CliResult z0 = train(2, run.config("z0", 10, 10), {"--set", "train.grad_accum=2"});
  ASSERT_EQ(z0.exit_code, 0) << z0.err;
  const CliResult z1 = train(2, run.config("z1", 10, 10, "zero = 1\n"), {"--set", "train.grad_accum=2"});
  ASSERT_EQ(z1.exit_code, 0) << z1.err;
  EXPECT_NE(z1.err.find("ZeRO-1"), std::string::npos) << z1.err;
  expect_losses_close(read_metrics(run.out_dir("z1")), read_metrics(run.out_dir("z0")), 1e-5, "ZeRO-1 vs ZeRO-0");
  // The gathered checkpoint holds every moment, as ZeRO-0's does.
  const std::string a = run.out_dir("z0") + "/step_0000010", b = run.out_dir("z1") + "/step_0000010";
  EXPECT_LT(max_rel_diff(b + "/model.safetensors", a + "/model.safetensors"), 1e-4);
  EXPECT_LT(max_rel_diff(b + "/optimizer.safetensors", a + "/optimizer.safetensors"), 1e-4);
}

// Checkpoint at step 3 of 6 by one world size, the rest of the run by another
// (and by the same one, which must match bit for bit).
void resume_across(int first_np, int second_np, const std::string& zero) {
  DistRun run;
  const CliResult full = train(first_np, run.config("full", 6, 3, zero));
  ASSERT_EQ(full.exit_code, 0) << full.err;
  const std::vector<MetricRow> reference = read_metrics(run.out_dir("full"));
  for (int np : {first_np, second_np}) {
    const std::string name = "resumed_" + std::to_string(np);
    const std::string cfg = run.config(name, 6, 3, zero);
    fs::create_directories(run.out_dir(name));
    fs::copy(run.out_dir("full") + "/step_0000003", run.out_dir(name) + "/step_0000003", fs::copy_options::recursive);
    const CliResult r = train(np, cfg, {"--resume"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("resumed from"), std::string::npos) << r.err;
    const std::vector<MetricRow> rows = read_metrics(run.out_dir(name));
    ASSERT_EQ(rows.size(), 3u);
    if (np == first_np) {
      for (size_t i = 0; i < rows.size(); ++i)
        EXPECT_EQ(rows[i].loss, reference[3 + i].loss) << "same world size: bit-exact, step " << rows[i].step;
    } else {
      expect_losses_close(rows, rows_after(reference, 3), 1e-5, "resumed at another world size");
    }
  }
}

TEST(Dist, ResumeTwoRanksToOne) {
  REQUIRE_MPIRUN();
  resume_across(2, 0, "zero = 1\n");
}

TEST(Dist, ResumeOneRankToTwo) {
  REQUIRE_MPIRUN();
  resume_across(0, 2, "zero = 1\n");
}

// Rank 1 is killed once training runs: the job ends non-zero, quickly, and says so.
TEST(Dist, KilledRankEndsTheJob) {
  REQUIRE_MPIRUN();
  DistRun run;
  const std::string cfg = run.config("killed", 100000, 0);
  pid_t killed = -1;
  double killed_at = 0;
  const CliHooks hooks = signal_rank1_at_step3(SIGKILL, &killed, &killed_at);
  const CliResult r = train(2, cfg, {}, hooks);
  const double ended = seconds_now();
  ASSERT_GT(killed, 0) << "rank 1 not found among mpirun's children\n" << r.err;
  EXPECT_FALSE(r.timed_out) << r.err;
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_LT(ended - killed_at, 30.0) << r.err;
  EXPECT_TRUE(r.err.find("rank 1") != std::string::npos || r.err.find("signal 9") != std::string::npos) << r.err;
  std::printf("what the job said:\n%s\n", r.err.substr(r.err.size() > 1500 ? r.err.size() - 1500 : 0).c_str());
}

// Rank 1 stops answering (SIGSTOP): rank 0 gives up after dist.timeout_s with
// a message naming what it waited for, and the job ends non-zero.
TEST(Dist, HungRankTimesOutWithAMessage) {
  REQUIRE_MPIRUN();
  DistRun run;
  const std::string cfg = run.config("hung", 100000, 0);
  pid_t stopped = -1;
  const CliHooks hooks = signal_rank1_at_step3(SIGSTOP, &stopped);
  const CliResult r = train(2, cfg, {"--set", "dist.timeout_s=4"}, hooks);
  if (stopped > 0) ::kill(stopped, SIGKILL);
  ASSERT_GT(stopped, 0) << r.err;
  EXPECT_FALSE(r.timed_out) << r.err;
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("rank 0:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("got no answer from the other ranks for 4 s"), std::string::npos) << r.err;
}

// Two ranks started with different learning rates: both stop before training
// and the message names the setting.
TEST(Dist, DifferentConfigsStopBeforeTraining) {
  REQUIRE_MPIRUN();
  DistRun run;
  const std::string cfg = run.config("mismatch", 5, 0);
  std::vector<std::string> args = mpirun_args(1);
  args.insert(args.end(), {cli_path(), "train", "--config", cfg, "--no-progress", ":", "-np", "1", cli_path(), "train",
                           "--config", cfg, "--no-progress", "--set", "train.lr=0.001"});
  CliHooks hooks;
  hooks.timeout_s = 60;
  const CliResult r = run_program(kMpirun, args, hooks);
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_FALSE(r.timed_out);
  EXPECT_NE(r.err.find("do not have the same config"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("train.lr = 0.001"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(run.out_dir("mismatch") + "/metrics.jsonl") &&
               !read_metrics(run.out_dir("mismatch")).empty());
}

// SIGTERM to rank 1 alone: every rank stops after the same step, one
// checkpoint of that step is written, and the run resumes from it.
TEST(Dist, StopSignalOnOneRankGivesOneConsistentCheckpoint) {
  REQUIRE_MPIRUN();
  DistRun run;
  const std::string cfg = run.config("stop", 1000, 0, "zero = 1\n");
  pid_t signalled = -1;
  const CliHooks hooks = signal_rank1_at_step3(SIGTERM, &signalled, nullptr, 180);
  const CliResult r = train(2, cfg, {}, hooks);
  ASSERT_GT(signalled, 0) << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("stopped by a stop signal on another rank: checkpoint saved"), std::string::npos) << r.err;
  std::vector<std::string> ckpts;
  for (const auto& e : fs::directory_iterator(run.out_dir("stop")))
    if (e.path().filename().string().rfind("step_", 0) == 0) ckpts.push_back(e.path().string());
  ASSERT_EQ(ckpts.size(), 1u);
  const int64_t stopped_at = read_metrics(run.out_dir("stop")).back().step;
  EXPECT_NE(ckpts[0].find("step_" + std::string(7 - std::to_string(stopped_at).size(), '0') + std::to_string(stopped_at)),
            std::string::npos);
  // It resumes (at the other world size too) from that step.
  const CliResult resumed = train(0, cfg, {"--resume", "--set", "train.steps=" + std::to_string(stopped_at + 2)});
  EXPECT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_NE(resumed.err.find("resumed from"), std::string::npos) << resumed.err;
  EXPECT_EQ(read_metrics(run.out_dir("stop")).back().step, stopped_at + 2);
}

// An error one rank meets alone (here: rank 1's data directory is missing)
// ends the whole job at once, with that rank's message. Rank 1 used to hang
// in MPI_Finalize while unwinding, rank 0 waited out dist.timeout_s, and
// the message was never printed.
TEST(Dist, AnErrorOnOneRankEndsTheJobAtOnceWithItsMessage) {
  REQUIRE_MPIRUN();
  DistRun run;
  const std::string cfg = run.config("alone", 5, 0);
  const std::string missing = run.dir.file("no_such_data");
  std::vector<std::string> args = mpirun_args(1);
  args.insert(args.end(), {cli_path(), "train", "--config", cfg, "--no-progress", "--set", "dist.timeout_s=300", ":",
                           "-np", "1", cli_path(), "train", "--config", cfg, "--no-progress", "--set",
                           "dist.timeout_s=300", "--set", "data.dir=" + missing});
  CliHooks hooks;
  hooks.timeout_s = 60;  // far below the ranks' own timeout
  const CliResult r = run_program(kMpirun, args, hooks);
  EXPECT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("rank 1 of 2: error:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(missing), std::string::npos) << r.err;
}

// The encoder and autoencoder trainers run in one process: under mpirun each
// rank trained the whole model into the same checkpoint.dir.
TEST(Dist, EpochRunsAreRefusedUnderSeveralProcesses) {
  REQUIRE_MPIRUN();
  DistRun run;
  for (const char* kind : {"encoder", "autoencoder"}) {
    const std::string out = run.out_dir(kind), cfg = run.dir.file(std::string(kind) + ".toml");
    write_text(cfg, std::string("[model]\nkind = \"") + kind + "\"\n[data]\nstore = \"" + run.dir.file("none.lmdb") +
                        "\"\n[checkpoint]\ndir = \"" + out + "\"\n");
    const CliResult r = train(2, cfg);
    EXPECT_FALSE(r.timed_out) << r.err;
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find("data-parallel training (2 processes under mpirun) is for GPT runs"), std::string::npos)
        << r.err;
    EXPECT_FALSE(fs::exists(out)) << kind;
  }
}

}  // namespace
}  // namespace brisk::itest
