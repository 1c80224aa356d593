// The communication thread (comm_thread.h).
#include "brisk/dist/comm_thread.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace brisk::dist {

namespace {
double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
}  // namespace

CommThread::CommThread(int rank, double timeout_s) : rank_(rank), timeout_s_(timeout_s), thread_([this] { loop(); }) {}

CommThread::~CommThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  thread_.join();
}

void CommThread::submit(std::function<void()> job, const char* what) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back({std::move(job), what});
    ++pending_;
  }
  work_cv_.notify_one();
}

void CommThread::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ and nothing left
    Job job = std::move(queue_.front());
    queue_.pop_front();
    running_ = job.what;
    lock.unlock();
    const double t0 = now_s();
    std::exception_ptr err;
    try {
      job.fn();
    } catch (...) {
      err = std::current_exception();
    }
    const double dt = now_s() - t0;
    lock.lock();
    busy_s_ += dt;
    running_ = nullptr;
    if (err && !error_) error_ = err;
    --pending_;
    ++finished_;
    done_cv_.notify_all();
  }
}

void CommThread::wait() {
  const double t0 = now_s();
  std::unique_lock<std::mutex> lock(mu_);
  // The limit is per collective, not on the whole wait: a step's queued
  // buckets together may take longer than dist.timeout_s on a slow link
  // while each of them finishes (a healthy job was ended as if a rank died).
  const auto limit = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(timeout_s_));
  auto deadline = std::chrono::steady_clock::now() + limit;
  int64_t finished = finished_;
  while (pending_ > 0) {
    const bool expired = done_cv_.wait_until(lock, deadline) == std::cv_status::timeout;
    if (finished_ != finished) {
      finished = finished_;
      deadline = std::chrono::steady_clock::now() + limit;
    } else if (expired && pending_ > 0) {
      timed_out(running_ ? running_ : (queue_.empty() ? "a collective" : queue_.front().what));
    }
  }
  waited_s_ += now_s() - t0;
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

void CommThread::run(std::function<void()> job, const char* what) {
  submit(std::move(job), what);
  wait();
}

double CommThread::busy_seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return busy_s_;
}

void CommThread::reset_times() {
  std::lock_guard<std::mutex> lock(mu_);
  busy_s_ = 0;
  waited_s_ = 0;
}

void CommThread::timed_out(const std::string& what) {
  // The collective cannot be cancelled and MPI cannot be finalised with it in
  // flight: say what happened and leave at once (the launcher ends the rest).
  std::fprintf(stderr,
               "brisk: rank %d: %s at step %lld got no answer from the other ranks for %.10g s (dist.timeout_s): a rank "
               "died, hangs or cannot be reached, or this one collective needs longer than that (a large transfer on "
               "a slow link: raise dist.timeout_s); stopping this rank\n",
               rank_, what.c_str(), (long long)step_, timeout_s_);
  std::fflush(stderr);
  std::_Exit(3);
}

}  // namespace brisk::dist
