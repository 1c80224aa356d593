// Memory-budget tuning (tune.h): the run's planned peak RSS (or GPU memory) part by part, the
// search over (recompute, fused_classifier) and micro-batch, and the choice at
// trainer start-up. Everything here plans; nothing runs a step. Each
// candidate setting gets one model at a time (its weights are the only real
// allocation), so the search itself never holds more than one model's
// parameters and gradients, well below the run it sizes.
#include "brisk/train/tune.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <stdexcept>
#include <tuple>

#include "brisk/core/allocator.h"
#include "brisk/core/error.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/models/gpt.h"
#include "brisk/monitor/run_summary.h"
#include "brisk/train/checkpoint.h"

namespace brisk::train {

using core::ConfigError;

uint64_t parse_byte_size(const std::string& text, const std::string& what) {
  auto bad = [&](const std::string& why) {
    return ConfigError(what + ": '" + text + "' is not a memory size" + (why.empty() ? "" : " (" + why + ")") +
                       "; write e.g. \"4GiB\", \"512MiB\", \"1.5GB\" or a plain number of bytes");
  };
  size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  const size_t num_begin = i;
  bool dot = false;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || (text[i] == '.' && !dot))) {
    dot = dot || text[i] == '.';
    ++i;
  }
  const std::string number = text.substr(num_begin, i - num_begin);
  if (number.empty() && num_begin < text.size() && text[num_begin] == '-') throw bad("negative");
  if (number.empty() || number == ".") throw bad("no number");
  if (i < text.size() && text[i] == ' ') ++i;  // "4 GiB"
  std::string unit;
  for (; i < text.size(); ++i) {
    if (std::isspace(static_cast<unsigned char>(text[i]))) break;
    unit += char(std::tolower(static_cast<unsigned char>(text[i])));
  }
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  if (i != text.size()) throw bad("text after the unit");
  // Binary units are powers of 1024, decimal ones of 1000; a bare K/M/G/T is
  // binary, as in Docker and the JVM.
  static const std::map<std::string, double> kUnits = {
      {"", 1.0},           {"b", 1.0},
      {"k", 1024.0},       {"kib", 1024.0},       {"kb", 1e3},
      {"m", 1048576.0},    {"mib", 1048576.0},    {"mb", 1e6},
      {"g", 1073741824.0}, {"gib", 1073741824.0}, {"gb", 1e9},
      {"t", 1099511627776.0}, {"tib", 1099511627776.0}, {"tb", 1e12}};
  const auto u = kUnits.find(unit);
  if (u == kUnits.end())
    throw bad("unknown unit '" + unit + "'; allowed: B, K/KiB, M/MiB, G/GiB, T/TiB (powers of 1024), kB, MB, GB, TB");
  if (dot && u->second == 1.0) throw bad("a number of bytes must be whole");
  double v = 0;
  try {
    v = std::stod(number) * u->second;
  } catch (const std::out_of_range&) {
    throw bad("too large");
  }
  if (!(v >= 1)) throw bad("it must be at least 1 byte");
  if (v >= 9.2e18) throw bad("too large");
  return uint64_t(std::llround(v));
}

std::string format_bytes(uint64_t b) {
  char buf[48];
  if (b >= (uint64_t(1) << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", double(b) / double(uint64_t(1) << 30));
  else if (b >= (uint64_t(1) << 20)) std::snprintf(buf, sizeof buf, "%.1f MiB", double(b) / double(1 << 20));
  else if (b >= 1024) std::snprintf(buf, sizeof buf, "%.1f KiB", double(b) / 1024.0);
  else std::snprintf(buf, sizeof buf, "%llu B", (unsigned long long)b);
  return buf;
}

double graph_matmul_flops(const core::Graph& g) {
  using core::OpKind;
  double f = 0;
  for (const core::Node& n : g.nodes()) {
    const auto& out = g.shape(n.outputs[0]);
    switch (n.op) {
      case OpKind::matmul: {
        const auto& a = g.shape(n.inputs[0]);
        const bool ta = std::get<core::MatmulParams>(n.params).trans_a;
        f += 2.0 * double(out.numel()) * double(a[a.rank() - (ta ? 2 : 1)]);
        break;
      }
      case OpKind::linear:
      case OpKind::linear_gelu:
        f += 2.0 * double(out.numel()) * double(g.shape(n.inputs[1])[1]);
        break;
      case OpKind::matmul_gelu_backward:  // (rows, out) x (out, in): the product is w's out-features deep
        f += 2.0 * double(out.numel()) * double(g.shape(n.inputs[1])[0]);
        break;
      case OpKind::linear_param_grad:  // dy^T x: (out, in), rows deep
        f += 2.0 * double(out.numel()) * double(g.shape(n.inputs[0])[0]);
        break;
      case OpKind::attention:
      case OpKind::flash_attention:
      case OpKind::masked_attention:
      case OpKind::masked_flash_attention:
      case OpKind::attention_backward:
      case OpKind::flash_attention_backward:
      case OpKind::masked_attention_backward:
      case OpKind::masked_flash_attention_backward: {  // every key of every row (the causal ones count it too)
        const bool fwd = n.op == OpKind::attention || n.op == OpKind::flash_attention ||
                         n.op == OpKind::masked_attention || n.op == OpKind::masked_flash_attention;
        const auto& y = g.shape(fwd ? n.outputs[0] : n.inputs[0]);  // (B, T, C): the output or its gradient
        f += (fwd ? 4.0 : 8.0) * double(y[0]) * double(y[1]) * double(y[1]) * double(y[2]);
        break;
      }
      case OpKind::classifier_train: {  // logits, dx and dw of an (N, C) x (V, C) head
        const auto& x = g.shape(n.inputs[0]);
        f += 6.0 * double(x[0]) * double(x[1]) * double(g.shape(n.inputs[1])[0]);
        break;
      }
      default:
        break;
    }
  }
  return f;
}

int64_t largest_fitting(int64_t max_batch, const std::function<bool(int64_t)>& fits) {
  if (max_batch < 1 || !fits(1)) return 0;
  int64_t lo = 1, hi = max_batch;  // fits(lo) holds; the answer is in [lo, hi]
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (fits(mid)) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

namespace {

namespace fs = std::filesystem;

// Bytes of the token shards a run maps: the dataset checks each shard's
// checksum when it opens it, so every page of both splits is read and stays
// resident (file-backed pages count in RSS). 0 when data.dir is missing.
uint64_t shard_bytes(const std::string& dir) {
  std::error_code ec;
  uint64_t n = 0;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const bool shard = (name.rfind("train_", 0) == 0 || name.rfind("val_", 0) == 0) && it->path().extension() == ".bin";
    if (shard && it->is_regular_file(ec)) n += uint64_t(it->file_size(ec));
  }
  return n;
}

// Plans one (recompute, fused_classifier) setting at any micro-batch with
// one model. What does not depend on the recompute level (eval arenas, the
// data) is shared between settings through `Shared`.
struct Shared {
  const TrainConfig& cfg;
  core::Backend& backend;
  bool gpu = false;        // train.device = "cuda": plan GPU memory
  uint64_t data = 0;
  // by (micro-batch, fused classifier, residual + LayerNorm fused)
  std::map<std::tuple<int64_t, bool, bool>, uint64_t> eval_arena;
};

class SettingPlanner {
 public:
  SettingPlanner(Shared& shared, const std::string& recompute, bool fused) : s_(shared) {
    models::GptConfig mc = planned_model_config(s_.cfg, recompute);  // the level resolves the fusions
    mc.fused_classifier = fused;
    model_ = std::make_unique<models::Gpt>(mc, s_.backend);
    for (const auto& [name, e] : model_->params().entries()) {
      // AdamW keeps two fp32 moments per parameter element.
      state_ += uint64_t(e.value.numel()) * 2 * sizeof(float);
      if (is_hf_conv1d_weight(name) && e.value.shape().rank() == 2)
        transposed_ = std::max<uint64_t>(transposed_, e.value.bytes());
    }
  }

  RunMemoryEstimate estimate(int64_t batch) {
    const TrainConfig& cfg = s_.cfg;
    RunMemoryEstimate m;
    const core::Graph g = model_->train_graph(batch, cfg.seq);
    m.train = core::plan_memory(g).report;
    m.train.optimizer_state = state_;
    m.flops_per_micro_step = graph_matmul_flops(g);
    if (cfg.eval_every > 0) {
      // The fused classifier setting shapes the eval program too (its head
      // runs in row chunks), and so does the residual + LayerNorm fusion
      // (which the recompute level can turn off); recompute itself does not.
      const std::tuple<int64_t, bool, bool> key{batch, model_->config().fused_classifier,
                                                model_->config().fuse_residual_layernorm == "on"};
      auto it = s_.eval_arena.find(key);
      if (it == s_.eval_arena.end())
        it = s_.eval_arena.emplace(key, core::plan_memory(model_->eval_graph(batch, cfg.seq)).report.arena).first;
      m.eval_arena = it->second;
    }
    if (s_.gpu) {  // the rest lives on the host
      m.gpu = true;
      m.baseline = kCudaProcessBytes;
      return m;
    }
    // The ring of workers x 2 + 1 slots, each inputs and targets (the
    // trainer's prefetch factor is 2), and the trainer's eval x and y.
    const uint64_t cells = uint64_t(batch) * uint64_t(cfg.seq);
    const uint64_t slots = uint64_t(std::max(0, cfg.loader_workers)) * 2 + 1;
    m.loader = slots * 2 * core::align_up(cells * 4) + 2 * cells * 4;
    m.data = s_.data;
    // write_checkpoint streams each tensor to its file; the one copy it
    // holds is a block weight's HF-layout transpose, the largest of them.
    m.checkpoint = transposed_;
    return m;
  }

 private:
  Shared& s_;
  std::unique_ptr<models::Gpt> model_;
  uint64_t state_ = 0, transposed_ = 0;  // transposed_: the largest block weight
};

const char* kLevels[] = {"none", "selective", "full"};
int level_rank(const std::string& r) {
  for (int i = 0; i < 3; ++i)
    if (r == kLevels[i]) return i;
  return 3;
}

Shared make_shared_state(const TrainConfig& cfg, core::Backend& backend) {
  Shared s{cfg, backend, cfg.device == "cuda", 0, {}};
  s.data = s.gpu ? 0 : shard_bytes(cfg.data_dir);
  return s;
}

std::string describe(int64_t batch, int64_t accum, const std::string& recompute, bool fused) {
  return "micro-batch " + std::to_string(batch) + " x grad_accum " + std::to_string(accum) + ", recompute " +
         recompute + ", fused classifier " + (fused ? "on" : "off");
}

}  // namespace

models::GptConfig planned_model_config(const TrainConfig& cfg, const std::string& recompute) {
  models::GptConfig c = cfg.model;
  if (!recompute.empty()) c.recompute = recompute;
  models::GptConfig mc = c.with_fusions_for(cfg.device == "cuda");
  mc.compute = compute_dtype(resolve_precision(cfg.precision, cfg.precision_fallback, cfg.device).effective);
  if (cfg.device == "cuda" && mc.classifier_chunk_floats == 0)
    mc.classifier_chunk_floats = models::kDeviceClassifierChunkFloats;
  return mc;
}

RunMemoryEstimate estimate_run_memory(const TrainConfig& cfg, core::Backend& backend) {
  Shared shared = make_shared_state(cfg, backend);
  SettingPlanner p(shared, cfg.model.recompute, cfg.model.fused_classifier);
  return p.estimate(cfg.batch);
}

TuneResult search_budget(const TrainConfig& cfg, uint64_t budget, core::Backend& backend) {
  TuneResult r;
  r.budget = budget;
  r.global_batch = cfg.batch * cfg.grad_accum;
  const int64_t G = r.global_batch;
  Shared shared = make_shared_state(cfg, backend);
  bool have_original = false;
  for (const char* level : kLevels) {
    for (const bool fused : {false, true}) {
      SettingPlanner p(shared, level, fused);
      TuneCandidate c;
      c.recompute = level;
      c.fused_classifier = fused;
      std::map<int64_t, RunMemoryEstimate> seen;
      auto at = [&](int64_t b) -> const RunMemoryEstimate& {
        auto it = seen.find(b);
        if (it == seen.end()) it = seen.emplace(b, p.estimate(b)).first;
        return it->second;
      };
      // At most the micro-batch a config may hold (batch x seq <= 2^31
      // tokens, config.cpp): a huge budget chose one whose config did not load.
      const int64_t cap = std::min<int64_t>(G, (int64_t(1) << 31) / cfg.seq);
      const int64_t most = largest_fitting(cap, [&](int64_t b) { return at(b).total() <= budget; });
      // The micro-batch must divide the global batch (grad_accum = G / b
      // keeps the tokens per optimizer step). Planned memory grows with the
      // batch, so every divisor below `most` fits too; the check stays, in
      // case the planner's greedy packing ever makes it non-monotone.
      for (int64_t b = most; b >= 1; --b)
        if (G % b == 0 && at(b).total() <= budget) {
          c.batch = b;
          c.grad_accum = G / b;
          break;
        }
      c.memory = at(c.fits() ? c.batch : 1);
      const int64_t tokens = (c.fits() ? c.batch : 1) * cfg.seq;
      c.flops_per_token = c.memory.flops_per_micro_step / double(tokens);
      if (level == cfg.model.recompute && fused == cfg.model.fused_classifier) {
        r.original = at(cfg.batch);
        have_original = true;
      }
      r.candidates.push_back(std::move(c));
    }
  }
  if (!have_original) {  // a level outside the three (validate() refuses those): plan it on its own
    SettingPlanner p(shared, cfg.model.recompute, cfg.model.fused_classifier);
    r.original = p.estimate(cfg.batch);
  }

  // Fitting first; then fewest FLOPs per token (what a step costs in
  // compute, recomputation included); then the larger micro-batch (fewer,
  // larger matrix products per optimizer step); then the cheaper level
  // (selective's elementwise replays are not in the FLOP count); then the
  // config's own classifier setting (its speed difference is within this
  // machine's noise, README ablation); then the smaller plan.
  // Settings that do not fit at all: the smallest plan first (what the error
  // names), ties broken like the fitting ones.
  std::stable_sort(r.candidates.begin(), r.candidates.end(), [&](const TuneCandidate& a, const TuneCandidate& b) {
    if (a.fits() != b.fits()) return a.fits();
    if (!a.fits() && a.memory.total() != b.memory.total()) return a.memory.total() < b.memory.total();
    const double fa = a.flops_per_token, fb = b.flops_per_token;
    if (std::abs(fa - fb) > 1e-9 * std::max(fa, fb)) return fa < fb;
    if (a.batch != b.batch) return a.batch > b.batch;
    if (level_rank(a.recompute) != level_rank(b.recompute)) return level_rank(a.recompute) < level_rank(b.recompute);
    const bool own_a = a.fused_classifier == cfg.model.fused_classifier, own_b = b.fused_classifier == cfg.model.fused_classifier;
    if (own_a != own_b) return own_a;
    return a.memory.total() < b.memory.total();
  });

  const TuneCandidate& best = r.candidates.front();
  if (!best.fits()) {
    r.summary = ("memory budget " + format_bytes(budget) + " is below the smallest planned run of this config: " +
                      format_bytes(best.memory.total()) + " (" + describe(1, G, best.recompute, best.fused_classifier) +
                      "); the budget must be at least that (brisk tune prints every setting)");
    return r;
  }
  for (TuneCandidate& c : r.candidates)
    c.relative_throughput = c.fits() ? best.flops_per_token / c.flops_per_token : 0.0;

  r.chosen = config_for(cfg, best);

  std::string s = "memory budget " + format_bytes(budget) + ": " +
                  describe(best.batch, best.grad_accum, best.recompute, best.fused_classifier) +
                  (best.memory.gpu ? ", planned GPU memory " : ", planned peak ") + format_bytes(best.memory.total()) +
                  ".";
  const bool same = best.batch == cfg.batch && best.recompute == cfg.model.recompute &&
                    best.fused_classifier == cfg.model.fused_classifier;
  if (same) {
    s += " The config as given fits and nothing cheaper in compute does better.";
  } else {
    const double given_per_token = r.original.flops_per_micro_step / double(cfg.batch * cfg.seq);
    const bool cheaper = best.flops_per_token < given_per_token * (1 - 1e-9);
    s += " The config as given (" + describe(cfg.batch, cfg.grad_accum, cfg.model.recompute, cfg.model.fused_classifier) +
         ") plans " + format_bytes(r.original.total()) +
         (r.original.total() > budget ? ", over the budget."
          : cheaper                   ? ", which fits, but this setting is cheaper per token."
                                      : ", which fits, but this setting runs a larger micro-batch for the same FLOPs "
                                        "per token.");
  }
  if (best.grad_accum != cfg.grad_accum)
    s += " train.grad_accum " + std::to_string(cfg.grad_accum) + " -> " + std::to_string(best.grad_accum) +
         " keeps the global batch at " + std::to_string(G) + " sequences (" + std::to_string(G * cfg.seq) +
         " tokens per optimizer step).";
  s += " Ranked by estimated FLOPs per token (recomputation included), then the larger micro-batch.";
  r.summary = s;
  return r;
}

TuneResult tune_for_budget(const TrainConfig& cfg, uint64_t budget, core::Backend& backend) {
  TuneResult r = search_budget(cfg, budget, backend);
  if (!r.fits()) throw ConfigError(r.summary);
  return r;
}

TrainConfig config_for(const TrainConfig& cfg, const TuneCandidate& c) {
  TrainConfig t = cfg;
  t.batch = c.batch;
  t.grad_accum = c.grad_accum;
  // Evaluation runs at the micro-batch, eval_batches of them: at a smaller
  // micro-batch it would score fewer windows (a noisier val loss, not
  // comparable with the config's). The sampler draws windows one by one from
  // its seed, so ceil(batch x eval_batches / micro-batch) micro-batches score
  // the config's windows first (exactly those when it divides).
  if (cfg.eval_batches > 0 && c.batch != cfg.batch)
    t.eval_batches = (cfg.batch * cfg.eval_batches + c.batch - 1) / c.batch;
  t.model.recompute = c.recompute;
  t.model.fused_classifier = c.fused_classifier;
  t.memory_budget.clear();  // the choice is made: the tuned config describes the run
  return t;
}

std::string candidates_table(const TuneResult& r) {
  auto mib = [](uint64_t b) { return double(b) / double(1 << 20); };
  std::string out;
  char buf[256];
  std::snprintf(buf, sizeof buf, "%-4s %-10s %-6s %6s %6s %11s %9s %9s %9s %9s %10s %10s\n", "rank", "recompute", "fused",
                "batch", "accum", "planned MiB", "arena", "eval", "fixed", "fits", "GFLOP/tok", "rel. tok/s");
  out += buf;
  int rank = 0;
  for (const TuneCandidate& c : r.candidates) {
    ++rank;
    const RunMemoryEstimate& m = c.memory;
    // fixed: everything that does not grow with the batch (weights, grads,
    // moments, data, checkpoint staging, process baseline, ...).
    const uint64_t fixed = m.total() - m.train.arena - m.eval_arena;
    char rel[16] = "-";
    if (c.fits()) std::snprintf(rel, sizeof rel, "%.3f", c.relative_throughput);
    std::snprintf(buf, sizeof buf, "%-4d %-10s %-6s %6s %6s %11.1f %9.1f %9.1f %9.1f %9s %10.4f %10s\n", rank,
                  c.recompute.c_str(), c.fused_classifier ? "on" : "off",
                  c.fits() ? std::to_string(c.batch).c_str() : "-", c.fits() ? std::to_string(c.grad_accum).c_str() : "-",
                  mib(m.total()), mib(m.train.arena), mib(m.eval_arena), mib(fixed), c.fits() ? "yes" : "no (b=1)",
                  c.flops_per_token * 1e-9, rel);
    out += buf;
  }
  return out;
}

uint64_t resolve_memory_budget(const std::string& text, const std::string& what, const TrainConfig& cfg,
                               const core::Backend& backend, std::string* how) {
  if (text != "auto") return parse_byte_size(text, what);
  uint64_t budget = 0;
  std::string line;
  auto percent = [](double share) { return std::to_string(int(std::lround(share * 100))) + "%"; };
  if (cfg.device == "cuda") {
    const auto mem = backend.device_memory();
    if (!mem)
      throw ConfigError(what + " = \"auto\" reads the free memory of the GPU the run trains on, and none is open "
                        "here (brisk tune plans without one): give the card's size, e.g. 79GiB for an 80 GB H100");
    budget = uint64_t(double(mem->free) * kAutoDeviceShare);
    line = "auto: " + format_bytes(budget) + " = " + percent(kAutoDeviceShare) + " of the GPU's free " +
           format_bytes(mem->free) + " of " + format_bytes(mem->total);
  } else {
    const uint64_t available = monitor::available_ram_bytes();
    if (available == 0) throw ConfigError(what + " = \"auto\": /proc/meminfo has no MemAvailable here; give a size");
    budget = uint64_t(double(available) * kAutoHostShare);
    line = "auto: " + format_bytes(budget) + " = " + percent(kAutoHostShare) + " of the host's MemAvailable " +
           format_bytes(available);
  }
  if (how) *how = line;
  return budget;
}

TrainConfig apply_memory_budget(const TrainConfig& cfg, core::Backend& backend, std::string* report) {
  if (cfg.memory_budget.empty()) return cfg;
  std::string how;
  const uint64_t budget = resolve_memory_budget(cfg.memory_budget, "train.memory_budget", cfg, backend, &how);
  // A GPU run is planned on the host (as `brisk plan` does): the search
  // builds a model per setting, whose weights need not visit the GPU.
  std::unique_ptr<cpu::CpuBackend> host;
  if (!backend.device().is_host()) host = std::make_unique<cpu::CpuBackend>(1);
  const TuneResult r = tune_for_budget(cfg, budget, host ? *host : backend);
  if (report) *report = "train.memory_budget: " + (how.empty() ? "" : how + "; ") + r.summary + "\n" + candidates_table(r);
  return r.chosen;
}

}  // namespace brisk::train
