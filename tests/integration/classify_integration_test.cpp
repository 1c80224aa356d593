// The encoder classifier through the command line, the way a user runs it:
// `brisk data emails` on a small SpamAssassin-shaped directory, `brisk train`
// on an encoder config, `brisk classify` on files and a directory, and the
// errors for empty messages, body-less messages and checkpoints of the
// wrong kind.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <csignal>
#include <fstream>
#include <random>

#include "../common/run_copy.h"
#include "brisk/cpu/cpu_features.h"
#include "../common/tiny_gpt.h"
#include "integration_util.h"

using namespace brisk::itest;

namespace {

// Ham bodies talk about meetings, spam bodies about money; both have headers.
std::string message(bool spam, std::mt19937& rng) {
  static const char* ham[] = {"meeting", "agenda", "notes", "schedule", "project", "review", "lunch", "team"};
  static const char* junk[] = {"money", "winner", "free", "offer", "cash", "prize", "click", "credit"};
  std::string m = "From: someone@example.org\nSubject: hello\n\n";
  for (int i = 0; i < 4 + int(rng() % 8); ++i) m += std::string(spam ? junk[rng() % 8] : ham[rng() % 8]) + " ";
  return m + "\n";
}

class ClassifyCli : public ::testing::Test {
 protected:
  void SetUp() override {
    std::mt19937 rng(7);
    for (const char* group : {"easy-ham-1", "spam-1"}) {
      fs::create_directories(tmp_.path() / "mail" / group);
      for (int i = 0; i < 60; ++i)
        write_text(tmp_.file("mail/" + std::string(group) + "/" + std::to_string(i) + ".txt"),
                   message(group[0] == 's', rng));
    }
    store_ = tmp_.file("mail.lmdb");
    const CliResult made = run_cli({"data", "emails", "--input", tmp_.file("mail"), "--out", store_, "--tokenizer",
                                    "bytes", "--strip-headers"});
    ASSERT_EQ(made.exit_code, 0) << made.err;
    config_ = tmp_.file("enc.toml");
    write_text(config_, "[model]\nkind = \"encoder\"\nvocab_size = 256\nn_layer = 1\nn_embd = 32\nn_head = 2\n"
                        "max_len = 64\nn_classes = 2\n[data]\nstore = \"" + store_ +
                            "\"\nstrip_headers = true\nlabel_names = [\"ham\", \"spam\"]\n[train]\nbatch = 8\n"
                            "epochs = 4\nlr = 3e-3\nwarmup = 5\nlog_every = 5\n[checkpoint]\ndir = \"" +
                            tmp_.file("run") + "\"\n");
  }

  TempDir tmp_;
  std::string store_, config_;
};

void expect_error(const CliResult& r, const std::string& fragment) {
  EXPECT_EQ(r.exit_code, 2) << "stdout:\n" << r.out << "\nstderr:\n" << r.err;
  EXPECT_NE(r.err.find(fragment), std::string::npos) << "'" << fragment << "' not in:\n" << r.err;
}

}  // namespace

TEST_F(ClassifyCli, TrainsReportsAndClassifiesFilesAndDirectories) {
  const CliResult trained = run_cli({"train", "--config", config_, "--profile"});
  ASSERT_EQ(trained.exit_code, 0) << trained.err;
  for (const char* s : {"encoder classifier", "cache hit", "test split (", "baseline (bag-of-words", "confusion",
                        "== time per op (train steps, every batch width) =="})
    EXPECT_NE(trained.err.find(s), std::string::npos) << s << " not in:\n" << trained.err;
  const auto report = nlohmann::json::parse(read_text(tmp_.file("run/report.json")));
  EXPECT_GE(report["test"]["accuracy"].get<double>(), 0.9);
  // --profile: every train step's ops, over all batch widths (1 layer: one
  // attention per step, flash by default).
  const int64_t steps = report["training"]["steps"].get<int64_t>();
  const auto& profile = report.at("profile");
  EXPECT_EQ(profile.at("masked_flash_attention").at("calls").get<int64_t>(), steps);
  EXPECT_EQ(profile.at("masked_flash_attention_backward").at("calls").get<int64_t>(), steps);
  double share = 0;
  for (const auto& [op, t] : profile.items()) {
    EXPECT_GT(t.at("calls").get<int64_t>(), 0) << op;
    share += t.at("share").get<double>();
  }
  EXPECT_NEAR(share, 1.0, 1e-9);

  std::mt19937 rng(99);
  fs::create_directories(tmp_.path() / "inbox");
  write_text(tmp_.file("inbox/a.eml"), message(true, rng));
  write_text(tmp_.file("inbox/b.eml"), message(false, rng));
  write_text(tmp_.file("single.eml"), message(true, rng));
  const CliResult r = run_cli({"classify", "--checkpoint", tmp_.file("run"), tmp_.file("single.eml"), tmp_.file("inbox")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::istringstream lines(r.out);
  std::vector<std::string> labels, paths;
  for (std::string line; std::getline(lines, line);) {
    std::istringstream f(line);
    std::string label, prob, path;
    std::getline(f, label, '\t');
    std::getline(f, prob, '\t');
    std::getline(f, path);
    EXPECT_GE(std::stod(prob), 0.5) << line;
    labels.push_back(label);
    paths.push_back(path);
  }
  EXPECT_EQ(labels, (std::vector<std::string>{"spam", "spam", "ham"})) << r.out;
  EXPECT_EQ(paths, (std::vector<std::string>{tmp_.file("single.eml"), tmp_.file("inbox/a.eml"), tmp_.file("inbox/b.eml")}));
}

// `brisk classify --precision bf16` on the training messages: the blocks in
// bf16 where the CPU has bf16 dot products (the same labels, probabilities
// close to fp32's but not all equal: bf16 did run), and fp32 with a warning
// where it has none (BRISK_BF16=emulated stands for such a CPU here: the
// same lines as fp32, to the digit).
TEST_F(ClassifyCli, Bf16ReadsMessagesWithTheSameLabels) {
  // One short epoch: a model not yet sure of itself, whose probabilities
  // show bf16's rounding in the printed digits.
  ASSERT_EQ(run_cli({"train", "--config", config_, "--set", "train.epochs=1", "--set", "train.lr=1e-3"}).exit_code, 0);
  const std::vector<std::string> base{"classify", "--checkpoint", tmp_.file("run"), "--threads", "2", tmp_.file("mail")};
  auto with = [&](const std::string& precision) {
    std::vector<std::string> args = base;
    args.insert(args.begin() + 3, {"--precision", precision});
    return args;
  };
  const CliResult fp32 = run_cli(base);
  ASSERT_EQ(fp32.exit_code, 0) << fp32.err;
  CliHooks no_fast_path;
  no_fast_path.in_child = [] { ::setenv("BRISK_BF16", "emulated", 1); };
  const CliResult fallback = run_cli(with("bf16"), no_fast_path);
  ASSERT_EQ(fallback.exit_code, 0) << fallback.err;
  EXPECT_NE(fallback.err.find("warning: precision bf16 asked for, but there is no bf16 fast path here "
                              "(BRISK_BF16=emulated)"),
            std::string::npos) << fallback.err;
  EXPECT_EQ(fallback.out, fp32.out);
  expect_error(run_cli(with("fp16")), "--precision");

  if (brisk::cpu::cpu_features().bf16 != brisk::cpu::Bf16Path::native)
    GTEST_SKIP() << "this CPU has no bf16 dot products: the bf16-native read is not checked here";
  const CliResult bf16 = run_cli(with("bf16"));
  ASSERT_EQ(bf16.exit_code, 0) << bf16.err;
  EXPECT_NE(bf16.err.find("precision bf16 (bf16-native"), std::string::npos) << bf16.err;
  // Labels must agree where fp32 is surer than the bound; closer to 0.5 a
  // bf16 rounding (which differs between CPUs' dot products) may flip one.
  constexpr double kBound = 0.02;
  std::istringstream a(fp32.out), b(bf16.out);
  std::string la, lb;
  int lines = 0, differ = 0, compared = 0;
  double worst = 0, closest = 1;
  while (std::getline(a, la) && std::getline(b, lb)) {
    ++lines;
    const size_t ta = la.find('\t'), tb = lb.find('\t');
    EXPECT_EQ(la.substr(la.rfind('\t')), lb.substr(lb.rfind('\t'))) << la;  // path
    const double pa = std::stod(la.substr(ta + 1)), pb = std::stod(lb.substr(tb + 1));
    closest = std::min(closest, pa - 0.5);
    if (pa - 0.5 > kBound) {
      ++compared;
      EXPECT_EQ(la.substr(0, ta), lb.substr(0, tb)) << la << " | " << lb;  // label
      worst = std::max(worst, std::fabs(pa - pb));
    }
    differ += pa != pb;
  }
  std::printf("%d messages (%d with fp32 surer than %.2f over 0.5, the closest %.4f over): the same labels, %d "
              "printed probabilities differ, by at most %.4f\n",
              lines, compared, kBound, closest, differ, worst);
  EXPECT_EQ(lines, 120);
  EXPECT_GT(compared, 60);
  EXPECT_LE(worst, kBound);
  EXPECT_GT(differ, 0) << "bf16 gave fp32's probabilities to the digit: did it run in bf16?";
}

TEST_F(ClassifyCli, BadMessagesAndWrongCheckpointsAreRefusedByName) {
  ASSERT_EQ(run_cli({"train", "--config", config_, "--set", "train.epochs=1"}).exit_code, 0);
  const std::string run = tmp_.file("run");
  write_text(tmp_.file("empty.eml"), "");
  expect_error(run_cli({"classify", "--checkpoint", run, tmp_.file("empty.eml")}), "empty.eml: empty message");
  write_text(tmp_.file("headers.eml"), "From: a@b.c\nSubject: no body\n");
  expect_error(run_cli({"classify", "--checkpoint", run, tmp_.file("headers.eml")}), "has no body");
  expect_error(run_cli({"classify", "--checkpoint", run, tmp_.file("missing.eml")}), "missing.eml: no such file");
  expect_error(run_cli({"classify", "--checkpoint", run, "/dev/null"}), "/dev/null: not a regular file");
  write_text(tmp_.file("ok.eml"), "From: a@b.c\nSubject: hi\n\nhello there\n");
  // Labels that cannot be written are an error, not exit 0.
  expect_error(run_program("/bin/sh", {"-c", std::string(cli_path()) + " classify --checkpoint " + run + " " +
                                                 tmp_.file("ok.eml") + " > /dev/full"}),
               "stdout failed");
  expect_error(run_cli({"generate", "--checkpoint", run, "--prompt", "hi"}),
               "this checkpoint is an encoder classifier (for brisk classify)");
  const std::string gpt = brisk::testing::save_tiny_gpt(tmp_.file("gpt"));
  expect_error(run_cli({"classify", "--checkpoint", gpt, tmp_.file("headers.eml")}),
               "this checkpoint is a GPT language model");
  expect_error(run_cli({"train", "--config", config_, "--trace", tmp_.file("t.json")}), "--trace is for GPT runs");
  expect_error(run_cli({"train", "--config", config_, "--set", "model.max_len=0"}), "model.max_len");
}

// A resume checks the records, not only their count: a store of other
// messages with the same ham and spam counts is refused. A resume at the
// run's last step trains nothing and reports with the checkpoint it
// resumed from, and null training figures rather than zeros.
TEST_F(ClassifyCli, ResumeRefusesOtherRecordsAndReportsAFinishedRun) {
  ASSERT_EQ(run_cli({"train", "--config", config_, "--set", "train.epochs=1", "--set", "checkpoint.every=3"}).exit_code,
            0);
  std::mt19937 rng(8);  // other messages, as many of each label
  for (const char* group : {"easy-ham-1", "spam-1"}) {
    fs::create_directories(tmp_.path() / "mail2" / group);
    for (int i = 0; i < 60; ++i)
      write_text(tmp_.file("mail2/" + std::string(group) + "/" + std::to_string(i) + ".txt"), message(group[0] == 's', rng));
  }
  const std::string other = tmp_.file("mail2.lmdb");
  ASSERT_EQ(run_cli({"data", "emails", "--input", tmp_.file("mail2"), "--out", other, "--tokenizer", "bytes",
                     "--strip-headers"}).exit_code, 0);
  expect_error(run_cli({"train", "--config", config_, "--set", "train.epochs=1", "--set", "data.store=" + other,
                        "--resume"}),
               "other records");

  const CliResult done = run_cli({"train", "--config", config_, "--set", "train.epochs=1", "--resume"});
  ASSERT_EQ(done.exit_code, 0) << done.err;
  EXPECT_NE(done.err.find("nothing left to train"), std::string::npos) << done.err;
  EXPECT_EQ(done.err.find("settings changed"), std::string::npos) << done.err;
  const CliResult decayed = run_cli({"train", "--config", config_, "--set", "train.epochs=1", "--set",
                                     "train.weight_decay=0.25", "--resume"});
  ASSERT_EQ(decayed.exit_code, 0) << decayed.err;
  EXPECT_NE(decayed.err.find("resume: settings changed since the stopped run"), std::string::npos) << decayed.err;
  EXPECT_NE(decayed.err.find(" -> 0.25"), std::string::npos) << decayed.err;
  const nlohmann::json report = nlohmann::json::parse(read_text(tmp_.file("run/report.json")));
  const std::string ckpt = report.at("checkpoint");
  EXPECT_NE(ckpt.find("step_"), std::string::npos) << report.dump();
  EXPECT_TRUE(report["training"]["tokens_per_s"].is_null()) << report["training"].dump();
  EXPECT_TRUE(report["training"]["first_loss"].is_null()) << report["training"].dump();
}

// The store notes how `data emails` made its records; a config reading
// messages the other way is refused (training on bodies and classifying
// whole messages scored a test split 83.3% in training, 80.0% in classify).
TEST_F(ClassifyCli, StripHeadersMustMatchTheStore) {
  expect_error(run_cli({"train", "--config", config_, "--set", "data.strip_headers=false"}),
               "was made with `brisk data emails --strip-headers`: set data.strip_headers = true");
  const std::string whole = tmp_.file("whole.lmdb");
  ASSERT_EQ(run_cli({"data", "emails", "--input", tmp_.file("mail"), "--out", whole, "--tokenizer", "bytes"}).exit_code,
            0);
  expect_error(run_cli({"train", "--config", config_, "--set", "data.store=" + whole}),
               "was made without `brisk data emails --strip-headers`: set data.strip_headers = false");
  EXPECT_FALSE(fs::exists(tmp_.file("run")));
}

// A split that leaves no test records is refused (it was scored as
// accuracy, precision, recall and F1 of 0 for the model and the baseline).
TEST_F(ClassifyCli, ASplitWithoutTestRecordsIsRefused) {
  expect_error(run_cli({"train", "--config", config_, "--set", "data.train_frac=0.995", "--set", "data.val_frac=0.004"}),
               "to hold any out for the test split");
  EXPECT_FALSE(fs::exists(tmp_.file("run/report.json")));
}

// The encoder's run stops as the GPT's does when its loss turns NaN: exit 2
// naming the step and the lr, and no checkpoint of the NaN weights.
TEST_F(ClassifyCli, ADivergedRunStopsWithoutACheckpoint) {
  const CliResult r = run_cli({"train", "--config", config_, "--set", "train.lr=1e30", "--set", "train.warmup=0"});
  expect_error(r, "diverged");
  EXPECT_NE(r.err.find("train.lr"), std::string::npos) << r.err;
  bool any = false;
  if (fs::exists(tmp_.file("run")))
    for (const auto& e : fs::directory_iterator(tmp_.file("run"))) any |= e.path().filename().string().rfind("step_", 0) == 0;
  EXPECT_FALSE(any) << "a checkpoint was written";
  // Its metrics rows still parse, the NaN step's loss as null (it was
  // written -nan, and `brisk report` then refused the run).
  std::ifstream rows(tmp_.file("run/metrics.jsonl"));
  nlohmann::json last;
  int n = 0;
  for (std::string line; std::getline(rows, line); ++n) {
    last = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    ASSERT_FALSE(last.is_discarded()) << line;
  }
  ASSERT_GT(n, 0);
  EXPECT_TRUE(last.at("loss").is_null()) << last;
  const CliResult report = run_cli({"report", tmp_.file("run"), "--out", tmp_.file("report.html")});
  EXPECT_EQ(report.exit_code, 0) << report.err;
}

// Ctrl-C in the middle of an epoch: exit 0 after a checkpoint at the step
// reached, no test split or report; `--resume` then finishes the run with the
// weights an uninterrupted run ends with, bit for bit.
TEST_F(ClassifyCli, SigintCheckpointsAndResumeFinishesTheStraightRun) {
  bool sent = false;
  CliHooks hooks;
  hooks.on_err_line = [&](const std::string& line, pid_t pid) {
    if (!sent && line.rfind("step ", 0) == 0) {
      ::kill(pid, SIGINT);
      sent = true;
    }
  };
  // 30 epochs of 12 steps: long enough that the signal lands well before the end.
  const std::vector<std::string> epochs = {"--set", "train.epochs=30"};
  auto train = [&](std::vector<std::string> args, const CliHooks& h = {}) {
    args.insert(args.begin(), {"train", "--config", config_});
    args.insert(args.end(), epochs.begin(), epochs.end());
    return run_cli(args, h);
  };
  const CliResult stopped = train({}, hooks);
  ASSERT_TRUE(sent) << stopped.err;
  EXPECT_EQ(stopped.signal, 0) << stopped.err;
  ASSERT_EQ(stopped.exit_code, 0) << stopped.err;
  EXPECT_NE(stopped.err.find("stopped by SIGINT after step"), std::string::npos) << stopped.err;
  EXPECT_EQ(stopped.err.find("test split ("), std::string::npos) << "an interrupted run evaluated the test split";
  EXPECT_FALSE(fs::exists(tmp_.path() / "run" / "report.json"));
  const std::string ckpt = brisk::train::latest_checkpoint(tmp_.file("run"));
  ASSERT_FALSE(ckpt.empty());
  const int64_t at = brisk::train::read_encoder_checkpoint(ckpt).step;
  EXPECT_GE(at, 5);
  EXPECT_LT(at, 360) << "the stop came before the end";

  const CliResult resumed = train({"--resume"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_NE(resumed.err.find("resumed from " + ckpt + " at step " + std::to_string(at)), std::string::npos)
      << resumed.err;
  EXPECT_TRUE(fs::exists(tmp_.path() / "run" / "report.json"));

  const CliResult straight = train({"--set", "checkpoint.dir=" + tmp_.file("straight")});
  ASSERT_EQ(straight.exit_code, 0) << straight.err;
  const std::string a = brisk::train::latest_checkpoint(tmp_.file("run"));
  const std::string b = brisk::train::latest_checkpoint(tmp_.file("straight"));
  EXPECT_EQ(fs::path(a).filename(), fs::path(b).filename());
  EXPECT_TRUE(brisk::testing::file_bytes(fs::path(a) / "model.safetensors") ==
              brisk::testing::file_bytes(fs::path(b) / "model.safetensors"))
      << "the stopped and resumed run ended with other weights than the straight one";
  EXPECT_EQ(brisk::testing::step_losses(tmp_.path() / "run" / "metrics.jsonl"),
            brisk::testing::step_losses(tmp_.path() / "straight" / "metrics.jsonl"));
}
