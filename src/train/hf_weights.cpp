// train.init_from with Hugging Face GPT-2 weights (hf_weights.h).
#include "brisk/train/hf_weights.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "brisk/core/error.h"
#include "brisk/core/safetensors.h"
#include "brisk/train/checkpoint.h"

namespace brisk::train {

namespace fs = std::filesystem;
using core::ConfigError;
using core::DType;
using core::IoError;
using core::Tensor;

namespace {

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

// Buffers and tied copies a Hugging Face file may carry that are no parameter.
bool skipped(const std::string& name) {
  return name == "lm_head.weight" || ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias");
}

// An f32 copy of a floating-point tensor (f16/bf16 files are common on the Hub).
Tensor as_f32(const Tensor& t, const std::string& file, const std::string& name) {
  if (t.dtype() == DType::f32) return t;
  if (t.dtype() != DType::bf16 && t.dtype() != DType::f16)
    throw IoError(file + ": tensor '" + name + "' is " + t.meta().str() + ", not a floating-point weight");
  Tensor out = Tensor::empty(t.shape(), DType::f32);
  const auto* src = t.data_as<uint16_t>();
  float* dst = out.data_as<float>();
  for (int64_t i = 0; i < t.numel(); ++i)
    dst[i] = t.dtype() == DType::bf16 ? core::bf16_to_f32(src[i]) : core::f16_to_f32(src[i]);
  return out;
}

std::string shape_str(const models::GptConfig& c) {
  return "n_layer " + std::to_string(c.n_layer) + ", n_embd " + std::to_string(c.n_embd) + ", n_head " +
         std::to_string(c.n_head) + ", vocab " + std::to_string(c.vocab_size) + ", block " +
         std::to_string(c.block_size);
}

// config.json's sizes against the model's; false when there is no config.json.
bool check_config(const fs::path& config_path, const models::GptConfig& m) {
  if (!fs::exists(config_path)) return false;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(core::read_file(config_path.string()));
  } catch (const nlohmann::json::exception& e) {
    throw IoError(config_path.string() + ": not valid JSON (" + e.what() + ")");
  }
  if (j.contains("model_type") && j["model_type"] != "gpt2")
    throw ConfigError(config_path.string() + ": model_type is " + j["model_type"].dump() + "; brisk trains GPT-2 models");
  check_hf_computation(j, config_path.string());
  auto num = [&](const char* key) -> int64_t {
    if (!j.contains(key) || !j[key].is_number_integer())
      throw IoError(config_path.string() + ": missing integer '" + key + "'");
    return j[key].get<int64_t>();
  };
  const int64_t n_layer = num("n_layer"), n_embd = num("n_embd"), n_head = num("n_head");
  const int64_t positions = num("n_positions"), vocab = num("vocab_size");
  if (n_layer != m.n_layer || n_embd != m.n_embd || n_head != m.n_head || positions < m.block_size ||
      vocab > m.vocab_size)
    throw ConfigError(config_path.string() + " describes n_layer " + std::to_string(n_layer) + ", n_embd " +
                      std::to_string(n_embd) + ", n_head " + std::to_string(n_head) + ", vocab " +
                      std::to_string(vocab) + ", n_positions " + std::to_string(positions) +
                      " but the model has " + shape_str(m) +
                      " (n_layer, n_embd and n_head must be equal; the model's vocab at least the file's, its "
                      "block at most n_positions)");
  return true;
}

}  // namespace

void check_hf_computation(const nlohmann::json& j, const std::string& path) {
  auto refuse = [&](const char* key, const std::string& why) {
    throw ConfigError(path + ": " + key + " is " + j[key].dump() + "; " + why);
  };
  if (j.contains("activation_function")) {
    const auto& a = j["activation_function"];
    if (!a.is_string() || (a != "gelu_new" && a != "gelu_pytorch_tanh" && a != "gelu_fast"))
      refuse("activation_function", "brisk's GPT-2 computes tanh GELU (gelu_new)");
  }
  if (j.contains("layer_norm_epsilon")) {
    const auto& e = j["layer_norm_epsilon"];
    if (!e.is_number() || std::abs(e.get<double>() - 1e-5) > 1e-12)
      refuse("layer_norm_epsilon", "brisk's LayerNorm uses 1e-5");
  }
  auto flag_must_be = [&](const char* key, bool want, const char* why) {
    if (j.contains(key) && !(j[key].is_boolean() && j[key].get<bool>() == want)) refuse(key, why);
  };
  flag_must_be("scale_attn_weights", true, "brisk scales attention scores by 1/sqrt(head size)");
  flag_must_be("scale_attn_by_inverse_layer_idx", false, "brisk does not scale attention by the layer's index");
  flag_must_be("add_cross_attention", false, "brisk's GPT-2 has no cross-attention");
  flag_must_be("tie_word_embeddings", true, "brisk's LM head is tied to the token embedding");
}

bool is_hf_gpt2_source(const std::string& path) {
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) return fs::path(path).extension() == ".safetensors";
  return fs::is_directory(path, ec) && fs::exists(fs::path(path) / "model.safetensors") &&
         !fs::exists(fs::path(path) / "state.json") && latest_checkpoint(path).empty();
}

HfLoadReport load_hf_gpt2(const std::string& path, models::Gpt& model) {
  const fs::path file = fs::is_directory(path) ? fs::path(path) / "model.safetensors" : fs::path(path);
  HfLoadReport report;
  report.file = file.string();
  const models::GptConfig& mc = model.config();
  report.config_checked = check_config(file.parent_path() / "config.json", mc);

  core::SafetensorsFile f = core::load_safetensors(report.file);
  std::map<std::string, Tensor> by_name;  // without the "transformer." prefix, buffers dropped
  for (auto& [name, t] : f.tensors) {
    const std::string n = name.rfind("transformer.", 0) == 0 ? name.substr(12) : name;
    if (skipped(n)) continue;
    if (!by_name.emplace(n, t).second)
      throw IoError(report.file + ": tensor '" + n + "' is there with and without the 'transformer.' prefix");
  }
  std::set<std::string> used;
  for (auto& [pname, e] : model.params().entries()) {
    auto it = by_name.find(pname);
    if (it == by_name.end())
      throw IoError(report.file + ": missing tensor '" + pname + "' (or 'transformer." + pname +
                    "'): not a GPT-2 file of this model's shape (" + shape_str(mc) + ")?");
    used.insert(pname);
    const Tensor stored = as_f32(it->second, report.file, pname);
    const core::Shape& want = e.value.shape();
    const core::Shape& got = stored.shape();
    auto mismatch = [&, name = pname](const std::string& why) {  // (a structured binding: captured by copy)
      return ConfigError(report.file + ": tensor '" + name + "' is " + got.str() + ", the model's is " + want.str() +
                         " (" + shape_str(mc) + "): " + why);
    };
    if (pname == "wte.weight" || pname == "wpe.weight") {
      const bool tokens = pname == "wte.weight";
      if (got.rank() != 2 || got[1] != want[1]) throw mismatch("another n_embd");
      if (tokens && got[0] > want[0]) throw mismatch("the file's vocabulary is larger than the model's");
      if (!tokens && got[0] < want[0]) throw mismatch("fewer positions than the model's block");
      (tokens ? report.file_vocab : report.file_positions) = got[0];
      // Rows the file has; past them (the vocabulary's padding) the mean of
      // the file's token rows. The head is tied, so a padding token's logit
      // is h . mean(w) = the mean of the real tokens' logits, and by
      // Jensen's inequality its probability is at most a real token's
      // average: GPT-2's 47 padding ids hold at most 47/50257 of the mass
      // (the loss moves by at most log(1 + 47/50257) = 0.0009). Zero rows
      // gave logit 0, far above GPT-2's (all well below 0), and took most
      // of the mass: a start from 18.7 read as 31.5.
      Tensor value = Tensor::zeros(want, DType::f32);
      const int64_t rows = std::min(got[0], want[0]), width = want[1];
      std::memcpy(value.data(), stored.data(), size_t(rows * width) * sizeof(float));
      if (tokens && rows < want[0]) {
        std::vector<double> mean(size_t(width), 0.0);
        const float* src = stored.data_as<float>();
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t k = 0; k < width; ++k) mean[size_t(k)] += src[r * width + k];
        float* dst = value.data_as<float>();
        for (int64_t r = rows; r < want[0]; ++r)
          for (int64_t k = 0; k < width; ++k) dst[r * width + k] = float(mean[size_t(k)] / double(rows));
      }
      model.params().upload(e.value, value);
      continue;
    }
    model.params().upload(e.value, param_from_file(report.file, pname, stored, e.value.meta()));
  }
  for (const auto& [name, t] : by_name)
    if (!used.count(name))
      throw IoError(report.file + ": unexpected tensor '" + name + "': the model (" + shape_str(mc) +
                    ") has no parameter of that name");
  return report;
}

}  // namespace brisk::train
