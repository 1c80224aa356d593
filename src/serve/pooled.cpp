// PooledService (brisk/serve/pooled.h): one worker thread takes what waits,
// across requests, up to max_batch sequences in arrival order, sorts them by
// length and runs them as right-padded batches of similar lengths.
//
// Why these shapes: the models compile one program per (batch, width), so a
// forward's rows are padded to 1, 2, 4, 8 or a multiple of 8 (rows of one
// token, dropped) and its width rounded up to a multiple of 32 (or max_len):
// at most 3 + ceil(max_batch / 8) row counts times ceil(max_len / 32) widths
// are ever built, and
// a lone request costs one row, not max_batch. Every row costs its
// forward's whole width in the products, so the sorted rows are cut into
// forwards no wider than twice their shortest row's width.
#include "brisk/serve/pooled.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <exception>
#include <string>
#include <utility>

#include "brisk/models/transformer_block.h"
#include "brisk/serve/api.h"

namespace brisk::serve {

namespace {

constexpr int64_t kRowStep = 8;     // rows: 1, 2, 4, 8, then multiples of 8
// A forward's width is at most this many times the padded width of its
// shortest input: no input pays more than twice its own width.
constexpr int64_t kMaxWidthRatio = 2;

}  // namespace

struct PooledService::Job {
  const std::vector<std::vector<int32_t>>* sequences = nullptr;
  std::vector<std::vector<float>> out;
  size_t remaining = 0;
  bool stopped = false;  // dropped by stop() before it ran: 503
  std::string error;     // its forward failed: 500 with this
};

PooledService::PooledService(PooledModel model, int64_t max_batch, int64_t max_waiting, Metrics& metrics,
                             double request_timeout_s)
    : model_(std::move(model)),
      max_batch_(std::max<int64_t>(1, max_batch)),
      max_waiting_(std::max<int64_t>(1, max_waiting)),
      // Past ~30 years a deadline would overflow the clock: no limit.
      timeout_s_(request_timeout_s > 0 && request_timeout_s < 1e9 ? request_timeout_s : 0),
      metrics_(metrics) {
  metrics_.slots_total = max_batch_;
  worker_ = std::thread([this] { work(); });
}

PooledService::~PooledService() {
  stop();
  if (worker_.joinable()) worker_.join();
}

void PooledService::stop() {
  {
    std::lock_guard lk(m_);
    stopping_ = true;
  }
  work_cv_.notify_all();
}

void PooledService::wake() {
  { std::lock_guard lk(m_); }  // a run() between its check and its wait sees the flag or gets the notification
  done_cv_.notify_all();
}

size_t PooledService::drop_waiting(const Job& job) {
  const size_t n = std::erase_if(queue_, [&](const Item& it) { return it.job == &job; });
  metrics_.queue_length -= int64_t(n);
  return n;
}

std::vector<std::vector<float>> PooledService::run(const std::vector<std::vector<int32_t>>& sequences,
                                                    const std::atomic<bool>* client_gone) {
  if (sequences.empty()) return {};
  using Clock = std::chrono::steady_clock;
  const Clock::time_point deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s_));
  Job job;
  job.sequences = &sequences;
  job.out.resize(sequences.size());
  job.remaining = sequences.size();
  std::unique_lock lk(m_);
  if (stopping_) throw ApiError(503, "the server is shutting down", "", "server_error");
  if (jobs_ >= max_waiting_)
    throw ApiError(429, "too many requests are waiting (--max-queue " + std::to_string(max_waiting_) + ")", "",
                   "server_error");
  ++jobs_;
  for (size_t i = 0; i < sequences.size(); ++i) queue_.push_back({&job, i});
  metrics_.queue_length += int64_t(sequences.size());
  work_cv_.notify_one();
  // The worker holds pointers into `job` until its items are done, so the
  // job is waited for even when stopping (the worker then drops what it has
  // not taken; see work()) or giving up (this drops what is still queued;
  // what a forward has taken finishes first).
  int gave_up = 0;  // 499: the client is gone; 504: the timeout passed
  while (job.remaining > 0 && gave_up == 0) {
    if (client_gone && client_gone->load()) gave_up = 499;
    else if (timeout_s_ > 0 && Clock::now() >= deadline) gave_up = 504;
    else if (timeout_s_ > 0) done_cv_.wait_until(lk, deadline);
    else done_cv_.wait(lk);
  }
  if (gave_up != 0) {
    job.remaining -= drop_waiting(job);
    done_cv_.wait(lk, [&] { return job.remaining == 0; });
  }
  --jobs_;
  if (job.stopped) throw ApiError(503, "the server is shutting down", "", "server_error");
  if (gave_up == 499) throw ApiError(499, "cancelled", "", "server_error");
  if (gave_up == 504) throw ApiError(504, request_timeout_message(timeout_s_), "", "server_error");
  if (!job.error.empty()) throw ApiError(500, job.error, "", "server_error");
  return std::move(job.out);
}

int64_t PooledService::length(const Item& it) const {
  return std::min<int64_t>(int64_t((*it.job->sequences)[it.index].size()), model_.max_len);
}

void PooledService::work() {
  std::vector<Item> batch;
  std::vector<std::string> errors;
  for (;;) {
    batch.clear();
    {
      std::unique_lock lk(m_);
      work_cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) {  // what still waits ends with 503
        for (const Item& it : queue_) {
          it.job->stopped = true;
          --it.job->remaining;
        }
        metrics_.queue_length -= int64_t(queue_.size());
        queue_.clear();
        done_cv_.notify_all();
        return;
      }
      while (!queue_.empty() && int64_t(batch.size()) < max_batch_) {
        batch.push_back(queue_.front());
        queue_.pop_front();
      }
      metrics_.queue_length -= int64_t(batch.size());
    }
    errors.assign(batch.size(), "");
    run_batch(batch, errors);
    {
      std::lock_guard lk(m_);
      for (size_t i = 0; i < batch.size(); ++i) {
        if (!errors[i].empty()) batch[i].job->error = errors[i];
        --batch[i].job->remaining;
      }
    }
    done_cv_.notify_all();
  }
}

int64_t PooledService::padded_rows(int64_t rows) {
  return rows <= kRowStep ? int64_t(std::bit_ceil(uint64_t(rows))) : (rows + kRowStep - 1) / kRowStep * kRowStep;
}

int64_t PooledService::padded_width(int64_t length) const { return models::round_width(length, model_.max_len); }

void PooledService::run_batch(std::vector<Item>& batch, std::vector<std::string>& errors) {
  std::stable_sort(batch.begin(), batch.end(), [&](const Item& a, const Item& b) { return length(a) < length(b); });
  // Shortest first, a forward takes inputs up to kMaxWidthRatio times its
  // first one's width: a long input waiting with short ones does not make
  // them pay for its width.
  for (size_t first = 0; first < batch.size();) {
    const int64_t limit = kMaxWidthRatio * padded_width(length(batch[first]));
    size_t end = first + 1;
    while (end < batch.size() && padded_width(length(batch[end])) <= limit) ++end;
    std::string error;
    try {
      run_rows(batch.data() + first, int64_t(end - first));
    } catch (const std::exception& e) {  // only this forward's inputs fail
      error = e.what();
    } catch (...) {
      error = "the forward failed";
    }
    if (!error.empty()) {
      metrics_.slots_busy = 0;
      for (size_t i = first; i < end; ++i) errors[i] = error;
    }
    first = end;
  }
}

void PooledService::run_rows(const Item* items, int64_t rows) {
  const int64_t B = padded_rows(rows), T = padded_width(length(items[rows - 1]));
  ids_.assign(size_t(B * T), 0);
  lengths_.assign(size_t(B), 1);  // the padding rows: one token (id 0), answered to no one
  uint64_t tokens = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<int32_t>& s = (*items[r].job->sequences)[items[r].index];
    const int64_t n = length(items[r]);
    std::copy_n(s.begin(), n, ids_.begin() + r * T);
    lengths_[size_t(r)] = int32_t(n);
    tokens += uint64_t(n);
  }
  metrics_.slots_busy = rows;
  const float* y = model_.forward(ids_.data(), lengths_.data(), B, T);
  metrics_.slots_busy = 0;
  const int64_t K = model_.width;
  for (int64_t r = 0; r < rows; ++r) items[r].job->out[items[r].index].assign(y + r * K, y + (r + 1) * K);
  metrics_.prompt_tokens += tokens;
  ++metrics_.engine_steps;
}

}  // namespace brisk::serve
