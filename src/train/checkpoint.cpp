// Checkpoint directories (checkpoint.h).
#include "brisk/train/checkpoint.h"

#include <fcntl.h>  // AT_FDCWD
#include <stdio.h>  // renameat2, RENAME_EXCHANGE

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "brisk/core/error.h"
#include "brisk/core/json_excerpt.h"
#include "brisk/core/safetensors.h"
#include "best_epoch.h"

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

// The step a checkpoint directory's name gives ("step_0000300" -> 300), or
// -1 for another name.
int64_t step_of_name(const std::string& n) {
  if (n.rfind("step_", 0) != 0 || n.size() == 5 || n.size() > 5 + 18) return -1;
  int64_t v = 0;
  for (size_t i = 5; i < n.size(); ++i) {
    if (n[i] < '0' || n[i] > '9') return -1;
    v = v * 10 + (n[i] - '0');
  }
  return v;
}

// Oldest first, by step number: names are padded to 7 digits, so past step
// 9,999,999 their string order is not the steps' order.
std::vector<fs::path> checkpoints_in(const fs::path& dir) {
  std::vector<std::pair<int64_t, fs::path>> found;
  if (!fs::is_directory(dir)) return {};
  for (const auto& e : fs::directory_iterator(dir)) {
    const int64_t step = step_of_name(e.path().filename().string());
    if (step >= 0 && e.is_directory() && fs::exists(e.path() / "state.json")) found.emplace_back(step, e.path());
  }
  std::sort(found.begin(), found.end());
  std::vector<fs::path> out;
  for (auto& [step, path] : found) out.push_back(std::move(path));
  return out;
}

// What a writer killed part-way leaves in a checkpoint directory: a
// `.tmp_step_*` it was writing (a stop checkpoint at a step never saved
// again), and a `.del_step_*` it was removing. Only the run's one writer
// (rank 0) writes here, so anything of these names is stale.
void sweep_leftovers(const fs::path& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (e.is_directory(ec) && (n.rfind(".tmp_step_", 0) == 0 || n.rfind(".del_step_", 0) == 0))
      fs::remove_all(e.path(), ec);
  }
}

using Json = nlohmann::json;

Json parse_state_file(const std::string& path) {
  Json st;
  try {
    st = Json::parse(core::read_file(path));
  } catch (const Json::exception& e) {
    throw IoError(path + ": not a valid checkpoint state: not JSON (" + e.what() + ")");
  }
  if (!st.is_object())
    throw IoError(path + ": not a valid checkpoint state: expected a JSON object, got " + core::json_excerpt(st));
  return st;
}

// state.json's fields, read with their types and ranges checked, so that a
// damaged or hand-edited file names the field instead of surfacing as a JSON
// library error.
struct StateFields {
  std::string path;

  [[noreturn]] void fail(const std::string& name, const std::string& what) const {
    throw IoError(path + ": field '" + name + "' " + what);
  }
  // obj[key], where `name` is the field's dotted name ("model.n_layer").
  const Json& at(const Json& obj, const std::string& name, const std::string& key) const {
    if (!obj.contains(key)) fail(name, "is missing");
    return obj[key];
  }
  const Json& object(const Json& obj, const std::string& name, const std::string& key) const {
    const Json& v = at(obj, name, key);
    if (!v.is_object()) fail(name, "must be a JSON object, got " + core::json_excerpt(v));
    return v;
  }
  int64_t integer(const Json& obj, const std::string& name, const std::string& key) const {
    const Json& v = at(obj, name, key);
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)) ||
        v.get<int64_t>() < 0)
      fail(name, "must be a non-negative integer, got " + core::json_excerpt(v));
    return v.get<int64_t>();
  }
  uint64_t unsigned_integer(const Json& obj, const std::string& name, const std::string& key) const {
    const Json& v = at(obj, name, key);
    if (!v.is_number_unsigned()) fail(name, "must be a non-negative integer, got " + core::json_excerpt(v));
    return v.get<uint64_t>();
  }
  std::string string(const Json& obj, const std::string& name, const std::string& key) const {
    const Json& v = at(obj, name, key);
    if (!v.is_string()) fail(name, "must be a string, got " + core::json_excerpt(v));
    return v.get<std::string>();
  }
  bool boolean(const Json& obj, const std::string& name, const std::string& key) const {
    const Json& v = at(obj, name, key);
    if (!v.is_boolean()) fail(name, "must be true or false, got " + core::json_excerpt(v));
    return v.get<bool>();
  }
  double fraction(const Json& obj, const std::string& name, const std::string& key) const {
    const Json& v = at(obj, name, key);
    if (!v.is_number() || !(v.get<double>() >= 0 && v.get<double>() <= 1))
      fail(name, "must be a number in [0, 1], got " + core::json_excerpt(v));
    return v.get<double>();
  }
  double positive_number(const Json& obj, const std::string& name, const std::string& key) const {
    const Json& v = at(obj, name, key);
    if (!v.is_number() || !(v.get<double>() > 0) || !std::isfinite(v.get<double>()))
      fail(name, "must be a positive finite number, got " + core::json_excerpt(v));
    return v.get<double>();
  }
};

// A state.json claiming a bigger model than model.safetensors holds would
// have the caller allocate that model before the weights are even read. The
// weights are f32, so the file holds at least 4 bytes per parameter.
void check_weights_cover(const std::string& ckpt_dir, const models::GptConfig& c, const std::string& state_path) {
  const fs::path weights = fs::path(ckpt_dir) / "model.safetensors";
  std::error_code ec;
  const uintmax_t size = fs::file_size(weights, ec);
  if (ec) return;  // a missing or unreadable file is reported when the weights are loaded
  const uint64_t need = uint64_t(c.num_params()) * 4;  // validate() bounds num_params() far below overflow
  if (size < need)
    throw IoError(weights.string() + ": truncated or another model's: it holds " + std::to_string(size) +
                  " bytes, but " + state_path + " describes a model (n_layer " + std::to_string(c.n_layer) +
                  ", n_embd " + std::to_string(c.n_embd) + ", vocab " + std::to_string(c.vocab_size) + ", block " +
                  std::to_string(c.block_size) + ") of " + std::to_string(c.num_params()) + " parameters, " +
                  std::to_string(need) + " bytes in f32");
}

// A run that diverges writes no checkpoint, so a NaN or an infinity in a
// stored tensor is damage: it would poison every output of the model, or
// every step after a resume.
void require_finite(const std::string& path, const std::string& pname, const core::Tensor& t) {
  const int64_t i = core::first_non_finite(t);
  if (i < 0) return;
  const double v = t.item(i);
  throw IoError(path + ": tensor '" + pname + "' holds " + (std::isnan(v) ? "NaN" : "an infinity") + " at element " +
                std::to_string(i) + " (a damaged checkpoint)");
}

// The stored tensor of parameter `pname` after checking it against the
// parameter, before anything is copied or transposed: Hugging Face stores
// Conv1D weights (in, out), so theirs must be the parameter's shape reversed.
core::Tensor stored_param(const std::string& path, const std::string& pname, const core::Tensor& stored,
                          const core::TensorMeta& param) {
  const bool conv1d = is_hf_conv1d_weight(pname) && param.shape.rank() == 2;
  core::TensorMeta expect = param;
  if (conv1d) expect.shape = core::Shape{param.shape[1], param.shape[0]};
  if (!(stored.meta() == expect))
    throw IoError(path + ": tensor '" + pname + "' is " + stored.meta().str() + ", expected " + expect.str() +
                  (conv1d ? " (Conv1D weights are stored in x out)" : ""));
  require_finite(path, pname, stored);
  return conv1d ? transposed(stored) : stored;
}

// A tensor no parameter asked for means the file is another model's (or
// damaged): loading the rest would silently drop it.
template <class Value>
void check_no_extra(const std::string& path, const std::map<std::string, Value>& tensors,
                    const std::set<std::string>& expected) {
  for (const auto& [name, t] : tensors)
    if (!expected.count(name))
      throw IoError(path + ": unexpected tensor '" + name + "' (" + std::to_string(tensors.size()) +
                    " tensors in the file, the model expects " + std::to_string(expected.size()) +
                    "): a checkpoint of another model?");
}

// Refuses a checkpoint of another kind than `want` (checkpoint_kind()),
// naming both and what each is for.
void check_kind(const StateFields& f, const Json& st, const std::string& want) {
  const std::string kind = st.contains("kind") ? f.string(st, "kind", "kind") : kGptCheckpoint;
  if (kind == want) return;
  auto what = [](const std::string& k) {
    return k == kGptCheckpoint           ? std::string("a GPT language model (for brisk generate, eval, serve)")
           : k == kEncoderCheckpoint     ? std::string("an encoder classifier (for brisk classify)")
           : k == kAutoencoderCheckpoint ? std::string("a sequence autoencoder (for brisk encode, decode)")
                                   : "of unknown kind '" + k + "'";
  };
  throw IoError(f.path + ": this checkpoint is " + what(kind) + ", but " + what(want) + " is needed here");
}

// Both files are read a tensor at a time, each uploaded and dropped: the
// loader holds one tensor beside the model, never a second copy of it.
void load_weights(const std::string& ckpt_dir, core::ParameterStore& store) {
  const std::string wpath = (fs::path(ckpt_dir) / "model.safetensors").string();
  const core::SafetensorsReader file(wpath);
  std::set<std::string> names;
  for (auto& [pname, e] : store.entries()) {
    if (!file.tensors().count(pname)) throw IoError(wpath + ": missing tensor '" + pname + "'");
    names.insert(pname);
  }
  check_no_extra(wpath, file.tensors(), names);
  for (auto& [pname, e] : store.entries())
    store.upload(e.value, stored_param(wpath, pname, file.read(pname), e.value.meta()));
}

// The AdamW moments of every parameter in `store` and the optimizer's step
// count (state.json's optimizer_steps; `steps_if_absent` for checkpoints
// from before the field, which took one AdamW step per step).
void load_moments(const std::string& ckpt_dir, core::ParameterStore& store, optim::AdamW& optimizer,
                  int64_t steps_if_absent) {
  const std::string opath = (fs::path(ckpt_dir) / "optimizer.safetensors").string();
  const core::SafetensorsReader moments(opath);
  // Every moment's name and shape checked before the first is read.
  std::vector<std::pair<std::string, core::Tensor*>> wanted;
  std::set<std::string> keys;
  for (auto& [pname, e] : store.entries())
    for (int k = 0; k < 2; ++k) {
      const std::string key = pname + (k == 0 ? ".exp_avg" : ".exp_avg_sq");
      core::Tensor& state = e.state.at(size_t(k));
      auto it = moments.tensors().find(key);
      if (it == moments.tensors().end()) throw IoError(opath + ": missing tensor '" + key + "'");
      if (!(it->second == state.meta()))
        throw IoError(opath + ": tensor '" + key + "' is " + it->second.str() + ", expected " + state.meta().str());
      wanted.emplace_back(key, &state);
      keys.insert(key);
    }
  check_no_extra(opath, moments.tensors(), keys);
  for (const auto& [key, state] : wanted) {
    const core::Tensor m = moments.read(key);
    require_finite(opath, key, m);
    store.upload(*state, m);
  }
  const std::string spath = (fs::path(ckpt_dir) / "state.json").string();
  const Json sj = parse_state_file(spath);
  optimizer.set_steps_taken(sj.contains("optimizer_steps")
                                ? StateFields{spath}.integer(sj, "optimizer_steps", "optimizer_steps")
                                : steps_if_absent);
}

}  // namespace

std::string checkpoint_kind(const std::string& ckpt_dir) {
  const std::string path = (fs::path(ckpt_dir) / "state.json").string();
  const Json st = parse_state_file(path);
  return st.contains("kind") ? StateFields{path}.string(st, "kind", "kind") : kGptCheckpoint;
}

core::Tensor param_from_file(const std::string& path, const std::string& pname, const core::Tensor& stored,
                             const core::TensorMeta& param) {
  return stored_param(path, pname, stored, param);
}

namespace {
// Puts the finished tmp directory where `final_dir` is. Saving a step that
// already has a checkpoint (a resumed run stopped at the same step) swaps
// the two in one atomic rename (RENAME_EXCHANGE), so a crash at any moment
// leaves a complete checkpoint of that step; only then is the old one
// removed. Where the file system cannot exchange, the old one moves aside
// first and is removed last.
void replace_directory(const fs::path& tmp_dir, const fs::path& final_dir) {
  if (!fs::exists(final_dir)) {
    fs::rename(tmp_dir, final_dir);
    return;
  }
  if (::renameat2(AT_FDCWD, tmp_dir.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
    fs::remove_all(tmp_dir);  // now holds the previous checkpoint
    return;
  }
  const fs::path aside = final_dir.parent_path() / (".old_" + final_dir.filename().string());
  fs::remove_all(aside);
  fs::rename(final_dir, aside);
  fs::rename(tmp_dir, final_dir);
  fs::remove_all(aside);
}
}  // namespace

namespace {
// A checkpoint directory for step `step`: the store's weights (HF layout),
// the optimizer's moments when given, and `state` as state.json; built in a
// temporary directory and renamed into place, then all but the newest `keep`
// are removed.
std::string write_checkpoint(const std::string& out_dir, int64_t step, const core::ParameterStore& store,
                             const optim::AdamW* optimizer, const nlohmann::json& state, int keep,
                             const ShardedMoments* sharded) {
  char name[32];
  std::snprintf(name, sizeof name, "step_%07lld", (long long)step);
  const fs::path final_dir = fs::path(out_dir) / name;
  const fs::path tmp_dir = fs::path(out_dir) / (std::string(".tmp_") + name);
  fs::create_directories(out_dir);
  sweep_leftovers(out_dir);
  fs::create_directories(tmp_dir);

  // The moments and the weights (in HF GPT-2 layout), each streamed to its
  // file one tensor at a time: the only copy made is one weight's transpose (or
  // one tensor's host copy where the store lives on a device), so saving
  // needs no memory the size of either file. Sharded moments arrive in runs
  // and are written where they belong.
  std::vector<core::SafetensorsWriter::Entry> weights, moments;
  std::map<std::string, size_t> exp_avg_entry;  // sharded: each parameter's first moment entry
  for (const auto& [pname, e] : store.entries()) {
    core::TensorMeta meta = e.value.meta();
    if (is_hf_conv1d_weight(pname)) meta.shape = core::Shape{meta.shape[1], meta.shape[0]};
    weights.push_back({pname, meta});
    const bool has_moments = sharded ? e.value.dtype() == core::DType::f32 : e.state.size() == 2;
    if (optimizer && has_moments) {
      exp_avg_entry[pname] = moments.size();
      for (int k = 0; k < 2; ++k)
        moments.push_back({pname + (k == 0 ? ".exp_avg" : ".exp_avg_sq"),
                           sharded ? e.value.meta() : e.state[size_t(k)].meta()});
    }
  }
  // The moments first: under ZeRO-1 the other ranks wait in the gather
  // while this rank writes, and should not wait for the weights as well.
  if (optimizer) {
    core::SafetensorsWriter mfile((tmp_dir / "optimizer.safetensors").string(), moments);
    if (sharded) {
      (*sharded)([&](const std::string& param, int moment, int64_t first, const float* values, int64_t count) {
        const auto it = exp_avg_entry.find(param);
        if (it == exp_avg_entry.end()) throw core::Error("checkpoint: moments of unknown parameter '" + param + "'");
        mfile.write_part(it->second + size_t(moment), size_t(first) * sizeof(float), values,
                         size_t(count) * sizeof(float));
      });
    } else {
      for (const auto& [pname, e] : store.entries())
        if (e.state.size() == 2)
          for (int k = 0; k < 2; ++k) mfile.write(store.download(e.state[size_t(k)]).as_view());
    }
    mfile.commit();
  }
  core::SafetensorsWriter wfile((tmp_dir / "model.safetensors").string(), weights, {{"format", "pt"}});
  for (const auto& [pname, e] : store.entries()) {
    const core::Tensor value = store.download(e.value);
    wfile.write((is_hf_conv1d_weight(pname) ? transposed(value) : value).as_view());
  }
  wfile.commit();
  core::write_file_atomic((tmp_dir / "state.json").string(), state.dump(2) + "\n");

  replace_directory(tmp_dir, final_dir);

  // An old checkpoint is renamed out of the step_* names first: a kill in
  // the middle of removing it leaves a .del_ directory the next write
  // sweeps, not a step_* without state.json that no pruning sees again.
  auto all = checkpoints_in(out_dir);
  for (size_t i = 0; keep > 0 && i + size_t(keep) < all.size(); ++i) {
    const fs::path doomed = all[i].parent_path() / (".del_" + all[i].filename().string());
    fs::remove_all(doomed);
    fs::rename(all[i], doomed);
    fs::remove_all(doomed);
  }
  return final_dir.string();
}
}  // namespace

std::string save_checkpoint(const std::string& out_dir, const models::Gpt& model, const optim::AdamW* optimizer,
                            const TrainState& state, int keep, const ShardedMoments* sharded) {
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
  if (state.lr_plateau) {
    const optim::PlateauState& p = *state.lr_plateau;
    // best is infinite until the first evaluation: JSON has no infinity, so null.
    st["lr_plateau"] = {{"scale", p.scale},
                        {"best", std::isfinite(p.best) ? Json(p.best) : Json(nullptr)},
                        {"bad_evals", p.bad_evals},
                        {"cuts", p.cuts}};
  }
  return write_checkpoint(out_dir, state.step, model.params(), optimizer, st, keep, sharded);
}

std::string latest_checkpoint(const std::string& path) {
  if (fs::exists(fs::path(path) / "state.json")) return path;
  // A train.keep_best directory (<run>/best) is the checkpoint its best.json
  // names, not the newest: a crash between saving a new best and recording
  // it leaves an unrecorded step_* there until the resumed run removes it.
  if (std::string best = detail::recorded_best_checkpoint(path); !best.empty()) return best;
  auto all = checkpoints_in(path);
  return all.empty() ? "" : all.back().string();
}

std::string require_checkpoint(const std::string& path) {
  if (path.empty()) throw core::ConfigError("--checkpoint: empty path");
  std::string dir = latest_checkpoint(path);
  if (dir.empty()) throw IoError(path + ": no checkpoint found (expected a step_* directory with state.json)");
  return dir;
}

models::GptConfig read_checkpoint_config(const std::string& ckpt_dir, TrainState* state) {
  const std::string path = (fs::path(ckpt_dir) / "state.json").string();
  const Json st = parse_state_file(path);
  const StateFields f{path};
  check_kind(f, st, kGptCheckpoint);
  const Json& m = f.object(st, "model", "model");
  models::GptConfig c;
  c.vocab_size = f.integer(m, "model.vocab_size", "vocab_size");
  c.n_layer = f.integer(m, "model.n_layer", "n_layer");
  c.n_embd = f.integer(m, "model.n_embd", "n_embd");
  c.n_head = f.integer(m, "model.n_head", "n_head");
  c.block_size = f.integer(m, "model.block_size", "block_size");
  // Checkpoints from before the field existed were trained with plain attention.
  c.attention = m.contains("attention") ? f.string(m, "model.attention", "attention") : "plain";
  // The sizes decide what the caller allocates: check them first.
  try {
    c.validate();
  } catch (const core::ConfigError& e) {
    throw IoError(path + ": " + e.what());
  }
  check_weights_cover(ckpt_dir, c, path);
  if (state) {
    state->step = f.integer(st, "step", "step");
    state->data_position = f.unsigned_integer(st, "data_position", "data_position");
    state->seed = f.unsigned_integer(st, "seed", "seed");
    state->tokenizer = f.string(st, "tokenizer", "tokenizer");
    // The names data::make_tokenizer knows (empty: saved without a dataset,
    // read as bytes); anything else would fail later without naming this file.
    if (!state->tokenizer.empty() && state->tokenizer != "bytes" && state->tokenizer != "gpt2")
      f.fail("tokenizer", "is '" + state->tokenizer + "'; expected 'bytes' or 'gpt2'");
    state->loss_scaler.reset();
    if (st.contains("loss_scaler")) {
      const Json& j = f.object(st, "loss_scaler", "loss_scaler");
      state->loss_scaler = optim::LossScalerState{float(f.positive_number(j, "loss_scaler.scale", "scale")),
                                                  f.integer(j, "loss_scaler.steps", "steps"),
                                                  f.integer(j, "loss_scaler.skipped", "skipped"),
                                                  f.integer(j, "loss_scaler.growths", "growths"),
                                                  f.integer(j, "loss_scaler.backoffs", "backoffs"),
                                                  f.integer(j, "loss_scaler.clean_streak", "clean_streak")};
    }
    state->lr_plateau.reset();
    if (st.contains("lr_plateau")) {
      const Json& j = f.object(st, "lr_plateau", "lr_plateau");
      optim::PlateauState p;
      p.scale = f.positive_number(j, "lr_plateau.scale", "scale");
      const Json& best = f.at(j, "lr_plateau.best", "best");
      if (!best.is_null()) {
        if (!best.is_number() || std::isnan(best.get<double>()))
          f.fail("lr_plateau.best", "must be a number or null, got " + core::json_excerpt(best));
        p.best = best.get<double>();
      }
      p.bad_evals = f.integer(j, "lr_plateau.bad_evals", "bad_evals");
      p.cuts = f.integer(j, "lr_plateau.cuts", "cuts");
      state->lr_plateau = p;
    }
  }
  return c;
}

void load_checkpoint(const std::string& ckpt_dir, models::Gpt& model, optim::AdamW* optimizer) {
  TrainState st;  // the step, for checkpoints whose state.json predates optimizer_steps (a resume only)
  const models::GptConfig saved = read_checkpoint_config(ckpt_dir, optimizer ? &st : nullptr);
  // The attention kind is no part of the weights: a flash checkpoint loads into a plain model and back.
  if (!saved.same_shape(model.config()))
    throw core::ConfigError(ckpt_dir + ": checkpoint is for a model with n_layer " + std::to_string(saved.n_layer) +
                            ", n_embd " + std::to_string(saved.n_embd) + ", vocab " + std::to_string(saved.vocab_size) +
                            ", block " + std::to_string(saved.block_size) + " but the model has n_layer " +
                            std::to_string(model.config().n_layer) + ", n_embd " + std::to_string(model.config().n_embd) +
                            ", vocab " + std::to_string(model.config().vocab_size) + ", block " +
                            std::to_string(model.config().block_size));
  load_weights(ckpt_dir, model.params());
  if (optimizer) load_moments(ckpt_dir, model.params(), *optimizer, st.step);
}

// ---- the encoder family: classifiers and sequence autoencoders ------------------------
// Both keep an encoder body's shape, the attention kernel, step, seed and
// tokenizer in state.json, plus one integer of their own under "model"
// (n_classes, latent); a classifier adds its label names and header setting.

namespace {

template <class Config>
nlohmann::json body_model_json(const Config& c, const std::string& extra, int64_t extra_value) {
  return {{"vocab_size", c.vocab_size}, {"n_layer", c.n_layer}, {"n_embd", c.n_embd}, {"n_head", c.n_head},
          {"max_len", c.max_len},       {extra, extra_value},   {"attention", c.attention}};
}

template <class Info>
nlohmann::json body_state_json(const std::string& kind, const Info& info, const optim::AdamW* optimizer,
                               nlohmann::json model) {
  nlohmann::json st = {{"kind", kind},
                       {"step", info.step},
                       {"seed", info.seed},
                       {"tokenizer", info.tokenizer},
                       {"optimizer_steps", optimizer ? optimizer->steps_taken() : 0},
                       {"model", std::move(model)}};
  if (info.run) {
    const EpochRunState& r = *info.run;
    st["run"] = {{"batch", r.batch},           {"steps_per_epoch", r.steps_per_epoch},
                 {"train_records", r.train_records}, {"bucket", r.bucket},
                 {"split_seed", r.split_seed}, {"train_frac", r.train_frac},
                 {"val_frac", r.val_frac},     {"input_dropout_state", r.input_dropout_state}};
    if (!r.train_digest.empty()) st["run"]["train_digest"] = r.train_digest;
  }
  return st;
}

// Reads and checks the shared fields into `info` (the model's own integer
// into `extra_value`); returns the parsed state.json for the rest.
template <class Info>
Json read_body_state(const std::string& ckpt_dir, const std::string& kind, const std::string& extra,
                     int64_t& extra_value, Info& info) {
  const std::string path = (fs::path(ckpt_dir) / "state.json").string();
  Json st = parse_state_file(path);
  const StateFields f{path};
  check_kind(f, st, kind);
  const Json& m = f.object(st, "model", "model");
  auto& c = info.config;
  c.vocab_size = f.integer(m, "model.vocab_size", "vocab_size");
  c.n_layer = f.integer(m, "model.n_layer", "n_layer");
  c.n_embd = f.integer(m, "model.n_embd", "n_embd");
  c.n_head = f.integer(m, "model.n_head", "n_head");
  c.max_len = f.integer(m, "model.max_len", "max_len");
  extra_value = f.integer(m, "model." + extra, extra);
  c.attention = f.string(m, "model.attention", "attention");
  try {
    c.validate();
  } catch (const core::ConfigError& e) {
    throw IoError(path + ": " + e.what());
  }
  info.step = f.integer(st, "step", "step");
  info.seed = f.unsigned_integer(st, "seed", "seed");
  info.tokenizer = f.string(st, "tokenizer", "tokenizer");
  if (st.contains("run")) {
    const Json& j = f.object(st, "run", "run");
    EpochRunState r;
    r.batch = f.integer(j, "run.batch", "batch");
    r.steps_per_epoch = f.integer(j, "run.steps_per_epoch", "steps_per_epoch");
    r.train_records = f.integer(j, "run.train_records", "train_records");
    r.bucket = f.boolean(j, "run.bucket", "bucket");
    r.split_seed = f.unsigned_integer(j, "run.split_seed", "split_seed");
    r.train_frac = f.fraction(j, "run.train_frac", "train_frac");
    r.val_frac = f.fraction(j, "run.val_frac", "val_frac");
    r.input_dropout_state = f.unsigned_integer(j, "run.input_dropout_state", "input_dropout_state");
    if (j.contains("train_digest")) r.train_digest = f.string(j, "run.train_digest", "train_digest");
    info.run = r;
  }
  return st;
}

// The weights, and with `optimizer` the moments and the step count.
template <class Model>
void load_body_checkpoint(const std::string& ckpt_dir, Model& model, optim::AdamW* optimizer, int64_t step) {
  load_weights(ckpt_dir, model.params());
  if (optimizer) load_moments(ckpt_dir, model.params(), *optimizer, step);
}

}  // namespace

std::string save_encoder_checkpoint(const std::string& out_dir, const models::Encoder& model,
                                    const optim::AdamW* optimizer, const EncoderCheckpoint& info, int keep) {
  const models::EncoderConfig& c = model.config();
  nlohmann::json st = body_state_json(kEncoderCheckpoint, info, optimizer, body_model_json(c, "n_classes", c.n_classes));
  st["label_names"] = info.label_names;
  st["strip_headers"] = info.strip_headers;
  return write_checkpoint(out_dir, info.step, model.params(), optimizer, st, keep, nullptr);
}

EncoderCheckpoint read_encoder_checkpoint(const std::string& ckpt_dir) {
  EncoderCheckpoint info;
  const Json st = read_body_state(ckpt_dir, kEncoderCheckpoint, "n_classes", info.config.n_classes, info);
  const StateFields f{(fs::path(ckpt_dir) / "state.json").string()};
  if (st.contains("strip_headers")) info.strip_headers = f.boolean(st, "strip_headers", "strip_headers");
  const int64_t n_classes = info.config.n_classes;
  const Json& names = f.at(st, "label_names", "label_names");
  if (!names.is_array() || int64_t(names.size()) != n_classes)
    f.fail("label_names", "must be an array of " + std::to_string(n_classes) + " strings, got " +
                              core::json_excerpt(names));
  for (const Json& n : names) {
    if (!n.is_string()) f.fail("label_names", "must hold strings, got " + core::json_excerpt(n));
    info.label_names.push_back(n.get<std::string>());
  }
  return info;
}

void load_encoder_checkpoint(const std::string& ckpt_dir, models::Encoder& model, optim::AdamW* optimizer) {
  const EncoderCheckpoint saved = read_encoder_checkpoint(ckpt_dir);
  if (!saved.config.same_shape(model.config()))
    throw core::ConfigError(ckpt_dir + ": checkpoint is for an encoder of another shape than the model");
  load_body_checkpoint(ckpt_dir, model, optimizer, saved.step);
}

std::string save_autoencoder_checkpoint(const std::string& out_dir, const models::SeqAutoencoder& model,
                                        const optim::AdamW* optimizer, const AutoencoderCheckpoint& info, int keep) {
  const models::SeqAutoencoderConfig& c = model.config();
  const nlohmann::json st =
      body_state_json(kAutoencoderCheckpoint, info, optimizer, body_model_json(c, "latent", c.latent));
  return write_checkpoint(out_dir, info.step, model.params(), optimizer, st, keep, nullptr);
}

AutoencoderCheckpoint read_autoencoder_checkpoint(const std::string& ckpt_dir) {
  AutoencoderCheckpoint info;
  read_body_state(ckpt_dir, kAutoencoderCheckpoint, "latent", info.config.latent, info);
  return info;
}

void load_autoencoder_checkpoint(const std::string& ckpt_dir, models::SeqAutoencoder& model,
                                 optim::AdamW* optimizer) {
  const AutoencoderCheckpoint saved = read_autoencoder_checkpoint(ckpt_dir);
  if (!saved.config.same_shape(model.config()))
    throw core::ConfigError(ckpt_dir + ": checkpoint is for an autoencoder of another shape than the model");
  load_body_checkpoint(ckpt_dir, model, optimizer, saved.step);
}

}  // namespace brisk::train
