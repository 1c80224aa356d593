// PooledService (brisk/serve/pooled.h): one worker thread takes what waits,
// across requests, up to max_batch sequences in arrival order, sorts them by
// length and runs them as one right-padded batch.
//
// Why these shapes: the models compile one program per (batch, width), so a
// batch is padded to a power of two of rows (rows of one token, dropped) and
// a width rounded up to a multiple of 32: at most 1 + log2(max_batch) row
// counts times max_len / 32 widths are ever built, and a lone request costs
// one row, not max_batch.
#include "brisk/serve/pooled.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <exception>

#include "brisk/serve/api.h"

namespace brisk::serve {

namespace {

constexpr int64_t kWidthStep = 32;  // as the classifier's trainer and brisk classify round a batch's width

}  // namespace

struct PooledService::Job {
  const std::vector<std::vector<int32_t>>* sequences = nullptr;
  std::vector<std::vector<float>> out;
  size_t remaining = 0;
  std::string error;  // the forward failed: the request gets a 500 with this
};

PooledService::PooledService(PooledModel model, int64_t max_batch, int64_t max_waiting, Metrics& metrics)
    : model_(std::move(model)),
      max_batch_(std::max<int64_t>(1, max_batch)),
      max_waiting_(std::max<int64_t>(1, max_waiting)),
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
  done_cv_.notify_all();
}

std::vector<std::vector<float>> PooledService::run(const std::vector<std::vector<int32_t>>& sequences) {
  if (sequences.empty()) return {};
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
  // job is waited for even when stopping (the worker drops what it has not
  // taken; see work()).
  done_cv_.wait(lk, [&] { return job.remaining == 0; });
  --jobs_;
  if (!job.error.empty()) {
    if (job.error == "stopped") throw ApiError(503, "the server is shutting down", "", "server_error");
    throw ApiError(500, job.error, "", "server_error");
  }
  return std::move(job.out);
}

void PooledService::work() {
  std::vector<Item> batch;
  for (;;) {
    batch.clear();
    {
      std::unique_lock lk(m_);
      work_cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) {  // what still waits ends with 503
        for (const Item& it : queue_) {
          it.job->error = "stopped";
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
      metrics_.slots_busy = int64_t(batch.size());
    }
    std::string error;
    try {
      run_batch(batch);
    } catch (const std::exception& e) {
      error = e.what();
    }
    {
      std::lock_guard lk(m_);
      for (const Item& it : batch) {
        if (!error.empty()) it.job->error = error;
        --it.job->remaining;
      }
      metrics_.slots_busy = 0;
    }
    done_cv_.notify_all();
  }
}

void PooledService::run_batch(std::vector<Item>& batch) {
  auto length = [&](const Item& it) {
    return std::min<int64_t>(int64_t((*it.job->sequences)[it.index].size()), model_.max_len);
  };
  std::stable_sort(batch.begin(), batch.end(), [&](const Item& a, const Item& b) { return length(a) < length(b); });
  const int64_t rows = int64_t(batch.size());
  const int64_t B = int64_t(std::bit_ceil(uint64_t(rows)));
  const int64_t T = std::min(model_.max_len, (length(batch.back()) + kWidthStep - 1) / kWidthStep * kWidthStep);
  ids_.assign(size_t(B * T), 0);
  lengths_.assign(size_t(B), 1);  // the padding rows: one token (id 0), answered to no one
  uint64_t tokens = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<int32_t>& s = (*batch[size_t(r)].job->sequences)[batch[size_t(r)].index];
    const int64_t n = length(batch[size_t(r)]);
    std::copy_n(s.begin(), n, ids_.begin() + r * T);
    lengths_[size_t(r)] = int32_t(n);
    tokens += uint64_t(n);
  }
  const float* y = model_.forward(ids_.data(), lengths_.data(), B, T);
  const int64_t K = model_.width;
  for (int64_t r = 0; r < rows; ++r) {
    const float* z = y + r * K;
    std::vector<float> v(z, z + K);
    if (model_.softmax) {
      const float mx = *std::max_element(v.begin(), v.end());
      float sum = 0;
      for (float& x : v) sum += (x = std::exp(x - mx));
      for (float& x : v) x /= sum;
    }
    batch[size_t(r)].job->out[batch[size_t(r)].index] = std::move(v);
  }
  metrics_.prompt_tokens += tokens;
  ++metrics_.engine_steps;
}

}  // namespace brisk::serve
