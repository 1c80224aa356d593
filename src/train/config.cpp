// TOML configuration through toml++ (config.h). The table of known keys below
// is the single source of what a config may say; anything else is an error.
#include "brisk/train/config.h"

#include "brisk/cpu/cpu_features.h"

#include <cpuid.h>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <sstream>

#include "run_preset_table.h"
#include "toml_config.h"

#include "brisk/core/error.h"
#include "brisk/data/tokenizer.h"
#include "brisk/train/tune.h"

namespace brisk::train {

using core::ConfigError;

namespace {

// model.classifier_chunk_mb: the fused classifier's chunk in MiB of f32 logits.
constexpr int64_t kFloatsPerMiB = (int64_t(1) << 20) / int64_t(sizeof(float));
constexpr int64_t kMaxClassifierChunkMiB = 65536;

const detail::KnownKeys kKnownKeys = {
    {"model", {"kind", "preset", "vocab_size", "n_layer", "n_embd", "n_head", "block_size", "attention", "fused_classifier",
               "fuse_bias_gelu", "fuse_residual_layernorm", "fuse_layernorm_backward", "fuse_gelu_backward",
               "fuse_bias_backward", "fuse_weight_casts", "classifier_chunk_mb", "dropout",
               "attention_dropout"}},
    {"data", {"dir"}},
    {"train", {"batch", "seq", "grad_accum", "steps", "lr", "min_lr_ratio", "warmup", "schedule", "weight_decay",
               "grad_clip", "beta1", "beta2", "eps", "seed", "threads", "device", "eval_every", "eval_batches", "log_every",
               "loader_workers", "precision", "precision_fallback", "loss_scaling", "loss_scale_init",
               "loss_scale_growth_interval", "recompute", "fused_adamw", "init_from", "keep_mask", "preset", "memory_budget", "plateau_patience",
               "plateau_factor", "tensorboard"}},
    {"checkpoint", {"dir", "every", "keep"}},
    {"dist", {"bucket_mb", "zero", "timeout_s", "backend"}},
};


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
  // What fp32 products run through on this CPU, and why.
  const std::string f32_engine = std::string("products through ") + cpu::f32_gemm_name(cpu::cpu_features().f32_gemm) +
                                 " (" + cpu::cpu_features().f32_reason + ")";
  if (requested == Precision::fp32) {
    c.reason = f32_engine;
    return c;
  }
  std::string cpu;
  bool fast = false;
  if (requested == Precision::bf16) {
    const cpu::CpuFeatures& f = cpu::cpu_features();
    fast = f.bf16 == cpu::Bf16Path::native;
    cpu = f.bf16_reason;
  } else {
    // CPUID.(EAX=7,ECX=0):EDX[23], read directly: clang 14 does not know
    // "avx512fp16" as a __builtin_cpu_supports name.
    unsigned a = 0, b = 0, cx = 0, d = 0;
    const bool native = __get_cpuid_count(7, 0, &a, &b, &cx, &d) && ((d >> 23) & 1);
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
  c.reason = f32_engine + "; no " + precision_name(requested) + " fast path: " + cpu;
  c.warning = std::string("warning: precision ") + precision_name(requested) +
              " requested but no fast path on this machine (" + cpu +
              "): training in fp32 (train.precision_fallback = false runs it emulated)";
  return c;
}

namespace {
TrainConfig config_from_table(const toml::table& root);

// A GPT config has no model.kind or "gpt"; the other kinds have loaders of
// their own (`brisk train` picks them), and anything else is a typo.
// `where` opens the message (the file, or "config").
void check_gpt_kind(const std::string& kind, const std::string& where) {
  if (kind == "encoder" || kind == "autoencoder")
    throw ConfigError(where + ": model.kind = \"" + kind + "\": this command takes GPT configs only (`brisk train` " +
                      "trains " + (kind == "encoder" ? "an encoder classifier" : "a sequence autoencoder") + ")");
  if (!kind.empty() && kind != "gpt")
    throw ConfigError(where + ": model.kind: unknown value '" + kind +
                      "' (allowed: encoder, autoencoder, gpt; a config without it is a GPT)");
}
}  // namespace

TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides) {
  // The kind first: an encoder config read as a GPT's failed on its first
  // key the GPT lacks ("unknown key 'data.store'"), and a misspelt kind too.
  check_gpt_kind(detail::model_kind_of(path, overrides), path);
  return detail::load_toml_config<TrainConfig>(path, overrides, kKnownKeys, config_from_table);
}

TrainConfig parse_train_config(std::string_view text, const std::string& name,
                               const std::vector<std::string>& overrides) {
  return detail::parse_toml_config<TrainConfig>(text, name, overrides, kKnownKeys, config_from_table);
}

namespace {

TrainConfig config_from_table(const toml::table& file) {
  // train.preset fills the keys the file and --set leave unset (run_presets.h).
  const toml::table root = detail::with_run_preset(file);
  TrainConfig c;
  detail::Reader r(root);
  std::string kind;
  r.get("model", "kind", kind);  // must be a string
  check_gpt_kind(kind, "config");
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
  c.model.dropout = detail::read_probability(r, "model", "dropout", c.model.dropout);
  c.model.attention_dropout = detail::read_probability(r, "model", "attention_dropout", c.model.attention_dropout);
  // auto | on | off (checked by validate()); true / false, its values when it
  // was a switch, still mean on / off.
  if (const toml::node* n = root.at_path("model.fuse_residual_layernorm").node(); n && n->is_boolean())
    c.model.fuse_residual_layernorm = n->value<bool>().value() ? "on" : "off";
  else
    r.get("model", "fuse_residual_layernorm", c.model.fuse_residual_layernorm);
  r.get("model", "fuse_layernorm_backward", c.model.fuse_layernorm_backward);  // checked (auto | on | off) by validate()
  r.get("model", "fuse_gelu_backward", c.model.fuse_gelu_backward);  // likewise
  r.get("model", "fuse_bias_backward", c.model.fuse_bias_backward);  // likewise
  r.get("model", "fuse_weight_casts", c.model.fuse_weight_casts);    // likewise
  // The fused classifier's f32 logits per chunk of rows, in MiB (0: the
  // backend's choice): more rows per chunk, fewer passes over dW.
  int64_t chunk_mb = c.model.classifier_chunk_floats / kFloatsPerMiB;
  r.get("model", "classifier_chunk_mb", chunk_mb);
  if (chunk_mb < 0 || chunk_mb > kMaxClassifierChunkMiB)
    throw ConfigError("config: model.classifier_chunk_mb must be in [0, " + std::to_string(kMaxClassifierChunkMiB) +
                      "] (0: the backend's choice, 64 on a CPU), got " + std::to_string(chunk_mb));
  c.model.classifier_chunk_floats = chunk_mb * kFloatsPerMiB;
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
  c.schedule.kind = optim::LrSchedule::parse(schedule, /*allow_plateau=*/true);
  r.get("train", "plateau_patience", c.schedule.plateau_patience);
  r.get("train", "plateau_factor", c.schedule.plateau_factor);
  r.get("train", "tensorboard", c.tensorboard);
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
  r.get("train", "init_from", c.init_from);
  r.get("train", "keep_mask", c.keep_mask);
  r.get("train", "preset", c.run_preset);
  // A size ("4GiB") or a plain number of bytes, checked now so a typo fails at load (tune.h).
  if (const toml::node* n = root.at_path("train.memory_budget").node(); n && n->is_integer())
    c.memory_budget = std::to_string(n->value<int64_t>().value());
  else if (n && n->is_floating_point() && std::isfinite(*n->value<double>()) && *n->value<double>() > 0 &&
           *n->value<double>() < 9.2e18 && std::floor(*n->value<double>()) == *n->value<double>())
    c.memory_budget = std::to_string(int64_t(*n->value<double>()));  // 4e9: a whole number of bytes
  else if (n && n->is_floating_point()) {  // 4.5: neither bytes nor a size with its unit
    const double v = *n->value<double>();
    char text[64];
    std::snprintf(text, sizeof text, "%.17g", v);
    throw core::ConfigError(std::string("config: train.memory_budget: ") + text + " is not a memory size (" +
                            (std::isnan(v)  ? "not a number"
                             : !(v > 0)     ? "it must be at least 1 byte"
                             : !std::isfinite(v) || v >= 9.2e18 ? "too large"
                                                                 : "a number of bytes must be whole") +
                            "); write e.g. \"4GiB\", \"512MiB\", \"1.5GB\" or a plain number of bytes");
  } else {
    r.get("train", "memory_budget", c.memory_budget);
  }
  if (!c.memory_budget.empty() && c.memory_budget != "auto")  // "auto" is read at start-up (tune.h)
    parse_byte_size(c.memory_budget, "config: train.memory_budget");
  r.get("checkpoint", "dir", c.out_dir);
  r.get("checkpoint", "every", c.checkpoint_every);
  r.get("checkpoint", "keep", c.keep_checkpoints);
  r.get("dist", "bucket_mb", c.dist.bucket_mb);
  r.get("dist", "zero", c.dist.zero);
  r.get("dist", "timeout_s", c.dist.timeout_s);
  r.get("dist", "backend", c.dist.backend);

  c.model.validate();
  auto positive = [](int64_t v, const char* key) {
    if (v <= 0) throw ConfigError(std::string("config: ") + key + " must be positive, got " + std::to_string(v));
  };
  // An empty path would name no directory: the errors it led to named
  // neither the key nor the problem.
  if (c.data_dir.empty()) throw ConfigError("config: data.dir must not be empty: give a dataset directory");
  if (c.out_dir.empty()) throw ConfigError("config: checkpoint.dir must not be empty: give the run's directory");
  positive(c.batch, "train.batch");
  positive(c.seq, "train.seq");
  positive(c.grad_accum, "train.grad_accum");
  // A step of more micro-batches never ends in practice, and a stop signal
  // acts only between steps; the bound also keeps batch x grad_accum exact.
  constexpr int64_t kMaxGradAccum = int64_t(1) << 20;
  if (c.grad_accum > kMaxGradAccum)
    throw ConfigError("config: train.grad_accum must be at most " + std::to_string(kMaxGradAccum) + ", got " +
                      std::to_string(c.grad_accum));
  if (c.threads < 0 || c.threads > 4096)
    throw ConfigError("config: train.threads must be in [0, 4096] (0: all cores), got " + std::to_string(c.threads));
  positive(c.steps, "train.steps");
  positive(c.log_every, "train.log_every");
  if (c.loader_workers > 64)
    throw ConfigError("config: train.loader_workers must be at most 64, got " + std::to_string(c.loader_workers));
  if (c.seq > c.model.block_size)
    throw ConfigError("config: train.seq (" + std::to_string(c.seq) + ") exceeds model.block_size (" +
                      std::to_string(c.model.block_size) + ")");
  // Bounds that keep the token buffers (batch x seq int32 ids per micro-step)
  // clear of overflow and of absurd allocations.
  constexpr int64_t kMaxTokensPerMicroBatch = int64_t(1) << 31;
  if (c.batch > kMaxTokensPerMicroBatch / c.seq)
    throw ConfigError("config: train.batch x train.seq = " + std::to_string(c.batch) + " x " + std::to_string(c.seq) +
                      " tokens per micro-batch; at most 2^31 are supported");
  if (!(c.schedule.max_lr > 0) || !std::isfinite(c.schedule.max_lr))
    throw ConfigError("config: train.lr must be a positive finite number");
  auto in_unit = [](double v, const char* key) {  // [0, 1)
    if (!(v >= 0 && v < 1))  // the value as stored: 0.9999999999 is 1 as a float32
      throw ConfigError(std::string("config: ") + key + " must be in [0, 1) as a 32-bit float, got " + toml_number(v));
  };
  in_unit(c.adamw.beta1, "train.beta1");
  in_unit(c.adamw.beta2, "train.beta2");
  if (!(c.adamw.eps > 0) || !std::isfinite(c.adamw.eps))
    throw ConfigError("config: train.eps must be a positive finite number as a 32-bit float (about 1.2e-38 to 3.4e38)");
  if (!(c.adamw.weight_decay >= 0) || !std::isfinite(c.adamw.weight_decay))
    throw ConfigError("config: train.weight_decay must be a finite number >= 0");
  if (!(c.adamw.grad_clip >= 0) || !std::isfinite(c.adamw.grad_clip))
    throw ConfigError("config: train.grad_clip must be a finite number >= 0 (0 disables clipping)");
  if (!(c.schedule.min_lr_ratio >= 0 && c.schedule.min_lr_ratio <= 1))  // NaN too
    throw ConfigError("config: train.min_lr_ratio must be in [0, 1], got " + toml_number(c.schedule.min_lr_ratio));
  if (c.schedule.plateau_patience < 0)
    throw ConfigError("config: train.plateau_patience must be >= 0, got " + std::to_string(c.schedule.plateau_patience));
  if (!(c.schedule.plateau_factor > 0 && c.schedule.plateau_factor < 1))
    throw ConfigError("config: train.plateau_factor must be in (0, 1), got " + std::to_string(c.schedule.plateau_factor));
  // The plateau schedule only moves when the validation loss is measured.
  // A mean over zero batches is no loss: it read 0, and drove the plateau schedule.
  if (c.eval_every > 0 && c.eval_batches <= 0)
    throw ConfigError("config: train.eval_every = " + std::to_string(c.eval_every) +
                      " evaluates, but train.eval_batches = 0 gives it nothing to average: set train.eval_batches > 0 "
                      "(or train.eval_every = 0 to never evaluate)");
  if (c.schedule.kind == optim::Schedule::plateau && c.eval_every <= 0)
    throw ConfigError("config: train.schedule = \"plateau\" follows the validation loss, but train.eval_every = " +
                      std::to_string(c.eval_every) + " never evaluates: set train.eval_every > 0");
  if (!(c.loss_scale_init >= 1) || !std::isfinite(c.loss_scale_init))
    throw ConfigError("config: train.loss_scale_init must be a finite number >= 1");
  positive(c.loss_scale_growth_interval, "train.loss_scale_growth_interval");
  // The mask is applied by host code to host weights (models::PruneMask).
  if (c.keep_mask && c.device != "cpu")
    throw ConfigError("config: train.keep_mask = true is supported with train.device = \"cpu\" only");
  // Dropout has CPU kernels only (models::Gpt refuses it on a device too).
  for (const auto& [key, p] : {std::pair<const char*, float>{"dropout", c.model.dropout},
                               {"attention_dropout", c.model.attention_dropout}})
    if (p > 0.f && c.device != "cpu")
      throw ConfigError(std::string("config: model.") + key +
                        " > 0 is supported with train.device = \"cpu\" only (the CUDA backend has no dropout kernel "
                        "yet); set model." + key + " = 0 to train on the GPU");
  if (!(c.dist.bucket_mb > 0) || !std::isfinite(c.dist.bucket_mb))
    throw ConfigError("config: dist.bucket_mb must be a positive number of MiB");
  if (c.dist.zero != 0 && c.dist.zero != 1)
    throw ConfigError("config: dist.zero must be 0 or 1, got " + std::to_string(c.dist.zero));
  // The bound keeps the deadline (now + timeout) within the clock's range.
  if (!(c.dist.timeout_s > 0) || !(c.dist.timeout_s <= 365 * 86400.0))
    throw ConfigError("config: dist.timeout_s must be a positive number of seconds, at most a year (31536000)");
  if (c.dist.backend != "auto" && c.dist.backend != "mpi" && c.dist.backend != "nccl")
    throw ConfigError("config: dist.backend: unknown value '" + c.dist.backend + "' (allowed: auto, mpi, nccl)");
  if (c.keep_mask && c.dist.zero == 1)
    throw ConfigError("config: train.keep_mask = true needs every rank to hold all AdamW moments: use dist.zero = 0");
  c.adamw.lr = c.schedule.max_lr;
  c.schedule.total_steps = c.steps;
  return c;
}

}  // namespace

namespace {
// The shortest decimal form that reads back as exactly v (std::to_chars).
template <class T>
std::string shortest(T v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}
}  // namespace

std::string toml_number(double v) { return shortest(v); }
std::string toml_number(float v) { return shortest(v); }

// `v` as a TOML basic string: quoted, with quotes, backslashes and control
// characters escaped, so that any path a config holds (a quote in a directory
// name, a Windows path) is written back as TOML that loads to the same value.
std::string toml_string(const std::string& v) {
  std::string out = "\"";
  for (const char ch : v) {
    const auto u = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (u < 0x20 || u == 0x7f) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\u%04X", u);
      out += esc;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

float detail::read_probability(const Reader& r, const std::string& section, const std::string& key, float value) {
  double p = value;
  r.get(section, key, p);
  if (!(p >= 0.0 && p < 1.0) || float(p) >= 1.f || (p > 0 && float(p) == 0.f))
    throw ConfigError("config: " + section + "." + key +
                      " must be in [0, 1) (and not round to 0 or 1 as a 32-bit float), got " + toml_number(p));
  return float(p);
}

std::string to_toml(const TrainConfig& c) {
  std::ostringstream s;
  const char* kinds[] = {"constant", "linear", "cosine", "plateau"};
  s << "[model]\n"
    << "vocab_size = " << c.model.vocab_size << "\nn_layer = " << c.model.n_layer << "\nn_embd = " << c.model.n_embd
    << "\nn_head = " << c.model.n_head << "\nblock_size = " << c.model.block_size
    << "\nattention = " << toml_string(c.model.attention) << "\nfused_classifier = "
    << (c.model.fused_classifier ? "true" : "false")
    << "\nfuse_bias_gelu = " << (c.model.fuse_bias_gelu ? "true" : "false")
    << "\nfuse_residual_layernorm = " << toml_string(c.model.fuse_residual_layernorm)
    << "\nfuse_layernorm_backward = " << toml_string(c.model.fuse_layernorm_backward)
    << "\nfuse_gelu_backward = " << toml_string(c.model.fuse_gelu_backward)
    << "\nfuse_bias_backward = " << toml_string(c.model.fuse_bias_backward)
    << "\nfuse_weight_casts = " << toml_string(c.model.fuse_weight_casts)
    << "\nclassifier_chunk_mb = " << c.model.classifier_chunk_floats / kFloatsPerMiB
    << "\ndropout = " << toml_number(c.model.dropout)
    << "\nattention_dropout = " << toml_number(c.model.attention_dropout)
    << "\n\n[data]\ndir = " << toml_string(c.data_dir) << "\n\n[train]\nbatch = " << c.batch << "\nseq = " << c.seq << "\ngrad_accum = " << c.grad_accum
    << "\nsteps = " << c.steps << "\nlr = " << toml_number(c.schedule.max_lr) << "\nmin_lr_ratio = " << toml_number(c.schedule.min_lr_ratio)
    << "\nwarmup = " << c.schedule.warmup_steps << "\nschedule = \"" << kinds[int(c.schedule.kind)]
    << "\"\nplateau_patience = " << c.schedule.plateau_patience << "\nplateau_factor = " << toml_number(c.schedule.plateau_factor)
    << "\nweight_decay = " << toml_number(c.adamw.weight_decay) << "\ngrad_clip = " << toml_number(c.adamw.grad_clip)
    << "\nfused_adamw = " << (c.adamw.fused ? "true" : "false")
    << "\nbeta1 = " << toml_number(c.adamw.beta1) << "\nbeta2 = " << toml_number(c.adamw.beta2) << "\neps = " << toml_number(c.adamw.eps)
    << "\nseed = " << c.seed << "\ndevice = " << toml_string(c.device) << "\nthreads = " << c.threads << "\nloader_workers = " << c.loader_workers
    << "\nprecision = \"" << precision_name(c.precision) << "\""
    << "\nprecision_fallback = " << (c.precision_fallback ? "true" : "false")
    << "\nrecompute = " << toml_string(c.model.recompute)
    << "\ninit_from = " << toml_string(c.init_from) << "\nkeep_mask = " << (c.keep_mask ? "true" : "false");
  if (c.loss_scaling) s << "\nloss_scaling = " << (*c.loss_scaling ? "true" : "false");
  if (!c.run_preset.empty()) s << "\npreset = " << toml_string(c.run_preset);
  if (!c.memory_budget.empty()) s << "\nmemory_budget = " << toml_string(c.memory_budget);
  s << "\nloss_scale_init = " << toml_number(c.loss_scale_init) << "\nloss_scale_growth_interval = " << c.loss_scale_growth_interval
    << "\neval_every = " << c.eval_every
    << "\neval_batches = " << c.eval_batches << "\nlog_every = " << c.log_every
    << "\ntensorboard = " << (c.tensorboard ? "true" : "false") << "\n\n[checkpoint]\ndir = "
    << toml_string(c.out_dir) << "\nevery = " << c.checkpoint_every << "\nkeep = " << c.keep_checkpoints << "\n";
  s << "\n[dist]\nbucket_mb = " << toml_number(c.dist.bucket_mb) << "\nzero = " << c.dist.zero << "\ntimeout_s = " << toml_number(c.dist.timeout_s)
    << "\nbackend = " << toml_string(c.dist.backend) << "\n";
  return s.str();
}

}  // namespace brisk::train
