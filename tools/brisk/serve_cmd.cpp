// `brisk serve`: the OpenAI-compatible HTTP server (src/serve/, docs/serving.md).
// A GPT is served through the engine and the scheduler; an encoder
// classifier or a sequence autoencoder through a PooledService
// (serve_pooled.cpp): POST /classify or /v1/embeddings.
#include "serve_cmd.h"

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <thread>

#include "brisk/core/error.h"
#include "brisk/data/tokenizer.h"
#include "brisk/infer/engine.h"
#include "brisk/serve/server.h"
#include "cli_checks.h"
#include "serve_pooled.h"

namespace brisk::cli {

namespace {

struct ServeArgs {
  std::string model, model_name, vocab_dir, host = "127.0.0.1";
  int port = 8080, slots = 8, max_queue = 64, threads = 0, max_connections = 512, max_batch = 64;
  int64_t max_body = 1 << 20, kv_mb = 0;
  std::string kv_dtype = "f32";
  std::string precision = "fp32";
  std::string api_key, cors_origin = "*";
  double drain_timeout = 30;
  int64_t response_cache_mb = 0;
  bool no_prefix_cache = false, log_requests = false;
  double request_timeout = 600;
};

// The name clients put in "model": the checkpoint's directory or file name.
std::string default_name(const std::string& path) {
  std::filesystem::path p(path);
  if (p.filename().empty()) p = p.parent_path();
  return p.filename().string();
}

int run_serve(const ServeArgs& a) {
  if (a.slots < 1) throw core::ConfigError("--slots must be at least 1");
  // Every sequence waits in the queue (if only for a step) before a slot
  // takes it: with room for none, every request would be a 429.
  if (a.max_queue < 1) throw core::ConfigError("--max-queue must be at least 1 (every request passes through the queue)");
  if (a.max_body < 1) throw core::ConfigError("--max-body must be at least 1 byte");
  if (a.port < 0 || a.port > 65535) throw core::ConfigError("--port must be in [0, 65535]");
  if (!(a.drain_timeout >= 0)) throw core::ConfigError("--drain-timeout must be a number of seconds >= 0");
  if (!(a.request_timeout >= 0)) throw core::ConfigError("--request-timeout must be a number of seconds >= 0 (0: none)");
  if (a.response_cache_mb < 0) throw core::ConfigError("--response-cache-mb must not be negative");
  if (a.precision != "fp32" && encoder_checkpoint(a.model).empty())
    throw core::ConfigError("--precision " + a.precision + " is for encoder classifiers; a GPT serves its weights "
                            "as loaded (brisk quantize for int8/int4, --kv-dtype bf16 for the key/value pool)");
  // SIGINT and SIGTERM are taken by one thread (sigwait) rather than a
  // handler, so stopping may lock and join. Blocked before any thread starts
  // (the engine's included), so every thread inherits the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client that hangs up is a failed write, not the end of the server

  // Listening before the model loads: /health answers 503 until it can
  // serve, so a load balancer (or a client polling /health) waits for it
  // rather than seeing connections refused.
  serve::ServerOptions so;
  so.host = a.host;
  so.port = a.port;
  so.max_body = a.max_body;
  so.http_threads = a.slots + a.max_queue + 4;  // every running and queued request holds an HTTP thread
  so.max_connections = std::max(a.max_connections, so.http_threads);
  so.api_key = a.api_key;
  so.cors_origin = a.cors_origin;
  so.response_cache_bytes = a.response_cache_mb << 20;
  if (a.log_requests)  // one fprintf per line: stdio's lock keeps lines from different threads whole
    so.access_log = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
  serve::Server server(so);
  const int port = server.bind();
  std::thread listener([&] { server.listen(); });
  std::fprintf(stderr, "brisk serve: loading %s (http://%s:%d/health says 503 until it is ready)\n", a.model.c_str(),
               a.host.c_str(), port);

  // A stop signal drains: new requests get 503 (and /health 503, so a load
  // balancer moves on) while running ones finish, for up to --drain-timeout
  // seconds; what is left then ends with an error, and the server exits.
  // While the model loads there is nothing to drain: the process exits.
  // Set once the model is attached: what ends every open request. The
  // waiter reads it only after seeing `attached`.
  std::function<void()> stop_model;
  std::atomic<bool> attached{false};
  std::atomic<bool> serving{true};
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    if (!serving) return;  // woken by the Joiner below: the server has stopped already
    const char* name = sig == SIGINT ? "SIGINT" : "SIGTERM";
    if (!attached) {
      std::fprintf(stderr, "brisk serve: %s while loading the model, stopped\n", name);
      std::fflush(stderr);
      std::_Exit(0);
    }
    server.start_draining();
    std::fprintf(stderr, "brisk serve: %s, draining %lld open requests (up to %.0f s)\n", name,
                 (long long)server.open_requests(), a.drain_timeout);
    if (!server.wait_for_open_requests(a.drain_timeout))
      std::fprintf(stderr, "brisk serve: drain timeout, ending %lld requests\n", (long long)server.open_requests());
    stop_model();  // ends every open request, so no HTTP thread stays blocked
    // Their errors go out before the server stops (httplib cuts a stream
    // short once it has stopped): up to a second more.
    server.wait_for_open_requests(1.0);
    server.stop();
  });
  // The model's side, whichever it is: a GPT's tokenizer, engine and
  // scheduler (whose metrics the server writes while draining), or an
  // encoder's service and what it counts. Declared before the Joiner, so
  // that they outlive both threads: the waiter may stop them and the HTTP
  // threads use them until the listener returns.
  std::unique_ptr<data::Tokenizer> tok;
  std::unique_ptr<infer::Engine> engine;
  std::unique_ptr<serve::Scheduler> scheduler;
  std::unique_ptr<serve::Metrics> pooled_metrics;
  std::unique_ptr<serve::PooledService> pooled;
  // Stops and joins both threads however this function ends (a model that
  // fails to load throws out of it), before the model's side goes.
  struct Joiner {
    std::thread &listener, &waiter;
    std::atomic<bool>& serving;
    serve::Server& server;
    ~Joiner() {
      serving = false;
      server.stop();
      if (listener.joinable()) listener.join();
      pthread_kill(waiter.native_handle(), SIGTERM);  // wakes the waiter if it still waits; it then returns
      waiter.join();
    }
  } joiner{listener, waiter, serving, server};

  if (const char* delay = std::getenv("BRISK_SERVE_LOAD_DELAY_MS"))  // tests: a model that takes a while to load
    std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(delay)));
  const std::string model_name = a.model_name.empty() ? default_name(a.model) : a.model_name;
  if (const std::string dir = encoder_checkpoint(a.model); !dir.empty()) {
    PooledServing p = load_pooled(dir, a.threads, a.precision);
    pooled_metrics = std::make_unique<serve::Metrics>();
    pooled = std::make_unique<serve::PooledService>(p.model, a.max_batch, a.max_queue, *pooled_metrics,
                                                     a.request_timeout);
    serve::ModelInfo info{model_name, p.model.vocab, p.model.max_len};
    server.attach(*pooled, p.encode, info);
    stop_model = [service = pooled.get()] { service->stop(); };
    attached = true;
    std::printf("brisk serve: %s on http://%s:%d (%s, from %s; POST %s, max_len %lld, batch %d, queue %d)\n",
                info.name.c_str(), a.host.c_str(), port, p.what.c_str(), dir.c_str(),
                p.model.kind == serve::PooledModel::Kind::classifier ? "/classify" : "/v1/embeddings",
                (long long)p.model.max_len, a.max_batch, a.max_queue);
    std::fflush(stdout);
    listener.join();  // returns after the waiter's server.stop()
    std::fprintf(stderr, "brisk serve: stopped\n");
    return 0;
  }
  infer::Model model = infer::load_model(a.model);
  tok = data::make_tokenizer(model.tokenizer, a.vocab_dir);
  serve::ModelInfo info{model_name, model.config.vocab_size, model.config.block_size};
  info.max_choices = a.max_queue;  // a request's choices all wait in the queue at first
  infer::EngineOptions eo;
  eo.max_seqs = a.slots;
  eo.threads = a.threads;
  eo.kv_mb = a.kv_mb;
  eo.kv_dtype = core::dtype_from_name(a.kv_dtype);
  eo.prefix_cache = !a.no_prefix_cache;
  eo.max_step_tokens = std::max<int64_t>(512, a.slots);
  engine = std::make_unique<infer::Engine>(std::move(model), eo, tok.get());
  scheduler = std::make_unique<serve::Scheduler>(*engine, a.max_queue, a.request_timeout);
  server.attach(*scheduler, *tok, info);
  stop_model = [s = scheduler.get()] { s->stop(); };
  attached = true;
  std::printf("brisk serve: %s on http://%s:%d (%s %s, context %lld, %d slots, queue %d, KV pool %.1f MiB %s)\n",
              info.name.c_str(), a.host.c_str(), port, infer::scheme_name(engine->model().scheme),
              engine->model().source.c_str(), (long long)info.context, a.slots, a.max_queue,
              double(engine->kv_bytes()) / (1 << 20), a.kv_dtype.c_str());
  std::fflush(stdout);
  listener.join();  // returns after the waiter's server.stop()
  std::fprintf(stderr, "brisk serve: stopped\n");
  return 0;
}

}  // namespace

ServeCommand add_serve_command(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  auto* s = app.add_subcommand("serve", "Serve a model over an OpenAI-compatible HTTP API (/v1/completions; encoder "
                                         "models: /classify, /v1/embeddings)");
  s->add_option("--model", a->model,
                "brisk checkpoint or run directory (a GPT, an encoder classifier, a sequence autoencoder), a "
                "quantized .safetensors, or Hugging Face GPT-2 safetensors")
      ->required();
  s->add_option("--model-name", a->model_name, "Name in /v1/models and the \"model\" field (default: the file name)");
  s->add_option("--host", a->host, "Address to listen on")->capture_default_str();
  s->add_option("--port", a->port, "Port (0 = any free port)")->capture_default_str();
  s->add_option("--slots", a->slots, "Sequences decoding at once")->capture_default_str();
  s->add_option("--max-queue", a->max_queue, "Requests waiting for a slot before 429")->capture_default_str();
  s->add_option("--max-connections", a->max_connections,
                 "Connections served at once, kept-alive ones too (each holds an HTTP thread; at least --slots + --max-queue + 4); more wait")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  s->add_option("--max-body", a->max_body, "Largest request body in bytes (larger: 413)")->capture_default_str();
  s->add_option("--max-batch", a->max_batch,
                "Encoder models: sequences one forward runs at most, from every waiting request")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  s->add_option("--precision", a->precision,
                "Encoder classifiers: fp32, or bf16 where the CPU has bf16 dot products (fp32 with a warning where "
                "it does not)")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  s->add_option("--threads", a->threads, "CPU threads for the engine (0 = all cores)")->check(non_negative());
  s->add_option("--kv-mb", a->kv_mb, "Key/value pool in MiB (0 = full context for every slot)");
  s->add_option("--kv-dtype", a->kv_dtype, "Key/value pool element type: f32, or bf16 (half the memory)")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  s->add_option("--vocab-dir", a->vocab_dir, "GPT-2 vocabulary directory (gpt2 models)");
  s->add_option("--api-key", a->api_key,
                "Require \"Authorization: Bearer KEY\" on every route but /health (default: $BRISK_API_KEY)")
      ->envname("BRISK_API_KEY");
  s->add_option("--cors-origin", a->cors_origin,
                "Access-Control-Allow-Origin sent with every answer, for browser clients (\"\" = no CORS headers)")
      ->capture_default_str();
  s->add_option("--request-timeout", a->request_timeout,
                "Seconds a request may wait and run before it is dropped with 504 (0 = no limit)")
      ->capture_default_str();
  s->add_flag("--no-prefix-cache", a->no_prefix_cache,
              "Do not share the key/value blocks of prompt prefixes seen before");
  s->add_option("--response-cache-mb", a->response_cache_mb,
                "Keep answers of deterministic requests (greedy or seeded) up to this many MiB, least recently used "
                "out first (0 = off)")
      ->capture_default_str();
  s->add_flag("--log-requests", a->log_requests,
              "Write one line per answered request to stderr (logfmt: time, client, method, path, status, ms, "
              "stream, token counts)");
  s->add_option("--drain-timeout", a->drain_timeout,
                "Seconds running requests may take to finish after SIGTERM/SIGINT")
      ->capture_default_str();
  ServeCommand c;
  c.app = s;
  c.run = [a] { return run_serve(*a); };
  return c;
}

}  // namespace brisk::cli
