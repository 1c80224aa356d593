// Bad inputs end with a clear error, never a crash: through the CLI, exit
// code 2 and a message that names the problem (the file, the key, the value);
// through the API, a typed core::Error with the same kind of message. Each
// case is one thing a user gets wrong: a missing or garbled config, an
// unknown or mistyped key, an impossible shape, broken data, a checkpoint of
// another model size, a prompt or sampling option the model cannot take.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include <cmath>
#include <csignal>
#include <sys/resource.h>
#include <map>
#include <nlohmann/json.hpp>

#include "brisk/core/error.h"
#include "brisk/core/safetensors.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/models/generate.h"
#include "brisk/train/checkpoint.h"
#include "brisk/train/trainer.h"
#include "integration_util.h"

using namespace brisk;
using namespace brisk::itest;

namespace {

// The CLI's answer to one bad input: exit 2, no signal, one error line that
// contains every expected fragment.
void expect_clear_error(const CliResult& r, const std::vector<std::string>& fragments) {
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.signal, 0) << "killed by signal " << r.signal << "\n" << r.err;
  EXPECT_EQ(r.exit_code, 2) << "stdout:\n" << r.out << "\nstderr:\n" << r.err;
  for (const auto& f : fragments) EXPECT_NE(r.err.find(f), std::string::npos) << "'" << f << "' not in:\n" << r.err;
}

class BadInputs : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string err;
    data_ = prepare_tiny_dataset(tmp_.path() / "corpus", &err);
    ASSERT_FALSE(data_.empty()) << "brisk data prepare failed:\n" << err;
  }

  // A valid tiny config, edited by the test.
  std::string good_config() const { return tiny_config_toml(data_, tmp_.file("run"), 2, 2, "cosine", 1); }

  CliResult train_with(const std::string& toml, std::vector<std::string> extra = {}) {
    const std::string path = tmp_.file("bad.toml");
    write_text(path, toml);
    std::vector<std::string> args = {"train", "--config", path, "--no-progress"};
    args.insert(args.end(), extra.begin(), extra.end());
    return run_cli(args);
  }

  // Replaces the first occurrence of `from` in the good config.
  std::string edited(const std::string& from, const std::string& to) const {
    std::string s = good_config();
    const auto at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at != std::string::npos) s.replace(at, from.size(), to);
    return s;
  }

  // A copy of the dataset to break.
  std::string copy_data(const std::string& name) const {
    const fs::path dst = tmp_.path() / name;
    fs::copy(data_, dst, fs::copy_options::recursive);
    return dst.string();
  }

  TempDir tmp_;
  std::string data_;
};

// ---------------------------------------------------------------- config --

TEST_F(BadInputs, MissingConfigFile) {
  const std::string missing = tmp_.file("nope.toml");
  expect_clear_error(run_cli({"train", "--config", missing}), {"nope.toml"});
}

TEST_F(BadInputs, GarbledTomlNamesFileAndLine) {
  std::string s = good_config();
  s.insert(s.find("[train]"), "this is = = not toml\n");
  // The inserted line's number, 1-based.
  const int line = int(std::count(s.begin(), s.begin() + std::ptrdiff_t(s.find("this is")), '\n')) + 1;
  expect_clear_error(train_with(s), {tmp_.file("bad.toml") + ":" + std::to_string(line) + ":"});
}

TEST_F(BadInputs, UnknownKeyIsNamed) {
  expect_clear_error(train_with(edited("batch = 4", "batch = 4\nbtach = 4")), {"train.btach", "unknown key"});
  expect_clear_error(train_with(good_config() + "\n[optimiser]\nlr = 1\n"), {"optimiser"});
  expect_clear_error(train_with(good_config(), {"--set", "train.stpes=3"}), {"train.stpes"});
}

TEST_F(BadInputs, WrongTypeIsNamed) {
  expect_clear_error(train_with(edited("steps = 2", "steps = \"ten\"")), {"train.steps", "integer"});
  expect_clear_error(train_with(good_config(), {"--set", "train.steps=ten"}), {"train.steps", "integer"});
  expect_clear_error(train_with(edited("lr = 3e-3", "lr = \"fast\"")), {"train.lr", "number"});
  expect_clear_error(train_with(edited("steps = 2", "steps = -3")), {"train.steps", "-3"});
  // Too large for an integer is not "not an integer"; an empty path names its key.
  expect_clear_error(train_with(good_config(), {"--set", "train.steps=99999999999999999999"}),
                     {"train.steps", "out of range"});
  expect_clear_error(train_with(good_config(), {"--set", "checkpoint.dir="}), {"checkpoint.dir", "empty"});
  expect_clear_error(train_with(good_config(), {"--set", "data.dir="}), {"data.dir", "empty"});
  // Evaluating over zero batches gave a validation loss of 0 (and drove the plateau schedule).
  expect_clear_error(train_with(good_config(), {"--set", "train.eval_batches=0"}), {"train.eval_batches"});
  // A file where a directory of the run should be: named by key, before anything is written.
  const std::string file = tmp_.file("a_file");
  write_text(file, "x");
  expect_clear_error(train_with(good_config(), {"--set", "checkpoint.dir=" + file + "/run"}),
                     {"checkpoint.dir", file, "is a file"});
  expect_clear_error(train_with(good_config(), {"--trace", file + "/t.json"}), {"--trace", file, "is a file"});
  const std::string config = tmp_.file("tune.toml");
  write_text(config, good_config());
  expect_clear_error(run_cli({"tune", config, "--memory-budget", "-5GiB"}), {"-5GiB", "negative"});
}

// Values that loaded and then misbehaved: a huge grad_accum (a step that
// never ended, and ignored SIGTERM), a NaN min_lr_ratio (lr nan, then a
// "diverged" blaming train.lr), a thread count past any machine (bad_alloc),
// a misspelt model.kind ("unknown key 'data.store'"), an encoder config given
// to plan/tune. Each is named before anything is written.
TEST_F(BadInputs, ValuesThatLoadedAndMisbehavedAreNamed) {
  expect_clear_error(train_with(good_config(), {"--set", "train.grad_accum=4611686018427387904"}),
                     {"train.grad_accum", "at most 1048576"});
  expect_clear_error(train_with(good_config(), {"--set", "train.min_lr_ratio=nan"}), {"train.min_lr_ratio", "nan"});
  expect_clear_error(train_with(good_config(), {"--set", "train.threads=2147483647"}), {"train.threads", "4096"});
  expect_clear_error(train_with(good_config(), {"--set", "train.beta2=0.9999999999"}), {"train.beta2", "32-bit float, got 1"});
  expect_clear_error(train_with(good_config(), {"--set", "model.kind=\"Encoder\""}),
                     {"model.kind", "unknown value 'Encoder'"});
  expect_clear_error(train_with(good_config(), {"--set", "model.kind=5"}), {"model.kind", "string"});
  // A val split shorter than one window is refused before the first step,
  // not at the first evaluation (the run then had no checkpoint).
  const std::string small = tmp_.file("small.txt");
  write_text(small, std::string(61, 'a'));  // 31 train + 30 val tokens
  ASSERT_EQ(run_cli({"data", "prepare", "--input", small, "--out", tmp_.file("small"), "--threads", "1"}).exit_code, 0);
  std::string s = good_config();
  s.replace(s.find(data_), data_.size(), tmp_.file("small"));
  expect_clear_error(train_with(s, {"--set", "train.seq=30", "--set", "train.steps=50", "--set", "train.eval_every=40"}),
                     {"the val split of dataset", "holds 30 tokens, fewer than one window of seq + 1 = 31"});
  EXPECT_FALSE(fs::exists(tmp_.path() / "run"));
  EXPECT_EQ(train_with(good_config(), {"--set", "model.kind=\"gpt\"", "--set", "train.memory_budget=4e9"}).exit_code, 0);
  const std::string enc = tmp_.file("enc.toml");
  write_text(enc, "[model]\nkind = \"encoder\"\n[data]\nstore = \"x.lmdb\"\nbucket = true\n");
  expect_clear_error(run_cli({"tune", enc, "--memory-budget", "1GiB"}), {"model.kind = \"encoder\"", "GPT configs only"});
  // brisk plan sizes an encoder run (its store need not exist: nothing is read).
  const CliResult plan = run_cli({"plan", enc});
  EXPECT_EQ(plan.exit_code, 0) << plan.err;
  EXPECT_NE(plan.out.find("(encoder classifier)"), std::string::npos) << plan.out;
}

// --resume of a run already at train.steps says so instead of printing a
// summary of zero steps.
TEST_F(BadInputs, ResumeOfAFinishedRunSaysItIsDone) {
  const std::string toml = good_config();  // 2 steps, a checkpoint at step 2
  ASSERT_EQ(train_with(toml).exit_code, 0);
  expect_clear_error(train_with(toml, {"--resume"}), {"step_0000002", "train.steps is 2", "already done"});
  EXPECT_EQ(train_with(toml, {"--resume", "--set", "train.steps=3"}).exit_code, 0);
}

TEST_F(BadInputs, SeqLongerThanBlockSize) {
  expect_clear_error(train_with(edited("seq = 32", "seq = 64")), {"train.seq", "64", "block_size", "32"});
}

TEST_F(BadInputs, ImpossibleModelShape) {
  expect_clear_error(train_with(edited("n_head = 2", "n_head = 3")), {"n_head"});
  expect_clear_error(train_with(edited("schedule = \"cosine\"", "schedule = \"wavy\"")), {"wavy"});
}

// A run whose loss turns NaN stops with an error instead of training on
// garbage and saving it as the newest checkpoint: the checkpoint of the last
// finite step stays the newest, and the message names it.
TEST_F(BadInputs, DivergedRunStopsAndKeepsTheLastGoodCheckpoint) {
  std::string toml = tiny_config_toml(data_, tmp_.file("diverge"), 4, 1, "cosine", 1);
  const auto at = toml.find("lr = 3e-3");
  ASSERT_NE(at, std::string::npos);
  toml.replace(at, 9, "lr = 1e30");
  const CliResult r = train_with(toml);
  expect_clear_error(r, {"step 2", "diverged", "step_0000001", "train.lr"});
  EXPECT_TRUE(fs::exists(tmp_.path() / "diverge" / "step_0000001"));
  EXPECT_FALSE(fs::exists(tmp_.path() / "diverge" / "step_0000002"));
}

// fp16: a skipped step changes no weight, so overflows only lower the loss
// scale; at its floor nothing is left to try, and a run whose loss stays
// NaN (here: a huge first update) ended at its last step with exit 0 and a
// checkpoint, every step skipped. It stops as a diverged run does.
TEST_F(BadInputs, AnFp16RunOverflowingAtTheScaleFloorStops) {
  std::string toml = tiny_config_toml(data_, tmp_.file("floor"), 40, 0, "constant", 1);
  const auto at = toml.find("lr = 3e-3");
  ASSERT_NE(at, std::string::npos);
  toml.replace(at, 9, "lr = 50");
  const CliResult r = train_with(toml, {"--set", "train.precision=fp16", "--set", "train.precision_fallback=false",
                                        "--set", "train.loss_scale_init=8", "--set", "train.grad_clip=0", "--set",
                                        "train.warmup=0"});
  expect_clear_error(r, {"overflowed at the loss scale's floor (1", "diverged", "train.lr"});
  EXPECT_NE(r.err.find("update skipped"), std::string::npos) << "the scale backed off first:\n" << r.err;
  EXPECT_FALSE(fs::exists(tmp_.path() / "floor" / "step_0000040"));
}

// A path override with a value it does not know (a typo) is ignored with a
// warning that names the values it takes, not silently.
TEST_F(BadInputs, AnUnknownPathOverrideIsNamed) {
  CliHooks hooks;
  hooks.in_child = [] { ::setenv("BRISK_BF16", "emulate", 1); };
  write_text(tmp_.file("ok.toml"), good_config());
  const CliResult ok = run_cli({"train", "--config", tmp_.file("ok.toml"), "--no-progress"}, hooks);
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_NE(ok.err.find("warning: BRISK_BF16=emulate is not a known value (emulated); ignored"), std::string::npos)
      << ok.err;
}

// ------------------------------------------------------------------ data --

TEST_F(BadInputs, DataDirWithoutMeta) {
  const std::string d = copy_data("nometa");
  fs::remove(fs::path(d) / "meta.json");
  std::string s = good_config();
  s.replace(s.find(data_), data_.size(), d);
  expect_clear_error(train_with(s), {d, "meta.json"});
  // And a data dir that does not exist at all.
  std::string s2 = good_config();
  s2.replace(s2.find(data_), data_.size(), tmp_.file("no_such_data"));
  expect_clear_error(train_with(s2), {"no_such_data"});
}

// A dataset prepared with --val-fraction 0 trains when the run does not
// evaluate (it was refused for its empty val split even then), and a run
// that evaluates says what is missing.
TEST_F(BadInputs, ADatasetWithoutAValSplitTrainsWithoutEvaluation) {
  const std::string d = copy_data("noval");
  for (const auto& e : fs::directory_iterator(d))
    if (e.path().filename().string().rfind("val_", 0) == 0) fs::remove(e.path());
  auto meta = nlohmann::json::parse(read_text(d + "/meta.json"));
  meta["val_tokens"] = 0;
  meta["val_shards"] = nlohmann::json::array();
  write_text(d + "/meta.json", meta.dump());
  std::string s = good_config();
  s.replace(s.find(data_), data_.size(), d);
  expect_clear_error(train_with(s, {"--set", "train.eval_every=1"}), {d, "val_*.bin", "--val-fraction 0"});
  const CliResult ok = train_with(s, {"--set", "train.eval_every=0"});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
}

TEST_F(BadInputs, TruncatedShard) {
  const std::string d = copy_data("truncated");
  const fs::path shard = fs::path(d) / "train_0000.bin";
  ASSERT_TRUE(fs::exists(shard));
  fs::resize_file(shard, fs::file_size(shard) - 100);
  std::string s = good_config();
  s.replace(s.find(data_), data_.size(), d);
  expect_clear_error(train_with(s), {"train_0000.bin"});
  // Cut inside the header.
  fs::resize_file(shard, 20);
  expect_clear_error(train_with(s), {"train_0000.bin", "truncated"});
}

// A shard cut short while a run reads it (a dataset copied over itself)
// cannot be an exit-2 error: the read is a load from a mapping, and the
// kernel answers it with SIGBUS. The process still dies of that signal, but
// first says what it means instead of the shell's bare "Bus error".
TEST_F(BadInputs, AShardCutShortDuringARunIsExplained) {
  const std::string d = copy_data("cut");
  const fs::path shard = fs::path(d) / "train_0000.bin";
  std::string s = tiny_config_toml(d, tmp_.file("cut-run"), 100000, 0, "constant", 1);
  const std::string path = tmp_.file("cut.toml");
  write_text(path, s);
  bool cut = false;
  CliHooks hooks;
  hooks.in_child = [] {  // the signal's default action dumps core: not here
    const rlimit none{0, 0};
    ::setrlimit(RLIMIT_CORE, &none);
  };
  hooks.on_err_line = [&](const std::string& line, pid_t) {
    if (!cut && line.rfind("step ", 0) == 0) {
      fs::resize_file(shard, 0);
      cut = true;
    }
  };
  const CliResult r = run_cli({"train", "--config", path, "--no-progress", "--set", "train.loader_workers=0"}, hooks);
  ASSERT_TRUE(cut) << r.err;
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.signal, SIGBUS) << "exit " << r.exit_code << "\n" << r.err;
  EXPECT_NE(r.err.find("brisk: bus error: a memory-mapped input (a token shard, an LMDB record store or a FASTA file) "
                       "became shorter"),
            std::string::npos)
      << r.err;
}

TEST_F(BadInputs, ForeignFileRenamedToShard) {
  const std::string d = copy_data("foreign");
  const fs::path shard = fs::path(d) / "train_0000.bin";
  write_text(shard.string(), std::string(4096, 'x'));  // long enough to hold a header
  std::string s = good_config();
  s.replace(s.find(data_), data_.size(), d);
  expect_clear_error(train_with(s), {"train_0000.bin"});
}

// -------------------------------------------------------------- generate --

class BadGenerate : public BadInputs {
 protected:
  void SetUp() override {
    BadInputs::SetUp();
    if (HasFatalFailure()) return;
    train::TrainOptions o;
    o.quiet = true;
    const std::string path = tmp_.file("gen.toml");
    write_text(path, good_config());
    ckpt_ = train::train(train::load_train_config(path, {}), o).last_checkpoint;
    ASSERT_FALSE(ckpt_.empty());
  }
  std::string ckpt_;
};

TEST_F(BadGenerate, CheckpointOfAnotherModelSizeNamesBothSizes) {
  cpu::CpuBackend backend(1);
  models::GptConfig other = train::read_checkpoint_config(ckpt_);
  ASSERT_EQ(other.n_embd, 32);
  other.n_embd = 48;
  other.n_layer = 3;
  models::Gpt model(other, backend);
  try {
    train::load_checkpoint(ckpt_, model, nullptr);
    FAIL() << "loaded a 2x32 checkpoint into a 3x48 model";
  } catch (const core::ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("n_embd 32"), std::string::npos) << m;
    EXPECT_NE(m.find("n_embd 48"), std::string::npos) << m;
    EXPECT_NE(m.find("n_layer 2"), std::string::npos) << m;
    EXPECT_NE(m.find("n_layer 3"), std::string::npos) << m;
  }
}

TEST_F(BadGenerate, PromptIdsOutsideVocab) {
  cpu::CpuBackend backend(1);
  models::Gpt model(train::read_checkpoint_config(ckpt_), backend);
  train::load_checkpoint(ckpt_, model, nullptr);
  models::SampleOptions so;
  so.max_new_tokens = 2;
  for (int32_t bad : {256, 1000, -1}) {
    try {
      models::generate(model, {10, 20, bad}, so);
      FAIL() << "accepted token " << bad;
    } catch (const core::Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(std::to_string(bad)), std::string::npos) << m;
      EXPECT_NE(m.find("256"), std::string::npos) << m;
    }
  }
}

TEST_F(BadGenerate, BadSamplingOptions) {
  auto gen = [&](const std::string& flag, const std::string& value) {
    return run_cli({"generate", "--checkpoint", ckpt_, "--prompt", "the", "--max-new", "3", flag, value});
  };
  expect_clear_error(gen("--top-p", "0"), {"--top-p"});
  expect_clear_error(gen("--top-p", "1.5"), {"--top-p"});
  expect_clear_error(gen("--temperature", "-1"), {"--temperature"});
  expect_clear_error(gen("--max-new", "-5"), {"--max-new"});
  expect_clear_error(gen("--top-k", "many"), {"--top-k"});
}

// Counts and sizes out of range are refused up front, naming the option:
// not run as 1 (--batch 0), not a NaN loss over 0 batches, not an internal
// error from a vector or an allocation that cannot be made.
TEST_F(BadGenerate, CountsAndSizesOutOfRangeNameTheOption) {
  auto gen = [&](std::vector<std::string> extra) {
    std::vector<std::string> args{"generate", "--checkpoint", ckpt_, "--prompt", "the", "--max-new", "2"};
    args.insert(args.end(), extra.begin(), extra.end());
    return run_cli(args);
  };
  expect_clear_error(gen({"--batch", "0"}), {"--batch", "at least 1", "got 0"});
  expect_clear_error(gen({"--threads", "-4"}), {"--threads", "at least 0"});
  expect_clear_error(gen({"--kv-mb", "-1"}), {"--kv-mb", "at least 0"});
  expect_clear_error(gen({"--kv-mb", "1000000000"}), {"--kv-mb 1000000000", "more than the machine's memory"});
  expect_clear_error(gen({"--temperature", "inf"}), {"--temperature", "finite"});
  expect_clear_error(gen({"--temperature", "nan"}), {"--temperature", "finite"});
  const std::string prompts = tmp_.file("prompts.txt");
  write_text(prompts, "one\ntwo\n");
  expect_clear_error(gen({"--prompt-file", prompts}), {"--prompt", "--prompt-file"});

  auto eval = [&](std::vector<std::string> extra) {
    std::vector<std::string> args{"eval", "--checkpoint", ckpt_, "--data", data_};
    args.insert(args.end(), extra.begin(), extra.end());
    return run_cli(args);
  };
  expect_clear_error(eval({"--batches", "0"}), {"--batches", "at least 1"});
  expect_clear_error(eval({"--batches", "-7"}), {"--batches", "at least 1"});
  expect_clear_error(eval({"--batch", "0"}), {"--batch", "at least 1"});
  expect_clear_error(eval({"--seq", "0"}), {"--seq", "at least 1"});
  expect_clear_error(eval({"--batch", "100000000", "--seq", "32"}), {"--batch 100000000", "2^31"});

  const std::string text = tmp_.file("calib.txt");
  write_text(text, "In the beginning God created the heaven and the earth.");
  for (const char* n : {"1", "-5"})
    expect_clear_error(run_cli({"quantize", "--checkpoint", ckpt_, "--scheme", "int4", "--calibration", text,
                                "--calibration-tokens", n, "--out", tmp_.file("q.safetensors")}),
                       {"--calibration-tokens", "at least 2"});
}

// An --out that is a directory (or in one that does not exist) is refused
// when the command line is read, not at the final rename after the work.
TEST_F(BadGenerate, OutputPathsThatCannotBeFilesAreRefusedUpFront) {
  const std::string dir = tmp_.file("outdir");
  fs::create_directories(dir);
  const std::string missing = tmp_.file("no_such_dir") + "/out.file";
  const std::string run_dir = fs::path(ckpt_).parent_path().string();
  const std::string config = tmp_.file("tune.toml");
  write_text(config, good_config());
  for (const std::string& out : {dir, missing}) {
    const std::string says = out == dir ? "is a directory" : "does not exist";
    expect_clear_error(run_cli({"quantize", "--checkpoint", ckpt_, "--scheme", "int8", "--out", out}), {"--out", out, says});
    expect_clear_error(run_cli({"report", run_dir, "--out", out}), {"--out", out, says});
    expect_clear_error(run_cli({"tune", config, "--memory-budget", "1GiB", "--out", out}), {"--out", out, says});
    expect_clear_error(run_cli({"export", "onnx", "--checkpoint", ckpt_, "--out", out}), {out, says});
  }
  EXPECT_TRUE(fs::is_directory(dir));
  EXPECT_TRUE(fs::is_empty(dir));
}

// A loss over ids of another tokenizer is a number, but a meaningless one.
TEST_F(BadGenerate, EvalOnDataOfAnotherTokenizerNamesBoth) {
  const std::string other = copy_data("as_gpt2");
  const std::string meta_path = other + "/meta.json";
  std::string meta = read_text(meta_path);
  const std::string from = "\"tokenizer\": \"bytes\"";
  const auto at = meta.find(from);
  ASSERT_NE(at, std::string::npos) << meta;
  meta.replace(at, from.size(), "\"tokenizer\": \"gpt2\"");
  write_text(meta_path, meta);
  expect_clear_error(run_cli({"eval", "--checkpoint", ckpt_, "--data", other, "--batches", "1"}),
                     {other, "gpt2", "bytes"});
}

TEST_F(BadGenerate, NonexistentCheckpointDir) {
  const std::string missing = tmp_.file("no_such_run");
  expect_clear_error(run_cli({"generate", "--checkpoint", missing, "--prompt", "hi"}), {missing});
  expect_clear_error(run_cli({"eval", "--checkpoint", missing, "--data", data_}), {missing});
}

TEST_F(BadGenerate, CorruptCheckpointFiles) {
  const fs::path bad = tmp_.path() / "corrupt" / "step_0000002";
  fs::create_directories(bad.parent_path());
  fs::copy(ckpt_, bad, fs::copy_options::recursive);
  write_text((bad / "model.safetensors").string(), "not a safetensors file");
  expect_clear_error(run_cli({"generate", "--checkpoint", bad.string(), "--prompt", "hi", "--max-new", "2"}),
                     {"model.safetensors"});
  write_text((bad / "state.json").string(), "{ \"step\": ");
  expect_clear_error(run_cli({"generate", "--checkpoint", bad.string(), "--prompt", "hi", "--max-new", "2"}),
                     {"state.json"});
}

// A resume whose checkpoint is of another model size says so instead of
// loading garbage or crashing.
TEST_F(BadGenerate, ResumeIntoAnotherModelSize) {
  expect_clear_error(train_with(edited("n_embd = 32", "n_embd = 48"), {"--resume"}), {"n_embd 32", "n_embd 48"});
}

// A resume on data of another tokenizer went on training, and named the
// checkpoint's tokenizer in every checkpoint after (generate would decode
// with the wrong one). Refused as train.init_from refuses it.
TEST_F(BadGenerate, ResumeOnDataOfAnotherTokenizerNamesBoth) {
  const std::string other = copy_data("resume_as_gpt2");
  std::string meta = read_text(other + "/meta.json");
  const std::string from = "\"tokenizer\": \"bytes\"";
  const auto at = meta.find(from);
  ASSERT_NE(at, std::string::npos) << meta;
  meta.replace(at, from.size(), "\"tokenizer\": \"gpt2\"");
  write_text(other + "/meta.json", meta);
  std::string text = good_config();
  text.replace(text.find(data_), data_.size(), other);
  expect_clear_error(train_with(text, {"--resume"}), {"tokenizer 'bytes'", "uses 'gpt2'"});
}

}  // namespace

// An output path naming the command's input (or a file inside the input
// checkpoint) is refused before anything is written: quantize, both exports
// and prune's --json replaced the checkpoint's own model.safetensors.
TEST_F(BadGenerate, OutputsThatWouldOverwriteTheInputAreRefused) {
  const std::string weights = ckpt_ + "/model.safetensors", state = ckpt_ + "/state.json";
  const std::string before = read_text(weights), state_before = read_text(state);
  const std::string run_dir = fs::path(ckpt_).parent_path().string();
  for (const std::string& in : {ckpt_, run_dir}) {
    expect_clear_error(run_cli({"quantize", "--checkpoint", in, "--scheme", "int8", "--out", weights}),
                       {weights, "input", in});
    expect_clear_error(run_cli({"export", "onnx", "--checkpoint", in, "--out", weights}), {weights, "input"});
    expect_clear_error(run_cli({"export", "gguf", "--checkpoint", in, "--out", state}), {state, "input"});
    expect_clear_error(run_cli({"prune", "--checkpoint", in, "--method", "magnitude", "--out", tmp_.file("pruned"),
                                "--json", state}),
                       {state, "input"});
  }
  // A quantized file as its own output.
  const std::string q8 = tmp_.file("q8.safetensors");
  ASSERT_EQ(run_cli({"quantize", "--checkpoint", ckpt_, "--scheme", "int8", "--out", q8}).exit_code, 0);
  expect_clear_error(run_cli({"quantize", "--checkpoint", q8, "--scheme", "int4", "--out", q8}), {q8, "is the input"});
  EXPECT_EQ(read_text(weights), before);
  EXPECT_EQ(read_text(state), state_before);
  EXPECT_FALSE(fs::exists(tmp_.file("pruned")));
  // A new file next to the checkpoint overwrites nothing, and an export may replace an earlier one.
  EXPECT_EQ(run_cli({"export", "onnx", "--checkpoint", ckpt_, "--out", ckpt_ + "/model.onnx"}).exit_code, 0);
  EXPECT_EQ(run_cli({"export", "onnx", "--checkpoint", ckpt_, "--out", ckpt_ + "/model.onnx"}).exit_code, 0);
}

// NaN or infinite weights (a diverged run's, a damaged file's) have no
// magnitude order and no scale: prune and quantize name the tensor.
// A NaN or infinity in a stored weight is damage (a run that diverges
// writes no checkpoint): every command that reads the checkpoint refuses
// it naming the tensor, where generate, eval and the exports used to run on
// and write NaN logits or files. A quantized file's scales likewise.
TEST_F(BadGenerate, NonFiniteWeightsAreRefusedByEveryReader) {
  cpu::CpuBackend backend(1);
  train::TrainState state;
  models::Gpt model(train::read_checkpoint_config(ckpt_, &state), backend);
  train::load_checkpoint(ckpt_, model, nullptr);
  model.params().entries().at("h.1.mlp.c_fc.weight").value.data_as<float>()[5] = std::nanf("");
  const std::string bad = train::save_checkpoint(tmp_.file("nan_run"), model, nullptr, state, 0);
  const std::vector<std::string> nan = {"h.1.mlp.c_fc.weight", "NaN"};
  expect_clear_error(run_cli({"prune", "--checkpoint", bad, "--method", "magnitude", "--out", tmp_.file("p")}), nan);
  expect_clear_error(run_cli({"quantize", "--checkpoint", bad, "--scheme", "int8", "--out", tmp_.file("q")}), nan);
  expect_clear_error(run_cli({"generate", "--checkpoint", bad, "--prompt", "In", "--max-new", "2"}), nan);
  expect_clear_error(run_cli({"eval", "--checkpoint", bad, "--data", data_}), nan);
  expect_clear_error(run_cli({"export", "onnx", "--checkpoint", bad, "--out", tmp_.file("m.onnx")}), nan);
  expect_clear_error(run_cli({"export", "gguf", "--checkpoint", bad, "--out", tmp_.file("m.gguf")}), nan);
  model.params().entries().at("h.1.mlp.c_fc.weight").value.data_as<float>()[5] = INFINITY;
  const std::string inf = train::save_checkpoint(tmp_.file("inf_run"), model, nullptr, state, 0);
  expect_clear_error(run_cli({"prune", "--checkpoint", inf, "--method", "2:4", "--sparsity", "0.5", "--out",
                              tmp_.file("p")}),
                     {"h.1.mlp.c_fc.weight", "infinity"});
  for (const char* out : {"p", "q", "m.onnx", "m.gguf"}) EXPECT_FALSE(fs::exists(tmp_.file(out))) << out;

  // A quantized file with a NaN scale.
  const std::string q8 = tmp_.file("q8.safetensors");
  ASSERT_EQ(run_cli({"quantize", "--checkpoint", ckpt_, "--scheme", "int8", "--out", q8}).exit_code, 0);
  const core::SafetensorsFile f = core::load_safetensors(q8);
  std::vector<core::NamedTensor> tensors;
  std::map<std::string, core::Tensor> copies;
  for (const auto& [name, t] : f.tensors) copies[name] = t.clone();
  copies.at("h.0.attn.c_proj.weight.scale").data_as<float>()[3] = std::nanf("");
  for (const auto& [name, t] : copies) tensors.push_back({name, t.as_view()});
  core::save_safetensors(tmp_.file("nan_scale.safetensors"), tensors, f.metadata);
  expect_clear_error(run_cli({"generate", "--checkpoint", tmp_.file("nan_scale.safetensors"), "--prompt", "In",
                              "--max-new", "2"}),
                     {"h.0.attn.c_proj.weight.scale", "NaN at element 3"});
}

// A checkpoint's own model.safetensors, named as the model, is read with the
// state.json beside it: its tokenizer and head count are not in the
// tensors (it was read as a Hugging Face file: GPT-2's tokenizer and 64-wide
// heads, without a word).
TEST_F(BadGenerate, ACheckpointsWeightsFileIsReadAsItsCheckpoint) {
  const std::vector<std::string> args = {"--prompt", "In the", "--max-new", "8", "--temperature", "0", "--no-stream"};
  auto generate = [&](const std::string& from) {
    std::vector<std::string> a = {"generate", "--checkpoint", from};
    a.insert(a.end(), args.begin(), args.end());
    return run_cli(a);
  };
  const CliResult dir = generate(ckpt_), file = generate((fs::path(ckpt_) / "model.safetensors").string());
  ASSERT_EQ(dir.exit_code, 0) << dir.err;
  ASSERT_EQ(file.exit_code, 0) << file.err;
  EXPECT_EQ(file.out, dir.out);
}

// A quantized file whose metadata says fp32 held int8 tensors the fp32 path
// read as floats, past the end of their buffers; one with a layer past its
// metadata's n_layer ran without it. Both are refused by name.
TEST_F(BadGenerate, QuantizedFilesThatDisagreeWithTheirMetadataAreRefused) {
  const std::string q8 = tmp_.file("q8.safetensors");
  ASSERT_EQ(run_cli({"quantize", "--checkpoint", ckpt_, "--scheme", "int8", "--out", q8}).exit_code, 0);
  const core::SafetensorsFile f = core::load_safetensors(q8);
  const auto rewrite = [&](const std::string& path, std::map<std::string, std::string> meta, bool drop_layer) {
    std::vector<core::NamedTensor> tensors;
    for (const auto& [name, t] : f.tensors)
      if (!drop_layer || name.rfind("h.1.", 0) != 0) tensors.push_back({name, t.as_view()});
    core::save_safetensors(path, tensors, meta);
  };
  auto meta = f.metadata;
  meta["brisk.scheme"] = "fp32";
  rewrite(tmp_.file("fp32.safetensors"), meta, false);
  expect_clear_error(run_cli({"generate", "--checkpoint", tmp_.file("fp32.safetensors"), "--prompt", "In", "--max-new",
                              "2"}),
                     {"brisk.scheme", "fp32", "int8 or int4"});
  meta = f.metadata;
  nlohmann::json model = nlohmann::json::parse(meta.at("brisk.model"));
  ASSERT_EQ(model["n_layer"], 2);
  model["n_layer"] = 1;
  meta["brisk.model"] = model.dump();
  rewrite(tmp_.file("layers.safetensors"), meta, false);
  expect_clear_error(run_cli({"generate", "--checkpoint", tmp_.file("layers.safetensors"), "--prompt", "In",
                              "--max-new", "2"}),
                     {"tensor 'h.1.", "n_layer 1"});
  rewrite(tmp_.file("one_layer.safetensors"), meta, true);  // the same file cut to one layer loads
  EXPECT_EQ(run_cli({"generate", "--checkpoint", tmp_.file("one_layer.safetensors"), "--prompt", "In", "--max-new",
                     "2"}).exit_code,
            0);
  model["n_layer"] = 2.5;
  meta["brisk.model"] = model.dump();
  rewrite(tmp_.file("float.safetensors"), meta, false);
  expect_clear_error(run_cli({"generate", "--checkpoint", tmp_.file("float.safetensors"), "--prompt", "In",
                              "--max-new", "2"}),
                     {"n_layer is not an integer"});
}

// Options the audit found accepted: an empty or directory --trace, negative
// --threads for prune and serve, a memory size past double's range.
TEST_F(BadGenerate, MoreOptionValuesAreRefusedByName) {
  const std::string config = tmp_.file("opts.toml");
  write_text(config, good_config());
  expect_clear_error(run_cli({"train", "--config", config, "--trace", ""}), {"--trace", "empty output path"});
  fs::create_directories(tmp_.file("tracedir"));
  expect_clear_error(run_cli({"train", "--config", config, "--trace", tmp_.file("tracedir")}),
                     {"--trace", "is a directory"});
  expect_clear_error(run_cli({"prune", "--checkpoint", ckpt_, "--method", "magnitude", "--out", tmp_.file("p"),
                              "--threads", "-1"}),
                     {"--threads", "at least 0"});
  expect_clear_error(run_cli({"serve", "--model", ckpt_, "--port", "0", "--threads", "-3"}), {"--threads", "at least 0"});
  // Every request passes through the queue: with room for none each was a 429.
  expect_clear_error(run_cli({"serve", "--model", ckpt_, "--port", "0", "--max-queue", "0"}),
                     {"--max-queue must be at least 1"});
  expect_clear_error(run_cli({"tune", config, "--memory-budget", "1" + std::string(400, '0')}),
                     {"--memory-budget", "too large"});
}
