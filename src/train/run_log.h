// What a training run shows and records between steps: the live progress
// line on stderr and the rows of metrics.jsonl. Both format into fixed
// buffers, so a step in the steady state allocates nothing (the whole-step
// no-allocation test runs the trainer with both on).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "brisk/monitor/event_writer.h"

namespace brisk::train {

// One step's numbers, as shown and logged.
struct StepRow {
  int64_t step = 0;
  double loss = 0, lr = 0, grad_norm = 0, tokens_per_s = 0, ms_per_step = 0, mfu = 0;
  double data_wait_ms = 0, time_s = 0;
  const char* precision = "";
  const char* precision_path = "";
  bool scaled = false;  // loss scaling on: loss_scale and skipped are logged
  double loss_scale = 0;
  bool skipped = false;
  bool has_val_loss = false;
  double val_loss = 0;
  // Several processes: their number, and this step's gradient communication
  // (ms in collectives, ms the step waited for them; the rest was hidden).
  int world = 1;
  double comm_ms = 0, comm_exposed_ms = 0;
  // This process's resident memory after the step (VmRSS), MiB; < 0: unknown.
  double rss_mib = -1;
};

// "12s", "4m05s", "1h02m".
void format_duration(double seconds, char (&out)[32]);

// The live progress line of a terminal `columns` wide (0: unknown, all of
// it): fields are left out, least useful first (lr, RSS, the bar, ms/step,
// MFU, tok/s, then the ETA), until it fits in columns - 1; the step and the
// loss are cut at the width if even they do not fit.
std::string live_line(const StepRow& m, int64_t total, const char* eta, int columns);

// A live bar on a terminal (one line redrawn with \r), plain lines every
// log_every steps otherwise, nothing when disabled.
class Progress {
 public:
  Progress(bool enabled, bool live, int64_t total_steps, int64_t log_every);
  void step(const StepRow& r, double eta_s);
  void line(const std::string& s);  // a message above the bar
  void finish();

 private:
  bool enabled_, tty_;
  int64_t total_, log_every_;
};

// Opens a run's metrics.jsonl for appending: a resumed run (last_step > 0)
// keeps only the rows of steps up to its checkpoint, a fresh one starts it
// empty. The rewrite is atomic. Throws IoError naming the file.
std::FILE* open_metrics_for_append(const std::string& path, int64_t last_step);

// metrics.jsonl: one JSON object per step, appended and flushed as the run
// goes. It describes the steps the weights in its directory went through:
// opening it for a resumed run drops the rows logged after the checkpoint
// (a crash or a stop between checkpoints would otherwise leave those steps
// twice); a fresh run (last_step 0) starts it anew.
class MetricsLog {
 public:
  MetricsLog(const std::string& path, int64_t last_step);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;
  void write(const StepRow& r);  // throws IoError when the disk refuses

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

// The same row as TensorBoard scalars: every number MetricsLog::write puts
// in the row (skipped as 0 / 1), tagged with its metrics.jsonl key, as one
// event at r.step. tests/monitor/read_tfevents.py checks that the two agree.
void write_events(monitor::EventWriter& events, const StepRow& r);

}  // namespace brisk::train
