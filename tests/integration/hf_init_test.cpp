// train.init_from with Hugging Face GPT-2 weights: a model.safetensors in
// Hugging Face's layout ("transformer." names, Conv1D weights (in, out), the
// attention mask buffers and a tied lm_head.weight beside the parameters, a
// config.json) starts a run exactly where the brisk checkpoint it was made
// from does; f16 files are widened; a token embedding with fewer rows than
// the model's vocabulary is padded with the mean of its rows and extra
// positions are cut;
// files of another shape or vocabulary end with exit 2 and a message naming
// the problem.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <vector>

#include "brisk/core/safetensors.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/models/gpt.h"
#include "brisk/train/hf_weights.h"
#include "brisk/train/checkpoint.h"
#include "brisk/train/trainer.h"
#include "integration_util.h"

using namespace brisk;
using namespace brisk::itest;

namespace {

const char* kConfigJson = R"({"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 32,
                              "vocab_size": 256})";

class HfInit : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new TempDir();
    std::string err;
    base_ckpt_ = train_tiny_base(tmp_->path(), "base", 6, data_, &err);
    ASSERT_FALSE(data_.empty()) << "brisk data prepare failed:\n" << err;
  }
  static void TearDownTestSuite() {
    delete tmp_;
    tmp_ = nullptr;
  }

  // The base checkpoint's weights as a Hugging Face directory `name`: every
  // tensor as `edit` leaves it (none: unchanged), under "transformer.", with
  // the buffers and tied head Hugging Face files carry, and config.json.
  static std::string hf_dir(const std::string& name, const char* config_json = kConfigJson,
                            const std::function<void(std::map<std::string, core::Tensor>&)>& edit = {}) {
    core::SafetensorsFile f = core::load_safetensors((fs::path(base_ckpt_) / "model.safetensors").string());
    std::map<std::string, core::Tensor> t;
    for (auto& [n, v] : f.tensors) t["transformer." + n] = v;
    for (int l = 0; l < 2; ++l)  // the causal mask buffer of older files
      t["transformer.h." + std::to_string(l) + ".attn.bias"] = core::Tensor::zeros({1, 1, 32, 32}, core::DType::f32);
    t["lm_head.weight"] = f.tensors.at("wte.weight");
    if (edit) edit(t);
    const fs::path dir = tmp_->path() / name;
    fs::create_directories(dir);
    std::vector<core::NamedTensor> named;
    for (auto& [n, v] : t) named.push_back({n, v.as_view()});
    core::save_safetensors((dir / "model.safetensors").string(), named);
    if (config_json) write_text((dir / "config.json").string(), config_json);
    return dir.string();
  }

  // A 3-step run started from `init_from`, learning rate 3e-4.
  static std::string config(const std::string& name, const std::string& init_from, int64_t vocab = 256) {
    std::string toml = tiny_config_toml(data_, tmp_->file(name), 3, 0, "cosine", 1);
    toml.replace(toml.find("lr = 3e-3"), 9, "lr = 3e-4");
    toml.replace(toml.find("vocab_size = 256"), 16, "vocab_size = " + std::to_string(vocab));
    toml.insert(toml.find("[train]\n") + 8, "init_from = \"" + init_from + "\"\n");
    const std::string path = tmp_->file(name + ".toml");
    write_text(path, toml);
    return path;
  }

  static train::TrainResult run(const std::string& config_path) {
    train::TrainOptions o;
    o.quiet = true;
    return train::train(train::load_train_config(config_path, {}), o);
  }

  static void expect_clear_error(const std::string& config_path, const std::vector<std::string>& fragments) {
    const CliResult r = run_cli({"train", "--config", config_path, "--no-progress"});
    EXPECT_EQ(r.exit_code, 2) << "stdout:\n" << r.out << "\nstderr:\n" << r.err;
    for (const auto& f : fragments) EXPECT_NE(r.err.find(f), std::string::npos) << "'" << f << "' not in:\n" << r.err;
  }

  static TempDir* tmp_;
  static std::string data_, base_ckpt_;
};

TempDir* HfInit::tmp_ = nullptr;
std::string HfInit::data_, HfInit::base_ckpt_;

TEST_F(HfInit, StartsWhereTheCheckpointItWasMadeFromDoes) {
  const train::TrainResult from_ckpt = run(config("from_ckpt", base_ckpt_));
  const train::TrainResult from_hf = run(config("from_hf", hf_dir("hf")));
  ASSERT_EQ(from_ckpt.losses.size(), 3u);
  EXPECT_EQ(from_hf.losses, from_ckpt.losses);  // the same weights, bit for bit, so the same run
  // And not a fresh model's: the base run had already learned something.
  const train::TrainResult fresh = run(config("fresh", ""));
  EXPECT_LT(from_hf.losses[0], fresh.losses[0] - 0.05);

  // A file in f16 (as many are on the Hub) is widened: the same start up to f16's rounding.
  const train::TrainResult from_f16 = run(config("from_f16", hf_dir("hf16", kConfigJson, [](auto& t) {
    for (auto& [n, v] : t) {
      core::Tensor h = core::Tensor::empty(v.shape(), core::DType::f16);
      for (int64_t i = 0; i < v.numel(); ++i) h.template data_as<uint16_t>()[i] = core::f32_to_f16(v.template data_as<float>()[i]);
      v = h;
    }
  })));
  EXPECT_NEAR(from_f16.losses[0], from_ckpt.losses[0], 2e-3);
}

TEST_F(HfInit, FewerTokenRowsArePaddedAndExtraPositionsCut) {
  // 200 of the model's 256 token rows, 64 positions for a block of 32.
  const std::string dir = hf_dir("hf_pad", nullptr, [](auto& t) {
    core::Tensor& wte = t.at("transformer.wte.weight");
    core::Tensor cut = core::Tensor::empty({200, 32}, core::DType::f32);
    std::copy(wte.template data_as<float>(), wte.template data_as<float>() + 200 * 32, cut.template data_as<float>());
    wte = cut;
    t.at("lm_head.weight") = cut;
    core::Tensor& wpe = t.at("transformer.wpe.weight");
    core::Tensor longer = core::Tensor::zeros({64, 32}, core::DType::f32);
    std::copy(wpe.template data_as<float>(), wpe.template data_as<float>() + 32 * 32, longer.template data_as<float>());
    wpe = longer;
  });
  const CliResult r = run_cli({"train", "--config", config("pad", dir), "--no-progress"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::string all = r.out + r.err;
  EXPECT_NE(all.find("200 token rows (rows 200-255 the mean of the file's rows)"), std::string::npos) << all;
  // The padding rows are the mean of the file's rows: with the tied head a
  // padding token's logit is the mean of the real ones', never above their
  // average probability (zero rows gave logit 0, above every real logit of
  // a trained GPT-2, and took most of the probability).
  cpu::CpuBackend backend(1);
  models::Gpt model(train::read_checkpoint_config(base_ckpt_), backend);
  const train::HfLoadReport rep = train::load_hf_gpt2(dir, model);
  EXPECT_EQ(rep.file_vocab, 200);
  const core::Tensor wte = model.params().download(model.params().entries().at("wte.weight").value);
  const float* w = wte.data_as<float>();
  for (int64_t k = 0; k < 32; ++k) {
    double mean = 0;
    for (int64_t r = 0; r < 200; ++r) mean += w[r * 32 + k];
    mean /= 200;
    for (int64_t r = 200; r < 256; ++r) EXPECT_NEAR(w[r * 32 + k], mean, 1e-6) << "row " << r << ", column " << k;
  }
  EXPECT_NE(all.find("64 positions (the first 32 used)"), std::string::npos) << all;
  EXPECT_NE(all.find("no config.json beside it, so n_head was not checked"), std::string::npos) << all;
}

TEST_F(HfInit, FilesThatDoNotFitAreClearErrors) {
  // config.json of another head count (the tensors alone cannot tell).
  expect_clear_error(config("heads", hf_dir("hf_heads", R"({"model_type": "gpt2", "n_embd": 32, "n_layer": 2,
      "n_head": 4, "n_positions": 32, "vocab_size": 256})")), {"train.init_from", "n_head 4", "n_head 2"});
  // Keys that ask for another computation than brisk's GPT-2.
  expect_clear_error(config("relu", hf_dir("hf_relu", R"({"model_type": "gpt2", "n_embd": 32, "n_layer": 2,
      "n_head": 2, "n_positions": 32, "vocab_size": 256, "activation_function": "relu"})")),
                     {"activation_function is \"relu\"", "tanh GELU"});
  expect_clear_error(config("eps", hf_dir("hf_eps", R"({"model_type": "gpt2", "n_embd": 32, "n_layer": 2,
      "n_head": 2, "n_positions": 32, "vocab_size": 256, "layer_norm_epsilon": 0.01})")),
                     {"layer_norm_epsilon is 0.01", "1e-5"});
  expect_clear_error(config("idx", hf_dir("hf_idx", R"({"model_type": "gpt2", "n_embd": 32, "n_layer": 2,
      "n_head": 2, "n_positions": 32, "vocab_size": 256, "scale_attn_by_inverse_layer_idx": true})")),
                     {"scale_attn_by_inverse_layer_idx is true"});
  // GPT-2's own values of those keys are accepted.
  const CliResult gpt2_keys = run_cli({"train", "--config",
                                       config("gpt2_keys", hf_dir("hf_gpt2_keys", R"({"model_type": "gpt2",
      "n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 32, "vocab_size": 256, "activation_function": "gelu_new",
      "layer_norm_epsilon": 1e-05, "scale_attn_weights": true, "scale_attn_by_inverse_layer_idx": false,
      "reorder_and_upcast_attn": false, "tie_word_embeddings": true})")),
                                       "--no-progress"});
  EXPECT_EQ(gpt2_keys.exit_code, 0) << gpt2_keys.err;
  // A tensor the model has no parameter for, and one it misses.
  expect_clear_error(config("extra", hf_dir("hf_extra", kConfigJson, [](auto& t) {
                       t["transformer.h.2.ln_1.weight"] = core::Tensor::zeros({32}, core::DType::f32);
                     })),
                     {"unexpected tensor 'h.2.ln_1.weight'"});
  expect_clear_error(config("missing", hf_dir("hf_missing", kConfigJson, [](auto& t) {
                       t.erase("transformer.h.1.mlp.c_fc.weight");
                     })),
                     {"missing tensor 'h.1.mlp.c_fc.weight'"});
  // GPT-2's BPE vocabulary on byte-level data.
  expect_clear_error(config("bpe", hf_dir("hf_bpe", nullptr, [](auto& t) {
                                 core::Tensor wte = core::Tensor::zeros({50257, 32}, core::DType::f32);
                                 t.at("transformer.wte.weight") = wte;
                                 t.at("lm_head.weight") = wte;
                               }),
                            50304),
                     {"GPT-2's BPE vocabulary", "tokenizer 'bytes'"});
}

}  // namespace
