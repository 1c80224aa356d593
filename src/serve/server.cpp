// HTTP routes of `brisk serve`; see brisk/serve/server.h.
#include "brisk/serve/server.h"

#include <httplib.h>
#include <strings.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <ctime>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "brisk/core/error.h"
#include "brisk/data/tokenizer.h"
#include "brisk/serve/access_log.h"
#include "brisk/serve/peer_watch.h"
#include "brisk/serve/pooled_api.h"
#include "brisk/serve/response_cache.h"
#include "connection_threads.h"
#include "fields.h"

namespace brisk::serve {

using nlohmann::json;

namespace {

constexpr int kListenBacklog = 1024;  // connections waiting to be accepted (nginx uses 511)

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(dump(body), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) { send_json(res, e.status, error_json(e)); }

bool write_event(httplib::DataSink& sink, const std::string& data) {
  const std::string event = "data: " + data + "\n\n";
  return sink.write(event.data(), event.size());
}

}  // namespace

struct Server::Impl {
  // Set once by attach(), before `ready` turns true; handlers read them only
  // after seeing `ready` (or from routes that need no model).
  Scheduler* scheduler = nullptr;
  const data::Tokenizer* tok = nullptr;
  PooledService* pooled = nullptr;  // an encoder model instead of the scheduler
  PooledEncode pooled_encode;
  Metrics* metrics = nullptr;
  std::unique_ptr<ResponseCache> cache;
  ModelInfo model;
  std::atomic<bool> ready{false};
  ServerOptions options;
  int64_t started = std::time(nullptr);
  PeerWatcher watcher;  // before `http`: it outlives every handler's watch
  httplib::Server http;
  std::mutex id_mutex;
  std::mt19937_64 id_rng{std::random_device{}()};
  std::atomic<int64_t> open{0};  // generation requests not yet answered in full
  int listen_socket = -1;        // the socket bind() made (see set_socket_options below)
  int port = 0;                  // the port bind() took
  // The peers (address, port) of the requests being answered: from routing
  // until httplib has written the response and logs it. stop() leaves their
  // connections be.
  std::mutex busy_mutex;
  std::multiset<std::pair<std::string, int>> busy;
  // listen() and stop() from different threads, in either order (see stop()).
  std::atomic<bool> stop_requested{false};
  std::atomic<int> listen_state{0};  // 0: listen() not called, 1: in it, 2: returned
  // stop()'s bound on a busy connection (see stop()): waits for listen() to
  // return, shuts what is left after kStopGrace.
  std::mutex stop_mutex;
  std::condition_variable listen_returned;
  std::thread reaper;
  ~Impl() {
    if (reaper.joinable()) reaper.join();
  }

  void attach(PooledService& s, PooledEncode encode, ModelInfo m) {
    if (ready) throw core::Error("Server::attach: a model is attached already");
    pooled = &s;
    pooled_encode = std::move(encode);
    metrics = &s.metrics();
    model = std::move(m);
    ready = true;
  }

  void attach(Scheduler& s, const data::Tokenizer& t, ModelInfo m) {
    if (ready) throw core::Error("Server::attach: a model is attached already");
    scheduler = &s;
    tok = &t;
    metrics = &s.metrics();
    model = std::move(m);
    // A prompt may hold only ids the tokenizer has: the model's embedding may
    // be padded past them (GPT-2's 50,257 to 50,304), and a padded id has no
    // text to echo or to stop on.
    model.vocab = std::min<int64_t>(model.vocab, int64_t(t.vocab_size()));
    cache = std::make_unique<ResponseCache>(options.response_cache_bytes, *metrics);
    ready = true;
  }

  explicit Impl(ServerOptions o) : options(std::move(o)) {
    const size_t threads = size_t(options.http_threads > 0 ? options.http_threads : 16);
    const size_t max = std::max(threads, size_t(options.max_connections > 0 ? options.max_connections : 512));
    http.new_task_queue = [threads, max] { return new ConnectionThreads(threads, max); };
    http.set_payload_max_length(size_t(options.max_body));
    // Each token goes out as its own small write; with Nagle's algorithm on,
    // the kernel held such writes back and a lone request's first token
    // arrived ~45 ms late.
    http.set_tcp_nodelay(true);
    // The library listens with a backlog of 5: when 16 clients connected at
    // once, SYNs past the fifth were dropped and those clients waited for
    // TCP's 1 s retransmission (TTFT p99 ~1 s). bind() raises the backlog on
    // the socket remembered here.
    //
    // Only SO_REUSEADDR (a restart binds while old connections linger in
    // TIME_WAIT): httplib's default sets SO_REUSEPORT, with which a second
    // server started on a busy port bound it too and the kernel split the
    // connections between two models instead of refusing the second.
    http.set_socket_options([this](int sock) {
      const int yes = 1;
      setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
      listen_socket = sock;
    });
    // Keep a client's connection for many requests (the library's default
    // closes it after 5, and a pooled OpenAI client then reconnects).
    http.set_keep_alive_max_count(10000);
    // Fills in an OpenAI error body for the statuses httplib answers by
    // itself (404 for an unknown path, 413 for a body over --max-body).
    using HandlerWithResponse = httplib::Server::HandlerWithResponse;
    http.set_error_handler(HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
      std::string msg = "HTTP " + std::to_string(res.status);
      if (res.status == 404) msg = "no route for " + req.method + " " + req.path;
      if (res.status == 413) msg = "the request body is larger than the server accepts (--max-body)";
      send_error(res, ApiError(res.status, msg));
      return httplib::Server::HandlerResponse::Handled;
    }));
    // While the model loads, every route answers 503 (a load balancer's
    // health check keeps the replica out of rotation until it can serve);
    // after that --api-key guards every route but /health (load balancers
    // probe it without a key).
    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      request_note().start = std::chrono::steady_clock::now();  // the logger reset the note after the last request
      {
        std::lock_guard lk(busy_mutex);
        busy.emplace(req.remote_addr, req.remote_port);
      }
      if (!options.cors_origin.empty()) res.set_header("Access-Control-Allow-Origin", options.cors_origin);
      if (!ready) {
        res.set_header("Retry-After", "1");
        if (req.path == "/health") send_json(res, 503, {{"status", "loading"}});
        else send_error(res, ApiError(503, "the model is still loading", "", "server_error"));
        return httplib::Server::HandlerResponse::Handled;
      }
      // A browser's CORS preflight carries no key: it is answered before the check.
      if (req.method == "OPTIONS") {
        const std::string allow = route_methods(req.path);
        if (allow.empty()) {
          send_error(res, ApiError(404, "no route for OPTIONS " + req.path));
        } else {
          res.status = 204;
          res.set_header("Allow", allow);
          if (!options.cors_origin.empty()) {
            res.set_header("Access-Control-Allow-Methods", allow);
            const std::string asked = req.get_header_value("Access-Control-Request-Headers");
            res.set_header("Access-Control-Allow-Headers", asked.empty() ? "Authorization, Content-Type" : asked);
            res.set_header("Access-Control-Max-Age", "86400");
          }
        }
        return httplib::Server::HandlerResponse::Handled;
      }
      if (!options.api_key.empty() && req.path != "/health" && !has_key(req.get_header_value("Authorization"))) {
        res.set_header("WWW-Authenticate", "Bearer");
        send_error(res, ApiError(401, req.has_header("Authorization") ? "the API key is not valid"
                                                                       : "an API key is required: send "
                                                                         "\"Authorization: Bearer <key>\"",
                                 "", "invalid_request_error", "invalid_api_key"));
        return httplib::Server::HandlerResponse::Handled;
      }
      if (auto refused = refuse_route(req, res)) {
        send_error(res, *refused);
        return httplib::Server::HandlerResponse::Handled;
      }
      return httplib::Server::HandlerResponse::Unhandled;
    });
    // Every answered request, by path and status (after its response is
    // sent); those answered while loading have no metrics to go to.
    http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
      {
        std::lock_guard lk(busy_mutex);
        if (auto it = busy.find({req.remote_addr, req.remote_port}); it != busy.end()) busy.erase(it);
      }
      if (ready) metrics->count_request(req.path, res.status);
      if (options.access_log)
        options.access_log(access_log_line(std::chrono::system_clock::now(),
                                           req.remote_addr + ":" + std::to_string(req.remote_port), req.method,
                                           req.path, res.status, request_note(), std::chrono::steady_clock::now()));
      request_note() = RequestNote{};  // a next request answered without routing shows no duration
    });
    http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      if (metrics->draining) send_json(res, 503, {{"status", "draining"}});
      else send_json(res, 200, {{"status", "ok"}});
    });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics->render(), "text/plain; version=0.0.4; charset=utf-8");
    });
    http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      send_json(res, 200, {{"object", "list"}, {"data", json::array({model_object()})}});
    });
    // Retrieve one model (the OpenAI clients' models.retrieve); httplib has
    // decoded the id, which may hold a '/'.
    http.Get(R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) { guarded(res, [&] {
      const std::string id = req.matches[1];
      if (id != model.name)
        throw ApiError(404, "The model '" + id + "' does not exist (this server has '" + model.name + "')", "model",
                       "invalid_request_error", "model_not_found");
      send_json(res, 200, model_object());
    }); });
    // Every POST reads its body through read_body, which holds it to --max-body.
    http.Post("/tokenize", [this](const httplib::Request&, httplib::Response& res, const httplib::ContentReader& body) {
      guarded(res, [&] { tokenize(read_body(body, res), res); });
    });
    http.Post("/detokenize", [this](const httplib::Request&, httplib::Response& res, const httplib::ContentReader& body) {
      guarded(res, [&] { detokenize(read_body(body, res), res); });
    });
    http.Post("/v1/completions",
              [this](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& body) {
                guarded(res, [&] { generate(req, read_body(body, res), res, Api::completions); });
              });
    http.Post("/v1/chat/completions",
              [this](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& body) {
                guarded(res, [&] { generate(req, read_body(body, res), res, Api::chat); });
              });
    // The encoder routes; route_methods() opens the one the model serves.
    for (const char* path : {kClassifyPath, kEmbeddingsPath})
      http.Post(path, [this](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& body) {
        guarded(res, [&] { encode(req, read_body(body, res), res); });
      });
  }

  static constexpr const char* kClassifyPath = "/classify";
  static constexpr const char* kEmbeddingsPath = "/v1/embeddings";

  // The POST route of an encoder model.
  const char* pooled_path() const {
    return pooled->model().kind == PooledModel::Kind::classifier ? kClassifyPath : kEmbeddingsPath;
  }

  // "Authorization: Bearer <key>", the scheme in any case (RFC 7235).
  bool has_key(const std::string& header) const {
    return header.size() == 7 + options.api_key.size() && strncasecmp(header.c_str(), "Bearer ", 7) == 0 &&
           header.compare(7, std::string::npos, options.api_key) == 0;
  }

  // The methods a path takes, as an Allow header; "" for an unknown path
  // (or one the attached model does not serve).
  std::string route_methods(const std::string& path) const {
    if (path == "/health" || path == "/metrics" || path == "/v1/models" ||
        (path.rfind("/v1/models/", 0) == 0 && path.size() > 11))
      return "GET, HEAD, OPTIONS";
    const bool generation =
        path == "/tokenize" || path == "/detokenize" || path == "/v1/completions" || path == "/v1/chat/completions";
    if (pooled ? path == pooled_path() : generation) return "POST, OPTIONS";
    return "";
  }

  // What httplib's own routing would get wrong, answered before it reads a
  // body: an unknown path is a 404 whatever the method (httplib answered a
  // POST to one 400), a known path with another method a 405 with `Allow`
  // (httplib: 404), and a POST with neither Content-Length nor chunked
  // encoding a 411 (httplib waited for the connection's end, then answered
  // 400). HEAD is httplib's own; OPTIONS is answered before this.
  std::optional<ApiError> refuse_route(const httplib::Request& req, httplib::Response& res) const {
    const std::string allow = route_methods(req.path);
    if (allow.empty() && pooled)  // a GPT route asked of an encoder model, the other encoder's, or none at all
      return ApiError(404, "no route for " + req.method + " " + req.path + ": this server serves " +
                               (pooled->model().kind == PooledModel::Kind::classifier ? "an encoder classifier"
                                                                                       : "a sequence embedder") +
                               " (POST " + pooled_path() + ")");
    if (allow.empty()) return ApiError(404, "no route for " + req.method + " " + req.path);
    const bool get = allow.rfind("GET", 0) == 0, post = !get;
    const bool method_ok = get ? req.method == "GET" || req.method == "HEAD" : req.method == "POST";
    if (!method_ok) {
      res.set_header("Allow", allow);
      return ApiError(405, req.path + " takes " + (get ? "GET" : "POST") + ", not " + req.method);
    }
    if (post && !req.has_header("Content-Length") && strcasecmp(req.get_header_value("Transfer-Encoding").c_str(), "chunked") != 0)
      return ApiError(411, "a POST needs a Content-Length header (or Transfer-Encoding: chunked)");
    return std::nullopt;
  }

  // vLLM's shapes: {"model"?, "prompt"} -> tokens, count and the context.
  void tokenize(const std::string& body, httplib::Response& res) {
    const json j = parse_body(body);
    fields::check_model_and_user(j, model);
    auto it = j.find("prompt");
    if (it == j.end() || !it->is_string()) throw ApiError(400, "prompt must be a string", "prompt");
    const std::vector<int32_t> ids = tok->encode(it->get<std::string>());
    send_json(res, 200, {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", model.context}});
  }

  void detokenize(const std::string& body, httplib::Response& res) {
    const json j = parse_body(body);
    fields::check_model_and_user(j, model);
    auto it = j.find("tokens");
    if (it == j.end() || !it->is_array()) throw ApiError(400, "tokens must be a list of token ids", "tokens");
    std::vector<int32_t> ids;
    for (const json& t : *it) {
      if (!t.is_number_integer()) throw ApiError(400, "tokens must be a list of token ids", "tokens");
      const int64_t id = t.get<int64_t>();
      if (id < 0 || id >= tok->vocab_size())
        throw ApiError(400, "token " + std::to_string(id) + " is outside the vocabulary [0, " +
                                std::to_string(tok->vocab_size()) + ")", "tokens");
      ids.push_back(int32_t(id));
    }
    send_json(res, 200, {{"prompt", valid_utf8(tok->decode(ids))}});
  }

  // The request body, held to --max-body as it arrives. The library checks
  // the limit only against a Content-Length header: a chunked body (or one
  // that a Content-Encoding expands) was read whole, however large. Bytes
  // are counted after decoding. Past the limit the bytes are dropped, and
  // after up to kLinger more the reading stops: a client still sending a
  // slightly larger body then gets its 413 instead of a reset connection,
  // and a huge one costs the server no memory. The connection closes after
  // a 413 either way.
  std::string read_body(const httplib::ContentReader& reader, httplib::Response& res) {
    constexpr size_t kLinger = size_t(1) << 20;
    std::string body;
    bool too_big = false;
    size_t dropped = 0;
    const bool read = reader([&](const char* data, size_t n) {
      if (!too_big && body.size() + n <= size_t(options.max_body)) {
        body.append(data, n);
        return true;
      }
      too_big = true;
      dropped += n;
      return dropped <= kLinger;
    });
    if (too_big || res.status == 413) {  // 413: a Content-Length over the limit, refused by the library
      res.set_header("Connection", "close");
      throw ApiError(413, "the request body is larger than the server accepts (--max-body " +
                              std::to_string(options.max_body) + " bytes)");
    }
    if (!read) throw ApiError(400, "the request body could not be read (a broken chunked or compressed body)");
    return body;
  }

  // Runs a handler, answering its ApiError (or any other failure) as an
  // OpenAI error object.
  template <class F>
  void guarded(httplib::Response& res, F&& f) {
    try {
      f();
    } catch (const ApiError& e) {
      send_error(res, e);
    } catch (const std::exception& e) {
      send_error(res, ApiError(500, e.what(), "", "server_error"));
    }
  }

  json model_object() const {
    return {{"id", model.name},
            {"object", "model"},
            {"created", started},
            {"owned_by", "brisk"},
            {"max_model_len", model.context}};
  }

  // `prefix` and 24 random hex digits ("cmpl-…", "chatcmpl-…", "classify-…").
  std::string next_id(const char* prefix) {
    std::lock_guard lk(id_mutex);
    char buf[40];
    std::snprintf(buf, sizeof buf, "%016llx%08llx", (unsigned long long)id_rng(),
                  (unsigned long long)(id_rng() & 0xffffffffu));
    return prefix + std::string(buf);
  }

  // Counts a generation request as open until its response is complete
  // (for a stream: until httplib releases its content provider).
  std::shared_ptr<void> open_request() {
    ++open;
    return std::shared_ptr<void>(nullptr, [this](void*) { --open; });
  }

  void refuse_if_draining() {
    if (metrics->draining) throw ApiError(503, "the server is shutting down", "", "server_error");
  }

  // An encoder route: every input of the request through the PooledService
  // (batched there with other requests' inputs), one answer. A client that
  // hangs up while its inputs wait takes them out of the queue (499), as a
  // generation request's does.
  void encode(const httplib::Request& req, const std::string& body, httplib::Response& res) {
    const std::shared_ptr<void> held = open_request();
    refuse_if_draining();
    const auto t0 = std::chrono::steady_clock::now();
    const PooledModel& m = pooled->model();
    const PooledRequest r = parse_pooled(body, model, m, pooled_encode);
    std::vector<std::vector<float>> out;
    try {
      auto gone = std::make_shared<std::atomic<bool>>(false);
      const int fd = find_connection_socket(req.local_addr, req.local_port, req.remote_addr, req.remote_port);
      if (fd == kConnectionReset) throw ApiError(499, "cancelled", "", "server_error");  // gone before we looked
      // The service outlives every handler, and the watch ends (waiting for
      // a callback under way) before this returns.
      const auto watch = watcher.watch(fd, [gone, service = pooled] {
        *gone = true;
        service->wake();
      });
      out = pooled->run(r.sequences, gone.get());
    } catch (const ApiError& e) {
      if (e.status == 429) res.set_header("Retry-After", "1");
      throw;
    }
    const json answer = m.kind == PooledModel::Kind::classifier
                            ? classify_response(r, out, m, next_id("classify-"), std::time(nullptr),
                                                model.name)
                            : embeddings_response(r, out, model.name);
    metrics->request_latency.observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    request_note().prompt_tokens = r.tokens;
    send_json(res, 200, answer);
  }

  // Answers a request of either route with any number of choices, streamed
  // or not, through a Generation (one engine sequence per choice).
  void generate(const httplib::Request& req, const std::string& body, httplib::Response& res, Api api) {
    const std::shared_ptr<void> held = open_request();
    refuse_if_draining();
    const Request r = api == Api::chat ? parse_chat(body, model, *tok) : parse_completions(body, model, *tok);
    request_note().stream = r.stream ? 1 : 0;
    const std::string id = next_id(api == Api::chat ? "chatcmpl-" : "cmpl-");
    std::shared_ptr<Generation> gen;
    try {
      gen = std::make_shared<Generation>(*scheduler, *tok, r, id, std::time(nullptr), model.name, cache.get());
    } catch (const ApiError& e) {
      if (e.status == 429) res.set_header("Retry-After", "1");
      throw;
    }
    // A client that gives up frees its slot (or its place in the queue) at
    // the next engine step: a non-streamed request writes nothing until it
    // is done, and a stream nothing while it waits for a slot, so without
    // the watch neither would notice before its first write.
    std::shared_ptr<PeerWatcher::Watch> watch;
    if (!gen->from_cache()) {
      const int fd = find_connection_socket(req.local_addr, req.local_port, req.remote_addr, req.remote_port);
      if (fd == kConnectionReset) gen->cancel();  // gone before we could watch it
      else watch = watcher.watch(fd, [gen] { gen->cancel(); });
    }
    if (!r.stream) {
      json answer = gen->response();
      watch.reset();
      request_note().set_usage(answer["usage"]);
      send_json(res, 200, answer);
      return;
    }
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        // The watch lives as long as the stream: httplib destroys the
        // provider with the response, before it closes the connection.
        // httplib writes through `res` and logs it after the provider is done.
        [gen, held, watch, &res](size_t, httplib::DataSink& sink) {
          // A failed write means the client is gone: the releaser cancels.
          // The headers said 200; what is logged and counted is 499, as
          // nginx logs a client that closed.
          if (!gen->pump([&](const std::string& data) { return write_event(sink, data); })) {
            res.status = 499;
            return false;
          }
          if (gen->done()) {
            // A stream that ended with an error event (timeout, drain) is
            // logged and counted with that error's status and no token
            // counts, as a failed non-streamed request is.
            if (gen->error_status() != 0) res.status = gen->error_status();
            else request_note().set_usage(gen->usage());  // the provider runs on the request's thread
            sink.done();
          }
          return true;
        },
        [gen](bool success) {
          if (!success) gen->cancel();
        });
  }
};

Server::Server(ServerOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

Server::Server(Scheduler& scheduler, const data::Tokenizer& tok, ModelInfo model, ServerOptions options)
    : Server(std::move(options)) {
  attach(scheduler, tok, std::move(model));
}

void Server::attach(Scheduler& scheduler, const data::Tokenizer& tok, ModelInfo model) {
  impl_->attach(scheduler, tok, std::move(model));
}

void Server::attach(PooledService& service, PooledEncode encode, ModelInfo model) {
  impl_->attach(service, std::move(encode), std::move(model));
}

Server::~Server() = default;

int Server::bind() {
  const ServerOptions& o = impl_->options;
  int port = o.port;
  if (port == 0) {
    port = impl_->http.bind_to_any_port(o.host);
    if (port < 0) throw core::IoError("cannot listen on " + o.host + " (any port)");
  } else if (!impl_->http.bind_to_port(o.host, port)) {
    throw core::IoError("cannot listen on " + o.host + ":" + std::to_string(port) +
                        " (in use, or not an address here)");
  }
  // Linux takes a second listen() on a listening socket as a new backlog
  // (capped by net.core.somaxconn).
  if (impl_->listen_socket >= 0) ::listen(impl_->listen_socket, kListenBacklog);
  impl_->port = port;
  return port;
}

void Server::listen() {
  impl_->listen_state = 1;
  if (!impl_->stop_requested) impl_->http.listen_after_bind();
  {
    std::lock_guard lk(impl_->stop_mutex);
    impl_->listen_state = 2;
  }
  impl_->listen_returned.notify_all();
}

// httplib's stop() does nothing while the server is not running yet, and a
// stop can come first: `brisk serve` stops at once when the model fails to
// load, maybe before its listener thread got to listen_after_bind(), which
// would then serve forever. So a stop is remembered (listen() sees it and
// does not start), and one that finds listen() entered but not yet running
// waits for it to run. The flag and the state are set before each side reads
// the other's (sequentially consistent atomics): one of them sees the other.
//
// httplib's stop() closes the listening socket, but a connection kept alive
// between requests is served on until it has been idle for 5 s, and
// listen() returns only after every connection has ended: a stopped
// server took 5 s to exit while any client held an idle connection. So
// the read side of every idle connection is shut: it reads its end at once
// and closes. Connections with a request being answered are left to
// finish it (and close after it: the server no longer runs), for up to
// kStopGrace: a client that uploads or reads a byte at a time would
// otherwise hold listen() for as long as it likes. What is left then is
// shut both ways.
void Server::stop() {
  constexpr auto kStopGrace = std::chrono::seconds(5);
  impl_->stop_requested = true;
  while (impl_->listen_state == 1 && !impl_->http.is_running())
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  impl_->http.stop();
  std::lock_guard lk(impl_->stop_mutex);
  // Once listen() has returned the port's connections are gone (and the
  // port may be another socket's): nothing to shut.
  if (impl_->port <= 0 || impl_->listen_state != 1 || impl_->reaper.joinable()) return;
  const int port = impl_->port;
  shut_connections(port, SHUT_RD, [this](const std::string& addr, int peer_port) {
    std::lock_guard busy_lk(impl_->busy_mutex);
    return impl_->busy.count({addr, peer_port}) > 0;
  });
  impl_->reaper = std::thread([impl = impl_.get(), port, kStopGrace] {
    std::unique_lock wait_lk(impl->stop_mutex);
    if (impl->listen_returned.wait_for(wait_lk, kStopGrace, [&] { return impl->listen_state == 2; })) return;
    shut_connections(port, SHUT_RDWR, [](const std::string&, int) { return false; });
  });
}

void Server::start_draining() {
  if (impl_->ready) impl_->metrics->draining = true;
}

int64_t Server::open_requests() const { return impl_->open.load(); }

bool Server::wait_for_open_requests(double seconds) const {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (impl_->open.load() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return impl_->open.load() == 0;
}

void Server::wait_until_ready() {
  while (!impl_->http.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

}  // namespace brisk::serve
