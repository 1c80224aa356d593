// `brisk export onnx` end to end. A small GPT (vocab 256, 2 layers, 64 wide,
// 2 heads, block 64) gets random values in every parameter, biases and
// LayerNorm weights included (the default init leaves biases at 0 and
// LayerNorm at 1, where a bias or LayerNorm wiring mistake would not show),
// is saved with train::save_checkpoint and exported by the real CLI. Then:
//   - onnx.checker (full_check) and the interface checks of check_onnx.py,
//     with Debian's python3-onnx;
//   - ONNX Runtime (npm onnxruntime-node, run_onnx.js) on random ids at
//     several (batch, seq) shapes, seq = block_size included, against
//     models::Gpt::logits() on the CPU backend for the same checkpoint and
//     ids: max |difference| <= 1e-4;
//   - the same for the `--kv-cache` export run as a generation loop runs it
//     (a prompt with an empty past, then one token per call on the returned
//     keys and values), up to block_size positions, and with left-padded
//     rows of different lengths against each row alone;
//   - user errors (missing or damaged checkpoint, unusable output path):
//     exit code 2, a message naming the path, no file left behind.
// A missing python3-onnx, node or onnxruntime-node fails the test and says
// what to install; nothing is skipped.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>

#include "../integration/integration_util.h"
#include "export_test_util.h"
#include "brisk/core/error.h"
#include "brisk/core/tensor.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/export/onnx_export.h"
#include "brisk/models/gpt.h"
#include "brisk/train/checkpoint.h"

using namespace brisk;
using namespace brisk::export_test;
using itest::CliResult;
using itest::run_cli;
using itest::TempDir;
namespace fs = std::filesystem;

namespace {

const models::GptConfig kConfig = kSmallGpt;
constexpr double kTolerance = 1e-4;

// One checkpoint and its export, made once per test process.
struct Exported {
  TempDir dir;
  std::string run_dir, checkpoint, model, kv_model;
  CliResult export_result, kv_export_result;
};

const Exported& exported() {
  // Destroyed at exit, which removes the directory.
  static const std::unique_ptr<Exported> e = [] {
    auto x = std::make_unique<Exported>();
    x->run_dir = x->dir.file("run");
    x->checkpoint = save_random_checkpoint(x->run_dir, kConfig, 1234, 3);
    x->model = x->dir.file("model.onnx");
    // The run directory, not the step: the CLI must pick the newest checkpoint.
    x->export_result = run_cli({"export", "onnx", "--checkpoint", x->run_dir, "--out", x->model});
    x->kv_model = x->dir.file("model_kv.onnx");
    x->kv_export_result =
        run_cli({"export", "onnx", "--checkpoint", x->run_dir, "--out", x->kv_model, "--kv-cache"});
    return x;
  }();
  return *e;
}

}  // namespace

TEST(OnnxExport, CliWritesModelAtomically) {
  const Exported& e = exported();
  ASSERT_EQ(e.export_result.exit_code, 0) << e.export_result.out << e.export_result.err;
  EXPECT_NE(e.export_result.out.find(e.checkpoint), std::string::npos) << "names the checkpoint it read\n"
                                                                          << e.export_result.out;
  EXPECT_NE(e.export_result.out.find("opset 17"), std::string::npos) << e.export_result.out;
  EXPECT_TRUE(fs::is_regular_file(e.model));
  EXPECT_GT(fs::file_size(e.model), kConfig.num_params() * sizeof(float));
  EXPECT_FALSE(fs::exists(e.model + ".tmp"));
}

ProgramResult check_onnx(const std::string& model, bool kv_cache) {
  std::vector<std::string> argv{"/usr/bin/python3", script("check_onnx.py"), model, "--vocab",
                                std::to_string(kConfig.vocab_size), "--embd", std::to_string(kConfig.n_embd),
                                "--layers", std::to_string(kConfig.n_layer), "--block",
                                std::to_string(kConfig.block_size)};
  if (kv_cache) argv.insert(argv.end(), {"--kv-cache", "--heads", std::to_string(kConfig.n_head)});
  return run_program(argv);
}

TEST(OnnxExport, OnnxCheckerAcceptsModel) {
  const Exported& e = exported();
  ASSERT_EQ(e.export_result.exit_code, 0) << e.export_result.err;
  const ProgramResult r = check_onnx(e.model, false);
  ASSERT_EQ(r.exit_code, 0) << "check_onnx.py failed (it needs Debian's python3-onnx: apt-get install python3-onnx, "
                               "or scripts/install_deps.sh):\n"
                            << r.output;
  std::printf("%s", r.output.c_str());
}

TEST(OnnxExport, OnnxCheckerAcceptsKvCacheModel) {
  const Exported& e = exported();
  ASSERT_EQ(e.kv_export_result.exit_code, 0) << e.kv_export_result.out << e.kv_export_result.err;
  EXPECT_NE(e.kv_export_result.out.find("present.{0..1}.key/.value"), std::string::npos) << e.kv_export_result.out;
  const ProgramResult r = check_onnx(e.kv_model, true);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::printf("%s", r.output.c_str());
  // The checker tells the two interfaces apart.
  EXPECT_NE(check_onnx(e.kv_model, false).exit_code, 0);
  EXPECT_NE(check_onnx(e.model, true).exit_code, 0);
}

// The checker is only worth running if it can say no: a truncated file must fail.
TEST(OnnxExport, OnnxCheckerRejectsTruncatedModel) {
  const Exported& e = exported();
  ASSERT_EQ(e.export_result.exit_code, 0) << e.export_result.err;
  TempDir dir;
  const std::string bytes = itest::read_text(e.model);
  const std::string cut = dir.file("cut.onnx");
  write_bytes(cut, bytes.data(), bytes.size() / 2);
  const ProgramResult r = run_program({"/usr/bin/python3", script("check_onnx.py"), cut, "--vocab", "256", "--embd",
                                       "64", "--layers", "2", "--block", "64"});
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("cannot import onnx"), std::string::npos) << r.output;
}

struct RuntimeCase {
  int64_t batch, seq;
  int64_t prompt = 0;         // KV-cache model: columns in the first call (the rest one per call)
  std::vector<int64_t> pads;  // KV-cache model: left padding of each row (attention_mask 0)
};

// Runs `cases` through ONNX Runtime (run_onnx.js) on random ids and compares
// every logit with models::Gpt::logits() of the same checkpoint and ids.
void expect_runtime_matches_brisk(const Exported& e, const std::string& onnx_model, bool kv_cache,
                                  const std::vector<RuntimeCase>& cases) {
  const std::string modules = npm_modules();
  ASSERT_TRUE(fs::exists(fs::path(modules) / "onnxruntime-node" / "package.json"))
      << "onnxruntime-node is not installed under " << modules
      << ": run `bash scripts/fetch_data.sh` (it runs npm install onnxruntime-node "
         "--onnxruntime-node-install-cuda=skip into third_party/npm; `make test` does it), or point "
         "BRISK_NPM_MODULES at a node_modules that has it";

  // brisk's side: the checkpoint loaded as `brisk generate` loads it.
  cpu::CpuBackend backend(2);
  models::Gpt model(train::read_checkpoint_config(e.checkpoint), backend);
  train::load_checkpoint(e.checkpoint, model, nullptr);

  TempDir dir;
  std::mt19937_64 rng(99);
  std::vector<std::string> argv{"node", script("run_onnx.js"), modules, onnx_model};
  if (kv_cache)
    argv.insert(argv.end(), {"--kv", std::to_string(kConfig.n_layer), std::to_string(kConfig.n_head),
                             std::to_string(kConfig.n_embd / kConfig.n_head)});
  std::vector<std::vector<int32_t>> ids(cases.size());
  for (size_t c = 0; c < cases.size(); ++c) {
    const int64_t n = cases[c].batch * cases[c].seq;
    std::uniform_int_distribution<int32_t> tok(0, int32_t(kConfig.vocab_size - 1));
    ids[c].resize(size_t(n));
    for (auto& t : ids[c]) t = tok(rng);
    ids[c].front() = 0;  // both ends of the vocabulary
    ids[c].back() = int32_t(kConfig.vocab_size - 1);
    const std::vector<int64_t> wide(ids[c].begin(), ids[c].end());
    const std::string in = dir.file("ids" + std::to_string(c) + ".bin");
    write_bytes(in, wide.data(), wide.size() * sizeof(int64_t));
    argv.insert(argv.end(), {std::to_string(cases[c].batch), std::to_string(cases[c].seq)});
    if (kv_cache) {
      std::string pads;
      for (int64_t b = 0; b < cases[c].batch; ++b)
        pads += (b ? "," : "") + std::to_string(cases[c].pads.empty() ? 0 : cases[c].pads[size_t(b)]);
      argv.insert(argv.end(), {std::to_string(cases[c].prompt), pads});
    }
    argv.insert(argv.end(), {in, dir.file("logits" + std::to_string(c) + ".bin")});
  }
  const ProgramResult r = run_program(argv);
  ASSERT_NE(r.exit_code, 127) << "could not start `node`: install Node.js and npm (Debian: apt-get install nodejs "
                                 "npm), then run scripts/fetch_data.sh\n"
                              << r.output;
  ASSERT_EQ(r.exit_code, 0) << "run_onnx.js failed:\n" << r.output;

  for (size_t c = 0; c < cases.size(); ++c) {
    const int64_t B = cases[c].batch, T = cases[c].seq, V = kConfig.vocab_size;
    const std::vector<float> ort = read_floats(dir.file("logits" + std::to_string(c) + ".bin"));
    ASSERT_EQ(int64_t(ort.size()), B * T * V) << "case " << B << "x" << T;
    // Each row's real tokens (after its padding) alone through brisk: the
    // logits at the row's positions [pad, T), which must not depend on the
    // padding's ids or on the other rows.
    double max_diff = 0, max_abs = 0;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t pad = cases[c].pads.empty() ? 0 : cases[c].pads[size_t(b)];
      const float* ref = model.logits(ids[c].data() + b * T + pad, 1, T - pad);  // (T - pad, V)
      const float* got = ort.data() + (b * T + pad) * V;
      for (int64_t i = 0; i < (T - pad) * V; ++i) {
        max_diff = std::max(max_diff, std::fabs(double(got[i]) - double(ref[i])));
        max_abs = std::max(max_abs, std::fabs(double(ref[i])));
      }
    }
    std::printf("%sbatch %lld seq %lld", kv_cache ? "KV cache, " : "", (long long)B, (long long)T);
    if (kv_cache) std::printf(" (prompt %lld, then %lld calls of one token)", (long long)cases[c].prompt,
                              (long long)(T - cases[c].prompt));
    for (size_t b = 0; b < cases[c].pads.size(); ++b)
      std::printf("%s%lld", b ? "," : ", left padding ", (long long)cases[c].pads[b]);
    std::printf(": max |onnxruntime - brisk| = %.3g (max |logit| %.3g)\n", max_diff, max_abs);
    // Logits of a few units: a 1e-4 bound is tight enough to catch any wiring mistake.
    EXPECT_GT(max_abs, 1.0) << "logits too small for the comparison to mean much";
    EXPECT_LE(max_diff, kTolerance) << "case batch " << B << " seq " << T;
  }
}

TEST(OnnxExport, OnnxRuntimeMatchesBriskLogits) {
  const Exported& e = exported();
  ASSERT_EQ(e.export_result.exit_code, 0) << e.export_result.err;
  expect_runtime_matches_brisk(e, e.model, false, {{2, 17, 0, {}}, {3, kConfig.block_size, 0, {}}, {1, 1, 0, {}}});
}

// Token by token on the returned keys and values, as a generation loop runs
// the model: every position's logits as brisk computes them over the whole
// sequence. A cache appended in the wrong place, positions or mask rows not
// offset by the past length, or a past ignored, each moves the later logits.
TEST(OnnxExport, KvCacheModelMatchesBriskLogitsTokenByToken) {
  const Exported& e = exported();
  ASSERT_EQ(e.kv_export_result.exit_code, 0) << e.kv_export_result.out << e.kv_export_result.err;
  expect_runtime_matches_brisk(e, e.kv_model, true,
                               {{2, 20, 7, {}},                  // a prompt, then 13 single tokens
                                {1, kConfig.block_size, 1, {}},  // one token per call, to block_size
                                {3, 9, 9, {}}});                 // a whole sequence, empty past
}

// Prompts of 10, 6 and 1 tokens in one batch, left-padded with random ids:
// each row's logits are those of its real tokens alone, before and after the
// single-token calls, so attention_mask hides the padding from every query
// and position_ids place the real tokens from 0.
TEST(OnnxExport, KvCacheModelLeftPaddedRowsMatchEachRowAlone) {
  const Exported& e = exported();
  ASSERT_EQ(e.kv_export_result.exit_code, 0) << e.kv_export_result.out << e.kv_export_result.err;
  expect_runtime_matches_brisk(e, e.kv_model, true, {{3, 24, 10, {0, 4, 9}}, {2, 12, 12, {5, 0}}});
}

TEST(OnnxExport, MissingCheckpointIsUserError) {
  TempDir dir;
  const std::string out = dir.file("m.onnx");
  const CliResult r = run_cli({"export", "onnx", "--checkpoint", dir.file("no_such_run"), "--out", out});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find(dir.file("no_such_run")), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("no checkpoint found"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(fs::exists(out + ".tmp"));
}

TEST(OnnxExport, DamagedCheckpointKeepsExistingOutput) {
  const Exported& e = exported();
  TempDir dir;
  const fs::path ckpt = dir.path() / "step_0000003";
  fs::copy(e.checkpoint, ckpt);
  const std::string weights = (ckpt / "model.safetensors").string();
  fs::resize_file(weights, fs::file_size(weights) / 2);
  const std::string out = dir.file("m.onnx");
  itest::write_text(out, "previous model");
  const CliResult r = run_cli({"export", "onnx", "--checkpoint", ckpt.string(), "--out", out});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("model.safetensors"), std::string::npos) << r.err;
  EXPECT_EQ(itest::read_text(out), "previous model");
  EXPECT_FALSE(fs::exists(out + ".tmp"));
}

TEST(OnnxExport, UnusableOutputPathIsUserError) {
  const Exported& e = exported();
  TempDir dir;
  struct Bad {
    std::string out, says;
  };
  const std::vector<Bad> bad{
      {dir.file("no_such_dir") + "/m.onnx", "does not exist"},
      {dir.path().string(), "is a directory"},
      {"/proc/brisk_export_test.onnx", "/proc/brisk_export_test.onnx"},  // not creatable, even for root
  };
  for (const Bad& b : bad) {
    const CliResult r = run_cli({"export", "onnx", "--checkpoint", e.run_dir, "--out", b.out});
    EXPECT_EQ(r.exit_code, 2) << b.out << "\n" << r.out << r.err;
    EXPECT_NE(r.err.find(b.says), std::string::npos) << b.out << "\n" << r.err;
    EXPECT_EQ(r.err.find("internal error"), std::string::npos) << r.err;
  }
}

TEST(OnnxExport, BadCommandLineIsUserError) {
  EXPECT_EQ(run_cli({"export"}).exit_code, 2);
  EXPECT_EQ(run_cli({"export", "onnx", "--out", "m.onnx"}).exit_code, 2);  // no --checkpoint
  EXPECT_EQ(run_cli({"export", "onnx", "--checkpoint", "c"}).exit_code, 2);  // no --out
}

// The library API throws typed errors, and a second export replaces the file.
TEST(OnnxExport, LibraryErrorsAreTypedAndReexportReplaces) {
  const Exported& e = exported();
  TempDir dir;
  EXPECT_THROW(exporter::export_onnx(dir.file("nothing"), dir.file("m.onnx")), core::IoError);
  EXPECT_THROW(exporter::export_onnx(e.run_dir, dir.path().string()), core::ConfigError);
  const std::string out = dir.file("m.onnx");
  itest::write_text(out, "old");
  const exporter::OnnxExportSummary s = exporter::export_onnx(e.checkpoint, out);
  EXPECT_EQ(s.checkpoint_dir, e.checkpoint);
  EXPECT_EQ(s.parameters, kConfig.num_params());
  EXPECT_EQ(s.bytes, fs::file_size(out));
  EXPECT_EQ(itest::read_text(out), itest::read_text(e.model)) << "same checkpoint, same bytes";
  EXPECT_FALSE(fs::exists(out + ".tmp"));
}
