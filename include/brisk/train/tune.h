// Memory-budget tuning: which micro-batch, recomputation level and
// fused-classifier setting a GPT training config should run with to fit a
// host-memory budget, decided from the memory planner alone (nothing is
// allocated beyond a model's weights, nothing is run). `brisk tune` prints
// the search and writes the tuned config; `train.memory_budget` makes the
// same choice at trainer start-up. docs/tuning.md describes the estimate and
// the measurements that check it against peak RSS.
//
// The estimate of a run's peak RSS (RunMemoryEstimate) is the planner's
// figures (parameters, gradients, AdamW moments, the train program's arena)
// plus what a `brisk train` process holds beside them: the eval program's
// arena (unfused: its logits exist), the loader's slots and eval token
// buffers, the memory-mapped token shards, the staging of a checkpoint
// write, and a fixed process baseline (code, libraries, thread stacks, BLAS
// buffers), each measured and explained in docs/tuning.md.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "brisk/core/backend.h"
#include "brisk/core/graph.h"
#include "brisk/core/planner.h"
#include "brisk/train/config.h"

namespace brisk::train {

// "4GiB", "512MiB", "64KiB", "1.5GB", "300MB", "2kB", "123456" or
// "123456B" -> bytes (binary units are powers of 1024, decimal ones of 1000;
// case-insensitive; one optional space). Throws ConfigError naming `what`
// (the key or option) and the accepted forms.
uint64_t parse_byte_size(const std::string& text, const std::string& what);

// A budget as written ("auto" or a size for parse_byte_size), in bytes.
// "auto" is what the run may use, read when it starts: for a CPU run
// kAutoHostShare of the host's MemAvailable; for a GPU run (train.device =
// "cuda") kAutoDeviceShare of the device's free memory, which needs the
// run's own CUDA backend (Backend::device_memory(); elsewhere it is an
// error). `how` receives the line saying where an "auto" figure came from.
inline constexpr double kAutoHostShare = 0.9, kAutoDeviceShare = 0.95;
uint64_t resolve_memory_budget(const std::string& text, const std::string& what, const TrainConfig& cfg,
                               const core::Backend& backend, std::string* how);
// Bytes as "1.50 GiB" / "512.0 MiB" / "900 B": for messages and tables.
std::string format_bytes(uint64_t bytes);

// Matrix-product and attention FLOPs (multiply-adds x 2) of a graph,
// forward and backward, counted the way GptConfig::flops_per_token does;
// elementwise ops left out. Recomputation's extra cost is the difference
// between two levels' counts (`brisk plan` prints it too).
double graph_matmul_flops(const core::Graph& g);

// A fixed share of a `brisk train` process's peak RSS that no planner
// figure explains: the binary and its shared libraries (oneDNN, OpenBLAS,
// OpenSSL, protobuf, the C++ runtime: ~22 MiB of file-backed pages), heap
// bookkeeping, OpenMP and loader thread stacks, BLAS packing buffers and
// oneDNN's primitive cache. Measured at 35 to 44 MiB (W1, W2, 2 threads;
// the same run varies by up to 9 MiB from one start to the next;
// docs/tuning.md); 48 keeps a run planned just under a budget under it.
inline constexpr uint64_t kProcessBaselineBytes = uint64_t(48) << 20;

// The same for a run with train.device = "cuda", in GPU memory: the CUDA
// context (the driver's own reservation and the loaded kernel images),
// cuBLASLt's handle and its 32 MiB workspace, and the rounding of the
// parameter store's one allocation per tensor. A GPU run reports what it
// held (`brisk train`'s summary: the driver's total - free beside the
// plan's figures), which is what this figure is checked against
// (docs/tuning.md).
inline constexpr uint64_t kCudaProcessBytes = uint64_t(1) << 30;

// The planned peak of a run of `cfg`, part by part: its peak RSS on the
// CPU; with train.device = "cuda" its GPU memory, where the host's parts
// (loader, data, checkpoint staging) are 0 and the baseline is
// kCudaProcessBytes.
struct RunMemoryEstimate {
  core::MemoryReport train;   // params, grads, AdamW moments, the train arena
  uint64_t eval_arena = 0;    // the eval program's arena (train.eval_every > 0)
  uint64_t loader = 0;        // loader slots + the trainer's eval token buffers
  uint64_t data = 0;          // the token shards of data.dir (mapped and read whole)
  uint64_t checkpoint = 0;    // a checkpoint write's staging (the largest transposed block weight)
  uint64_t baseline = kProcessBaselineBytes;
  bool gpu = false;           // GPU memory (train.device = "cuda"), not host RSS
  double flops_per_micro_step = 0;  // graph_matmul_flops of the train program
  uint64_t total() const {
    return train.total() + eval_arena + loader + data + checkpoint + baseline;
  }
};

// The model config a run of `cfg` builds, as its device runs it, for
// planning on this machine (`brisk plan`, the tuner): the compute dtype of
// train.precision on train.device (a GPU's native bf16, not this CPU's
// fp32 fallback), its fusions (GptConfig::with_fusions_for) and, on a GPU,
// its classifier chunks (models::kDeviceClassifierChunkFloats) unless the
// config sets them. The
// graph is otherwise the same: the CPU backend has a kernel for every
// (op, dtype) the GPT uses on the GPU. `recompute` (when not empty) plans
// that level instead of the config's; the fusions resolve for it.
models::GptConfig planned_model_config(const TrainConfig& cfg, const std::string& recompute = "");

// Plans `cfg` as `brisk train` would run it in one process (its batch,
// recompute level, classifier setting, precision; on a GPU as the GPU runs
// it, as `brisk plan` does). Builds a model (weights allocated) on `backend`
// (the CPU's, for either device) to know the parameters; plans, never runs.
RunMemoryEstimate estimate_run_memory(const TrainConfig& cfg, core::Backend& backend);

// The largest b in [1, max_batch] with fits(b), where fits is monotone
// (true up to some b, false after): a binary search. 0 when fits(1) is false.
int64_t largest_fitting(int64_t max_batch, const std::function<bool(int64_t)>& fits);

// One (recompute, fused_classifier) setting of the search and the largest
// micro-batch at which it fits.
struct TuneCandidate {
  std::string recompute;              // none | selective | full
  bool fused_classifier = false;
  int64_t batch = 0, grad_accum = 0;  // batch 0: does not fit even at micro-batch 1
  RunMemoryEstimate memory;           // at `batch` (at batch 1 when it does not fit)
  double flops_per_token = 0;         // train program FLOPs / tokens of a micro-step
  double relative_throughput = 0;     // estimated tokens/s against the best candidate (1.0)
  bool fits() const { return batch > 0; }
};

struct TuneResult {
  uint64_t budget = 0;
  int64_t global_batch = 0;             // train.batch x train.grad_accum, kept
  RunMemoryEstimate original;           // the config as given
  std::vector<TuneCandidate> candidates;  // ranked: fitting ones first, best first
  TrainConfig chosen;                   // cfg with batch, grad_accum, recompute, fused_classifier of candidates[0]
  std::string summary;                  // what was chosen and why; or why nothing fits, naming the minimum
  bool fits() const { return !candidates.empty() && candidates.front().fits(); }
};

// Searches every (recompute, fused_classifier) pair for the largest
// micro-batch b dividing the global batch G = train.batch x train.grad_accum
// whose planned peak fits `budget` (grad_accum = G / b, so the tokens per
// optimizer step stay the same), ranks the fitting ones by estimated
// throughput (fewest FLOPs per token, recomputation included; then the
// larger micro-batch; then the cheaper recompute level; then the config's
// own classifier setting) and returns the best as a config. Throws
// ConfigError when nothing fits, naming the smallest planned peak.
TuneResult tune_for_budget(const TrainConfig& cfg, uint64_t budget, core::Backend& backend);
// The same search without the verdict: when nothing fits, fits() is false,
// `chosen` is unset and `summary` is the error tune_for_budget would throw
// (`brisk tune` prints the candidates first).
TuneResult search_budget(const TrainConfig& cfg, uint64_t budget, core::Backend& backend);

// `cfg` run as candidate `c`: its micro-batch, grad_accum, recompute level
// and classifier setting; eval_batches raised so that evaluation at the
// smaller micro-batch scores the config's windows; memory_budget cleared
// (the result describes the run). What `chosen` is, and what `brisk tune
// --time-top` times and writes.
TrainConfig config_for(const TrainConfig& cfg, const TuneCandidate& c);

// The candidates as a table (one row each), for `brisk tune` and the trainer.
std::string candidates_table(const TuneResult& r);

// train.memory_budget at start-up: `cfg` tuned to its budget (memory_budget
// cleared, so the result describes the run), and the lines saying what was
// chosen and why in *report. A config without a budget comes back as it is.
// With train.device = "cuda" the budget is GPU memory; `backend` is the
// run's, the planning happens on a CPU backend of its own.
TrainConfig apply_memory_budget(const TrainConfig& cfg, core::Backend& backend, std::string* report);

}  // namespace brisk::train
