// The encoder-bodied models behind `brisk serve` (docs/serving.md, "Encoder
// models"): an encoder classifier answers POST /classify, a sequence
// autoencoder's encoder POST /v1/embeddings. Each maps a sequence to one
// vector (class probabilities, or a latent). Requests hand their sequences
// to a PooledService, whose one worker thread runs whatever is waiting,
// across requests, as batches of similar lengths, so concurrent requests
// share the model's products instead of taking turns one row at a time.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "brisk/serve/metrics.h"

namespace brisk::serve {

struct PooledModel {
  enum class Kind { classifier, embedder };
  Kind kind = Kind::classifier;
  int64_t width = 0;    // floats per sequence: n_classes, or latent
  int64_t max_len = 0;  // tokens the model reads of a sequence (the first max_len; longer ones are cut)
  int64_t vocab = 0;    // token ids in [0, vocab)
  std::vector<std::string> labels;  // a classifier's class names, one per output
  // (B, T) right-padded ids and B lengths in [1, T] -> (B, width) floats
  // (a classifier's: class probabilities), valid until the next call.
  // Called from the worker thread only.
  std::function<const float*(const int32_t* ids, const int32_t* lengths, int64_t B, int64_t T)> forward;
};

// A text input to the model's token ids (a classifier: its tokenizer, after
// stripping the headers of a bodies-only model; an embedder: FASTA
// residues). Throws ApiError 400 naming `param` for text it cannot take.
using PooledEncode = std::function<std::vector<int32_t>(const std::string& text, const std::string& param)>;

class PooledService {
 public:
  // Runs at most `max_batch` sequences per forward; `max_waiting` requests
  // may wait or run at once (one more: 429). A request not done
  // `request_timeout_s` seconds after it came in (0, or 1e9 and more: no
  // limit) ends with 504. Counts into `metrics`.
  PooledService(PooledModel model, int64_t max_batch, int64_t max_waiting, Metrics& metrics,
                double request_timeout_s = 0);
  // Stops and joins the worker. Every run() must have returned first (the
  // server's handlers are joined when it stops).
  ~PooledService();
  PooledService(const PooledService&) = delete;
  PooledService& operator=(const PooledService&) = delete;

  const PooledModel& model() const { return model_; }
  Metrics& metrics() { return metrics_; }

  // Each sequence's vector, in order; blocks until all are done. Sequences
  // must be non-empty with ids in [0, vocab) (the server checks); longer
  // ones are cut to max_len. Throws ApiError 429 when max_waiting requests
  // are in, 503 once stop() was called (also for one waiting then), 500
  // when the forward that ran one of its sequences failed.
  //
  // Gives up when `*client_gone` turns true (its client hung up; then
  // call wake()) or at the request timeout: its sequences still waiting
  // are dropped, those in a forward already finish (a forward cannot be
  // cut), and it throws 499 "cancelled" or 504.
  std::vector<std::vector<float>> run(const std::vector<std::vector<int32_t>>& sequences,
                                      const std::atomic<bool>* client_gone = nullptr);
  // Wakes the waiting run() calls to look at their client_gone flags.
  void wake();
  // Ends the worker; requests still waiting get 503.
  void stop();

 private:
  struct Job;
  struct Item {
    Job* job;
    size_t index;
  };
  void work();
  // Takes the job's items off the queue; how many were there.
  size_t drop_waiting(const Job& job);
  // The items taken, sorted and cut into forwards of similar lengths; a
  // forward that throws sets errors[i] of its items (the others still run).
  void run_batch(std::vector<Item>& batch, std::vector<std::string>& errors);
  void run_rows(const Item* items, int64_t rows);  // one forward
  int64_t length(const Item& it) const;            // the tokens the model reads of it
  static int64_t padded_rows(int64_t rows);
  int64_t padded_width(int64_t length) const;

  PooledModel model_;
  int64_t max_batch_, max_waiting_;
  double timeout_s_;
  Metrics& metrics_;
  std::mutex m_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<Item> queue_;
  int64_t jobs_ = 0;
  bool stopping_ = false;
  std::vector<int32_t> ids_, lengths_;  // the worker's batch buffers
  std::thread worker_;
};

}  // namespace brisk::serve
