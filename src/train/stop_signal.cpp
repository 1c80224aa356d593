#include "stop_signal.h"

#include <atomic>

namespace brisk::train::detail {

namespace {
std::atomic<int> g_stop_signal{0};
extern "C" void on_stop_signal(int sig) { g_stop_signal = sig; }
}  // namespace

int stop_signal() { return g_stop_signal; }

const char* stop_signal_name(int sig) {
  return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a stop signal";
}

StopSignalGuard::StopSignalGuard() {
  g_stop_signal = 0;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  // Restart interrupted system calls: a signal landing in a write to a pipe
  // (the log) or a file must not turn a clean stop into a failed write.
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int_);
  sigaction(SIGTERM, &sa, &old_term_);
}

StopSignalGuard::~StopSignalGuard() {
  sigaction(SIGINT, &old_int_, nullptr);
  sigaction(SIGTERM, &old_term_, nullptr);
}

}  // namespace brisk::train::detail
