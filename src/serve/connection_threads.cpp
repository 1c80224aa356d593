// The server's growing pool of HTTP threads; see connection_threads.h.
#include "connection_threads.h"

#include <algorithm>

namespace brisk::serve {

ConnectionThreads::ConnectionThreads(size_t base, size_t max) : max_(std::max<size_t>({base, max, 1})) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < std::max<size_t>(base, 1); ++i) threads_.emplace_back([this] { run(); });
}

ConnectionThreads::~ConnectionThreads() { shutdown(); }

void ConnectionThreads::enqueue(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(mu_);
  jobs_.push_back(std::move(fn));
  // Every idle thread already has a job waiting for it: one more thread.
  if (idle_ < jobs_.size() && threads_.size() < max_ && !stop_) threads_.emplace_back([this] { run(); });
  cv_.notify_one();
}

void ConnectionThreads::shutdown() {
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    threads.swap(threads_);
  }
  cv_.notify_all();
  for (std::thread& t : threads) t.join();
}

size_t ConnectionThreads::threads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return threads_.size();
}

void ConnectionThreads::run() {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      ++idle_;
      cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
      --idle_;
      if (jobs_.empty()) return;  // stopping, nothing left to run
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
  }
}

}  // namespace brisk::serve
