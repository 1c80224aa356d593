// The HTTP front of `brisk serve`: OpenAI-compatible routes on cpp-httplib,
// each request answered by its own HTTP thread, which hands the work to the
// Scheduler and waits on its Channel (docs/serving.md). An encoder model is
// served instead through a PooledService: POST /classify or /v1/embeddings.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "brisk/serve/completions.h"
#include "brisk/serve/pooled.h"
#include "brisk/serve/scheduler.h"

namespace brisk::data {
class Tokenizer;
}

namespace brisk::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;             // 0: any free port (bind() says which)
  int64_t max_body = 1 << 20;  // bytes; larger bodies get 413
  int http_threads = 0;        // 0: enough for every slot and queued request
  // Connections served at once: the HTTP threads grow from http_threads to
  // this, one per connection that finds none idle (connection_threads.h);
  // past it a new connection waits for one to close. 0: 512.
  int max_connections = 0;
  std::string api_key;         // non-empty: every route but /health needs "Authorization: Bearer <key>"
  // Access-Control-Allow-Origin on every answer, and CORS preflights
  // answered, so pages of other origins can call the API; "": neither.
  std::string cors_origin = "*";
  int64_t response_cache_bytes = 0;  // 0: no response cache (response_cache.h)
  // Called with one line per answered request (access_log.h), from the HTTP
  // thread that answered it; empty: no access log.
  std::function<void(const std::string&)> access_log;
};

class Server {
 public:
  // A server with no model yet: it can bind and listen while the model
  // loads, answering /health (and every other route) with 503 until attach().
  explicit Server(ServerOptions options);
  // Both steps at once (the model is already loaded).
  Server(Scheduler& scheduler, const data::Tokenizer& tok, ModelInfo model, ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // The model is loaded: generation routes open and /health says 200. Once.
  void attach(Scheduler& scheduler, const data::Tokenizer& tok, ModelInfo model);
  // An encoder model instead (once, and not with the other): a classifier
  // answers POST /classify, an embedder POST /v1/embeddings; `encode` turns
  // an input text into the model's token ids (or a 400 naming it).
  void attach(PooledService& service, PooledEncode encode, ModelInfo model);
  // Binds the socket; returns the port. Throws core::IoError when it cannot.
  int bind();
  // Serves until stop(); call after bind().
  void listen();
  // Safe from any thread, more than once. Idle connections close at once;
  // listen() returns when the requests being answered have ended, or 5 s
  // later with their connections shut.
  void stop();
  // Blocks until listen() is accepting connections.
  void wait_until_ready();
  // Graceful stop, first half: new generation (or encoder) requests get 503
  // and /health says 503 (a load balancer takes the replica out), running
  // ones go on.
  void start_draining();
  // Generation (or encoder) requests whose response is not finished yet.
  int64_t open_requests() const;
  // Waits up to `seconds` for open_requests() to fall to 0; whether it did.
  bool wait_for_open_requests(double seconds) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace brisk::serve
