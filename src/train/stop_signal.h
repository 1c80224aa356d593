// SIGINT / SIGTERM during a training run: the handler only records the
// signal; the step loop reads it between steps, saves a checkpoint and stops,
// so Ctrl-C or a scheduler's TERM loses no finished step. Internal to
// src/train (the GPT trainer and the epoch-based ones share it).
#pragma once

#include <signal.h>

namespace brisk::train::detail {

// The signal received since the guard was installed, 0 if none.
int stop_signal();

// "SIGINT", "SIGTERM" or "a stop signal" (for the stop message).
const char* stop_signal_name(int sig);

// Installs the SIGINT/SIGTERM handlers for the life of a run and restores
// the previous ones after it.
class StopSignalGuard {
 public:
  StopSignalGuard();
  ~StopSignalGuard();
  StopSignalGuard(const StopSignalGuard&) = delete;
  StopSignalGuard& operator=(const StopSignalGuard&) = delete;

 private:
  struct sigaction old_int_ {}, old_term_ {};
};

}  // namespace brisk::train::detail
