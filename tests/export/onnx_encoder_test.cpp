// `brisk export onnx` of the encoder-bodied models end to end. A small encoder
// (vocab 300, 2 layers, 64 wide, 4 heads, max_len 48, 3 classes) gets random
// values in every parameter (biases, LayerNorms and the head included), is
// saved with train::save_encoder_checkpoint and exported by the real CLI.
// Then:
//   - onnx.checker (full_check) and the classifier interface checks of
//     check_onnx.py (inputs, output, initializers, the labels in the
//     metadata), with Debian's python3-onnx;
//   - ONNX Runtime (npm onnxruntime-node, run_onnx.js --pooled logits) on
//     right-padded batches of random ids, random ids on the padding too, at
//     several (batch, seq) shapes, seq = max_len and rows of one token
//     included, against models::Encoder::logits() of the same checkpoint on
//     the same padded batch and on each row alone at its own length: max
//     |difference| <= 1e-4;
//   - deploy/onnx_classify.js against `brisk classify` on message files;
//   - a sequence autoencoder's encoder half (enc.* parameters, the latent
//     out) the same ways, against models::SeqAutoencoder::encode();
//   - user errors (--kv-cache of an encoder, a checkpoint of a kind brisk
//     does not know): exit code 2, a message naming the problem, no file left.
// A missing python3-onnx, node or onnxruntime-node fails the test and says
// what to install; nothing is skipped.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <set>

#include "../integration/integration_util.h"
#include "export_test_util.h"
#include "brisk/core/error.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/export/onnx_export.h"
#include "brisk/models/encoder.h"
#include "brisk/train/checkpoint.h"

using namespace brisk;
using namespace brisk::export_test;
using itest::CliResult;
using itest::run_cli;
using itest::TempDir;
namespace fs = std::filesystem;

namespace {

constexpr double kTolerance = 1e-4;

models::EncoderConfig small_encoder(int64_t vocab = 300) {
  models::EncoderConfig c;
  c.vocab_size = vocab, c.n_layer = 2, c.n_embd = 64, c.n_head = 4, c.max_len = 48, c.n_classes = 3;
  return c;
}

// A label with a comma and quotes: the metadata must keep it as one JSON string.
const std::vector<std::string> kLabels{"ham", "spam", "other, \"quoted\""};

struct Exported {
  TempDir dir;
  std::string run_dir, checkpoint, model;
  CliResult result;
};

// A random classifier of `vocab` tokens trained (as far as its checkpoint
// says) on `tokenizer` tokens of whole messages or, with `strip_headers`, of
// their bodies; saved and exported by the CLI.
std::unique_ptr<Exported> export_random_classifier(const std::string& tokenizer, int64_t vocab, bool strip_headers) {
  auto x = std::make_unique<Exported>();
  x->run_dir = x->dir.file("run");
  cpu::CpuBackend backend(2);
  models::Encoder enc(small_encoder(vocab), backend);
  enc.init_weights(5);
  randomize(enc, 4321);
  const train::EncoderCheckpoint info{small_encoder(vocab), kLabels, tokenizer, strip_headers, 7, 1, {}};
  x->checkpoint = train::save_encoder_checkpoint(x->run_dir, enc, nullptr, info, 0);
  x->model = x->dir.file("classifier.onnx");
  // The run directory, not the step: the CLI must pick the newest checkpoint.
  x->result = run_cli({"export", "onnx", "--checkpoint", x->run_dir, "--out", x->model});
  return x;
}

// The bytes classifier of whole messages most tests use; made once per test
// process and destroyed at exit, which removes its directory.
const Exported& exported() {
  static const std::unique_ptr<Exported> e = export_random_classifier("bytes", 300, false);
  return *e;
}

// A random sequence autoencoder's export (defined with its tests, below).
const Exported& exported_autoencoder();

ProgramResult check_classifier(const std::string& model, int64_t classes) {
  const models::EncoderConfig c = small_encoder();
  return run_program({"/usr/bin/python3", script("check_onnx.py"), model, "--classifier", "--vocab",
                      std::to_string(c.vocab_size), "--embd", std::to_string(c.n_embd), "--layers",
                      std::to_string(c.n_layer), "--max-len", std::to_string(c.max_len), "--classes",
                      std::to_string(classes)});
}

}  // namespace

TEST(OnnxEncoderExport, CliWritesTheClassifier) {
  const Exported& e = exported();
  ASSERT_EQ(e.result.exit_code, 0) << e.result.out << e.result.err;
  std::printf("%s", e.result.out.c_str());
  EXPECT_NE(e.result.out.find(e.checkpoint), std::string::npos) << "names the checkpoint it read";
  EXPECT_NE(e.result.out.find("encoder classifier"), std::string::npos);
  EXPECT_NE(e.result.out.find("3 classes [\"ham\",\"spam\",\"other, \\\"quoted\\\"\"]"), std::string::npos);
  EXPECT_NE(e.result.out.find("attention_mask int64 [batch, seq]"), std::string::npos);
  EXPECT_NE(e.result.out.find("logits float32 [batch, 3]"), std::string::npos);
  EXPECT_GT(fs::file_size(e.model), small_encoder().num_params() * sizeof(float));
  EXPECT_FALSE(fs::exists(e.model + ".tmp"));
}

TEST(OnnxEncoderExport, OnnxCheckerAcceptsTheClassifier) {
  const Exported& e = exported();
  ASSERT_EQ(e.result.exit_code, 0) << e.result.err;
  const ProgramResult r = check_classifier(e.model, 3);
  ASSERT_EQ(r.exit_code, 0) << "check_onnx.py failed (it needs Debian's python3-onnx: apt-get install python3-onnx, "
                               "or scripts/install_deps.sh):\n"
                            << r.output;
  std::printf("%s", r.output.c_str());
  EXPECT_NE(r.output.find("labels ['ham', 'spam', 'other, \"quoted\"']"), std::string::npos) << r.output;
  // The checker can say no: another class count, or the GPT's interface.
  EXPECT_NE(check_classifier(e.model, 2).exit_code, 0);
  const models::EncoderConfig c = small_encoder();
  EXPECT_NE(run_program({"/usr/bin/python3", script("check_onnx.py"), e.model, "--vocab", std::to_string(c.vocab_size),
                         "--embd", std::to_string(c.n_embd), "--layers", std::to_string(c.n_layer), "--block",
                         std::to_string(c.max_len)})
                .exit_code,
            0);
}

struct PaddedCase {
  int64_t batch, seq;
  std::vector<int32_t> lengths;  // real tokens of each row (right-padded to seq)
};

// brisk's (batch, width) output for right-padded ids and their lengths.
using Reference = std::function<std::vector<float>(const int32_t* ids, const int32_t* lengths, int64_t B, int64_t T)>;

// Runs `cases` through ONNX Runtime (run_onnx.js --pooled `output`) on
// random ids below `vocab` (the padding's too) and compares every number
// with `reference` on the same padded batch and on each row's real tokens
// alone: max |difference| <= 1e-4, the values at least `min_scale` large.
void expect_runtime_matches_brisk(const std::string& onnx_model, const std::string& output, int64_t vocab,
                                  int64_t width, const Reference& reference, const std::vector<PaddedCase>& cases,
                                  double min_scale = 0.5) {
  const std::string modules = npm_modules();
  ASSERT_TRUE(fs::exists(fs::path(modules) / "onnxruntime-node" / "package.json"))
      << "onnxruntime-node is not installed under " << modules
      << ": run `bash scripts/fetch_data.sh` (`make test` does it), or point BRISK_NPM_MODULES at a node_modules "
         "that has it";
  TempDir dir;
  std::mt19937_64 rng(77);
  std::uniform_int_distribution<int32_t> tok(0, int32_t(vocab - 1));
  std::vector<std::string> argv{"node", script("run_onnx.js"), modules, onnx_model, "--pooled", output};
  std::vector<std::vector<int32_t>> ids(cases.size());
  for (size_t c = 0; c < cases.size(); ++c) {
    ids[c].resize(size_t(cases[c].batch * cases[c].seq));
    for (auto& t : ids[c]) t = tok(rng);
    ids[c].front() = 0;  // both ends of the vocabulary
    ids[c].back() = int32_t(vocab - 1);
    const std::vector<int64_t> wide(ids[c].begin(), ids[c].end());
    const std::string in = dir.file("ids" + std::to_string(c) + ".bin");
    write_bytes(in, wide.data(), wide.size() * sizeof(int64_t));
    std::string lengths;
    for (size_t b = 0; b < cases[c].lengths.size(); ++b) lengths += (b ? "," : "") + std::to_string(cases[c].lengths[b]);
    argv.insert(argv.end(), {std::to_string(cases[c].batch), std::to_string(cases[c].seq), lengths, in,
                             dir.file("out" + std::to_string(c) + ".bin")});
  }
  const ProgramResult r = run_program(argv);
  ASSERT_NE(r.exit_code, 127) << "could not start `node`: install Node.js and npm (Debian: apt-get install nodejs "
                                 "npm), then run scripts/fetch_data.sh\n"
                              << r.output;
  ASSERT_EQ(r.exit_code, 0) << "run_onnx.js failed:\n" << r.output;

  for (size_t c = 0; c < cases.size(); ++c) {
    const int64_t B = cases[c].batch, T = cases[c].seq, K = width;
    const std::vector<float> ort = read_floats(dir.file("out" + std::to_string(c) + ".bin"));
    ASSERT_EQ(int64_t(ort.size()), B * K) << "case " << B << "x" << T;
    const std::vector<float> batch = reference(ids[c].data(), cases[c].lengths.data(), B, T);
    double vs_batch = 0, vs_alone = 0, max_abs = 0;
    for (int64_t b = 0; b < B; ++b) {
      const int32_t n = cases[c].lengths[size_t(b)];
      const std::vector<float> alone = reference(ids[c].data() + b * T, &n, 1, n);
      for (int64_t k = 0; k < K; ++k) {
        const double got = ort[size_t(b * K + k)];
        vs_batch = std::max(vs_batch, std::fabs(got - double(batch[size_t(b * K + k)])));
        vs_alone = std::max(vs_alone, std::fabs(got - double(alone[size_t(k)])));
        max_abs = std::max(max_abs, std::fabs(double(alone[size_t(k)])));
      }
    }
    std::printf("%s: batch %lld seq %lld, lengths", output.c_str(), (long long)B, (long long)T);
    for (int32_t n : cases[c].lengths) std::printf(" %d", n);
    std::printf(": max |onnxruntime - brisk| = %.3g on the batch, %.3g against each row alone (max |value| %.3g)\n",
                vs_batch, vs_alone, max_abs);
    EXPECT_GT(max_abs, min_scale) << "values too small for the comparison to mean much";
    EXPECT_LE(vs_batch, kTolerance) << "case batch " << B << " seq " << T;
    EXPECT_LE(vs_alone, kTolerance) << "case batch " << B << " seq " << T;
  }
}

// Rows of different lengths right-padded with random ids: each row's logits
// are those of its real tokens alone, so attention_mask hides the padded
// keys and the mean covers only the real positions.
TEST(OnnxEncoderExport, OnnxRuntimeMatchesBriskOnPaddedBatches) {
  const Exported& e = exported();
  ASSERT_EQ(e.result.exit_code, 0) << e.result.err;
  const models::EncoderConfig cfg = small_encoder();
  cpu::CpuBackend backend(2);
  models::Encoder model(train::read_encoder_checkpoint(e.checkpoint).config, backend);
  train::load_encoder_checkpoint(e.checkpoint, model);
  const Reference logits = [&](const int32_t* ids, const int32_t* lengths, int64_t B, int64_t T) {
    const float* y = model.logits(ids, lengths, B, T);
    return std::vector<float>(y, y + B * cfg.n_classes);  // a copy: the next call reuses the output
  };
  expect_runtime_matches_brisk(e.model, "logits", cfg.vocab_size, cfg.n_classes, logits,
                               {{2, 17, {17, 5}}, {3, cfg.max_len, {48, 1, 30}}, {1, 1, {1}}, {4, 32, {32, 32, 7, 19}}});
}

TEST(OnnxEncoderExport, KvCacheIsAUserError) {
  const Exported& e = exported();
  TempDir dir;
  const std::string out = dir.file("m.onnx");
  const CliResult r = run_cli({"export", "onnx", "--checkpoint", e.run_dir, "--out", out, "--kv-cache"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("--kv-cache is for GPT checkpoints"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(e.checkpoint), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(fs::exists(out + ".tmp"));
}

// A kind brisk does not know is refused by name (state.json's kind says
// what a checkpoint is; nothing else of it is read).
TEST(OnnxEncoderExport, AnUnknownCheckpointKindIsRefusedByName) {
  const Exported& e = exported();
  TempDir dir;
  const fs::path ckpt = dir.path() / "step_0000007";
  fs::copy(e.checkpoint, ckpt);
  const std::string state = (ckpt / "state.json").string();
  std::string text = itest::read_text(state);
  const std::string kind = "\"encoder-classifier\"";
  const size_t at = text.find(kind);
  ASSERT_NE(at, std::string::npos) << text;
  text.replace(at, kind.size(), "\"mystery\"");
  itest::write_text(state, text);
  const std::string out = dir.file("m.onnx");
  const CliResult r = run_cli({"export", "onnx", "--checkpoint", ckpt.string(), "--out", out});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("unknown kind 'mystery'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(ckpt.string()), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("internal error"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out));
}

TEST(OnnxEncoderExport, LibrarySummaryAndReexport) {
  const Exported& e = exported();
  ASSERT_EQ(e.result.exit_code, 0) << e.result.err;
  TempDir dir;
  const std::string out = dir.file("m.onnx");
  itest::write_text(out, "old");
  const exporter::OnnxExportSummary s = exporter::export_onnx(e.checkpoint, out);
  EXPECT_EQ(s.kind, train::kEncoderCheckpoint);
  EXPECT_EQ(s.checkpoint_dir, e.checkpoint);
  EXPECT_TRUE(s.encoder.same_shape(small_encoder()));
  EXPECT_EQ(s.label_names, kLabels);
  EXPECT_EQ(s.parameters, small_encoder().num_params());
  EXPECT_EQ(s.bytes, fs::file_size(out));
  EXPECT_EQ(itest::read_text(out), itest::read_text(e.model)) << "same checkpoint, same bytes";
  EXPECT_THROW(exporter::export_onnx(e.checkpoint, dir.file("kv.onnx"), {.kv_cache = true}), core::ConfigError);
}

namespace {

struct Classified {
  std::string label, path;
  double prob = 0;
};

// Lines "label<TAB>probability<TAB>path" as brisk classify prints them.
std::vector<Classified> parse_classified(const std::string& out) {
  std::vector<Classified> rows;
  size_t at = 0;
  while (at < out.size()) {
    const size_t end = out.find('\n', at);
    const std::string line = out.substr(at, end - at);
    at = end == std::string::npos ? out.size() : end + 1;
    const size_t t1 = line.find('\t'), t2 = line.find('\t', t1 + 1);
    if (t1 == std::string::npos || t2 == std::string::npos) continue;
    rows.push_back({line.substr(0, t1), line.substr(t2 + 1), std::stod(line.substr(t1 + 1, t2 - t1 - 1))});
  }
  return rows;
}

// Messages that exercise what classify does before the model: headers with
// either line ending, none at all, bytes that are not UTF-8, a body past
// max_len tokens, a directory read in path order with a link to a file in
// it, and 70 more messages there, so that the model runs more than one
// batch of 64.
std::vector<std::string> write_messages(const TempDir& dir) {
  std::string long_body = "Subject: long\n\n";
  for (int i = 0; i < 60; ++i) long_body += "word" + std::to_string(i) + " and more, ";
  const std::vector<std::pair<std::string, std::string>> messages{
      {"a.eml", "Subject: hi\nFrom: someone@example.com\n\nHello there, this is the body.\nSee you.\n"},
      {"b.eml", "Subject: crlf\r\nFrom: x@y\r\n\r\nA body with CRLF line endings\r\nand a second line\r\n"},
      {"c.eml", "\nNo headers at all: the message starts with an empty line."},
      {"mail/d.eml", "Subject: latin-1\n\nCaf\xe9 cr\xe8me \xff\xfe and UTF-8 \xc3\xa9t\xc3\xa9 \xe2\x82\xac 100"},
      {"mail/sub/e.eml", long_body},
      {"mail/sub-x.eml", "Subject: order\n\nAfter mail/sub/: sorted by path component, not by the whole string."},
  };
  fs::create_directories(dir.path() / "mail" / "sub");
  fs::create_directories(dir.path() / "mail" / "many");
  for (const auto& [name, text] : messages) itest::write_text(dir.file(name), text);
  fs::create_symlink(dir.file("a.eml"), dir.path() / "mail" / "link.eml");  // a link to a file counts
  for (int i = 0; i < 70; ++i) {
    std::string body = "Subject: " + std::to_string(i) + "\n\nmessage " + std::to_string(i);
    for (int w = 0; w < i % 13; ++w) body += " w" + std::to_string(w * i);
    itest::write_text(dir.file("mail/many/m" + std::to_string(i) + ".eml"), body);
  }
  return {dir.file("a.eml"), dir.file("b.eml"), dir.file("c.eml"), dir.file("mail")};
}

// deploy/onnx_classify.js on the export (two paths as arguments, two in a
// --files-from list) against `brisk classify` on the checkpoint: the same files in the same order, the same labels, the same
// probabilities to the 4 decimals both print (a last digit may round apart).
void expect_deploy_script_matches_classify(const Exported& e) {
  ASSERT_EQ(e.result.exit_code, 0) << e.result.out << e.result.err;
  TempDir dir;
  const std::vector<std::string> inputs = write_messages(dir);
  std::vector<std::string> brisk_argv{"classify", "--checkpoint", e.run_dir};
  brisk_argv.insert(brisk_argv.end(), inputs.begin(), inputs.end());
  const CliResult want = run_cli(brisk_argv);
  ASSERT_EQ(want.exit_code, 0) << want.out << want.err;
  // The first two as arguments, the rest through --files-from (read after them).
  const std::string list = dir.file("list.txt");
  itest::write_text(list, inputs[2] + "\n" + inputs[3] + "\n");
  std::vector<std::string> node_argv{"node", std::string(BRISK_DEPLOY_DIR) + "/onnx_classify.js", e.model,
                                     inputs[0], inputs[1], "--files-from", list};
  node_argv.insert(node_argv.end(), {"--node-modules", npm_modules(), "--threads", "1"});
  const ProgramResult got = run_program(node_argv);
  ASSERT_EQ(got.exit_code, 0) << got.output;
  std::printf("brisk classify:\n%sonnx_classify.js:\n%s", want.out.c_str(), got.output.c_str());
  const std::vector<Classified> a = parse_classified(want.out), b = parse_classified(got.output);
  ASSERT_EQ(a.size(), 77u) << want.out;
  ASSERT_EQ(b.size(), a.size()) << got.output;
  std::set<std::string> labels;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(b[i].path, a[i].path);
    EXPECT_EQ(b[i].label, a[i].label) << a[i].path;
    EXPECT_NEAR(b[i].prob, a[i].prob, 1.01e-4) << a[i].path;
    labels.insert(a[i].label);
  }
  EXPECT_GE(labels.size(), 2u) << "every message got one label: the comparison would not see a wrong body or token";
}

}  // namespace

// Whole messages (strip_headers false), byte tokens.
TEST(OnnxEncoderExport, DeployScriptClassifiesAsBriskClassifyOnBytes) {
  expect_deploy_script_matches_classify(exported());
}

// Bodies only, GPT-2 BPE (E1's): the script's ids come from npm
// gpt-3-encoder, brisk's from its own tokenizer.
TEST(OnnxEncoderExport, DeployScriptClassifiesAsBriskClassifyOnGpt2Bodies) {
  const std::unique_ptr<Exported> e = export_random_classifier("gpt2", 50257, true);
  expect_deploy_script_matches_classify(*e);
}

// What the script refuses, as brisk classify refuses it: exit 2 and the
// reason, nothing classified.
TEST(OnnxEncoderExport, DeployScriptRefusesBadInputByName) {
  const std::unique_ptr<Exported> bodies = export_random_classifier("bytes", 300, true);
  ASSERT_EQ(bodies->result.exit_code, 0) << bodies->result.err;
  TempDir dir;
  itest::write_text(dir.file("empty.eml"), "");
  itest::write_text(dir.file("headers.eml"), "Subject: only headers\nFrom: x@y\n");
  itest::write_text(dir.file("ok.eml"), "Subject: hi\n\nbody");
  itest::write_text(dir.file("not.onnx"), "not a model");
  struct Case {
    std::string model, input, says;
  };
  const std::vector<Case> cases{
      {bodies->model, dir.file("empty.eml"), "empty message"},
      {bodies->model, dir.file("headers.eml"), "has no body"},
      {bodies->model, dir.file("missing.eml"), "no such file or directory"},
      {exported_autoencoder().model, dir.file("ok.eml"), "not an encoder classifier's export"},
      {dir.file("not.onnx"), dir.file("ok.eml"), "not.onnx"},
      {dir.file("no_model.onnx"), dir.file("ok.eml"), "cannot read the model"},
  };
  for (const Case& c : cases) {
    const ProgramResult r = run_program({"node", std::string(BRISK_DEPLOY_DIR) + "/onnx_classify.js", c.model,
                                         dir.file("ok.eml"), c.input, "--node-modules", npm_modules()});
    EXPECT_EQ(r.exit_code, 2) << c.input << "\n" << r.output;
    EXPECT_NE(r.output.find(c.says), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("\t" + dir.file("ok.eml")), std::string::npos) << "classified before refusing:\n"
                                                                          << r.output;
  }
}

// ---- the sequence autoencoder's encoder -------------------------------------------------

namespace {

models::SeqAutoencoderConfig small_autoencoder() {
  models::SeqAutoencoderConfig c;
  c.vocab_size = 28, c.n_layer = 2, c.n_embd = 32, c.n_head = 2, c.max_len = 40, c.latent = 8;
  return c;
}

const Exported& exported_autoencoder() {
  static const std::unique_ptr<Exported> e = [] {
    auto x = std::make_unique<Exported>();
    x->run_dir = x->dir.file("run");
    cpu::CpuBackend backend(2);
    models::SeqAutoencoder ae(small_autoencoder(), backend);
    ae.init_weights(3);
    randomize(ae, 987);
    x->checkpoint =
        train::save_autoencoder_checkpoint(x->run_dir, ae, nullptr, {small_autoencoder(), "fasta", 11, 1, {}}, 0);
    x->model = x->dir.file("encoder.onnx");
    x->result = run_cli({"export", "onnx", "--checkpoint", x->run_dir, "--out", x->model});
    return x;
  }();
  return *e;
}

}  // namespace

TEST(OnnxEncoderExport, AutoencoderEncoderPassesTheChecker) {
  const Exported& e = exported_autoencoder();
  ASSERT_EQ(e.result.exit_code, 0) << e.result.out << e.result.err;
  std::printf("%s", e.result.out.c_str());
  EXPECT_NE(e.result.out.find("sequence autoencoder's encoder"), std::string::npos);
  EXPECT_NE(e.result.out.find("latent float32 [batch, 8]"), std::string::npos);
  const models::SeqAutoencoderConfig c = small_autoencoder();
  auto check = [&](int64_t latent) {
    return run_program({"/usr/bin/python3", script("check_onnx.py"), e.model, "--autoencoder", "--vocab",
                        std::to_string(c.vocab_size), "--embd", std::to_string(c.n_embd), "--layers",
                        std::to_string(c.n_layer), "--max-len", std::to_string(c.max_len), "--latent",
                        std::to_string(latent)});
  };
  const ProgramResult r = check(c.latent);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::printf("%s", r.output.c_str());
  EXPECT_NE(check(c.latent + 1).exit_code, 0);
  // Only the encoder half: none of the decoder's parameters is in the file.
  const std::string bytes = itest::read_text(e.model);
  EXPECT_EQ(bytes.find("dec.h.0"), std::string::npos);
  EXPECT_EQ(bytes.find("from_latent"), std::string::npos);
}

TEST(OnnxEncoderExport, AutoencoderEncoderMatchesBriskEncode) {
  const Exported& e = exported_autoencoder();
  ASSERT_EQ(e.result.exit_code, 0) << e.result.err;
  const models::SeqAutoencoderConfig cfg = small_autoencoder();
  cpu::CpuBackend backend(2);
  models::SeqAutoencoder model(train::read_autoencoder_checkpoint(e.checkpoint).config, backend);
  train::load_autoencoder_checkpoint(e.checkpoint, model);
  const Reference latent = [&](const int32_t* ids, const int32_t* lengths, int64_t B, int64_t T) {
    const float* z = model.encode(ids, lengths, B, T);
    return std::vector<float>(z, z + B * cfg.latent);
  };
  // Latents are smaller than logits: at least 0.25 still stands 2,500 times over the 1e-4 bound.
  expect_runtime_matches_brisk(e.model, "latent", cfg.vocab_size, cfg.latent, latent,
                               {{3, 23, {23, 4, 1}}, {2, cfg.max_len, {40, 31}}}, 0.25);
}

TEST(OnnxEncoderExport, KvCacheOfAnAutoencoderIsAUserError) {
  const Exported& e = exported_autoencoder();
  TempDir dir;
  const std::string out = dir.file("m.onnx");
  const CliResult r = run_cli({"export", "onnx", "--checkpoint", e.run_dir, "--out", out, "--kv-cache"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("--kv-cache is for GPT checkpoints; this one is a sequence autoencoder"), std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(out));
}
