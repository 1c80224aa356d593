// One thread that runs a communicator's collectives, in the order they were
// submitted, while the submitting thread computes: the gradient buckets'
// all-reduces run during backward this way. Every MPI call of a process
// goes through it (MPI is initialised with MPI_THREAD_SERIALIZED).
//
// A collective that another rank never joins would block for ever: wait()
// gives up after the timeout, prints which rank waited for what, and ends
// the process with exit status 3, so a dead or hung rank never leaves the
// others hanging silently (the launcher then stops the rest of the job).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace brisk::dist {

class CommThread {
 public:
  CommThread(int rank, double timeout_s);
  ~CommThread();
  CommThread(const CommThread&) = delete;
  CommThread& operator=(const CommThread&) = delete;

  // Queues `job`; `what` names it in a timeout message.
  void submit(std::function<void()> job, const char* what);
  // Blocks until every submitted job ran; rethrows the first job's exception.
  void wait();
  // submit + wait.
  void run(std::function<void()> job, const char* what);

  // Seconds the thread spent inside jobs, and seconds wait() blocked, since
  // the last reset: their difference is communication hidden behind compute.
  double busy_seconds() const;
  double waited_seconds() const { return waited_s_; }
  void reset_times();
  // The step number named in timeout messages.
  void set_step(int64_t step) { step_ = step; }

 private:
  void loop();
  [[noreturn]] void timed_out(const std::string& what);

  const int rank_;
  const double timeout_s_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  struct Job {
    std::function<void()> fn;
    const char* what;
  };
  std::deque<Job> queue_;
  const char* running_ = nullptr;  // the job in flight, for the timeout message
  int64_t pending_ = 0;            // submitted and not finished
  int64_t finished_ = 0;           // ever finished: a wait's deadline restarts when it grows
  std::exception_ptr error_;
  bool stop_ = false;
  double busy_s_ = 0, waited_s_ = 0;
  int64_t step_ = 0;
  std::thread thread_;
};

}  // namespace brisk::dist
