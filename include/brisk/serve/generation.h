// Running one request: every choice is its own engine sequence, submitted to
// the Scheduler; their events become one answer (non-streamed) or one
// stream whose chunks of different choices interleave as the engine
// produces them. Knows nothing of HTTP: a stream is written through a
// callback, so the server (or a test) decides where the bytes go.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "brisk/serve/api.h"
#include "brisk/serve/choice_builder.h"
#include "brisk/serve/response_cache.h"

namespace brisk::data {
class Tokenizer;
}

namespace brisk::serve {

class Scheduler;
class Channel;

class Generation {
 public:
  // Submits every choice. Throws ApiError 429 (with none of them left
  // queued) when the scheduler's queue cannot take them all now. With a
  // `cache`, a deterministic request it holds is replayed from it instead,
  // and one that runs to its end without an error is stored in it.
  Generation(Scheduler& scheduler, const data::Tokenizer& tok, const Request& req, const std::string& id,
             int64_t created, const std::string& model, ResponseCache* cache = nullptr);
  // Cancels the choices still running and waits for its reader threads.
  ~Generation();
  Generation(const Generation&) = delete;
  Generation& operator=(const Generation&) = delete;

  // Non-streamed: waits for every choice and returns the answer; throws the
  // first failed choice's error as an ApiError. With best_of > n, each
  // prompt's n sequences of highest mean token logprob, best first,
  // numbered p * n + i; usage counts every sequence generated.
  nlohmann::json response();

  // Streamed: waits for new events and writes the chunks they make, one
  // `data` payload per call of `write` (the role chunks first, a failed
  // choice's error, the usage chunk when asked, then "[DONE]"). False when
  // a write failed (the client is gone: call cancel()).
  bool pump(const std::function<bool(const std::string&)>& write);
  // The stream has written its "[DONE]".
  bool done() const { return done_; }
  // The HTTP status of the error event a done stream ended with (504 time
  // out, 503 drain, 500, ...); 0 when it ended normally. The headers said
  // 200, but the access log and the metrics should not.
  int error_status() const { return error_status_; }
  bool from_cache() const { return from_cache_; }
  // OpenAI's `usage` object for the tokens so far (every sequence's; each
  // prompt counted once). Not while another thread runs response() or pump().
  nlohmann::json usage() const;
  // Drops the choices still queued or running. Safe from another thread
  // while response() or pump() runs (the connection watch calls it when the
  // client hangs up): response() then throws the 499 "cancelled" of the
  // first choice not finished.
  void cancel();

 private:
  struct Inbox;
  void record(size_t choice, const std::vector<infer::TokenEvent>& events);
  void store_if_complete();
  Scheduler& scheduler_;
  const bool include_usage_;
  const int64_t prompt_tokens_;
  const int64_t best_of_, n_;  // sequences per prompt, choices answered per prompt
  std::vector<std::shared_ptr<Channel>> channels_;
  std::vector<CompletionBuilder> builders_;
  std::vector<bool> first_of_prompt_;  // usage counts each prompt once, at its first choice
  // Streams only: one thread per choice moves its channel's events here,
  // so that one wait sees whichever choice moves first.
  std::shared_ptr<Inbox> inbox_;
  std::vector<std::thread> readers_;
  bool started_ = false, done_ = false;
  int error_status_ = 0;
  // The response cache: where to store this request's events, and them.
  ResponseCache* cache_ = nullptr;
  std::string cache_key_;
  bool from_cache_ = false;
  ChoiceEvents recorded_;
};

}  // namespace brisk::serve
