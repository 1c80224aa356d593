// `brisk export gguf` end to end: a small GPT (vocab 256, bytes tokenizer,
// 2 layers, 64 wide, 2 heads, block 64) with random values in every
// parameter is saved, exported by the real CLI in each weight type, and run
// in llama.cpp (npm node-llama-cpp's prebuilt CPU binaries, run_gguf.mjs)
// on a random token sequence. llama.cpp's next-token distribution after
// every position is compared with the softmax of models::Gpt::logits() for
// the same checkpoint and ids:
//   - brisk runs on the weights as the file holds them (rounded to f16, or
//     quantized to q8_0 / q4_0 and back with ggml's reference rounding,
//     written again in this test), so what is left is llama.cpp's own
//     arithmetic (an f16 key/value cache, activations rounded to 8 bits in
//     q8_0 and q4_0 products): every probability within 2e-3 (f32) to 5e-2
//     (q8_0, q4_0), the mean total-variation distance per position within
//     1e-3 to 3e-2, and for q4_0 under a quarter of its distance to fp32;
//   - the distance to fp32 brisk is printed beside it (the format's cost).
// Also: the tokenizer inside (llama.cpp tokenizes text into the byte ids),
// and the CLI's errors. A missing node or node-llama-cpp fails the test and
// says what to install; nothing is skipped.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <random>

#include "../integration/integration_util.h"
#include "brisk/core/dtype.h"
#include "brisk/core/error.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/export/gguf_export.h"
#include "brisk/models/gpt.h"
#include "brisk/train/checkpoint.h"
#include "export_test_util.h"
#include "gguf_reader.h"

using namespace brisk;
using namespace brisk::export_test;
using itest::CliResult;
using itest::run_cli;
using itest::TempDir;
namespace fs = std::filesystem;

namespace {

const models::GptConfig kConfig = kSmallGpt;

// One random checkpoint per test process, with the bytes tokenizer.
struct Saved {
  TempDir dir;
  std::string run_dir, checkpoint;
};

const Saved& saved() {
  static const std::unique_ptr<Saved> s = [] {
    auto x = std::make_unique<Saved>();
    x->run_dir = x->dir.file("run");
    x->checkpoint = save_random_checkpoint(x->run_dir, kConfig, 4321, 5);
    return x;
  }();
  return *s;
}

struct LlamaRun {
  std::vector<float> probs;  // (T, V)
  std::string report;        // run_gguf.mjs's JSON line
};

LlamaRun run_in_llama_cpp(const std::string& gguf, const std::vector<int32_t>& ids) {
  const std::string modules = llama_npm_modules();
  EXPECT_TRUE(fs::exists(fs::path(modules) / "node-llama-cpp" / "package.json"))
      << "node-llama-cpp is not installed under " << modules
      << ": run `bash scripts/fetch_data.sh` (`make test` does it), or point BRISK_LLAMA_NPM_MODULES at a "
         "node_modules that has it";
  TempDir dir;
  const std::string in = dir.file("ids.bin"), out = dir.file("probs.bin");
  write_bytes(in, ids.data(), ids.size() * sizeof(int32_t));
  const ProgramResult r = run_program({"node", script("run_gguf.mjs"), modules, gguf, in, out});
  EXPECT_NE(r.exit_code, 127) << "could not start `node`: install Node.js (Debian: apt-get install nodejs)\n"
                              << r.output;
  EXPECT_EQ(r.exit_code, 0) << "run_gguf.mjs failed:\n" << r.output;
  LlamaRun run;
  if (r.exit_code == 0) run.probs = read_floats(out);
  run.report = r.output;
  return run;
}

// A weight row as `type` stores it, back in float: ggml's reference
// rounding (quantize_row_*_ref), written here apart from the exporter, so
// that llama.cpp's reading of the file is what the comparison checks.
void round_trip(float* x, int64_t n, const std::string& type) {
  const auto half = [](float v) { return float(core::f16(v)); };
  if (type == "f16") {
    for (int64_t i = 0; i < n; ++i) x[i] = half(x[i]);
    return;
  }
  for (int64_t b = 0; b < n; b += 32) {
    float* v = x + b;
    if (type == "q8_0") {
      float amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(v[j]));
      const float d = amax / 127, id = d != 0 ? 1 / d : 0, dh = half(d);
      for (int j = 0; j < 32; ++j) v[j] = dh * float(std::lround(v[j] * id));
    } else {  // q4_0: scale = the value of largest magnitude / -8, codes 0..15 around 8
      float amax = 0, max = 0;
      for (int j = 0; j < 32; ++j)
        if (std::fabs(v[j]) > amax) amax = std::fabs(v[j]), max = v[j];
      const float d = max / -8, id = d != 0 ? 1 / d : 0, dh = half(d);
      for (int j = 0; j < 32; ++j) v[j] = dh * float(std::min(15, int(int8_t(v[j] * id + 8.5f))) - 8);
    }
  }
}

// Softmax rows of brisk's logits for ids, (T, V), for a checkpoint whose
// 2-D weights `adjust` may change first (to what a file holds).
using Adjust = std::function<void(const std::string& name, core::Tensor& weight)>;
std::vector<double> probs_of(const std::string& checkpoint, const std::vector<int32_t>& ids, const Adjust& adjust = {}) {
  cpu::CpuBackend backend(2);
  const models::GptConfig cfg = train::read_checkpoint_config(checkpoint);
  models::Gpt model(cfg, backend);
  train::load_checkpoint(checkpoint, model, nullptr);
  if (adjust)
    for (auto& [name, e] : model.params().entries()) {
      if (e.value.shape().rank() != 2) continue;
      core::Tensor w = model.params().download(e.value);
      adjust(name, w);
      model.params().upload(e.value, w);
    }
  const int64_t T = int64_t(ids.size()), V = cfg.vocab_size;
  const float* logits = model.logits(ids.data(), 1, T);
  std::vector<double> p(size_t(T * V));
  for (int64_t t = 0; t < T; ++t) {
    const float* row = logits + t * V;
    const double m = *std::max_element(row, row + V);
    double sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += p[size_t(t * V + v)] = std::exp(double(row[v]) - m);
    for (int64_t v = 0; v < V; ++v) p[size_t(t * V + v)] /= sum;
  }
  return p;
}

// brisk on the test checkpoint with every 2-D weight but the position
// embeddings as `type` holds it.
std::vector<double> brisk_probs(const std::vector<int32_t>& ids, const std::string& type = "f32") {
  if (type == "f32") return probs_of(saved().checkpoint, ids);
  return probs_of(saved().checkpoint, ids, [&](const std::string& name, core::Tensor& w) {
    if (name != "wpe.weight") round_trip(w.data_as<float>(), w.numel(), type);
  });
}

std::vector<int32_t> random_ids(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> tok(0, int32_t(kConfig.vocab_size - 1));
  std::vector<int32_t> ids(static_cast<size_t>(n), 0);
  for (auto& t : ids) t = tok(rng);
  ids.front() = 0;
  ids.back() = int32_t(kConfig.vocab_size - 1);
  return ids;
}

struct Agreement {
  double max_abs = 0, mean_tv = 0, same_top = 0;
};

Agreement compare(const std::vector<float>& got, const std::vector<double>& want, int64_t T, int64_t V) {
  Agreement a;
  for (int64_t t = 0; t < T; ++t) {
    double tv = 0;
    int64_t top_got = 0, top_want = 0;
    for (int64_t v = 0; v < V; ++v) {
      const double g = got[size_t(t * V + v)], w = want[size_t(t * V + v)];
      a.max_abs = std::max(a.max_abs, std::fabs(g - w));
      tv += std::fabs(g - w) / 2;
      if (g > got[size_t(t * V + top_got)]) top_got = v;
      if (w > want[size_t(t * V + top_want)]) top_want = v;
    }
    a.mean_tv += tv / double(T);
    a.same_top += (top_got == top_want ? 1.0 : 0.0) / double(T);
  }
  return a;
}

}  // namespace

// Each weight type against brisk run on the same rounded weights: what is
// left is llama.cpp's own arithmetic (an f16 key/value cache; activations
// rounded to 8 bits before q8_0 and q4_0 products). A block layout llama.cpp
// read differently from how it was written would move every distribution.
TEST(GgufExport, LlamaCppMatchesBriskInEveryWeightType) {
  const Saved& s = saved();
  const std::vector<int32_t> ids = random_ids(kConfig.block_size, 77);  // the whole context
  const std::vector<double> fp32 = brisk_probs(ids);
  struct Case {
    const char* type;
    double max_abs, max_tv;  // per probability; mean total variation per position
  };
  for (const Case& c : {Case{"f32", 2e-3, 1e-3}, Case{"f16", 3e-3, 2e-3}, Case{"q8_0", 5e-2, 3e-2},
                        Case{"q4_0", 5e-2, 3e-2}}) {
    TempDir dir;
    const std::string out = dir.file(std::string("model-") + c.type + ".gguf");
    const CliResult e = run_cli({"export", "gguf", "--checkpoint", s.run_dir, "--out", out, "--type", c.type});
    ASSERT_EQ(e.exit_code, 0) << e.out << e.err;
    EXPECT_NE(e.out.find(s.checkpoint), std::string::npos) << "names the newest checkpoint\n" << e.out;
    EXPECT_FALSE(fs::exists(out + ".tmp"));
    const LlamaRun run = run_in_llama_cpp(out, ids);
    ASSERT_EQ(run.probs.size(), fp32.size()) << run.report;
    const int64_t T = int64_t(ids.size()), V = kConfig.vocab_size;
    const Agreement same = compare(run.probs, brisk_probs(ids, c.type), T, V), full = compare(run.probs, fp32, T, V);
    std::printf("%-5s %7.0f bytes  against brisk on the same weights: max |dp| %.2g, mean TV %.2g, same top %.1f%%; "
                "against fp32 brisk: mean TV %.2g, same top %.1f%%\n",
                c.type, double(fs::file_size(out)), same.max_abs, same.mean_tv, 100 * same.same_top, full.mean_tv,
                100 * full.same_top);
    EXPECT_LE(same.max_abs, c.max_abs) << c.type;
    EXPECT_LE(same.mean_tv, c.max_tv) << c.type;
    // q4_0's rounding moves the model far more than llama.cpp's arithmetic
    // does: llama.cpp must be much nearer the weights as written than fp32.
    if (std::string(c.type) == "q4_0") {
      EXPECT_LT(4 * same.mean_tv, full.mean_tv);
    }
    if (std::string(c.type) == "f32") {
      // The tokenizer inside: llama.cpp cuts text into the byte ids.
      EXPECT_NE(run.report.find("\"tokenized\":[65,110,100,32,71,111,100,32,115,97,105,100]"), std::string::npos)
          << run.report;
      EXPECT_NE(run.report.find("\"architecture\":\"gpt2\""), std::string::npos) << run.report;
    }
  }
}

// The K-quant mixes on a model they can hold (n_embd a multiple of their
// 256-value super-block), with 8 blocks so that each mix's per-block rules
// pick differently (Linear weights of spread 0.05: the activations of the
// 64-wide model's 0.1). The file is read back here (gguf_reader.h): each
// tensor's type is the mix's, each weight reads back within its format's
// error of the fp32 one (a layout written one way and read another would
// not), and llama.cpp's distributions match brisk's run on the weights as
// read (a reader that read differently from llama.cpp would not).
TEST(GgufExport, LlamaCppReadsTheKQuantMixesAsWritten) {
  const models::GptConfig wide{256, 8, 256, 4, 64};
  TempDir dir;
  const std::string run_dir = dir.file("run"), checkpoint = save_random_checkpoint(run_dir, wide, 2468, 7, 0.05f);
  const std::vector<int32_t> ids = random_ids(wide.block_size, 78);
  const std::vector<double> fp32 = probs_of(checkpoint, ids);
  cpu::CpuBackend backend(1);
  models::Gpt original(wide, backend);
  train::load_checkpoint(checkpoint, original, nullptr);

  // llama-quantize's choices for gpt2 with 8 blocks, as llama.cpp's own
  // llama_model_quantize (node-llama-cpp 3.21.1's build) made them from this
  // exporter's f32 file of such a model: the tied token embedding in q6_K;
  // for _M, attn_qkv and ffn_down in q6_K in blocks 0, 3, 6 and 7
  // (use_more_bits: the first and last eighth, then every third); for
  // q4_k_s, attn_qkv in q5_K in blocks 0 to 3 and ffn_down in block 0.
  struct Mix {
    const char* name;
    uint32_t file_type;
    const char* base;
    std::set<int> q6, qkv_q5, ffn_down_q5;  // blocks whose attn_qkv and ffn_down are q6_K; ... q5_K
  };
  const Mix mixes[] = {{"q6_k", 18, "q6_K", {}, {}, {}},
                       {"q5_k_m", 17, "q5_K", {0, 3, 6, 7}, {}, {}},
                       {"q5_k_s", 16, "q5_K", {}, {}, {}},
                       {"q4_k_m", 15, "q4_K", {0, 3, 6, 7}, {}, {}},
                       {"Q4_K_S", 14, "q4_K", {}, {0, 1, 2, 3}, {0}}};
  const std::map<std::string, double> max_weight_error = {{"q6_K", 0.03}, {"q5_K", 0.05}, {"q4_K", 0.10}};
  const std::vector<std::pair<std::string, std::string>> blocks = {{"attn_qkv", "attn.c_attn"},
                                                                   {"attn_output", "attn.c_proj"},
                                                                   {"ffn_up", "mlp.c_fc"},
                                                                   {"ffn_down", "mlp.c_proj"}};
  for (const Mix& mix : mixes) {
    const std::string out = dir.file(std::string("model-") + mix.name + ".gguf");
    const CliResult e = run_cli({"export", "gguf", "--checkpoint", run_dir, "--out", out, "--type", mix.name});
    ASSERT_EQ(e.exit_code, 0) << e.out << e.err;
    const export_test::GgufFile file(out);
    EXPECT_EQ(file.u32("general.file_type"), mix.file_type) << mix.name;

    // gguf name -> (brisk name, the type the mix gives it)
    std::map<std::string, std::pair<std::string, std::string>> weights = {
        {"token_embd.weight", {"wte.weight", "q6_K"}}, {"position_embd.weight", {"wpe.weight", "f32"}}};
    for (int l = 0; l < wide.n_layer; ++l)
      for (const auto& [gguf, brisk_name] : blocks) {
        std::string type = mix.base;
        if ((gguf == "attn_qkv" || gguf == "ffn_down") && mix.q6.count(l)) type = "q6_K";
        if (gguf == "attn_qkv" && mix.qkv_q5.count(l)) type = "q5_K";
        if (gguf == "ffn_down" && mix.ffn_down_q5.count(l)) type = "q5_K";
        weights["blk." + std::to_string(l) + "." + gguf + ".weight"] = {
            "h." + std::to_string(l) + "." + brisk_name + ".weight", type};
      }
    std::map<std::string, std::vector<float>> as_read;  // brisk name -> the file's weight, dequantized
    for (const auto& [name, t] : file.tensors) {
      const auto w = weights.find(name);
      if (w == weights.end()) {
        EXPECT_STREQ(export_test::ggml_name(t.type), "f32") << mix.name << " " << name << ": LayerNorms and biases";
        continue;
      }
      EXPECT_EQ(export_test::ggml_name(t.type), w->second.second) << mix.name << " " << name;
      std::vector<float> x = export_test::dequantize(t);
      const core::Tensor ref = original.params().download(original.params().at(w->second.first).value);
      ASSERT_EQ(int64_t(x.size()), ref.numel()) << name;
      double num = 0, den = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        const double r = ref.data_as<float>()[i];
        num += (x[i] - r) * (x[i] - r);
        den += r * r;
      }
      if (max_weight_error.count(w->second.second)) {
        EXPECT_LT(std::sqrt(num / den), max_weight_error.at(w->second.second)) << mix.name << " " << name;
      }
      as_read[w->second.first] = std::move(x);
    }
    ASSERT_EQ(as_read.size(), weights.size()) << mix.name << ": every weight is in the file";

    const LlamaRun run = run_in_llama_cpp(out, ids);
    ASSERT_EQ(run.probs.size(), fp32.size()) << run.report;
    const std::vector<double> same_weights = probs_of(checkpoint, ids, [&](const std::string& name, core::Tensor& w) {
      const std::vector<float>& x = as_read.at(name);
      std::copy(x.begin(), x.end(), w.data_as<float>());
    });
    const int64_t T = int64_t(ids.size()), V = wide.vocab_size;
    const Agreement same = compare(run.probs, same_weights, T, V), full = compare(run.probs, fp32, T, V);
    std::printf("%-6s %7.0f bytes  against brisk on the weights as read: max |dp| %.2g, mean TV %.2g, same top %.1f%%; "
                "against fp32 brisk: mean TV %.2g, same top %.1f%%\n",
                mix.name, double(fs::file_size(out)), same.max_abs, same.mean_tv, 100 * same.same_top, full.mean_tv,
                100 * full.same_top);
    // llama.cpp rounds activations to 8 bits per 256 values (q8_K) before
    // K-quant products, coarser than q8_0's 32: on this 8-block model that
    // alone moves its distributions by a mean TV of about 0.025.
    EXPECT_LE(same.max_abs, 0.15) << mix.name;
    EXPECT_LE(same.mean_tv, 0.05) << mix.name;
    EXPECT_LT(2 * same.mean_tv, full.mean_tv) << mix.name << ": llama.cpp should be nearer the weights as read than fp32";
  }
}

TEST(GgufExport, UserErrors) {
  const Saved& s = saved();
  TempDir dir;
  auto refused = [&](const std::vector<std::string>& args, const std::string& says) {
    const CliResult r = run_cli(args);
    EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
    EXPECT_NE(r.err.find(says), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("internal error"), std::string::npos) << r.err;
  };
  refused({"export", "gguf", "--checkpoint", s.run_dir, "--out", dir.file("m.gguf"), "--type", "q5_1"}, "q5_1");
  // The K-quants' 256-value blocks do not divide this model's 64-wide rows.
  refused({"export", "gguf", "--checkpoint", s.run_dir, "--out", dir.file("m.gguf"), "--type", "q4_k_m"},
          "multiple of 256");
  refused({"export", "gguf", "--checkpoint", dir.file("none"), "--out", dir.file("m.gguf")}, "no checkpoint found");
  refused({"export", "gguf", "--checkpoint", s.run_dir, "--out", dir.path().string()}, "is a directory");
  // A damaged checkpoint leaves an earlier file at --out as it was.
  const fs::path bad = dir.path() / "bad" / "step_0000005";
  fs::create_directories(bad.parent_path());
  fs::copy(s.checkpoint, bad);
  fs::resize_file(bad / "model.safetensors", fs::file_size(bad / "model.safetensors") / 2);
  const std::string out = dir.file("keep.gguf");
  itest::write_text(out, "previous");
  refused({"export", "gguf", "--checkpoint", bad.string(), "--out", out}, "model.safetensors");
  EXPECT_EQ(itest::read_text(out), "previous");
  EXPECT_FALSE(fs::exists(out + ".tmp"));
  EXPECT_THROW(exporter::parse_gguf_type("int4"), core::ConfigError);
}
