// One thread owns the engine; see brisk/serve/scheduler.h.
#include "brisk/serve/scheduler.h"

#include <algorithm>

#include "brisk/core/error.h"

namespace brisk::serve {

bool Channel::next(std::vector<infer::TokenEvent>& out) {
  std::unique_lock lk(m_);
  cv_.wait(lk, [&] { return !events_.empty() || closed_; });
  out.clear();
  out.swap(events_);
  return !(out.empty() && closed_);
}

std::string Channel::error() const {
  std::lock_guard lk(m_);
  return error_;
}

int Channel::error_status() const {
  std::lock_guard lk(m_);
  return error_status_;
}

void Channel::push(const infer::TokenEvent& e) {
  {
    std::lock_guard lk(m_);
    if (closed_) return;
    events_.push_back(e);
    if (e.finish != infer::Finish::none) closed_ = true;
  }
  cv_.notify_all();
}

void Channel::fail(int status, const std::string& message) {
  {
    std::lock_guard lk(m_);
    if (closed_) return;
    error_ = message;
    error_status_ = status;
    closed_ = true;
  }
  cv_.notify_all();
}

Scheduler::Scheduler(infer::Engine& engine, int max_queue)
    : engine_(engine), max_queue_(size_t(std::max(0, max_queue))), thread_([this] { run(); }) {}

Scheduler::~Scheduler() { stop(); }

std::shared_ptr<Channel> Scheduler::submit(std::vector<int32_t> prompt, const infer::SamplingParams& params) {
  auto ch = std::make_shared<Channel>();
  {
    std::lock_guard lk(m_);
    if (stopping_) {
      ch->fail(503, "the server is shutting down");
      return ch;
    }
    if (queue_.size() >= max_queue_) return nullptr;
    queue_.push_back(Pending{std::move(prompt), params, ch});
  }
  cv_.notify_all();
  return ch;
}

void Scheduler::cancel(const std::shared_ptr<Channel>& ch) {
  if (!ch) return;
  ch->cancel_ = true;
  {
    std::lock_guard lk(m_);
    wake_ = true;
  }
  cv_.notify_all();
}

size_t Scheduler::queued() const {
  std::lock_guard lk(m_);
  return queue_.size();
}

void Scheduler::stop() {
  {
    std::lock_guard lk(m_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

// Admits waiting requests in arrival order until the engine refuses one
// (no free slot or cache blocks): it stays at the front for the next step,
// so a long request is not overtaken forever by shorter ones.
void Scheduler::admit() {
  for (;;) {
    Pending p;
    {
      std::lock_guard lk(m_);
      if (queue_.empty()) return;
      p = std::move(queue_.front());
      queue_.pop_front();
    }
    if (p.ch->cancel_) {
      p.ch->fail(499, "cancelled");
      continue;
    }
    int64_t id = -1;
    try {
      id = engine_.add(p.prompt, p.params);
    } catch (const core::Error& e) {
      p.ch->fail(400, e.what());
      continue;
    }
    if (id >= 0) {
      running_[id] = p.ch;
      continue;
    }
    if (engine_.idle()) {
      // Refused with nothing running: it can never fit.
      p.ch->fail(400, "the request needs more key/value cache than the server has (raise --kv-mb or lower max_tokens)");
      continue;
    }
    std::lock_guard lk(m_);
    queue_.push_front(std::move(p));
    return;
  }
}

void Scheduler::cancel_running() {
  for (auto& [id, ch] : running_)
    if (ch->cancel_) engine_.cancel(id);
}

void Scheduler::run() {
  for (;;) {
    {
      std::unique_lock lk(m_);
      cv_.wait(lk, [&] { return stopping_ || wake_ || !queue_.empty() || !running_.empty(); });
      if (stopping_) break;
      wake_ = false;
    }
    cancel_running();
    admit();
    if (engine_.idle()) continue;
    std::vector<infer::TokenEvent> events;
    try {
      events = engine_.step();
    } catch (const std::exception& e) {
      // Nothing in a step depends on the request, so this is the engine's
      // failure: every running request gets the message rather than a hang.
      for (auto& [id, ch] : running_) {
        ch->fail(500, std::string("inference failed: ") + e.what());
        engine_.cancel(id);
      }
      running_.clear();
      continue;
    }
    for (const infer::TokenEvent& e : events) {
      auto it = running_.find(e.seq);
      if (it == running_.end()) continue;
      if (e.finish == infer::Finish::cancelled)
        it->second->fail(499, "cancelled");
      else
        it->second->push(e);
      if (e.finish != infer::Finish::none) running_.erase(it);
    }
  }
  for (auto& [id, ch] : running_) ch->fail(503, "the server is shutting down");
  running_.clear();
  std::lock_guard lk(m_);
  for (Pending& p : queue_) p.ch->fail(503, "the server is shutting down");
  queue_.clear();
}

}  // namespace brisk::serve
