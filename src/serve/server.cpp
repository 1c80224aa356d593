// HTTP routes of `brisk serve`; see brisk/serve/server.h.
#include "brisk/serve/server.h"

#include <httplib.h>

#include <chrono>
#include <ctime>
#include <mutex>
#include <random>
#include <thread>

#include "brisk/core/error.h"
#include "brisk/data/tokenizer.h"

namespace brisk::serve {

using nlohmann::json;

namespace {

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(dump(body), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) { send_json(res, e.status, error_json(e)); }

bool write_event(httplib::DataSink& sink, const std::string& data) {
  const std::string event = "data: " + data + "\n\n";
  return sink.write(event.data(), event.size());
}

// Why a request ended without its finishing event, as an API error.
ApiError channel_error(const Channel& ch) {
  const int status = ch.error_status();
  return status == 400 ? ApiError(400, ch.error()) : ApiError(status, ch.error(), "", "server_error");
}

// What a stream's content provider keeps between its calls.
struct StreamState {
  std::shared_ptr<Channel> ch;
  CompletionBuilder builder;
  bool include_usage;
};

}  // namespace

struct Server::Impl {
  Scheduler& scheduler;
  const data::Tokenizer& tok;
  ModelInfo model;
  ServerOptions options;
  int64_t started = std::time(nullptr);
  httplib::Server http;
  std::mutex id_mutex;
  std::mt19937_64 id_rng{std::random_device{}()};

  Impl(Scheduler& s, const data::Tokenizer& t, ModelInfo m, ServerOptions o)
      : scheduler(s), tok(t), model(std::move(m)), options(std::move(o)) {
    const size_t threads = size_t(options.http_threads > 0 ? options.http_threads : 16);
    http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    http.set_payload_max_length(size_t(options.max_body));
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
    http.Get("/health", [](const httplib::Request&, httplib::Response& res) {
      send_json(res, 200, {{"status", "ok"}});
    });
    http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      send_json(res, 200,
                {{"object", "list"},
                 {"data", json::array({{{"id", model.name},
                                        {"object", "model"},
                                        {"created", started},
                                        {"owned_by", "brisk"},
                                        {"max_model_len", model.context}}})}});
    });
    http.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) { guarded(res, [&] {
      const json j = parse_body(req.body);
      auto it = j.find("prompt");
      if (it == j.end() || !it->is_string()) throw ApiError(400, "prompt must be a string", "prompt");
      const std::vector<int32_t> ids = tok.encode(it->get<std::string>());
      send_json(res, 200, {{"tokens", ids}, {"count", ids.size()}});
    }); });
    http.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) { guarded(res, [&] {
      const json j = parse_body(req.body);
      auto it = j.find("tokens");
      if (it == j.end() || !it->is_array()) throw ApiError(400, "tokens must be a list of token ids", "tokens");
      std::vector<int32_t> ids;
      for (const json& t : *it) {
        if (!t.is_number_integer()) throw ApiError(400, "tokens must be a list of token ids", "tokens");
        const int64_t id = t.get<int64_t>();
        if (id < 0 || id >= tok.vocab_size())
          throw ApiError(400, "token " + std::to_string(id) + " is outside the vocabulary [0, " +
                                  std::to_string(tok.vocab_size()) + ")", "tokens");
        ids.push_back(int32_t(id));
      }
      send_json(res, 200, {{"prompt", valid_utf8(tok.decode(ids))}});
    }); });
    http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      guarded(res, [&] { completion(req, res); });
    });
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

  std::string next_id() {
    std::lock_guard lk(id_mutex);
    char buf[40];
    std::snprintf(buf, sizeof buf, "cmpl-%016llx%08llx", (unsigned long long)id_rng(),
                  (unsigned long long)(id_rng() & 0xffffffffu));
    return buf;
  }

  void completion(const httplib::Request& req, httplib::Response& res) {
    const CompletionRequest cr = parse_completion(req.body, model, tok);
    std::shared_ptr<Channel> ch = scheduler.submit(cr.prompt, cr.params);
    if (!ch) {
      res.set_header("Retry-After", "1");
      throw ApiError(429, "the server is busy: its queue of waiting requests is full; retry later", "",
                     "rate_limit_exceeded");
    }
    CompletionBuilder builder(tok, cr, next_id(), std::time(nullptr), model.name);
    if (!cr.stream) {
      std::vector<infer::TokenEvent> events;
      while (ch->next(events))
        for (const infer::TokenEvent& e : events) builder.add(e);
      if (!builder.finished()) throw channel_error(*ch);
      send_json(res, 200, builder.response());
      return;
    }
    auto st = std::make_shared<StreamState>(StreamState{ch, std::move(builder), cr.include_usage});
    res.set_header("Cache-Control", "no-cache");
    Scheduler* sched = &scheduler;
    res.set_chunked_content_provider(
        "text/event-stream",
        [st](size_t, httplib::DataSink& sink) {
          std::vector<infer::TokenEvent> events;
          const bool more = st->ch->next(events);
          for (const infer::TokenEvent& e : events) {
            const json chunk = st->builder.add(e);
            // A failed write means the client is gone: the releaser cancels.
            if (!chunk.is_null() && !write_event(sink, dump(chunk))) return false;
          }
          if (!more || st->builder.finished()) {
            if (!st->builder.finished() &&
                !write_event(sink, dump(error_json(channel_error(*st->ch)))))
              return false;
            if (st->builder.finished() && st->include_usage && !write_event(sink, dump(st->builder.usage_chunk())))
              return false;
            if (!write_event(sink, "[DONE]")) return false;
            sink.done();
          }
          return true;
        },
        [st, sched](bool success) {
          if (!success) sched->cancel(st->ch);
        });
  }
};

Server::Server(Scheduler& scheduler, const data::Tokenizer& tok, ModelInfo model, ServerOptions options)
    : impl_(std::make_unique<Impl>(scheduler, tok, std::move(model), std::move(options))) {}

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
  return port;
}

void Server::listen() { impl_->http.listen_after_bind(); }

void Server::stop() { impl_->http.stop(); }

void Server::wait_until_ready() {
  while (!impl_->http.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

}  // namespace brisk::serve
