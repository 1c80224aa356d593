// The scheduler between the HTTP threads and the inference engine.
//
// The engine is not thread-safe, so one thread owns it: between two engine
// steps it admits queued requests (in arrival order, while the engine has a
// free slot and cache blocks), cancels the ones whose client has gone, runs
// step() and hands every TokenEvent to the Channel of its request. HTTP
// threads only touch the bounded queue (submit) and their own Channel.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "brisk/infer/engine.h"
#include "brisk/serve/metrics.h"

namespace brisk::serve {

// The events of one request, from the scheduler thread to the HTTP thread
// that answers it. Closed after the event that finishes the sequence, or
// with an error when the request could not run to its end.
class Channel {
 public:
  // Blocks until there are events or the channel is closed; moves the
  // pending events into `out`. False once closed with nothing left.
  bool next(std::vector<infer::TokenEvent>& out);
  // The reason it was closed without a finishing event (empty otherwise),
  // and the HTTP status that fits it: 400 the request cannot run, 500 the
  // engine failed, 503 the server is stopping (499: the client went away,
  // so nobody reads it).
  std::string error() const;
  int error_status() const;
  // A channel that already holds a finished sequence's events and is closed
  // (a response cache hit replays through it).
  static std::shared_ptr<Channel> replay(std::vector<infer::TokenEvent> events);

 private:
  friend class Scheduler;
  void push(const infer::TokenEvent& e);
  void fail(int status, const std::string& message);

  mutable std::mutex m_;
  std::condition_variable cv_;
  std::vector<infer::TokenEvent> events_;
  bool closed_ = false;
  std::string error_;
  int error_status_ = 0;
  std::atomic<bool> cancel_{false};  // set by the HTTP side when its client left
  // Set and read by the scheduler thread only (latency metrics).
  double submitted_ = 0, last_token_ = 0;
  bool got_token_ = false, timed_out_ = false;
};

class Scheduler {
 public:
  // `engine` must outlive the scheduler and is used only by its thread from
  // now on. At most `max_queue` requests wait for admission at once.
  // A request still queued or running `request_timeout_s` seconds after it
  // was submitted is dropped and its channel closed with 504 (0: no limit).
  Scheduler(infer::Engine& engine, int max_queue, double request_timeout_s = 0);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request; nullptr when the queue is full (the caller answers 429).
  // The parameters should already be validated: an engine refusal closes the
  // channel with its message.
  std::shared_ptr<Channel> submit(std::vector<int32_t> prompt, const infer::SamplingParams& params);
  // The client is gone: drop the request if queued, cancel it if running.
  void cancel(const std::shared_ptr<Channel>& ch);
  // Closes every open channel with an error and joins the thread. Idempotent.
  void stop();
  size_t queued() const;
  int64_t running() const { return running_count_.load(); }  // sequences in the engine
  Metrics& metrics() { return metrics_; }

 private:
  struct Pending {
    std::vector<int32_t> prompt;
    infer::SamplingParams params;
    std::shared_ptr<Channel> ch;
  };
  void run();
  void admit();
  // Takes the waiting requests whose client left (499) or whose time is up
  // (504) out of the queue, wherever they wait; m_ held. Otherwise they held
  // their places until they reached the front, and --max-queue refused
  // live requests (429) for them.
  void drop_abandoned_locked();
  void cancel_running();
  std::string timeout_message() const;
  bool expired(const Channel& ch, double now) const { return timeout_s_ > 0 && now - ch.submitted_ > timeout_s_; }
  void deliver(const infer::TokenEvent& e, Channel& ch, double now);
  void publish();

  infer::Engine& engine_;
  const size_t max_queue_;
  const double timeout_s_;
  mutable std::mutex m_;
  std::condition_variable cv_;
  std::deque<Pending> queue_;
  bool stopping_ = false;
  bool wake_ = false;  // a cancel arrived
  // Running sequences by engine id; touched only by the scheduler thread.
  std::unordered_map<int64_t, std::shared_ptr<Channel>> running_;
  std::atomic<int64_t> running_count_{0};
  Metrics metrics_;
  std::thread thread_;
};

}  // namespace brisk::serve
