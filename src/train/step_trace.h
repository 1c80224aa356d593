// `brisk train --trace` (docs/monitoring.md): a timeline of chosen steps in
// the Chrome trace event format, for https://ui.perfetto.dev or
// chrome://tracing. Each traced step is one "step" event on the trainer
// thread holding, in time order, its data waits, its micro-steps (each the
// kernels of the train program, as core::Executor::set_trace records them:
// name = op name, args = node, input and output shapes), the gradient
// communication (several ranks) and the optimizer step. Kernels run one by
// one with a synchronize after each while traced, as under --profile, so a
// traced step is a little slower than the others; the rest run untouched.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "brisk/core/executor.h"

namespace brisk::train {

class StepTrace {
 public:
  // steps: the 1-based numbers (metrics.jsonl's "step") of the steps to trace.
  StepTrace(std::string path, std::vector<int64_t> steps);

  // The default steps of a run that starts after `start` and ends at `total`:
  // the third to fifth of its steps (the first two warm caches and pools up),
  // or its last one when it is shorter.
  static std::vector<int64_t> default_steps(int64_t start, int64_t total);

  bool wants(int64_t step) const;
  // Step `step` starts: `exec` (the train program) records its kernels.
  void begin(int64_t step, core::Executor& exec);
  // A span of the trainer thread in the step that began (seconds on
  // steady_clock, monitor::now_seconds()); micro = -1 when it belongs to no micro-step.
  void span(const char* name, const char* cat, double start_s, double end_s, int64_t micro = -1);
  // The step ends (start_s .. end_s: the step time metrics.jsonl reports).
  // After the last chosen step the file is written.
  void end(double start_s, double end_s);
  // Writes what has been traced to path (a temporary file renamed into
  // place). Called by end() after the last step, and by the trainer for a run
  // that stopped before it; true when something was written.
  bool write();

  const std::string& path() const { return path_; }
  const std::vector<int64_t>& steps() const { return steps_; }
  bool written() const { return written_; }

 private:
  struct Span {
    const char* name;
    const char* cat;
    double start_s, end_s;
    int64_t micro;
  };
  std::string path_;
  std::vector<int64_t> steps_;
  int64_t current_ = -1;            // the step being traced, -1 between steps
  core::Executor* exec_ = nullptr;  // its train program
  std::vector<core::Executor::KernelSpan> kernels_;
  std::vector<Span> spans_;
  std::string events_;              // JSON events of the steps traced so far, comma-separated
  double origin_s_ = -1;            // ts 0: the start of the first traced step
  int64_t traced_ = 0;
  bool written_ = false;
};

}  // namespace brisk::train
