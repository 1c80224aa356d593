// Loading the engine's weights (model.h): brisk checkpoints, brisk quantized
// files and Hugging Face GPT-2 safetensors all come through one reader of
// GPT-2-named tensors; they differ only in where the config comes from and
// whether the Linears are quantized.
#include "brisk/infer/model.h"

#include <cmath>
#include <cstring>
#include <functional>
#include <set>
#include <stdexcept>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "brisk/core/error.h"
#include "brisk/core/safetensors.h"
#include "brisk/ops/packed_linear.h"
#include "brisk/ops/quant.h"
#include "brisk/ops/reference_backend.h"
#include "brisk/train/checkpoint.h"
#include "brisk/train/hf_weights.h"

namespace brisk::infer {

namespace fs = std::filesystem;
using core::ConfigError;
using core::DType;
using core::IoError;
using core::Shape;
using core::Tensor;
using nlohmann::json;

const char* scheme_name(Scheme s) {
  switch (s) {
    case Scheme::f32: return "fp32";
    case Scheme::int8: return "int8";
    case Scheme::int4: return "int4";
  }
  return "?";
}

Scheme parse_scheme(const std::string& name) {
  if (name == "int8") return Scheme::int8;
  if (name == "int4") return Scheme::int4;
  if (name == "fp32" || name == "f32") return Scheme::f32;
  throw ConfigError("unknown quantization scheme '" + name + "' (allowed: int8, int4)");
}

size_t QLinear::bytes() const {
  size_t b = w.defined() ? w.bytes() : 0;
  if (scale.defined()) b += scale.bytes();
  if (bias.defined()) b += bias.bytes();
  return b;
}

size_t Model::weight_bytes() const {
  size_t b = head.bytes() + wpe.bytes() + lnf_w.bytes() + lnf_b.bytes();
  for (const Layer& l : layers)
    b += l.ln1_w.bytes() + l.ln1_b.bytes() + l.ln2_w.bytes() + l.ln2_b.bytes() + l.qkv.bytes() + l.proj.bytes() +
         l.fc.bytes() + l.fc_proj.bytes();
  return b;
}

namespace {
void pack_linear(QLinear& l) {
  if (l.scheme != Scheme::f32 || l.packed) return;
  core::Tensor p = core::Tensor::empty(ops::packed::packed_shape(l.out, l.in), core::DType::f32);
  ops::packed::pack(l.w.data_as<float>(), l.out, l.in, p.data_as<float>());
  l.w = std::move(p);
  l.packed = true;
}

void pack_quantized_linear(QLinear& l) {
  if (l.packed) return;
  if (l.scheme == Scheme::int8) {
    core::Tensor p = core::Tensor::empty(ops::packed::q8_packed_shape(l.out, l.in), core::DType::u8);
    ops::packed::pack_q8(l.w.data_as<int8_t>(), l.out, l.in, p.data_as<uint8_t>());
    l.w = std::move(p);
    l.packed = true;
  } else if (l.scheme == Scheme::int4) {
    core::Tensor p = core::Tensor::empty(ops::packed::q4_packed_shape(l.out, l.in), core::DType::u8);
    core::Tensor s = core::Tensor::empty(ops::packed::q4_packed_scale_shape(l.out, l.in), core::DType::f32);
    ops::packed::pack_q4(l.w.data_as<uint8_t>(), l.scale.data_as<float>(), l.out, l.in, p.data_as<uint8_t>(),
                         s.data_as<float>());
    l.w = std::move(p);
    l.scale = std::move(s);
    l.packed = true;
  }
}
}  // namespace

void pack_f32_linears(Model& m) {
  pack_linear(m.head);
  for (Layer& l : m.layers)
    for (QLinear* q : {&l.qkv, &l.proj, &l.fc, &l.fc_proj}) pack_linear(*q);
}

void pack_quantized_linears(Model& m) {
  pack_quantized_linear(m.head);
  for (Layer& l : m.layers)
    for (QLinear* q : {&l.qkv, &l.proj, &l.fc, &l.fc_proj}) pack_quantized_linear(*q);
}

void Model::embed(int32_t id, int64_t pos, float* out) const {
  const int64_t c = config.n_embd;
  const float* p = wpe.data_as<float>() + pos * c;
  switch (head.scheme) {
    case Scheme::f32: {
      if (head.packed) {  // the row is a column of its panel: gather it
        ops::packed::unpack_row(head.w.data_as<float>(), c, id, out);
        for (int64_t i = 0; i < c; ++i) out[i] += p[i];
        break;
      }
      const float* e = head.w.data_as<float>() + int64_t(id) * c;
      for (int64_t i = 0; i < c; ++i) out[i] = e[i] + p[i];
      break;
    }
    case Scheme::int8: {
      const float s = head.scale.data_as<float>()[id];
      if (head.packed) {  // the row is spread over its panel's groups
        for (int64_t i = 0; i < c; ++i)
          out[i] = float(ops::packed::q8_weight(head.w.data_as<uint8_t>(), c, id, i)) * s + p[i];
        break;
      }
      const int8_t* e = head.w.data_as<int8_t>() + int64_t(id) * c;
      for (int64_t i = 0; i < c; ++i) out[i] = float(e[i]) * s + p[i];
      break;
    }
    case Scheme::int4: {
      const int64_t groups = c / ops::quant::kQ4Group;
      if (head.packed) {  // codes and scales in the row's panel
        const float* sp = head.scale.data_as<float>() + (id / ops::packed::kPanel) * groups * ops::packed::kPanel;
        for (int64_t i = 0; i < c; ++i)
          out[i] = float(ops::packed::q4_packed_code(head.w.data_as<uint8_t>(), c, id, i)) *
                       sp[(i / 32) * ops::packed::kPanel + id % ops::packed::kPanel] +
                   p[i];
        break;
      }
      const uint8_t* e = head.w.data_as<uint8_t>() + int64_t(id) * (c / 2);
      const float* s = head.scale.data_as<float>() + int64_t(id) * groups;
      for (int64_t g = 0; g < groups; ++g)
        for (int j = 0; j < 32; ++j)
          out[g * 32 + j] = float(ops::quant::q4_code(e + g * 16, j)) * s[g] + p[g * 32 + j];
      break;
    }
  }
}

namespace {

// The tensors of one file by GPT-2 name ("h.0.attn.c_attn.weight"), with a
// "transformer." prefix dropped, and what to say when one is missing.
struct Tensors {
  std::map<std::string, Tensor> by_name;
  std::string path;
  mutable std::set<std::string> taken;  // names get() returned (brisk's own files may hold no others)

  const Tensor& get(const std::string& name) const {
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      std::string some;
      int n = 0;
      for (auto& [k, v] : by_name)
        if (n++ < 3) some += (some.empty() ? "" : ", ") + k;
      throw IoError(path + ": no tensor '" + name + "': not a GPT-2 model in brisk's or Hugging Face's naming (it has " +
                    std::to_string(by_name.size()) + " tensors, e.g. " + some + ")");
    }
    taken.insert(name);
    return it->second;
  }
  bool has(const std::string& name) const { return by_name.count(name) > 0; }
  // The first tensor get() never returned, or "".
  std::string first_untaken() const {
    for (const auto& [name, tensor] : by_name)
      if (!taken.count(name)) return name;
    return "";
  }
};

// One NaN or infinity in a weight, a LayerNorm or a quantized scale turns
// every token after it into NaN logits: a file's tensors are checked once,
// as they are read (a brisk checkpoint's were checked by its loader).
void require_finite(const Tensor& x, const std::string& path, const std::string& name) {
  const int64_t i = core::first_non_finite(x);
  if (i < 0) return;
  throw IoError(path + ": tensor '" + name + "' holds " + (std::isnan(x.item(i)) ? "NaN" : "an infinity") +
                " at element " + std::to_string(i) + " (a diverged or damaged model)");
}

Tensors tensors_of(const std::map<std::string, Tensor>& tensors, const std::string& path) {
  Tensors t;
  t.path = path;
  for (auto& [name, tensor] : tensors) {
    require_finite(tensor, path, name);
    t.by_name[name.rfind("transformer.", 0) == 0 ? name.substr(12) : name] = tensor;
  }
  return t;
}

// A float tensor of exactly `shape`, widened to f32 if stored as f16/bf16.
Tensor f32_of(const Tensors& t, const std::string& name, const Shape& shape) {
  const Tensor& x = t.get(name);
  if (x.shape() != shape)
    throw IoError(t.path + ": tensor '" + name + "' is " + x.meta().str() + ", expected shape " + shape.str() +
                  " for this GPT-2 config");
  if (x.dtype() == DType::f32) return x;
  if (!core::dtype_is_float(x.dtype()))
    throw IoError(t.path + ": tensor '" + name + "' is " + x.meta().str() + ", expected a float tensor");
  Tensor y = Tensor::empty(shape, DType::f32);
  for (int64_t i = 0; i < x.numel(); ++i) y.data_as<float>()[i] = float(x.item(i));
  return y;
}

// A Conv1D weight stored (in, out) as (out, in).
Tensor linear_weight(const Tensors& t, const std::string& name, int64_t out, int64_t in) {
  const Tensor w = f32_of(t, name, Shape{in, out});
  Tensor y = Tensor::empty(Shape{out, in}, DType::f32);
  const float* src = w.data_as<float>();
  float* dst = y.data_as<float>();
  for (int64_t i = 0; i < in; ++i)
    for (int64_t o = 0; o < out; ++o) dst[o * in + i] = src[i * out + o];
  return y;
}

// Positions, the final LayerNorm and every block: the same names in all
// formats; `linear` reads one Linear ("h.0.attn.c_attn", out, in).
void read_common(const Tensors& t, Model& m, const std::function<QLinear(const std::string&, int64_t, int64_t)>& linear) {
  const int64_t c = m.config.n_embd;
  m.wpe = f32_of(t, "wpe.weight", Shape{m.config.block_size, c});
  m.lnf_w = f32_of(t, "ln_f.weight", Shape{c});
  m.lnf_b = f32_of(t, "ln_f.bias", Shape{c});
  for (int64_t i = 0; i < m.config.n_layer; ++i) {
    const std::string p = "h." + std::to_string(i) + ".";
    Layer y;
    y.ln1_w = f32_of(t, p + "ln_1.weight", Shape{c});
    y.ln1_b = f32_of(t, p + "ln_1.bias", Shape{c});
    y.ln2_w = f32_of(t, p + "ln_2.weight", Shape{c});
    y.ln2_b = f32_of(t, p + "ln_2.bias", Shape{c});
    y.qkv = linear(p + "attn.c_attn", 3 * c, c);
    y.proj = linear(p + "attn.c_proj", c, c);
    y.fc = linear(p + "mlp.c_fc", 4 * c, c);
    y.fc_proj = linear(p + "mlp.c_proj", c, 4 * c);
    m.layers.push_back(std::move(y));
  }
}

// Linear weights are Conv1D (in, out) in Hugging Face files, (out, in) in
// brisk's parameter store.
enum class WeightLayout { conv1d, out_in };

Model fp32_from_tensors(const Tensors& t, models::GptConfig config, const std::string& tokenizer, WeightLayout layout) {
  const int64_t c = config.n_embd, v = config.vocab_size, l = config.n_layer;
  Model m;
  m.config = config;
  m.tokenizer = tokenizer;
  m.source = t.path;
  m.head = QLinear{Scheme::f32, v, c, f32_of(t, "wte.weight", Shape{v, c}), {}, {}};
  read_common(t, m, [&](const std::string& p, int64_t out, int64_t in) {
    Tensor w = layout == WeightLayout::conv1d ? linear_weight(t, p + ".weight", out, in)
                                               : f32_of(t, p + ".weight", Shape{out, in});
    return QLinear{Scheme::f32, out, in, std::move(w), {}, f32_of(t, p + ".bias", Shape{out})};
  });
  if (t.has("h." + std::to_string(l) + ".ln_1.weight"))
    throw IoError(t.path + ": has more layers than its config's n_layer " + std::to_string(l));
  return m;
}

// Hugging Face's config.json: n_embd, n_layer, n_head, n_positions, vocab_size.
models::GptConfig hf_config(const std::string& config_path, const Tensors& t) {
  models::GptConfig c;
  c.compute = core::DType::f32;
  if (fs::exists(config_path)) {
    json j;
    try {
      j = json::parse(core::read_file(config_path));
    } catch (const json::exception& e) {
      throw IoError(config_path + ": not valid JSON (" + e.what() + ")");
    }
    if (j.contains("model_type") && j["model_type"] != "gpt2")
      throw ConfigError(config_path + ": model_type is " + j["model_type"].dump() + "; brisk runs GPT-2 models");
    train::check_hf_computation(j, config_path);
    auto num = [&](const char* key) -> int64_t {
      if (!j.contains(key) || !j[key].is_number_integer()) throw IoError(config_path + ": missing integer '" + key + "'");
      return j[key].get<int64_t>();
    };
    c.n_embd = num("n_embd");
    c.n_layer = num("n_layer");
    c.n_head = num("n_head");
    c.block_size = num("n_positions");
    c.vocab_size = num("vocab_size");
  } else {
    // No config: the shapes give all but the head count, which GPT-2 sizes
    // all set to n_embd / 64.
    const Tensor& wte = t.get("wte.weight");
    const Tensor& wpe = t.get("wpe.weight");
    c.vocab_size = wte.shape()[0];
    c.n_embd = wte.shape()[1];
    c.block_size = wpe.shape()[0];
    c.n_layer = 0;
    while (t.has("h." + std::to_string(c.n_layer) + ".ln_1.weight")) ++c.n_layer;
    c.n_head = std::max<int64_t>(1, c.n_embd / 64);
  }
  try {
    c.validate();
  } catch (const ConfigError& e) {
    throw IoError(t.path + ": " + e.what());
  }
  return c;
}

// ---- brisk's quantized files -------------------------------------------------------

QLinear read_qlinear(const Tensors& t, const std::string& name, Scheme s, int64_t out, int64_t in, bool bias) {
  QLinear q;
  q.scheme = s;
  q.out = out;
  q.in = in;
  const bool q4 = s == Scheme::int4;
  const Shape wshape = q4 ? Shape{out, in / 2} : Shape{out, in};
  const Shape sshape = q4 ? Shape{out, in / ops::quant::kQ4Group} : Shape{out};
  q.w = t.get(name + ".weight");
  q.scale = t.get(name + ".weight.scale");
  if (q.w.shape() != wshape || q.w.dtype() != (q4 ? DType::u8 : DType::i8) || q.scale.shape() != sshape ||
      q.scale.dtype() != DType::f32)
    throw IoError(t.path + ": '" + name + ".weight' is " + q.w.meta().str() + " with scale " + q.scale.meta().str() +
                  ", expected " + std::string(q4 ? "u8" : "i8") + wshape.str() + " with f32" + sshape.str());
  if (bias) q.bias = f32_of(t, name + ".bias", Shape{out});
  return q;
}

Model load_quantized(const std::string& path, const core::SafetensorsFile& f) {
  auto meta = [&](const char* key) {
    auto it = f.metadata.find(key);
    if (it == f.metadata.end()) throw IoError(path + ": quantized file without '" + key + "' in its metadata");
    return it->second;
  };
  const Tensors t = tensors_of(f.tensors, path);  // (brisk's names never start with "transformer.")
  Model m;
  m.scheme = parse_scheme(meta("brisk.scheme"));
  // The loaders below read int8/int4 tensors; an fp32 model is a checkpoint, not this format.
  if (m.scheme == Scheme::f32)
    throw IoError(path + ": 'brisk.scheme' metadata is '" + meta("brisk.scheme") +
                  "'; a quantized file is int8 or int4");
  m.quant_note = f.metadata.count("brisk.calibration") ? f.metadata.at("brisk.calibration") : "";
  m.tokenizer = meta("brisk.tokenizer");
  m.source = path;
  try {
    const json j = json::parse(meta("brisk.model"));
    auto integer = [&](const char* key) {
      const json& v = j.at(key);
      if (!v.is_number_integer()) throw std::invalid_argument(std::string(key) + " is not an integer: " + v.dump());
      return v.get<int64_t>();
    };
    m.config.vocab_size = integer("vocab_size");
    m.config.n_layer = integer("n_layer");
    m.config.n_embd = integer("n_embd");
    m.config.n_head = integer("n_head");
    m.config.block_size = integer("block_size");
    m.config.validate();
  } catch (const std::exception& e) {
    throw IoError(path + ": bad 'brisk.model' metadata (" + e.what() + ")");
  }
  const int64_t c = m.config.n_embd;
  if (m.scheme == Scheme::int4 && c % 32 != 0)
    throw IoError(path + ": int4 needs n_embd to be a multiple of 32, got " + std::to_string(c));
  m.head = read_qlinear(t, "wte", m.scheme, m.config.vocab_size, c, false);
  read_common(t, m, [&](const std::string& p, int64_t out, int64_t in) {
    return read_qlinear(t, p, m.scheme, out, in, true);
  });
  // brisk wrote the file, so a tensor the model does not use (a layer past
  // n_layer) means the metadata and the tensors disagree.
  if (const std::string extra = t.first_untaken(); !extra.empty())
    throw IoError(path + ": tensor '" + extra + "' is not part of the model its metadata describes (n_layer " +
                  std::to_string(m.config.n_layer) + ")");
  return m;
}

// A brisk checkpoint goes through the trainer's own loader, which checks
// every tensor's name, dtype and shape (and refuses extras); the weights are
// then taken from the parameter store as they are, (out, in).
Model from_checkpoint(const std::string& ckpt) {
  train::TrainState state;
  models::GptConfig config = train::read_checkpoint_config(ckpt, &state);
  config.compute = core::DType::f32;
  config.attention = "plain";
  // The reference backend only holds the parameters here; a CpuBackend would
  // also reset the process's thread count under any engine already running.
  ops::ReferenceBackend backend;
  models::Gpt gpt(config, backend);
  train::load_checkpoint(ckpt, gpt, nullptr);
  Tensors t;
  t.path = ckpt;
  // Copies: the store's memory goes with the model when this returns.
  for (auto& [name, e] : gpt.params().entries()) t.by_name[name] = e.value.clone();
  Model m = fp32_from_tensors(t, config, state.tokenizer.empty() ? "bytes" : state.tokenizer, WeightLayout::out_in);
  m.source = ckpt;
  return m;
}

}  // namespace

Model load_model(const std::string& path) {
  if (!fs::exists(path)) throw IoError(path + ": no such checkpoint, model file or directory");
  if (fs::is_directory(path)) {
    // A brisk checkpoint (or run directory), else a Hugging Face model directory.
    const std::string ckpt = train::latest_checkpoint(path);
    if (!ckpt.empty()) return from_checkpoint(ckpt);
    const fs::path weights = fs::path(path) / "model.safetensors";
    if (!fs::exists(weights))
      throw IoError(path + ": neither a brisk checkpoint (state.json) nor a model directory (model.safetensors)");
    const Tensors t = tensors_of(core::load_safetensors(weights.string()).tensors, weights.string());
    return fp32_from_tensors(t, hf_config((fs::path(path) / "config.json").string(), t), "gpt2", WeightLayout::conv1d);
  }
  // A brisk checkpoint's own weights file: its config and tokenizer are in
  // the state.json beside it, not in the tensors' shapes.
  const fs::path dir = fs::absolute(path).parent_path();
  if (fs::path(path).filename() == "model.safetensors" && fs::exists(dir / "state.json"))
    return from_checkpoint(dir.string());
  core::SafetensorsFile f;
  try {
    f = core::load_safetensors(path);
  } catch (const IoError& e) {
    throw IoError(path + ": not a checkpoint directory, and not a readable safetensors model file (" + e.what() + ")");
  }
  if (f.metadata.count("brisk.scheme")) return load_quantized(path, f);
  const Tensors t = tensors_of(f.tensors, path);
  return fp32_from_tensors(t, hf_config((fs::path(path).parent_path() / "config.json").string(), t), "gpt2",
                           WeightLayout::conv1d);
}

}  // namespace brisk::infer
