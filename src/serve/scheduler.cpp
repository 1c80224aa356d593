// One thread owns the engine; see brisk/serve/scheduler.h.
#include "brisk/serve/scheduler.h"

#include <algorithm>
#include <chrono>

#include "brisk/core/error.h"
#include "brisk/serve/api.h"

namespace brisk::serve {

namespace {
double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

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

std::shared_ptr<Channel> Channel::replay(std::vector<infer::TokenEvent> events) {
  auto ch = std::make_shared<Channel>();
  ch->events_ = std::move(events);
  ch->closed_ = true;
  return ch;
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

Scheduler::Scheduler(infer::Engine& engine, int max_queue, double request_timeout_s)
    : engine_(engine),
      max_queue_(size_t(std::max(0, max_queue))),
      timeout_s_(std::max(0.0, request_timeout_s)) {
  // Set before the thread starts, which from then on owns the engine and
  // writes only the atomics; /metrics reads them. The engine is idle: every
  // block is free (kv_blocks_free was 0 until the first step, so a fresh
  // server reported its whole pool as used).
  metrics_.slots_total = engine.options().max_seqs;
  metrics_.kv_blocks_total = engine.kv_blocks_free();
  metrics_.kv_blocks_free = metrics_.kv_blocks_total;
  thread_ = std::thread([this] { run(); });
}

Scheduler::~Scheduler() { stop(); }

std::shared_ptr<Channel> Scheduler::submit(std::vector<int32_t> prompt, const infer::SamplingParams& params) {
  auto ch = std::make_shared<Channel>();
  ch->submitted_ = now_seconds();  // read by the scheduler thread after the queue's lock hands it over
  {
    std::lock_guard lk(m_);
    if (stopping_) {
      ch->fail(503, "the server is shutting down");
      return ch;
    }
    if (queue_.size() >= max_queue_) drop_abandoned_locked();
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

void Scheduler::drop_abandoned_locked() {
  const double now = now_seconds();
  std::erase_if(queue_, [&](const Pending& p) {
    if (p.ch->cancel_) p.ch->fail(499, "cancelled");
    else if (expired(*p.ch, now)) p.ch->fail(504, timeout_message());
    else return false;
    return true;
  });
}

// Admits waiting requests in arrival order until the engine refuses one
// (no free slot or cache blocks): it stays at the front for the next step,
// so a long request is not overtaken forever by shorter ones.
void Scheduler::admit() {
  {
    std::lock_guard lk(m_);
    drop_abandoned_locked();
  }
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
    if (expired(*p.ch, now_seconds())) {
      p.ch->fail(504, timeout_message());
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
      metrics_.prompt_tokens += p.prompt.size();
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

// Sequences whose client left or whose time is up leave at the next step.
void Scheduler::cancel_running() {
  const double now = now_seconds();
  for (auto& [id, ch] : running_) {
    if (!ch->timed_out_ && expired(*ch, now)) ch->timed_out_ = true;
    if (ch->cancel_ || ch->timed_out_) engine_.cancel(id);
  }
}

std::string Scheduler::timeout_message() const { return request_timeout_message(timeout_s_); }

// Hands one event to its request and times it (first token, gap since the last).
void Scheduler::deliver(const infer::TokenEvent& e, Channel& ch, double now) {
  if (e.finish == infer::Finish::cancelled) {
    if (ch.timed_out_) ch.fail(504, timeout_message());
    else ch.fail(499, "cancelled");
    return;
  }
  // The counters first: the last event wakes the request's handler, which
  // can answer before this thread goes on, and a client that reads /metrics
  // right after its response must find its tokens counted (under ASan the
  // handler won that race and a test saw 7 of 8 tokens).
  metrics_.prefix_cached_tokens += uint64_t(e.cached_prompt_tokens);  // non-zero on a sequence's first event only
  if (e.choice.token >= 0) {  // (a prompt scored with max_tokens 0 ends with no token)
    ++metrics_.generation_tokens;
    if (!ch.got_token_) metrics_.time_to_first_token.observe(now - ch.submitted_);
    else metrics_.inter_token_latency.observe(now - ch.last_token_);
    ch.got_token_ = true;
    ch.last_token_ = now;
  }
  if (e.finish != infer::Finish::none) metrics_.request_latency.observe(now - ch.submitted_);
  ch.push(e);
}

// The gauges /metrics shows, after every step (only this thread may ask the engine).
void Scheduler::publish() {
  running_count_ = int64_t(running_.size());
  metrics_.slots_busy = int64_t(running_.size());
  metrics_.kv_blocks_free = engine_.kv_blocks_free();
  metrics_.kv_blocks_cached = engine_.kv_blocks_cached();
  metrics_.queue_length = int64_t(queued());
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
    publish();
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
      publish();
      continue;
    }
    const double now = now_seconds();
    // A request's last event wakes its handler, which may answer before
    // this thread goes on: the gauges are published first, with its slot and
    // blocks already returned (the engine released them in step()).
    std::vector<std::pair<const infer::TokenEvent*, std::shared_ptr<Channel>>> last;
    for (const infer::TokenEvent& e : events) {
      auto it = running_.find(e.seq);
      if (it == running_.end()) continue;
      if (e.finish == infer::Finish::none) {
        deliver(e, *it->second, now);
        continue;
      }
      last.emplace_back(&e, std::move(it->second));
      running_.erase(it);
    }
    ++metrics_.engine_steps;
    publish();
    for (auto& [e, ch] : last) deliver(*e, *ch, now);
  }
  for (auto& [id, ch] : running_) ch->fail(503, "the server is shutting down");
  running_.clear();
  running_count_ = 0;
  std::lock_guard lk(m_);
  for (Pending& p : queue_) p.ch->fail(503, "the server is shutting down");
  queue_.clear();
}

}  // namespace brisk::serve
