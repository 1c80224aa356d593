// `brisk prune` end to end on a tiny trained model: the output is a normal
// checkpoint (generate and eval read it) whose zeros match the report
// printed and written as JSON; fine-tuning it with train.init_from and
// train.keep_mask keeps every pruned weight and its AdamW moments at exactly
// 0 while the other weights train; bad options end with exit code 2 and a
// message naming the problem.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "brisk/cpu/cpu_backend.h"
#include "brisk/models/prune.h"
#include "brisk/optim/optimizer.h"
#include "brisk/train/checkpoint.h"
#include "brisk/train/trainer.h"
#include "integration_util.h"

using namespace brisk;
using namespace brisk::itest;

namespace {

using Weights = std::map<std::string, std::vector<float>>;

// A checkpoint's weights (and, with moments, AdamW's m and v as "<name>.m"/".v").
Weights load_weights(const std::string& ckpt, bool moments = false) {
  cpu::CpuBackend backend(1);
  models::Gpt model(train::read_checkpoint_config(ckpt), backend);
  optim::AdamW adamw(optim::AdamWConfig{}, model.params(), backend);
  train::load_checkpoint(ckpt, model, moments ? &adamw : nullptr);
  Weights out;
  for (const auto& [name, e] : model.params().entries()) {
    out[name].assign(e.value.data_as<float>(), e.value.data_as<float>() + e.value.numel());
    if (moments)
      for (int k = 0; k < 2; ++k)
        out[name + (k ? ".v" : ".m")].assign(e.state[size_t(k)].data_as<float>(),
                                             e.state[size_t(k)].data_as<float>() + e.value.numel());
  }
  return out;
}

int64_t zeros(const std::vector<float>& w) {
  int64_t z = 0;
  for (float x : w) z += x == 0.0f;
  return z;
}

class PruneIntegration : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new TempDir();
    std::string err;
    // The model to prune: a few steps, so its weights are trained, not the init.
    train_tiny_base(tmp_->path(), "base", 6, data_, &err);
    ASSERT_FALSE(data_.empty()) << "brisk data prepare failed:\n" << err;
  }
  static void TearDownTestSuite() {
    delete tmp_;
    tmp_ = nullptr;
  }

  static std::string base_run() { return tmp_->file("base"); }

  CliResult prune(const std::string& out, std::vector<std::string> extra) {
    std::vector<std::string> args = {"prune", "--checkpoint", base_run(), "--out", out, "--threads", "1"};
    args.insert(args.end(), extra.begin(), extra.end());
    return run_cli(args);
  }

  // A fine-tuning config: the tiny model from `init_from`, `steps` steps at a
  // small learning rate (weights stay near where they started).
  std::string finetune_config(const std::string& name, const std::string& init_from, bool keep_mask, int steps) {
    std::string toml = tiny_config_toml(data_, tmp_->file(name), steps, 0, "cosine", 1);
    const std::string lr = "lr = 3e-3";
    toml.replace(toml.find(lr), lr.size(), "lr = 3e-4");
    const std::string at = "[train]\n";
    toml.insert(toml.find(at) + at.size(), (init_from.empty() ? "" : "init_from = \"" + init_from + "\"\n") +
                                               std::string("keep_mask = ") + (keep_mask ? "true" : "false") + "\n");
    const std::string path = tmp_->file(name + ".toml");
    write_text(path, toml);
    return path;
  }

  static void expect_clear_error(const CliResult& r, const std::vector<std::string>& fragments) {
    EXPECT_FALSE(r.timed_out);
    EXPECT_EQ(r.signal, 0) << r.err;
    EXPECT_EQ(r.exit_code, 2) << "stdout:\n" << r.out << "\nstderr:\n" << r.err;
    for (const auto& f : fragments) EXPECT_NE(r.err.find(f), std::string::npos) << "'" << f << "' not in:\n" << r.err;
  }

  static TempDir* tmp_;
  static std::string data_;
};

TempDir* PruneIntegration::tmp_ = nullptr;
std::string PruneIntegration::data_;

TEST_F(PruneIntegration, MagnitudeWritesCheckpointAndReport) {
  const std::string out = tmp_->file("mag50"), json_path = tmp_->file("mag50.json");
  const CliResult r = prune(out, {"--method", "magnitude", "--sparsity", "0.5", "--json", json_path});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("h.0.attn.c_attn.weight"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("total"), std::string::npos) << r.out;

  // A checkpoint directory itself, with the method in state.json and the report next to it.
  ASSERT_TRUE(fs::exists(fs::path(out) / "state.json"));
  EXPECT_FALSE(fs::exists(tmp_->file(".tmp_prune_mag50")));
  const auto state = nlohmann::json::parse(read_text(out + "/state.json"));
  EXPECT_EQ(state.at("pruning").at("method"), "magnitude");
  EXPECT_DOUBLE_EQ(state.at("pruning").at("sparsity").get<double>(), 0.5);
  const auto report = nlohmann::json::parse(read_text(out + "/prune_report.json"));
  EXPECT_EQ(report, nlohmann::json::parse(read_text(json_path)));

  // The report's numbers are a recount of the written weights; the rest is the source's.
  const Weights pruned = load_weights(out), source = load_weights(train::latest_checkpoint(base_run()));
  int64_t total_zeros = 0, total = 0;
  ASSERT_EQ(report.at("layers").size(), size_t(8));
  for (const auto& l : report.at("layers")) {
    const std::vector<float>& w = pruned.at(l.at("name").get<std::string>());
    EXPECT_EQ(l.at("numel").get<int64_t>(), int64_t(w.size()));
    EXPECT_EQ(l.at("zeros").get<int64_t>(), zeros(w));
    EXPECT_LE(std::fabs(double(zeros(w)) - 0.5 * double(w.size())), 1.0);
    total_zeros += zeros(w);
    total += int64_t(w.size());
  }
  EXPECT_EQ(report.at("total").at("zeros").get<int64_t>(), total_zeros);
  EXPECT_EQ(report.at("total").at("numel").get<int64_t>(), total);
  for (const auto& [name, w] : source)
    if (!models::is_prunable(name)) {
      EXPECT_EQ(pruned.at(name), w) << name;
    }

  // Readable by the other commands.
  const CliResult gen = run_cli({"generate", "--checkpoint", out, "--prompt", "the king", "--max-new", "8",
                                 "--temperature", "0", "--threads", "1"});
  EXPECT_EQ(gen.exit_code, 0) << gen.err;
  const CliResult ev = run_cli({"eval", "--checkpoint", out, "--data", data_, "--batches", "2", "--batch", "2",
                                "--seq", "32", "--threads", "1"});
  EXPECT_EQ(ev.exit_code, 0) << ev.err;
  EXPECT_NE(ev.out.find("val loss"), std::string::npos) << ev.out;
}

TEST_F(PruneIntegration, GlobalScopeThroughTheCli) {
  const std::string out = tmp_->file("global60");
  const CliResult r = prune(out, {"--method", "magnitude", "--sparsity", "0.6", "--scope", "global"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("method magnitude, scope global, sparsity 0.6"), std::string::npos) << r.out;
  const auto report = nlohmann::json::parse(read_text(out + "/prune_report.json"));
  EXPECT_EQ(report.at("scope"), "global");
  EXPECT_EQ(nlohmann::json::parse(read_text(out + "/state.json")).at("pruning").at("scope"), "global");
  // The whole is exact; the layers are not held to it.
  const int64_t total = report.at("total").at("numel").get<int64_t>();
  EXPECT_EQ(report.at("total").at("zeros").get<int64_t>(), std::llround(0.6 * double(total)));
  double lo = 1, hi = 0;
  for (const auto& l : report.at("layers")) {
    lo = std::min(lo, l.at("sparsity").get<double>());
    hi = std::max(hi, l.at("sparsity").get<double>());
  }
  EXPECT_GT(hi - lo, 0.01) << report.dump(1);
  // The layer scope is the default and says so.
  const auto layer = prune(tmp_->file("layer60"), {"--method", "magnitude", "--sparsity", "0.6"});
  ASSERT_EQ(layer.exit_code, 0) << layer.err;
  EXPECT_EQ(nlohmann::json::parse(read_text(tmp_->file("layer60") + "/prune_report.json")).at("scope"), "layer");
}

TEST_F(PruneIntegration, TwoFourThroughTheCli) {
  const std::string out = tmp_->file("two_four");
  const CliResult r = prune(out, {"--method", "2:4"});  // --sparsity defaults to 0.5
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (const auto& [name, w] : load_weights(out)) {
    if (!models::is_prunable(name)) continue;
    for (size_t g = 0; g < w.size(); g += 4)
      ASSERT_EQ(int(w[g] != 0.f) + int(w[g + 1] != 0.f) + int(w[g + 2] != 0.f) + int(w[g + 3] != 0.f), 2)
          << name << " group " << g / 4;
  }
  const auto report = nlohmann::json::parse(read_text(out + "/prune_report.json"));
  EXPECT_EQ(report.at("method"), "2:4");
  EXPECT_DOUBLE_EQ(report.at("total").at("sparsity").get<double>(), 0.5);
}

TEST_F(PruneIntegration, FineTuneKeepsMaskAndMoments) {
  const std::string pruned = tmp_->file("ft_src");
  ASSERT_EQ(prune(pruned, {"--method", "magnitude", "--sparsity", "0.6"}).exit_code, 0);
  const Weights start = load_weights(pruned);
  const auto report = nlohmann::json::parse(read_text(pruned + "/prune_report.json"));

  const std::string cfg = finetune_config("ft", pruned, true, 5);
  const CliResult r = run_cli({"train", "--config", cfg, "--no-progress"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("initialized from"), std::string::npos) << r.err;
  // The mask is the pruned checkpoint's zeros (a random init has none).
  const std::string held = "keep_mask: " + std::to_string(report.at("total").at("zeros").get<int64_t>()) + " of " +
                           std::to_string(report.at("total").at("numel").get<int64_t>());
  EXPECT_NE(r.err.find(held), std::string::npos) << held << " not in:\n" << r.err;
  const std::vector<MetricRow> rows = read_metrics(tmp_->file("ft"));
  ASSERT_EQ(rows.size(), size_t(5));  // from step 0: a fresh run, not a continuation
  EXPECT_EQ(rows.front().step, 1);
  for (const MetricRow& m : rows) EXPECT_TRUE(std::isfinite(m.loss)) << "step " << m.step;

  const std::string ckpt = train::latest_checkpoint(tmp_->file("ft"));
  const Weights end = load_weights(ckpt, true);
  int64_t masked = 0, moved = 0, kept = 0;
  double diff = 0, mag = 0;
  for (const auto& [name, w0] : start) {
    const std::vector<float>& w1 = end.at(name);
    for (size_t i = 0; i < w0.size(); ++i) {
      if (models::is_prunable(name) && w0[i] == 0.0f) {
        ++masked;
        ASSERT_EQ(w1[i], 0.0f) << name << " [" << i << "] revived";
        ASSERT_EQ(end.at(name + ".m")[i], 0.0f) << name << " [" << i << "] first moment";
        ASSERT_EQ(end.at(name + ".v")[i], 0.0f) << name << " [" << i << "] second moment";
      } else if (models::is_prunable(name)) {
        ++kept;
        moved += w1[i] != w0[i];
        diff += std::fabs(double(w1[i]) - double(w0[i]));
        mag += std::fabs(double(w0[i]));
      }
    }
  }
  EXPECT_GT(masked, 0);
  EXPECT_GT(moved, kept * 9 / 10) << "the unmasked weights should train";
  // Near the pruned weights, not a fresh init: the run started from them.
  EXPECT_LT(diff, 0.2 * mag);
}

TEST_F(PruneIntegration, WithoutKeepMaskPrunedWeightsMove) {
  // The control: the same fine-tune without the mask revives pruned weights.
  const std::string pruned = tmp_->file("ctl_src");
  ASSERT_EQ(prune(pruned, {"--method", "magnitude", "--sparsity", "0.6"}).exit_code, 0);
  const std::string cfg = finetune_config("ctl", pruned, false, 3);
  ASSERT_EQ(run_cli({"train", "--config", cfg, "--no-progress"}).exit_code, 0);
  const Weights start = load_weights(pruned), end = load_weights(train::latest_checkpoint(tmp_->file("ctl")));
  int64_t revived = 0;
  for (const auto& [name, w0] : start)
    for (size_t i = 0; i < w0.size(); ++i) revived += models::is_prunable(name) && w0[i] == 0.f && end.at(name)[i] != 0.f;
  EXPECT_GT(revived, 0);
}

TEST_F(PruneIntegration, BadInputsExitTwo) {
  const std::string out = tmp_->file("bad");
  expect_clear_error(prune(out, {"--method", "magnitude", "--sparsity", "1.0"}), {"sparsity", "[0, 1)", "got 1"});
  expect_clear_error(prune(out, {"--method", "magnitude", "--sparsity=-0.1"}), {"sparsity", "got -0.1"});
  expect_clear_error(prune(out, {"--method", "foo"}), {"method", "'foo'"});
  expect_clear_error(prune(out, {"--method", "2:4", "--sparsity", "0.3"}), {"2:4", "0.5"});
  expect_clear_error(prune(out, {"--method", "magnitude", "--scope", "model"}), {"scope", "'model'", "layer, global"});
  expect_clear_error(prune(out, {"--method", "2:4", "--scope", "global"}), {"2:4", "no global scope"});
  EXPECT_FALSE(fs::exists(out));

  // Not a checkpoint: a directory with no state.json, and one whose state.json is garbage.
  fs::create_directories(tmp_->file("empty_dir"));
  expect_clear_error(run_cli({"prune", "--checkpoint", tmp_->file("empty_dir"), "--method", "magnitude", "--out", out}),
                     {"empty_dir", "not a brisk checkpoint"});
  fs::create_directories(tmp_->file("junk_ckpt"));
  write_text(tmp_->file("junk_ckpt/state.json"), "{\"hello\": 1}");
  expect_clear_error(run_cli({"prune", "--checkpoint", tmp_->file("junk_ckpt"), "--method", "magnitude", "--out", out}),
                     {"state.json", "model"});
  expect_clear_error(run_cli({"prune", "--checkpoint", tmp_->file("nowhere"), "--method", "magnitude", "--out", out}),
                     {"nowhere"});

  // An existing output is not overwritten.
  expect_clear_error(prune(base_run(), {"--method", "magnitude"}), {"already exists"});
}

TEST_F(PruneIntegration, KeepMaskNeedsACheckpoint) {
  const CliResult r = run_cli({"train", "--config", finetune_config("nomask", "", true, 2), "--no-progress"});
  expect_clear_error(r, {"train.keep_mask", "train.init_from"});
  EXPECT_FALSE(fs::exists(tmp_->file("nomask") + "/metrics.jsonl"));  // refused before the run started

  const CliResult missing =
      run_cli({"train", "--config", finetune_config("nosrc", tmp_->file("no_such_ckpt"), true, 2), "--no-progress"});
  expect_clear_error(missing, {"train.init_from", "no_such_ckpt"});
}

TEST_F(PruneIntegration, InitFromAnotherShapeIsRefused) {
  const std::string pruned = tmp_->file("shape_src");
  ASSERT_EQ(prune(pruned, {"--method", "magnitude", "--sparsity", "0.3"}).exit_code, 0);
  const CliResult r = run_cli({"train", "--config", finetune_config("shape", pruned, true, 2), "--no-progress",
                               "--set", "model.n_embd=64"});
  expect_clear_error(r, {"train.init_from", "n_embd 32", "n_embd 64"});
}

}  // namespace
