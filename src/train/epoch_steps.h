// The step loop pieces the two epoch-based runs share (the encoder
// classifier and the sequence autoencoder): the blocks' compute precision,
// the run directory, the program width of a batch, padding a loader batch
// to it, the throughput counters, and the metrics.jsonl row. Internal to
// src/train.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "brisk/core/error.h"
#include "brisk/core/safetensors.h"
#include "brisk/data/loader.h"
#include "brisk/models/transformer_block.h"
#include "brisk/train/config.h"
#include "run_log.h"

namespace brisk::train::detail {

// The precision the run's blocks compute in (the model's `compute` is
// compute_dtype(effective)): train.precision through resolve_precision, so
// bf16 falls back to fp32 where it would be emulated unless
// train.precision_fallback = false. Its warning and note go to `say`.
template <class Config, class Say>
PrecisionChoice epoch_precision(const Config& c, Say&& say) {
  PrecisionChoice p = resolve_precision(c.precision, c.precision_fallback, "cpu");
  if (!p.warning.empty()) say(p.warning + "\n");
  if (!p.note.empty()) say(p.note + "\n");
  return p;
}

// Programs are compiled per width (models::round_width).
using models::kSeqMultiple;
using models::round_width;

// The batch's rows right-padded with 0 to width T in `ids`; returns the
// number of real tokens (the sum of the rows' lengths).
inline int64_t pad_batch(const data::Batch& b, int64_t T, std::vector<int32_t>& ids) {
  ids.assign(size_t(b.rows * T), 0);
  int64_t real = 0;
  for (int64_t r = 0; r < b.rows; ++r) {
    std::copy_n(b.inputs + r * b.cols, b.cols, ids.begin() + r * T);
    real += b.lengths[r];
  }
  return real;
}

// Real tokens, padded cells and step seconds over the run and over the
// current log window.
struct StepCounters {
  double real_tokens = 0, cells = 0, seconds = 0;
  double window_tokens = 0, window_cells = 0, window_seconds = 0;
  void add(int64_t real, int64_t padded, double dt) {
    real_tokens += double(real), cells += double(padded), seconds += dt;
    window_tokens += double(real), window_cells += double(padded), window_seconds += dt;
  }
  void reset_window() { window_tokens = window_cells = window_seconds = 0; }
};

// The record cache's hits and lookups over the batches the run consumed
// (Batch::cache_hits). The cache's own counters also hold the lookups of
// batches the loader's workers prefetched past the last step, so they would
// make the rate depend on the worker count.
struct ConsumedCacheCounts {
  uint64_t hits = 0, lookups = 0;
  void add(const data::Batch& b) { hits += uint64_t(b.cache_hits), lookups += uint64_t(b.rows); }
  double hit_rate() const { return lookups ? double(hits) / double(lookups) : 0.0; }
};

// The progress line of step `step` of `total` (1-based `epoch`): the
// window's rate in `unit` ("tok/s", "res/s"), padding and cache hit rate,
// and the time left at the window's pace over its `window_steps` steps.
inline std::string progress_line(int64_t step, int64_t total, int64_t epoch, double loss, double lr, double hit,
                                 const StepCounters& count, int64_t window_steps, const char* unit) {
  const double eta = count.window_seconds / double(window_steps) * double(total - step);
  char line[256];
  std::snprintf(line, sizeof line,
                "step %5lld/%lld | epoch %lld | loss %.4f | lr %.2e | %6.0f %s | padding %4.1f%% | cache hit %4.1f%% "
                "| eta %.0fs\n",
                (long long)step, (long long)total, (long long)epoch, loss, lr, count.window_tokens / count.window_seconds,
                unit, 100.0 * (1.0 - count.window_tokens / count.window_cells), 100.0 * hit, eta);
  return line;
}

// The run directory: created, the config written to config.toml, and
// metrics.jsonl opened for the step rows (closed with this object). A run
// resumed at `last_step` keeps the rows of the steps up to it.
class RunDir {
 public:
  RunDir(const std::string& dir, const std::string& config_toml, int64_t last_step) {
    std::filesystem::create_directories(dir);
    core::write_file_atomic((std::filesystem::path(dir) / "config.toml").string(), config_toml);
    metrics = open_metrics_for_append((std::filesystem::path(dir) / "metrics.jsonl").string(), last_step);
  }
  ~RunDir() { std::fclose(metrics); }
  RunDir(const RunDir&) = delete;
  RunDir& operator=(const RunDir&) = delete;
  std::FILE* metrics;
};

// One metrics.jsonl row of a step (1-based `step`).
struct StepRow {
  int64_t step, epoch;
  double loss, lr, grad_norm, seconds;
  int64_t real, rows, width;
  double cache_hit_rate, data_wait_seconds;
};

// `v` printed with `format`, or null: JSON has no NaN or infinity, and a
// diverged step's row must still parse (`brisk report` reads it).
inline std::string json_number(const char* format, double v) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

inline void write_step_row(std::FILE* f, const StepRow& s) {
  std::fprintf(f,
               "{\"step\":%lld,\"epoch\":%lld,\"loss\":%s,\"lr\":%s,\"grad_norm\":%s,\"ms_per_step\":%.3f,"
               "\"tokens_per_s\":%s,\"batch_width\":%lld,\"padding_waste\":%.4f,\"cache_hit_rate\":%.4f,"
               "\"data_wait_ms\":%.3f}\n",
               (long long)s.step, (long long)s.epoch, json_number("%.6f", s.loss).c_str(),
               json_number("%.6g", s.lr).c_str(), json_number("%.6g", s.grad_norm).c_str(), s.seconds * 1e3,
               json_number("%.1f", double(s.real) / s.seconds).c_str(), (long long)s.width,
               1.0 - double(s.real) / double(s.rows * s.width), s.cache_hit_rate, s.data_wait_seconds * 1e3);
  // Whole rows on disk as they are written, as the GPT trainer's: a run
  // killed between checkpoints leaves a file `brisk report` can read.
  if (std::fflush(f) != 0) throw core::IoError(std::string("metrics.jsonl: write failed: ") + std::strerror(errno));
}

}  // namespace brisk::train::detail
