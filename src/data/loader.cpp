// The prefetching loader (loader.h) and the token-window source.
//
// The ring: step s always lives in slot s % n, and a worker may claim step s
// only once step s - n has been handed back by the consumer. Claims are made
// in order under one mutex, so the slot a step lands in, and which step the
// consumer waits for, never depend on which worker was faster; only the fill
// itself runs outside the lock, in parallel. One mutex is plenty: a claim or
// a hand-back is a few hundred nanoseconds against a fill of microseconds to
// milliseconds, and a single lock keeps the ordering argument obvious.
//
// Slots are allocated once and carved into 64-byte-aligned arrays, so the
// steady state allocates nothing and a page-locked allocator covers every
// byte the GPU copy reads.
#include "brisk/data/loader.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "brisk/core/error.h"
#include "brisk/data/shards.h"

namespace brisk::data {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

// ---- token windows -----------------------------------------------------------------

TokenWindowSource::TokenWindowSource(const TokenDataset& data, int64_t batch, int64_t seq, uint64_t seed)
    : data_(data), batch_(batch), seq_(seq), seed_(seed) {
  // WindowSampler validates batch, seq and the split's length, with messages
  // that name them: construct one now so a bad setting fails here, not in a
  // worker thread.
  WindowSampler probe(data, batch, seq, seed);
}

BatchCapacity TokenWindowSource::capacity() const {
  BatchCapacity c;
  c.rows = batch_;
  c.cols = seq_;
  c.targets = true;
  return c;
}

void TokenWindowSource::fill(uint64_t global_index, Batch& out) const {
  // WindowSampler is counter-based: positioned at g*B it draws exactly the
  // windows an uninterrupted sampler would, so reusing it (rather than a
  // copy of its formula) keeps loader batches and checkpoints' data_position
  // in lockstep by construction. It holds no buffer (constructing
  // one allocates nothing), so concurrent fills share nothing but the
  // read-only mapped dataset.
  WindowSampler sampler(data_, batch_, seq_, seed_);
  sampler.set_position(global_index * static_cast<uint64_t>(batch_));
  out.rows = batch_;
  out.cols = seq_;
  sampler.next(out.inputs, out.targets);
}

// ---- the loader --------------------------------------------------------------------

Loader::Loader(const BatchSource& source, const LoaderOptions& options, core::Allocator& allocator)
    : source_(source), options_(options), allocator_(allocator), cap_(source.capacity()) {
  if (options_.workers < 0 || options_.workers > 256)
    throw core::ConfigError("loader: workers must be in [0, 256], got " + std::to_string(options_.workers));
  if (options_.prefetch_factor < 1)
    throw core::ConfigError("loader: prefetch_factor must be at least 1, got " +
                            std::to_string(options_.prefetch_factor));
  if (options_.world_size < 1 || options_.rank < 0 || options_.rank >= options_.world_size)
    throw core::ConfigError("loader: rank " + std::to_string(options_.rank) + " is outside world size " +
                            std::to_string(options_.world_size));
  if (cap_.rows <= 0 || cap_.cols <= 0)
    throw core::ConfigError("loader: the source's batch capacity (" + std::to_string(cap_.rows) + " x " +
                            std::to_string(cap_.cols) + ") must be positive");

  const size_t cells = static_cast<size_t>(cap_.rows * cap_.cols), rows = static_cast<size_t>(cap_.rows);
  slot_bytes_ = core::align_up(cells * 4);
  if (cap_.targets) slot_bytes_ += core::align_up(cells * 4);
  if (cap_.lengths) slot_bytes_ += core::align_up(rows * 4);
  if (cap_.mask) slot_bytes_ += core::align_up(cells);
  if (cap_.labels) slot_bytes_ += core::align_up(rows * 4);

  const size_t n = static_cast<size_t>(options_.workers) * static_cast<size_t>(options_.prefetch_factor) + 1;
  slots_.resize(n);
  try {
    for (Slot& s : slots_) {
      s.memory = allocator_.allocate(slot_bytes_);
      carve(s);
    }
  } catch (...) {
    for (Slot& s : slots_)
      if (s.memory) allocator_.deallocate(s.memory, slot_bytes_);
    throw;
  }
}

Loader::~Loader() {
  stop_workers();
  for (Slot& s : slots_) allocator_.deallocate(s.memory, slot_bytes_);
}

void Loader::carve(Slot& s) {
  auto* p = static_cast<unsigned char*>(s.memory);
  const size_t cells = static_cast<size_t>(cap_.rows * cap_.cols), rows = static_cast<size_t>(cap_.rows);
  auto take = [&](size_t bytes) {
    unsigned char* q = p;
    p += core::align_up(bytes);
    return q;
  };
  Batch& b = s.batch;
  b.inputs = reinterpret_cast<int32_t*>(take(cells * 4));
  b.targets = cap_.targets ? reinterpret_cast<int32_t*>(take(cells * 4)) : nullptr;
  b.lengths = cap_.lengths ? reinterpret_cast<int32_t*>(take(rows * 4)) : nullptr;
  b.mask = cap_.mask ? take(cells) : nullptr;
  b.labels = cap_.labels ? reinterpret_cast<int32_t*>(take(rows * 4)) : nullptr;
}

void Loader::fill_slot(Slot& s, uint64_t step) {
  s.error = nullptr;
  s.batch.step = step;
  s.batch.global_index = step * static_cast<uint64_t>(options_.world_size) + static_cast<uint64_t>(options_.rank);
  s.batch.rows = s.batch.cols = 0;
  try {
    source_.fill(s.batch.global_index, s.batch);
    if (s.batch.rows <= 0 || s.batch.rows > cap_.rows || s.batch.cols <= 0 || s.batch.cols > cap_.cols)
      throw core::Error("loader: the source filled a " + std::to_string(s.batch.rows) + " x " +
                        std::to_string(s.batch.cols) + " batch, outside its capacity " +
                        std::to_string(cap_.rows) + " x " + std::to_string(cap_.cols));
  } catch (...) {
    s.error = std::current_exception();
  }
}

void Loader::start() {
  if (options_.workers == 0 || !threads_.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = false;
  }
  threads_.reserve(static_cast<size_t>(options_.workers));
  for (int i = 0; i < options_.workers; ++i) threads_.emplace_back([this] { worker_loop(); });
}

void Loader::stop_workers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

void Loader::worker_loop() {
  const uint64_t n = slots_.size();
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stop_ || next_claim_ < released_ + n; });
    if (stop_) return;
    const uint64_t step = next_claim_++;
    Slot& s = slots_[step % n];
    s.state = SlotState::kFilling;
    lock.unlock();
    const auto t0 = std::chrono::steady_clock::now();
    fill_slot(s, step);
    const double dt = seconds_since(t0);
    lock.lock();
    s.step = step;
    s.state = SlotState::kReady;
    fill_s_ += dt;
    ready_cv_.notify_all();
  }
}

const Batch& Loader::next() {
  const uint64_t n = slots_.size();
  const auto t0 = std::chrono::steady_clock::now();
  Slot& s = slots_[consumed_ % n];
  if (options_.workers == 0) {
    // No workers: the consumer assembles its own batch, all of it data wait.
    fill_slot(s, consumed_);
    s.step = consumed_;
    fill_s_ += seconds_since(t0);
  } else {
    start();
    std::unique_lock<std::mutex> lock(mu_);
    if (holding_) {
      // Hand the previous batch's slot back before waiting, so a worker can
      // refill it while we wait for this one.
      slots_[(consumed_ - 1) % n].state = SlotState::kFree;
      released_ = consumed_;
      holding_ = false;
      work_cv_.notify_one();
    }
    ready_cv_.wait(lock, [&] { return s.state == SlotState::kReady && s.step == consumed_; });
    holding_ = true;
  }
  stats_.last_wait_s = seconds_since(t0);
  stats_.wait_s_total += stats_.last_wait_s;
  stats_.batches += 1;
  consumed_ += 1;
  if (s.error) {
    std::exception_ptr e = s.error;
    s.error = nullptr;
    std::rethrow_exception(e);
  }
  return s.batch;
}

void Loader::set_position(uint64_t p) {
  stop_workers();
  std::lock_guard<std::mutex> lock(mu_);
  for (Slot& s : slots_) {
    s.state = SlotState::kFree;
    s.error = nullptr;
  }
  next_claim_ = released_ = consumed_ = p;
  holding_ = false;
  stop_ = false;
}

uint64_t Loader::epoch() const {
  const uint64_t per_epoch = source_.batches_per_epoch();
  if (per_epoch == 0) return 0;
  const uint64_t global = consumed_ * static_cast<uint64_t>(options_.world_size) + static_cast<uint64_t>(options_.rank);
  return global / per_epoch;
}

LoaderStats Loader::stats() const {
  LoaderStats s = stats_;
  std::lock_guard<std::mutex> lock(mu_);
  s.fill_s_total = fill_s_;
  return s;
}

}  // namespace brisk::data
