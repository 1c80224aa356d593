// TOML configuration through toml++ (config.h). The table of known keys below
// is the single source of what a config may say; anything else is an error.
#include "brisk/train/config.h"

#include "brisk/cpu/cpu_features.h"

#include <cmath>
#include <map>
#include <sstream>
#include <toml++/toml.h>

#include "brisk/core/error.h"

namespace brisk::train {

using core::ConfigError;

namespace {

const std::map<std::string, std::vector<std::string>> kKnownKeys = {
    {"model", {"preset", "vocab_size", "n_layer", "n_embd", "n_head", "block_size", "attention", "fused_classifier",
               "fuse_bias_gelu", "fuse_residual_layernorm"}},
    {"data", {"dir"}},
    {"train", {"batch", "seq", "grad_accum", "steps", "lr", "min_lr_ratio", "warmup", "schedule", "weight_decay",
               "grad_clip", "beta1", "beta2", "eps", "seed", "threads", "device", "eval_every", "eval_batches", "log_every",
               "loader_workers", "precision", "precision_fallback", "loss_scaling", "loss_scale_init",
               "loss_scale_growth_interval", "recompute", "fused_adamw"}},
    {"checkpoint", {"dir", "every", "keep"}},
};

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
  return s;
}

void check_known(const toml::table& root) {
  std::vector<std::string> sections;
  for (const auto& [k, v] : kKnownKeys) sections.push_back(k);
  for (const auto& [section, node] : root) {
    const std::string name(section.str());
    auto it = kKnownKeys.find(name);
    if (it == kKnownKeys.end())
      throw ConfigError("config: unknown section [" + name + "] (allowed: " + join(sections) + ")");
    const toml::table* t = node.as_table();
    if (!t) throw ConfigError("config: '" + name + "' must be a section ([" + name + "])");
    for (const auto& [key, value] : *t) {
      const std::string k(key.str());
      if (std::find(it->second.begin(), it->second.end(), k) == it->second.end())
        throw ConfigError("config: unknown key '" + name + "." + k + "' (allowed in [" + name + "]: " +
                          join(it->second) + ")");
    }
  }
}

// Typed getters that name the key when the type is wrong.
class Reader {
 public:
  explicit Reader(const toml::table& root) : root_(root) {}

  template <class T>
  void get(const std::string& section, const std::string& key, T& out) const {
    const toml::node* n = root_.at_path(section + "." + key).node();
    if (!n) return;
    const std::string full = section + "." + key;
    if constexpr (std::is_same_v<T, std::string>) {
      if (!n->is_string()) throw ConfigError("config: " + full + " must be a string");
      out = n->value<std::string>().value();
    } else if constexpr (std::is_same_v<T, bool> || std::is_same_v<T, std::optional<bool>>) {
      if (!n->is_boolean()) throw ConfigError("config: " + full + " must be true or false");
      out = n->value<bool>().value();
    } else if constexpr (std::is_floating_point_v<T>) {
      if (!n->is_number()) throw ConfigError("config: " + full + " must be a number");
      out = T(n->value<double>().value());
    } else {
      if (!n->is_integer()) throw ConfigError("config: " + full + " must be an integer");
      const int64_t v = n->value<int64_t>().value();
      if (v < 0) throw ConfigError("config: " + full + " must not be negative, got " + std::to_string(v));
      out = T(v);
    }
  }

 private:
  const toml::table& root_;
};

void apply_override(toml::table& root, const std::string& assignment) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw ConfigError("--set '" + assignment + "': expected section.key=value, e.g. train.steps=100");
  const std::string path = assignment.substr(0, eq), value = assignment.substr(eq + 1);
  const auto dot = path.find('.');
  if (dot == std::string::npos)
    throw ConfigError("--set '" + assignment + "': the key must name its section, e.g. train." + path);
  const std::string section = path.substr(0, dot), key = path.substr(dot + 1);
  // A value is parsed as TOML (numbers, booleans, quoted strings); anything
  // that does not parse is taken as a bare string (a path, a preset name).
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + value);
  } catch (const toml::parse_error&) {
    parsed.insert_or_assign("v", value);
  }
  if (!root.contains(section)) root.insert(section, toml::table{});
  toml::table* t = root[section].as_table();
  if (!t) throw ConfigError("--set '" + assignment + "': '" + section + "' is not a section");
  t->insert_or_assign(key, *parsed["v"].node());
}

}  // namespace

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::fp32: return "fp32";
    case Precision::bf16: return "bf16";
    case Precision::fp16: return "fp16";
  }
  return "fp32";
}

Precision parse_precision(const std::string& name) {
  if (name == "fp32") return Precision::fp32;
  if (name == "bf16") return Precision::bf16;
  if (name == "fp16") return Precision::fp16;
  throw ConfigError("train.precision: unknown value '" + name + "' (allowed: fp32, bf16, fp16)");
}

core::DType compute_dtype(Precision p) {
  switch (p) {
    case Precision::fp32: return core::DType::f32;
    case Precision::bf16: return core::DType::bf16;
    case Precision::fp16: return core::DType::f16;
  }
  return core::DType::f32;
}

PrecisionChoice resolve_precision(Precision requested, bool fallback, const std::string& device) {
  // bf16 is fast where cpu_features() found bf16 dot products; fp16 has no
  // fast CPU path yet (it would need avx512_fp16 kernels), so it is emulated.
  PrecisionChoice c;
  c.requested = requested;
  if (device == "cuda") {
    c.effective = requested;
    if (requested == Precision::fp32) {
      c.reason = "products through cuBLASLt in fp32 (TF32 only with BRISK_CUDA_TF32=1)";
    } else {
      c.path = std::string(precision_name(requested)) + "-tensor-cores";
      c.reason = "products on the GPU's tensor cores through cuBLASLt, fp32 accumulation";
    }
    return c;
  }
  if (requested == Precision::fp32) {
    c.reason = std::string("products through ") + cpu::f32_gemm_name(cpu::cpu_features().f32_gemm) + " (" +
               cpu::cpu_features().f32_reason + ")";
    return c;
  }
  std::string cpu;
  bool fast = false;
  if (requested == Precision::bf16) {
    const cpu::CpuFeatures& f = cpu::cpu_features();
    fast = f.bf16 == cpu::Bf16Path::native;
    cpu = f.bf16_reason;
  } else {
    const bool native = __builtin_cpu_supports("avx512fp16");
    cpu = std::string(native ? "CPU has avx512_fp16" : "CPU has no avx512_fp16") +
          "; brisk has no fp16 dot-product matmul path yet";
  }
  c.reason = cpu;
  if (fast) {
    c.effective = requested;
    c.path = "bf16-native";
    return c;
  }
  if (!fallback) {
    c.effective = requested;
    c.emulated = true;
    c.path = std::string(precision_name(requested)) + "-emulated";
    c.note = std::string("note: precision ") + precision_name(requested) + " emulated (" + cpu +
             "; train.precision_fallback = false): " + precision_name(requested) +
             " numerics, products widened to fp32, slower than fp32";
    return c;
  }
  c.effective = Precision::fp32;
  c.warning = std::string("warning: precision ") + precision_name(requested) +
              " requested but no fast path on this machine (" + cpu +
              "): training in fp32 (train.precision_fallback = false runs it emulated)";
  return c;
}

TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides) {
  toml::table root;
  if (!path.empty()) {
    try {
      root = toml::parse_file(path);
    } catch (const toml::parse_error& e) {
      std::ostringstream msg;
      msg << path << ":" << e.source().begin.line << ":" << e.source().begin.column << ": " << e.description();
      throw ConfigError(msg.str());
    }
  }
  for (const std::string& o : overrides) apply_override(root, o);
  check_known(root);

  TrainConfig c;
  Reader r(root);
  r.get("model", "preset", c.preset);
  if (!c.preset.empty()) c.model = models::GptConfig::preset(c.preset);
  r.get("model", "vocab_size", c.model.vocab_size);
  r.get("model", "n_layer", c.model.n_layer);
  r.get("model", "n_embd", c.model.n_embd);
  r.get("model", "n_head", c.model.n_head);
  r.get("model", "block_size", c.model.block_size);
  r.get("model", "attention", c.model.attention);  // checked (flash | plain) by validate() below
  r.get("model", "fused_classifier", c.model.fused_classifier);
  r.get("model", "fuse_bias_gelu", c.model.fuse_bias_gelu);
  r.get("model", "fuse_residual_layernorm", c.model.fuse_residual_layernorm);
  r.get("data", "dir", c.data_dir);
  r.get("train", "batch", c.batch);
  r.get("train", "seq", c.seq);
  r.get("train", "grad_accum", c.grad_accum);
  r.get("train", "steps", c.steps);
  r.get("train", "lr", c.schedule.max_lr);
  r.get("train", "min_lr_ratio", c.schedule.min_lr_ratio);
  r.get("train", "warmup", c.schedule.warmup_steps);
  std::string schedule = "cosine";
  r.get("train", "schedule", schedule);
  c.schedule.kind = optim::LrSchedule::parse(schedule);
  r.get("train", "weight_decay", c.adamw.weight_decay);
  r.get("train", "grad_clip", c.adamw.grad_clip);
  r.get("train", "fused_adamw", c.adamw.fused);
  r.get("train", "beta1", c.adamw.beta1);
  r.get("train", "beta2", c.adamw.beta2);
  r.get("train", "eps", c.adamw.eps);
  r.get("train", "seed", c.seed);
  r.get("train", "threads", c.threads);
  r.get("train", "device", c.device);
  if (c.device != "cpu" && c.device != "cuda")
    throw ConfigError("config: train.device: unknown value '" + c.device + "' (allowed: cpu, cuda)");
  r.get("train", "loader_workers", c.loader_workers);
  r.get("train", "eval_every", c.eval_every);
  r.get("train", "eval_batches", c.eval_batches);
  r.get("train", "log_every", c.log_every);
  std::string precision = "fp32";
  r.get("train", "precision", precision);
  c.precision = parse_precision(precision);
  r.get("train", "precision_fallback", c.precision_fallback);
  r.get("train", "loss_scaling", c.loss_scaling);
  r.get("train", "loss_scale_init", c.loss_scale_init);
  r.get("train", "loss_scale_growth_interval", c.loss_scale_growth_interval);
  r.get("train", "recompute", c.model.recompute);  // checked (none | selective | full) by validate() below
  r.get("checkpoint", "dir", c.out_dir);
  r.get("checkpoint", "every", c.checkpoint_every);
  r.get("checkpoint", "keep", c.keep_checkpoints);

  c.model.validate();
  auto positive = [](int64_t v, const char* key) {
    if (v <= 0) throw ConfigError(std::string("config: ") + key + " must be positive, got " + std::to_string(v));
  };
  positive(c.batch, "train.batch");
  positive(c.seq, "train.seq");
  positive(c.grad_accum, "train.grad_accum");
  positive(c.steps, "train.steps");
  positive(c.log_every, "train.log_every");
  if (c.loader_workers > 64)
    throw ConfigError("config: train.loader_workers must be at most 64, got " + std::to_string(c.loader_workers));
  if (c.seq > c.model.block_size)
    throw ConfigError("config: train.seq (" + std::to_string(c.seq) + ") exceeds model.block_size (" +
                      std::to_string(c.model.block_size) + ")");
  if (!(c.schedule.max_lr > 0)) throw ConfigError("config: train.lr must be positive");
  if (c.schedule.min_lr_ratio < 0 || c.schedule.min_lr_ratio > 1)
    throw ConfigError("config: train.min_lr_ratio must be in [0, 1]");
  if (!(c.loss_scale_init >= 1) || !std::isfinite(c.loss_scale_init))
    throw ConfigError("config: train.loss_scale_init must be a finite number >= 1");
  positive(c.loss_scale_growth_interval, "train.loss_scale_growth_interval");
  c.adamw.lr = c.schedule.max_lr;
  c.schedule.total_steps = c.steps;
  return c;
}

std::string to_toml(const TrainConfig& c) {
  std::ostringstream s;
  const char* kinds[] = {"constant", "linear", "cosine"};
  s << "[model]\n"
    << "vocab_size = " << c.model.vocab_size << "\nn_layer = " << c.model.n_layer << "\nn_embd = " << c.model.n_embd
    << "\nn_head = " << c.model.n_head << "\nblock_size = " << c.model.block_size
    << "\nattention = \"" << c.model.attention << "\"\nfused_classifier = "
    << (c.model.fused_classifier ? "true" : "false")
    << "\nfuse_bias_gelu = " << (c.model.fuse_bias_gelu ? "true" : "false")
    << "\nfuse_residual_layernorm = " << (c.model.fuse_residual_layernorm ? "true" : "false")
    << "\n\n[data]\ndir = \""
    << c.data_dir << "\"\n\n[train]\nbatch = " << c.batch << "\nseq = " << c.seq << "\ngrad_accum = " << c.grad_accum
    << "\nsteps = " << c.steps << "\nlr = " << c.schedule.max_lr << "\nmin_lr_ratio = " << c.schedule.min_lr_ratio
    << "\nwarmup = " << c.schedule.warmup_steps << "\nschedule = \"" << kinds[int(c.schedule.kind)]
    << "\"\nweight_decay = " << c.adamw.weight_decay << "\ngrad_clip = " << c.adamw.grad_clip
    << "\nfused_adamw = " << (c.adamw.fused ? "true" : "false")
    << "\nbeta1 = " << c.adamw.beta1 << "\nbeta2 = " << c.adamw.beta2 << "\neps = " << c.adamw.eps
    << "\nseed = " << c.seed << "\ndevice = \"" << c.device << "\"\nthreads = " << c.threads << "\nloader_workers = " << c.loader_workers
    << "\nprecision = \"" << precision_name(c.precision) << "\""
    << "\nprecision_fallback = " << (c.precision_fallback ? "true" : "false")
    << "\nrecompute = \"" << c.model.recompute << "\"";
  if (c.loss_scaling) s << "\nloss_scaling = " << (*c.loss_scaling ? "true" : "false");
  s << "\nloss_scale_init = " << c.loss_scale_init << "\nloss_scale_growth_interval = " << c.loss_scale_growth_interval
    << "\neval_every = " << c.eval_every
    << "\neval_batches = " << c.eval_batches << "\nlog_every = " << c.log_every << "\n\n[checkpoint]\ndir = \""
    << c.out_dir << "\"\nevery = " << c.checkpoint_every << "\nkeep = " << c.keep_checkpoints << "\n";
  return s.str();
}

}  // namespace brisk::train
