// The server's HTTP threads: httplib runs each connection on one thread for
// as long as it stays open (keep-alive included), so a fixed pool (httplib's
// ThreadPool) let a few kept-alive connections hold every thread while new
// ones, /health included, waited in its queue for 5 s or for good. This
// pool starts with `base` threads and grows, one per connection that finds
// none idle, up to `max`; past that a connection waits as before. Threads
// stay once started (an idle one costs a stack's address space and a few
// KiB), until shutdown.
#pragma once

#include <httplib.h>

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace brisk::serve {

class ConnectionThreads : public httplib::TaskQueue {
 public:
  ConnectionThreads(size_t base, size_t max);
  ~ConnectionThreads() override;
  void enqueue(std::function<void()> fn) override;
  void shutdown() override;
  size_t threads() const;

 private:
  void run();

  const size_t max_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  size_t idle_ = 0;  // threads waiting for a job
  bool stop_ = false;
};

}  // namespace brisk::serve
