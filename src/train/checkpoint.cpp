// Checkpoint directories (checkpoint.h).
#include "brisk/train/checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "brisk/core/error.h"
#include "brisk/core/safetensors.h"

namespace brisk::train {

namespace fs = std::filesystem;
using core::IoError;

bool is_hf_conv1d_weight(const std::string& name) {
  for (const char* s : {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"})
    if (name.size() >= std::strlen(s) && name.compare(name.size() - std::strlen(s), std::strlen(s), s) == 0) return true;
  return false;
}

namespace {

core::Tensor transposed(const core::Tensor& t) {
  const int64_t r = t.shape()[0], c = t.shape()[1];
  core::Tensor out = core::Tensor::empty({c, r}, t.dtype());
  const float* src = t.data_as<float>();
  float* dst = out.data_as<float>();
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) dst[j * r + i] = src[i * c + j];
  return out;
}

nlohmann::json config_json(const models::GptConfig& c) {
  return {{"vocab_size", c.vocab_size}, {"n_layer", c.n_layer}, {"n_embd", c.n_embd},
          {"n_head", c.n_head}, {"block_size", c.block_size}, {"attention", c.attention}};
}

std::vector<fs::path> checkpoints_in(const fs::path& dir) {
  std::vector<fs::path> out;
  if (!fs::is_directory(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (e.is_directory() && n.rfind("step_", 0) == 0 && fs::exists(e.path() / "state.json")) out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

std::string save_checkpoint(const std::string& out_dir, const models::Gpt& model, const optim::AdamW* optimizer,
                            const TrainState& state, int keep) {
  char name[32];
  std::snprintf(name, sizeof name, "step_%07lld", (long long)state.step);
  const fs::path final_dir = fs::path(out_dir) / name;
  const fs::path tmp_dir = fs::path(out_dir) / (std::string(".tmp_") + name);
  fs::create_directories(out_dir);
  fs::remove_all(tmp_dir);
  fs::create_directories(tmp_dir);

  // Weights in HF GPT-2 layout; transposed copies live until the save returns.
  std::vector<core::NamedTensor> weights, moments;
  std::vector<core::Tensor> keep_alive;
  // (Host copies first where the store lives on a device: download() is the
  // tensor itself on the host.)
  const core::ParameterStore& store = model.params();
  keep_alive.reserve(3 * store.entries().size());  // views below point into it
  for (const auto& [pname, e] : store.entries()) {
    const core::Tensor value = store.download(e.value);
    keep_alive.push_back(is_hf_conv1d_weight(pname) ? transposed(value) : value);
    weights.push_back({pname, keep_alive.back().as_view()});
    if (optimizer && e.state.size() == 2) {
      for (int k = 0; k < 2; ++k) {
        keep_alive.push_back(store.download(e.state[size_t(k)]));
        moments.push_back({pname + (k == 0 ? ".exp_avg" : ".exp_avg_sq"), keep_alive.back().as_view()});
      }
    }
  }
  core::save_safetensors((tmp_dir / "model.safetensors").string(), weights, {{"format", "pt"}});
  if (optimizer) core::save_safetensors((tmp_dir / "optimizer.safetensors").string(), moments);

  nlohmann::json st = {{"step", state.step},
                       {"data_position", state.data_position},
                       {"seed", state.seed},
                       {"tokenizer", state.tokenizer},
                       {"optimizer_steps", optimizer ? optimizer->steps_taken() : 0},
                       {"model", config_json(model.config())}};
  if (state.loss_scaler) {
    const optim::LossScalerState& ls = *state.loss_scaler;
    st["loss_scaler"] = {{"scale", ls.scale},       {"steps", ls.steps},       {"skipped", ls.skipped},
                         {"growths", ls.growths},   {"backoffs", ls.backoffs}, {"clean_streak", ls.clean_streak}};
  }
  core::write_file_atomic((tmp_dir / "state.json").string(), st.dump(2) + "\n");

  fs::remove_all(final_dir);
  fs::rename(tmp_dir, final_dir);

  auto all = checkpoints_in(out_dir);
  for (size_t i = 0; keep > 0 && i + size_t(keep) < all.size(); ++i) fs::remove_all(all[i]);
  return final_dir.string();
}

std::string latest_checkpoint(const std::string& path) {
  if (fs::exists(fs::path(path) / "state.json")) return path;
  auto all = checkpoints_in(path);
  return all.empty() ? "" : all.back().string();
}

models::GptConfig read_checkpoint_config(const std::string& ckpt_dir, TrainState* state) {
  const std::string path = (fs::path(ckpt_dir) / "state.json").string();
  nlohmann::json st;
  try {
    st = nlohmann::json::parse(core::read_file(path));
    models::GptConfig c;
    const auto& m = st.at("model");
    c.vocab_size = m.at("vocab_size");
    c.n_layer = m.at("n_layer");
    c.n_embd = m.at("n_embd");
    c.n_head = m.at("n_head");
    c.block_size = m.at("block_size");
    // Checkpoints from before the field existed were trained with plain attention.
    c.attention = m.value("attention", std::string("plain"));
    if (state) {
      state->step = st.at("step");
      state->data_position = st.at("data_position");
      state->seed = st.at("seed");
      state->tokenizer = st.at("tokenizer");
      state->loss_scaler.reset();
      if (st.contains("loss_scaler")) {
        const auto& j = st.at("loss_scaler");
        state->loss_scaler = optim::LossScalerState{j.at("scale").get<float>(),    j.at("steps").get<int64_t>(),
                                                    j.at("skipped").get<int64_t>(), j.at("growths").get<int64_t>(),
                                                    j.at("backoffs").get<int64_t>(),
                                                    j.at("clean_streak").get<int64_t>()};
      }
    }
    return c;
  } catch (const nlohmann::json::exception& e) {
    throw IoError(path + ": not a valid checkpoint state (" + e.what() + ")");
  }
}

void load_checkpoint(const std::string& ckpt_dir, models::Gpt& model, optim::AdamW* optimizer) {
  const models::GptConfig saved = read_checkpoint_config(ckpt_dir);
  // The attention kind is no part of the weights: a flash checkpoint loads into a plain model and back.
  if (!saved.same_shape(model.config()))
    throw core::ConfigError(ckpt_dir + ": checkpoint is for a model with n_layer " + std::to_string(saved.n_layer) +
                            ", n_embd " + std::to_string(saved.n_embd) + ", vocab " + std::to_string(saved.vocab_size) +
                            ", block " + std::to_string(saved.block_size) + " but the model has n_layer " +
                            std::to_string(model.config().n_layer) + ", n_embd " + std::to_string(model.config().n_embd) +
                            ", vocab " + std::to_string(model.config().vocab_size) + ", block " +
                            std::to_string(model.config().block_size));
  const std::string wpath = (fs::path(ckpt_dir) / "model.safetensors").string();
  auto file = core::load_safetensors(wpath);
  for (auto& [pname, e] : model.params().entries()) {
    auto it = file.tensors.find(pname);
    if (it == file.tensors.end()) throw IoError(wpath + ": missing tensor '" + pname + "'");
    core::Tensor t = is_hf_conv1d_weight(pname) ? transposed(it->second) : it->second;
    if (!(t.meta() == e.value.meta()))
      throw IoError(wpath + ": tensor '" + pname + "' is " + t.meta().str() + ", expected " + e.value.meta().str());
    model.params().upload(e.value, t);
  }
  if (!optimizer) return;
  const std::string opath = (fs::path(ckpt_dir) / "optimizer.safetensors").string();
  auto moments = core::load_safetensors(opath);
  for (auto& [pname, e] : model.params().entries()) {
    for (int k = 0; k < 2; ++k) {
      const std::string key = pname + (k == 0 ? ".exp_avg" : ".exp_avg_sq");
      auto it = moments.tensors.find(key);
      if (it == moments.tensors.end()) throw IoError(opath + ": missing tensor '" + key + "'");
      if (!(it->second.meta() == e.state.at(size_t(k)).meta()))
        throw IoError(opath + ": tensor '" + key + "' is " + it->second.meta().str() + ", expected " +
                      e.state.at(size_t(k)).meta().str());
      model.params().upload(e.state.at(size_t(k)), it->second);
    }
  }
  TrainState st;
  read_checkpoint_config(ckpt_dir, &st);
  nlohmann::json sj = nlohmann::json::parse(core::read_file((fs::path(ckpt_dir) / "state.json").string()));
  optimizer->set_steps_taken(sj.value("optimizer_steps", st.step));
}

}  // namespace brisk::train
