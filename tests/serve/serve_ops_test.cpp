// `brisk serve` operations (src/serve/): /metrics, --api-key and draining,
// in-process on a free port with a small random GPT and the byte tokenizer.
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <omp.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <thread>

#include "brisk/data/tokenizer.h"
#include "brisk/infer/engine.h"
#include "brisk/serve/server.h"
#include "raw_connection.h"
#include "../common/tiny_gpt.h"

namespace brisk {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Random GPTs saved once per process under one directory, removed at exit:
// "tiny" (fast) and "slow" (4 x 256 wide, 512 context: a long generation
// takes long enough to still be running when a test acts on it).
const std::string& checkpoint(bool slow) {
  static const struct Dirs {
    fs::path root = fs::temp_directory_path() / ("brisk_serve_ops_test_" + std::to_string(::getpid()));
    std::string tiny, slow;
    static std::string save(const fs::path& dir, int64_t layers, int64_t width, int64_t context) {
      testing::TinyGpt t;
      t.layers = layers, t.width = width, t.context = context, t.seed = 5;
      return testing::save_tiny_gpt(dir.string(), t);
    }
    Dirs() : tiny(save(root / "tiny", 1, 32, 64)), slow(save(root / "slow", 4, 256, 512)) {}
    ~Dirs() {
      std::error_code ec;
      fs::remove_all(root, ec);
    }
  } dirs;
  return slow ? dirs.slow : dirs.tiny;
}

struct Served {
  std::unique_ptr<data::Tokenizer> tok = data::make_byte_tokenizer();
  std::unique_ptr<infer::Engine> engine;
  std::unique_ptr<serve::Scheduler> scheduler;
  std::unique_ptr<serve::Server> server;
  std::thread thread;
  int port = 0;

  explicit Served(const std::string& api_key = "", bool slow = false, int64_t response_cache_bytes = 0,
                  double request_timeout_s = 0, std::function<void(const std::string&)> access_log = {}) {
    infer::EngineOptions eo;
    eo.max_seqs = 4;
    eo.threads = 1;
    eo.max_step_tokens = 64;
    engine = std::make_unique<infer::Engine>(infer::load_model(checkpoint(slow)), eo, tok.get());
    scheduler = std::make_unique<serve::Scheduler>(*engine, 8, request_timeout_s);
    serve::ServerOptions so;
    so.port = 0;
    so.http_threads = 16;
    so.api_key = api_key;
    so.response_cache_bytes = response_cache_bytes;
    so.access_log = std::move(access_log);
    server = std::make_unique<serve::Server>(*scheduler, *tok,
                                             serve::ModelInfo{"tiny", 256, engine->model().config.block_size}, so);
    port = server->bind();
    thread = std::thread([this] { server->listen(); });
    server->wait_until_ready();
  }
  ~Served() {
    scheduler->stop();
    server->stop();
    thread.join();
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60, 0);
    return c;
  }
};

const char* kJson = "application/json";

// Prometheus text -> {series with labels: value}.
std::map<std::string, double> parse_metrics(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.rfind(' ');
    out[line.substr(0, sp)] = std::stod(line.substr(sp + 1));
  }
  return out;
}

std::map<std::string, double> metrics_of(httplib::Client& c) {
  auto r = c.Get("/metrics");
  EXPECT_TRUE(r && r->status == 200);
  return r ? parse_metrics(r->body) : std::map<std::string, double>{};
}

// The metrics once `done` holds of them, polled every 2 ms (at most `tries`
// times: then the last ones read, for the caller's assertions to report).
template <class Done>
std::map<std::string, double> metrics_when(httplib::Client& c, Done done, int tries = 500) {
  std::map<std::string, double> m = metrics_of(c);
  for (int i = 1; i < tries && !done(m); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    m = metrics_of(c);
  }
  return m;
}

// A streamed /v1/completions request whose body bytes go to `receive` as
// they arrive (returning false hangs up).
httplib::Request stream_request(const json& body, httplib::ContentReceiverWithProgress receive) {
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", kJson);
  req.content_receiver = std::move(receive);
  return req;
}

TEST(ServeMetrics, CountRequestsTokensAndLatencies) {
  Served s;
  auto c = s.client();
  {
    // A fresh server: every key/value block free, nothing busy.
    const std::map<std::string, double> fresh = metrics_of(c);
    EXPECT_EQ(fresh.at("brisk_kv_blocks_used"), 0);
    EXPECT_GT(fresh.at("brisk_kv_blocks_total"), 0);
    EXPECT_EQ(fresh.at("brisk_slots_busy"), 0);
  }
  int64_t completion_tokens = 0;
  for (bool stream : {false, true}) {
    const json body = {{"prompt", "In the beginning"}, {"max_tokens", 6}, {"temperature", 0}, {"stream", stream}};
    auto r = c.Post("/v1/completions", body.dump(), kJson);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    if (!stream) completion_tokens += json::parse(r->body)["usage"]["completion_tokens"].get<int64_t>();
    else completion_tokens += 6;  // max_tokens, no stop string: every token is generated
  }
  ASSERT_EQ(c.Get("/no/such/route")->status, 404);
  ASSERT_EQ(c.Get("/v1/models/no-such-model")->status, 404);

  // A request is counted after its response is sent, which can be a moment
  // after the client has read the end of it...
  std::map<std::string, double> m;
  for (int tries = 0; tries < 500; ++tries) {
    auto r = c.Get("/metrics");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200);
    EXPECT_NE(r->get_header_value("Content-Type").find("text/plain"), std::string::npos);
    m = parse_metrics(r->body);
    // ... and the gauges are published after the step that ended the last one.
    if (m["brisk_requests_total{path=\"/v1/completions\",status=\"200\"}"] >= 2 &&
        m["brisk_requests_total{path=\"other\",status=\"404\"}"] >= 1 &&
        m["brisk_requests_total{path=\"/v1/models/{id}\",status=\"404\"}"] >= 1 && m["brisk_slots_busy"] == 0 &&
        m["brisk_kv_blocks_used"] == 0)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(m.at("brisk_requests_total{path=\"/v1/completions\",status=\"200\"}"), 2);
  EXPECT_EQ(m.at("brisk_requests_total{path=\"other\",status=\"404\"}"), 1);  // unknown paths share one label
  EXPECT_EQ(m.at("brisk_requests_total{path=\"/v1/models/{id}\",status=\"404\"}"), 1);  // so do model ids
  EXPECT_EQ(m.at("brisk_generation_tokens_total"), double(completion_tokens));
  EXPECT_EQ(m.at("brisk_prompt_tokens_total"), 2.0 * 16);  // "In the beginning": 16 bytes, twice
  EXPECT_EQ(m.at("brisk_time_to_first_token_seconds_count"), 2);
  EXPECT_EQ(m.at("brisk_inter_token_latency_seconds_count"), double(completion_tokens - 2));
  EXPECT_EQ(m.at("brisk_request_duration_seconds_count"), 2);
  EXPECT_GT(m.at("brisk_time_to_first_token_seconds_sum"), 0);
  EXPECT_EQ(m.at("brisk_slots_total"), 4);
  EXPECT_EQ(m.at("brisk_slots_busy"), 0);
  EXPECT_EQ(m.at("brisk_kv_blocks_used"), 0);  // both finished: their blocks are back
  EXPECT_GT(m.at("brisk_kv_blocks_total"), 0);
  EXPECT_EQ(m.at("brisk_draining"), 0);
  // Buckets are cumulative and end at the count.
  double last = 0;
  const std::regex bucket("brisk_inter_token_latency_seconds_bucket\\{le=\"([^\"]+)\"\\}");
  int buckets = 0;
  for (const auto& [series, v] : m)
    if (std::regex_match(series, bucket)) ++buckets;
  EXPECT_GE(buckets, 5);
  for (const char* le : {"0.001", "0.01", "0.1", "1", "+Inf"}) {
    const double v = m.at(std::string("brisk_inter_token_latency_seconds_bucket{le=\"") + le + "\"}");
    EXPECT_GE(v, last) << le;
    last = v;
  }
  EXPECT_EQ(last, m.at("brisk_inter_token_latency_seconds_count"));
}

// The slot and key/value gauges are published before a request's last
// token is handed to its handler: a client that reads /metrics as soon as
// its response arrives finds nothing busy. They used to be published after
// the hand-over; a read then saw the finished request still holding its
// slot and blocks whenever the scheduler thread was descheduled between the
// two (4 reads in 100 with the cores busy; none on an idle machine).
TEST(ServeMetrics, TheGaugesAreIdleAsSoonAsAResponseArrives) {
  Served s;
  auto c = s.client();
  int stale = 0;
  for (int i = 0; i < 100; ++i) {
    const json body = {{"prompt", "And God said"}, {"max_tokens", 2}, {"temperature", 0}};
    auto r = c.Post("/v1/completions", body.dump(), kJson);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const std::map<std::string, double> m = metrics_of(c);
    stale += m.at("brisk_slots_busy") != 0 || m.at("brisk_kv_blocks_used") != 0;
  }
  EXPECT_EQ(stale, 0) << "reads of /metrics right after a response that still showed it running";
}

TEST(ServeApiKey, EveryRouteButHealthNeedsTheKey) {
  Served s("sekret");
  auto c = s.client();
  EXPECT_EQ(c.Get("/health")->status, 200);  // load balancers probe without a key
  auto r = c.Get("/v1/models");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  EXPECT_EQ(r->get_header_value("WWW-Authenticate"), "Bearer");
  const json e = json::parse(r->body);
  EXPECT_NE(e["error"]["message"].get<std::string>().find("API key"), std::string::npos);
  EXPECT_EQ(c.Get("/v1/models", {{"Authorization", "Bearer wrong"}})->status, 401);
  EXPECT_EQ(c.Get("/metrics")->status, 401);
  const json body = {{"prompt", "x"}, {"max_tokens", 2}};
  EXPECT_EQ(c.Post("/v1/completions", body.dump(), kJson)->status, 401);
  EXPECT_EQ(c.Get("/v1/models", {{"Authorization", "Bearer sekret"}})->status, 200);
  EXPECT_EQ(c.Post("/v1/completions", {{"Authorization", "Bearer sekret"}}, body.dump(), kJson)->status, 200);
  EXPECT_EQ(json::parse(c.Get("/v1/models")->body)["error"]["code"], "invalid_api_key");
  // The scheme is case-insensitive (RFC 7235); the key is not.
  EXPECT_EQ(c.Get("/v1/models", {{"Authorization", "bearer sekret"}})->status, 200);
  EXPECT_EQ(c.Get("/v1/models", {{"Authorization", "Bearer SEKRET"}})->status, 401);
  EXPECT_EQ(c.Get("/v1/models", {{"Authorization", "Bearer sekret2"}})->status, 401);
}

// A browser's CORS preflight (OPTIONS, no key) is answered on every known
// route, and every answer allows the page's origin (--cors-origin, "*" by
// default): it was a 404 "no route", so no web page could call the API.
TEST(ServeCors, PreflightsAreAnsweredWithoutTheKeyAndAnswersAllowTheOrigin) {
  Served s("sekret");
  auto c = s.client();
  httplib::Request pre;
  pre.method = "OPTIONS";
  pre.path = "/v1/chat/completions";
  pre.set_header("Origin", "http://ui.example");
  pre.set_header("Access-Control-Request-Method", "POST");
  pre.set_header("Access-Control-Request-Headers", "authorization, content-type, x-stainless-os");
  auto r = c.send(pre);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 204);
  EXPECT_EQ(r->get_header_value("Allow"), "POST, OPTIONS");
  EXPECT_EQ(r->get_header_value("Access-Control-Allow-Origin"), "*");
  EXPECT_EQ(r->get_header_value("Access-Control-Allow-Methods"), "POST, OPTIONS");
  EXPECT_EQ(r->get_header_value("Access-Control-Allow-Headers"), "authorization, content-type, x-stainless-os");
  pre.path = "/v1/models";
  r = c.send(pre);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 204);
  EXPECT_EQ(r->get_header_value("Allow"), "GET, HEAD, OPTIONS");
  pre.path = "/no/such/route";
  r = c.send(pre);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  // Real requests still need the key, and every answer, refused or not, names the origin allowed.
  auto refused = c.Get("/v1/models");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 401);
  EXPECT_EQ(refused->get_header_value("Access-Control-Allow-Origin"), "*");
  auto ok = c.Post("/v1/completions", {{"Authorization", "Bearer sekret"}},
                   json{{"prompt", "x"}, {"max_tokens", 2}, {"stream", true}}.dump(), kJson);
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  EXPECT_EQ(ok->get_header_value("Access-Control-Allow-Origin"), "*");
  // 405's Allow lists OPTIONS too.
  auto wrong = c.Get("/v1/completions", {{"Authorization", "Bearer sekret"}});
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 405);
  EXPECT_EQ(wrong->get_header_value("Allow"), "POST, OPTIONS");
}

// A greedy stream of 400 tokens of the slow model on its own thread: what
// it received, and its status (0: no answer).
struct LongStream {
  std::atomic<bool> first_chunk{false};
  std::string streamed;
  int status = 0;
  std::thread thread;
  explicit LongStream(const Served& s) {
    thread = std::thread([this, &s] {
      auto c = s.client();
      const json body = {{"prompt", "And"}, {"max_tokens", 400}, {"temperature", 0}, {"stream", true}};
      httplib::Request req = stream_request(body, [this](const char* data, size_t n, uint64_t, uint64_t) {
        streamed.append(data, n);
        first_chunk = true;
        return true;
      });
      if (auto r = c.send(req)) status = r->status;
    });
    for (int i = 0; i < 30000 && !first_chunk; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_TRUE(first_chunk) << "no token streamed within 30 s";
  }
  ~LongStream() {
    if (thread.joinable()) thread.join();
  }
};

// The same request not streamed: its status (0: no answer) and body.
struct LongRequest {
  int status = 0;
  std::string body;
  std::jthread thread;  // joined however the test ends
  explicit LongRequest(const Served& s)
      : thread([this, &s] {
          auto c = s.client();
          if (auto r = c.Post("/v1/completions", json{{"prompt", "And"}, {"max_tokens", 400}}.dump(), kJson)) {
            status = r->status;
            body = r->body;
          }
        }) {}
};

// Waits (up to 5 s) until `n` requests are open.
bool open_soon(const Served& s, int64_t n) {
  for (int i = 0; i < 5000 && s.server->open_requests() < n; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return s.server->open_requests() == n;
}

TEST(ServeDrain, RunningStreamsFinishNewRequestsGet503) {
  Served s("", /*slow=*/true);
  // A stream that is running when draining starts: it must end normally.
  LongStream stream(s);
  s.server->start_draining();
  EXPECT_EQ(s.server->open_requests(), 1);  // 400 tokens of the slow model: still running

  auto c = s.client();
  EXPECT_EQ(c.Get("/health")->status, 503);
  auto r = c.Post("/v1/completions", json{{"prompt", "x"}, {"max_tokens", 2}}.dump(), kJson);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(json::parse(r->body)["error"]["type"], "server_error");

  stream.thread.join();
  EXPECT_EQ(stream.status, 200);
  EXPECT_NE(stream.streamed.find("data: [DONE]"), std::string::npos);
  EXPECT_NE(stream.streamed.find("\"finish_reason\":\"length\""), std::string::npos);
  // The stream counts as open until httplib releases it, just after its last write.
  for (int i = 0; i < 1000 && s.server->open_requests() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_EQ(s.server->open_requests(), 0);
}

// What the stop thread does at the drain timeout: the scheduler ends what
// runs, the open requests write their errors, then the server stops. A
// stream gets its error event and [DONE] (httplib cuts a stream short once
// the server has stopped, hence the wait), a non-streamed request its 503.
TEST(ServeDrain, AtTheDrainTimeoutRunningRequestsStillGetTheirErrors) {
  Served s("", /*slow=*/true);
  LongStream stream(s);
  LongRequest plain(s);
  ASSERT_TRUE(open_soon(s, 2));
  s.server->start_draining();
  s.scheduler->stop();
  EXPECT_TRUE(s.server->wait_for_open_requests(5.0));
  s.server->stop();
  stream.thread.join();
  plain.thread.join();
  const std::string& streamed = stream.streamed;
  EXPECT_EQ(stream.status, 200);
  EXPECT_NE(streamed.find("\"error\""), std::string::npos) << streamed.substr(streamed.size() > 300 ? streamed.size() - 300 : 0);
  EXPECT_NE(streamed.find("data: [DONE]"), std::string::npos);
  EXPECT_EQ(plain.status, 503) << plain.body;
  EXPECT_NE(plain.body.find("server_error"), std::string::npos) << plain.body;
}

// An answer written after the server's stop() still goes out: stop() shuts
// only idle connections, as httplib does not write on a socket whose read
// side is shut (stopped first here, so that the answer comes after it).
TEST(ServeDrain, AnAnswerWrittenAfterStopStillGoesOut) {
  Served s("", /*slow=*/true);
  LongRequest plain(s);
  ASSERT_TRUE(open_soon(s, 1));
  s.server->stop();
  s.scheduler->stop();
  plain.thread.join();
  EXPECT_EQ(plain.status, 503) << plain.body;
}

// The schema is part of the key: the same greedy request under another
// schema is generated again, not answered with the first schema's text.
TEST(ServeResponseCache, TheJsonSchemaIsPartOfTheKey) {
  Served s("", false, 1 << 20);
  auto c = s.client();
  const std::string head = R"({"prompt":"x","max_tokens":20,"temperature":0,"logit_bias":{"9":-100,"10":-100,)"
                           R"("13":-100,"32":-100},"guided_json":)";
  for (int round = 0; round < 2; ++round) {  // the second round from the cache
    auto one = c.Post("/v1/completions", head + R"({"type":"array","minItems":1,"maxItems":1,"items":{"type":"null"}}})",
                      kJson);
    auto none = c.Post("/v1/completions", head + R"({"type":"array","maxItems":0}})", kJson);
    ASSERT_TRUE(one && none);
    ASSERT_EQ(one->status, 200) << one->body;
    ASSERT_EQ(none->status, 200) << none->body;
    EXPECT_EQ(json::parse(one->body)["choices"][0]["text"], "[null]") << round;
    EXPECT_EQ(json::parse(none->body)["choices"][0]["text"], "[]") << round;
  }
  EXPECT_EQ(metrics_of(c)["brisk_response_cache_hits_total"], 2);
}

// So is a grammar or regular expression.
TEST(ServeResponseCache, TheGrammarIsPartOfTheKey) {
  Served s("", false, 1 << 20);
  auto c = s.client();
  for (int round = 0; round < 2; ++round) {
    for (const char* want : {"aaa", "bbb"}) {
      const json body = {{"prompt", "x"}, {"max_tokens", 20}, {"temperature", 0},
                         {"guided_regex", std::string(1, want[0]) + "{3}"}};
      auto r = c.Post("/v1/completions", body.dump(), kJson);
      ASSERT_TRUE(r);
      ASSERT_EQ(r->status, 200) << r->body;
      EXPECT_EQ(json::parse(r->body)["choices"][0]["text"], want) << round;
    }
    const json gbnf = {{"prompt", "x"}, {"max_tokens", 20}, {"temperature", 0}, {"grammar", "root ::= \"ccc\""}};
    auto r = c.Post("/v1/completions", gbnf.dump(), kJson);
    ASSERT_TRUE(r);
    EXPECT_EQ(json::parse(r->body)["choices"][0]["text"], "ccc") << round;
  }
  EXPECT_EQ(metrics_of(c)["brisk_response_cache_hits_total"], 3);
}

TEST(ServeResponseCache, DeterministicRequestsAreAnsweredFromTheCache) {
  Served s("", false, 1 << 20);
  auto c = s.client();
  const json greedy = {{"prompt", "In the beginning"}, {"max_tokens", 8}, {"temperature", 0}};
  auto first = c.Post("/v1/completions", greedy.dump(), kJson);
  ASSERT_TRUE(first);
  ASSERT_EQ(first->status, 200);
  const json a = json::parse(first->body);
  auto m = metrics_of(c);
  EXPECT_EQ(m["brisk_response_cache_misses_total"], 1);
  EXPECT_EQ(m["brisk_response_cache_hits_total"], 0);
  EXPECT_EQ(m["brisk_response_cache_entries"], 1);
  EXPECT_GT(m["brisk_response_cache_bytes"], 0);
  const double generated = m["brisk_generation_tokens_total"];

  // Again: the same text and usage, a fresh id, and the model did not run.
  const json b = json::parse(c.Post("/v1/completions", greedy.dump(), kJson)->body);
  EXPECT_EQ(b["choices"][0]["text"], a["choices"][0]["text"]);
  EXPECT_EQ(b["usage"], a["usage"]);
  EXPECT_NE(b["id"], a["id"]);
  m = metrics_of(c);
  EXPECT_EQ(m["brisk_response_cache_hits_total"], 1);
  EXPECT_EQ(m["brisk_generation_tokens_total"], generated);

  // Streamed, the cached events give the same text.
  json streamed = greedy;
  streamed["stream"] = true;
  auto r = c.Post("/v1/completions", streamed.dump(), kJson);
  ASSERT_TRUE(r);
  std::string text;
  std::istringstream in(r->body);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("data: {", 0) == 0) text += json::parse(line.substr(6))["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(text, a["choices"][0]["text"]);
  EXPECT_NE(r->body.find("data: [DONE]"), std::string::npos);
  EXPECT_EQ(metrics_of(c)["brisk_response_cache_hits_total"], 2);

  // Seeded sampling is deterministic too; unseeded sampling never touches the cache.
  const json seeded = {{"prompt", "And God"}, {"max_tokens", 8}, {"temperature", 1}, {"seed", 7}};
  const json s1 = json::parse(c.Post("/v1/completions", seeded.dump(), kJson)->body);
  const json s2 = json::parse(c.Post("/v1/completions", seeded.dump(), kJson)->body);
  EXPECT_EQ(s1["choices"][0]["text"], s2["choices"][0]["text"]);
  m = metrics_of(c);
  EXPECT_EQ(m["brisk_response_cache_hits_total"], 3);
  EXPECT_EQ(m["brisk_response_cache_misses_total"], 2);
  const json unseeded = {{"prompt", "And God"}, {"max_tokens", 8}, {"temperature", 1}};
  for (int i = 0; i < 2; ++i) ASSERT_EQ(c.Post("/v1/completions", unseeded.dump(), kJson)->status, 200);
  m = metrics_of(c);
  EXPECT_EQ(m["brisk_response_cache_hits_total"], 3);
  EXPECT_EQ(m["brisk_response_cache_misses_total"], 2);
  EXPECT_EQ(m["brisk_response_cache_entries"], 2);
}

TEST(ServeResponseCache, LeastRecentlyUsedLeaveWithinTheBudget) {
  const int64_t budget = 6000;
  Served s("", false, budget);
  auto c = s.client();
  auto ask = [&](int i) {
    const json body = {{"prompt", "prompt " + std::to_string(i)}, {"max_tokens", 8}, {"temperature", 0}};
    auto r = c.Post("/v1/completions", body.dump(), kJson);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200);
  };
  for (int i = 0; i < 12; ++i) ask(i);
  auto m = metrics_of(c);
  EXPECT_GT(m["brisk_response_cache_evictions_total"], 0);
  EXPECT_LE(m["brisk_response_cache_bytes"], double(budget));
  EXPECT_GE(m["brisk_response_cache_entries"], 1);
  EXPECT_EQ(m["brisk_response_cache_entries"] + m["brisk_response_cache_evictions_total"], 12);
  // The newest is still there, the oldest is not.
  ask(11);
  EXPECT_EQ(metrics_of(c)["brisk_response_cache_hits_total"], 1);
  ask(0);
  EXPECT_EQ(metrics_of(c)["brisk_response_cache_hits_total"], 1);
}

TEST(ServePrefixCache, RepeatedPromptReportsCachedTokensAndKeepsTheText) {
  Served s;
  auto c = s.client();
  const std::string prompt(40, 'a');  // 40 tokens: 2 whole blocks of 16 before the last token
  const json body = {{"prompt", prompt + "b"}, {"max_tokens", 6}, {"temperature", 0}};
  const json first = json::parse(c.Post("/v1/completions", body.dump(), kJson)->body);
  EXPECT_EQ(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  const json second = json::parse(c.Post("/v1/completions", body.dump(), kJson)->body);
  EXPECT_EQ(second["usage"]["prompt_tokens_details"]["cached_tokens"], 32);
  EXPECT_EQ(second["usage"]["prompt_tokens"], 41);
  EXPECT_EQ(second["choices"][0]["text"], first["choices"][0]["text"]);
  const auto m = metrics_of(c);
  EXPECT_EQ(m.at("brisk_prefix_cache_hit_tokens_total"), 32);
  EXPECT_EQ(m.at("brisk_prompt_tokens_total"), 82);
  EXPECT_GE(m.at("brisk_kv_blocks_cached"), 2);
}

// A client that hangs up mid-stream frees its slot within a few engine
// steps: the server sees the hang-up at its next failed write (the first
// write after the close can still succeed), cancels, and the scheduler
// drops the sequence at its next step, long before its 400 tokens.
TEST(ServeDisconnect, AHungUpStreamFreesItsSlotWithinAFewSteps) {
  Served s("", /*slow=*/true);
  auto c = s.client();
  const json body = {{"prompt", "And"}, {"max_tokens", 400}, {"temperature", 0}, {"stream", true}};
  int chunks = 0;
  httplib::Request req =
      stream_request(body, [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 3; });  // then hang up
  c.send(req);
  const double steps_at_close = metrics_of(c).at("brisk_engine_steps_total");
  std::map<std::string, double> m = metrics_when(c, [](auto& m) { return m.at("brisk_slots_busy") == 0; });
  EXPECT_EQ(m.at("brisk_slots_busy"), 0);
  // Usually 0-3 steps; the HTTP thread that sees the failed write competes
  // with the engine's threads for 2 cores, so allow a margin that still
  // fails a server that lets the sequence run on (~400 steps).
  EXPECT_LE(m.at("brisk_engine_steps_total") - steps_at_close, 100);
  std::printf("slot free %.0f engine steps after the client hung up, %.0f tokens generated\n",
              m.at("brisk_engine_steps_total") - steps_at_close, m.at("brisk_generation_tokens_total"));
  EXPECT_LT(m.at("brisk_generation_tokens_total"), 400);  // the sequence did not run to its end
  EXPECT_EQ(m.at("brisk_kv_blocks_used"), 0);
  // Counted as a client that closed (499), not as the 200 its headers said.
  const std::string gone = "brisk_requests_total{path=\"/v1/completions\",status=\"499\"}";
  m = metrics_when(c, [&](auto& m) { return m[gone] > 0; });
  EXPECT_EQ(m[gone], 1);
  EXPECT_EQ((m["brisk_requests_total{path=\"/v1/completions\",status=\"200\"}"]), 0);
}

// A client of a non-streamed request that gives up (here: its read timeout)
// frees its slot too, though the server writes nothing it could fail on
// before the answer is complete: the server watches the connection and
// drops the sequence at the next step, counting the request as 499.
TEST(ServeDisconnect, AClientThatGivesUpOnANonStreamedRequestFreesItsSlot) {
  Served s("", /*slow=*/true);
  const json body = {{"prompt", "And"}, {"max_tokens", 400}, {"temperature", 0}};
  {
    httplib::Client impatient("127.0.0.1", s.port);
    impatient.set_read_timeout(0, 30 * 1000);  // 400 tokens take ~150 ms here, longer under load
    auto r = impatient.Post("/v1/completions", body.dump(), kJson);
    ASSERT_FALSE(r) << r->status << " " << r->body.substr(0, 300);  // timed out and closed the connection
  }
  auto c = s.client();
  const double steps_at_close = metrics_of(c).at("brisk_engine_steps_total");
  std::map<std::string, double> m = metrics_when(
      c,
      [](auto& m) {
        return m.at("brisk_slots_busy") == 0 && m["brisk_requests_total{path=\"/v1/completions\",status=\"499\"}"] == 1;
      },
      1000);
  EXPECT_EQ(m.at("brisk_slots_busy"), 0);
  EXPECT_EQ((m["brisk_requests_total{path=\"/v1/completions\",status=\"499\"}"]), 1);
  // The watch polls every 20 ms; allow the margin of the streamed case.
  EXPECT_LE(m.at("brisk_engine_steps_total") - steps_at_close, 100);
  std::printf("slot free %.0f engine steps after the client gave up, %.0f tokens generated\n",
              m.at("brisk_engine_steps_total") - steps_at_close, m.at("brisk_generation_tokens_total"));
  EXPECT_LT(m.at("brisk_generation_tokens_total"), 400);
  EXPECT_EQ(m.at("brisk_kv_blocks_used"), 0);
  // A patient client of the same request still gets its whole answer.
  json shorter = body;
  shorter["max_tokens"] = 5;
  auto r = c.Post("/v1/completions", shorter.dump(), kJson);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["usage"]["completion_tokens"], 5);
}

// A second server on a port one already listens on is refused: with
// httplib's default SO_REUSEPORT it bound the port too, and the kernel
// split the connections between the two.
TEST(ServeStartup, ASecondServerOnABusyPortIsRefused) {
  Served s;
  serve::ServerOptions so;
  so.port = s.port;
  serve::Server second(*s.scheduler, *s.tok, serve::ModelInfo{"second", 256, 64}, so);
  try {
    second.bind();
    ADD_FAILURE() << "a second server bound port " << s.port;
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("in use"), std::string::npos) << e.what();
  }
  // The first one still answers every request.
  auto c = s.client();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(c.Get("/v1/models")->status, 200);
}

// A client that sends its request and resets the connection at once (a
// proxy's abort, SO_LINGER 0) is gone before the server looks for its
// socket: the kernel still hands the server the request, but the socket has
// no peer address to be found by. Such requests ran to their end unwatched
// (5 x 120 tokens generated, none counted); each is now a 499 at once.
TEST(ServeDisconnect, AClientThatResetsBeforeItsRequestIsAdmittedIsCancelled) {
  Served s("", /*slow=*/true);
  const std::string body = json{{"prompt", "And"}, {"max_tokens", 120}, {"temperature", 0}}.dump();
  const std::string request = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                              "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  constexpr int kClients = 5;
  for (int i = 0; i < kClients; ++i) {
    const int fd = testing::connect_loopback(s.port);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(write(fd, request.data(), request.size()), ssize_t(request.size()));
    const linger abort_on_close{1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &abort_on_close, sizeof abort_on_close);
    close(fd);
  }
  auto c = s.client();
  const std::string cancelled = "brisk_requests_total{path=\"/v1/completions\",status=\"499\"}";
  std::map<std::string, double> m =
      metrics_when(c, [&](auto& m) { return m[cancelled] == kClients && m.at("brisk_slots_busy") == 0; }, 2500);
  EXPECT_EQ(m[cancelled], kClients);
  EXPECT_EQ(m.at("brisk_slots_busy"), 0);
  EXPECT_LT(m.at("brisk_generation_tokens_total"), kClients * 120 / 2) << "the requests ran unwatched";
}

// A schema nested 400,000 deep inside a body under the 1 MiB limit, with a
// key after it: parsing the body as ordered_json (to keep the schema's key
// order) copied the deep value recursively and the server died of a stack
// overflow. The nesting is checked first: a 400, and the server lives on.
TEST(ServeLimits, ADeeplyNestedSchemaIsA400NotACrash) {
  Served s;
  auto c = s.client();
  const std::string deep = std::string(400000, '[') + std::string(400000, ']');
  const std::vector<std::pair<std::string, std::string>> bodies = {
      {R"({"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"a",)"
       R"("parameters":{"type":"object","description":)" + deep + R"(}}}],"tool_choice":"required","max_tokens":5})",
       "tools"},
      {R"({"prompt":"x","response_format":{"type":"json_schema","json_schema":{"name":"n","schema":)"
       R"({"type":"object","description":)" + deep + R"(}}},"max_tokens":5})",
       "response_format"},
      {R"({"prompt":"x","guided_json":{"type":"object","description":)" + deep + R"(},"max_tokens":5})", "guided_json"},
  };
  for (const auto& [body, param] : bodies) {
    const std::string route = param == "tools" ? "/v1/chat/completions" : "/v1/completions";
    auto r = c.Post(route, body, kJson);
    ASSERT_TRUE(r) << param << ": no answer (the server died?)";
    EXPECT_EQ(r->status, 400) << r->body.substr(0, 300);
    const json e = json::parse(r->body)["error"];
    EXPECT_EQ(e["param"], param);
    EXPECT_NE(e["message"].get<std::string>().find("nests deeper than 300"), std::string::npos) << e;
  }
  EXPECT_EQ(c.Get("/health")->status, 200);
}

// Kept-alive connections each hold an HTTP thread while open. With a fixed
// pool (the server's 16 here), 20 idle ones made a new client wait for the
// 5 s keep-alive timeout (and clients that kept theirs busy locked everyone
// out); the pool now grows, so /health answers at once.
TEST(ServeConnections, IdleKeptAliveConnectionsDoNotLockOutNewClients) {
  Served s;
  const std::string request = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  std::vector<int> held;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 20; ++i) {
    const int fd = testing::connect_loopback(s.port, 3);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(write(fd, request.data(), request.size()), ssize_t(request.size()));
    char buf[512];
    ASSERT_GT(read(fd, buf, sizeof buf), 0) << "connection " << i << " was not answered within 3 s";
    held.push_back(fd);  // answered, and kept open
  }
  httplib::Client c("127.0.0.1", s.port);
  c.set_read_timeout(3, 0);
  c.set_connection_timeout(3, 0);
  auto r = c.Get("/health");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(r) << "no answer within 3 s while 20 kept-alive connections were open";
  EXPECT_EQ(r->status, 200);
  EXPECT_LT(seconds, 2.0) << "21 connections took " << seconds << " s to be answered";
  for (const int fd : held) close(fd);
}

// stop() ends a connection kept alive between requests at once: httplib
// served an idle one until its 5 s keep-alive timeout, and listen() (so
// `brisk serve` after SIGTERM) returned only then.
TEST(ServeConnections, StopClosesIdleKeptAliveConnectionsAtOnce) {
  Served s;
  const std::string request = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  const int fd = testing::connect_loopback(s.port, 10);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, request.data(), request.size()), ssize_t(request.size()));
  // The whole answer (headers, then Content-Length bytes), so that the
  // server has gone back to waiting for the next request.
  std::string answer;
  char buf[512];
  for (;;) {
    const size_t head = answer.find("\r\n\r\n");
    if (head != std::string::npos) {
      const size_t at = answer.find("Content-Length: ");
      ASSERT_NE(at, std::string::npos) << answer;
      if (answer.size() >= head + 4 + std::stoul(answer.substr(at + 16))) break;
    }
    const ssize_t n = read(fd, buf, sizeof buf);
    ASSERT_GT(n, 0) << "no whole answer: " << answer;
    answer.append(buf, size_t(n));
  }
  EXPECT_EQ(answer.rfind("HTTP/1.1 200", 0), 0u) << answer;
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // idle between requests
  const auto t0 = std::chrono::steady_clock::now();
  s.server->stop();
  s.thread.join();  // listen() returns once every connection has ended
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(seconds, 2.0) << "listen() returned " << seconds << " s after stop() with an idle connection open";
  EXPECT_EQ(read(fd, buf, sizeof buf), 0) << "the server closed the idle connection";
  close(fd);
  s.thread = std::thread([] {});  // the destructor joins it
}

// A client that keeps its request going a byte at a time (a slow upload
// here) does not hold a stopped server for as long as it likes: after
// stop()'s 5 s grace its connection is shut both ways and listen() returns.
TEST(ServeConnections, StopEndsASlowClientAfterItsGrace) {
  Served s;
  const int fd = testing::connect_loopback(s.port);
  ASSERT_GE(fd, 0);
  const std::string head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           "Content-Length: 1000\r\n\r\n{\"prompt\": \"";
  ASSERT_EQ(write(fd, head.data(), head.size()), ssize_t(head.size()));
  std::atomic<bool> done{false};
  std::jthread trickle([&] {  // a byte every 200 ms, well inside httplib's 5 s read timeout
    for (int i = 0; i < 150 && !done; ++i) {
      if (send(fd, "a", 1, MSG_NOSIGNAL) != 1) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // its headers are in: a request being read
  const auto t0 = std::chrono::steady_clock::now();
  s.server->stop();
  s.thread.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  done = true;
  trickle.join();
  close(fd);
  s.thread = std::thread([] {});  // the destructor joins it
  EXPECT_GT(seconds, 4.0) << "a connection with a request in progress was not given its grace";
  EXPECT_LT(seconds, 8.0) << "listen() returned " << seconds << " s after stop() while a client trickled";
}

// A client that leaves while its request waits for a slot takes it out of
// the queue, streamed or not: it is never admitted, so its prompt is never
// prefilled (without the watch a queued stream would be, once a slot freed,
// and dropped only at its first write).
TEST(ServeDisconnect, AClientThatLeavesWhileQueuedLeavesTheQueue) {
  Served s("", /*slow=*/true);  // 4 slots
  const json blocker = {{"prompt", "And"}, {"max_tokens", 500}, {"temperature", 0}};
  std::vector<std::thread> blockers;
  std::atomic<int> answered{0};
  for (int i = 0; i < 4; ++i)
    blockers.emplace_back([&] {
      auto c = s.client();
      auto r = c.Post("/v1/completions", blocker.dump(), kJson);
      if (r && r->status == 200) ++answered;
    });
  auto c = s.client();
  for (int i = 0; i < 5000 && metrics_of(c).at("brisk_slots_busy") < 4; ++i)  // up to ~10 s on a loaded machine
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  ASSERT_EQ(metrics_of(c).at("brisk_slots_busy"), 4);
  for (bool stream : {false, true}) {
    httplib::Client impatient("127.0.0.1", s.port);
    impatient.set_read_timeout(0, 30 * 1000);
    const json body = {{"prompt", "Hello there"}, {"max_tokens", 8}, {"temperature", 0}, {"stream", stream}};
    EXPECT_FALSE(impatient.Post("/v1/completions", body.dump(), kJson)) << "stream " << stream;
  }
  for (auto& t : blockers) t.join();
  EXPECT_EQ(answered, 4);
  std::map<std::string, double> m = metrics_when(c, [](auto& m) {
    return m["brisk_requests_total{path=\"/v1/completions\",status=\"499\"}"] == 2 && m.at("brisk_queue_length") == 0;
  });
  // Both: the stream's failed write answers 499, whatever its headers said.
  EXPECT_EQ((m["brisk_requests_total{path=\"/v1/completions\",status=\"499\"}"]), 2);
  EXPECT_EQ(m.at("brisk_queue_length"), 0);
  EXPECT_EQ(m.at("brisk_prompt_tokens_total"), 4 * 3) << "a queued request whose client left was prefilled";
}

// A waiting request whose client left gives up its place in the queue at
// once, wherever it waits: behind a request the engine cannot take yet it
// used to keep its place until it reached the front, and --max-queue
// refused live requests (429) in its stead.
TEST(ServeScheduler, ACancelledRequestBehindTheFrontFreesItsPlace) {
  infer::EngineOptions eo;
  eo.max_seqs = 1;
  eo.threads = 1;
  infer::Engine engine(infer::load_model(checkpoint(/*slow=*/true)), eo);
  serve::Scheduler scheduler(engine, /*max_queue=*/3);
  infer::SamplingParams long_run;
  long_run.temperature = 0;
  long_run.max_tokens = 500;
  const std::vector<int32_t> prompt{10, 20, 30};
  auto running = scheduler.submit(prompt, long_run);
  for (int i = 0; i < 5000 && scheduler.running() < 1; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  ASSERT_EQ(scheduler.running(), 1);
  auto b1 = scheduler.submit(prompt, long_run), b2 = scheduler.submit(prompt, long_run);
  auto leaves = scheduler.submit(prompt, long_run);
  ASSERT_TRUE(b1 && b2 && leaves);
  EXPECT_EQ(scheduler.submit(prompt, long_run), nullptr) << "the queue of 3 is full";
  scheduler.cancel(leaves);
  auto d = scheduler.submit(prompt, long_run);
  EXPECT_NE(d, nullptr) << "two live requests wait in a queue of 3";
  std::vector<infer::TokenEvent> events;
  EXPECT_FALSE(leaves->next(events));
  EXPECT_EQ(leaves->error_status(), 499);
  for (const auto& ch : {running, b1, b2, d}) scheduler.cancel(ch);
  scheduler.stop();
}

// OpenMP's thread count is per thread: the engine's own count has to hold
// on the scheduler thread that steps it, not only on the thread that built
// it (`brisk serve --threads` ran every kernel on OpenMP's default team).
TEST(ServeScheduler, TheEngineRunsOnItsOwnThreadCount) {
  int fresh_default = 0;  // what a new thread gets from OpenMP
  std::thread([&] { fresh_default = omp_get_max_threads(); }).join();
  infer::EngineOptions eo;
  eo.max_seqs = 1;
  eo.threads = fresh_default + 1;
  infer::Engine engine(infer::load_model(checkpoint(/*slow=*/false)), eo);
  std::atomic<int> seen{-1};
  engine.set_observer([&](int64_t, int, const float*, int64_t, int64_t) { seen = omp_get_max_threads(); });
  serve::Scheduler scheduler(engine, /*max_queue=*/2);
  infer::SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 3;
  auto ch = scheduler.submit({10, 20, 30}, p);
  ASSERT_NE(ch, nullptr);
  std::vector<infer::TokenEvent> events;
  while (ch->next(events)) {
  }
  EXPECT_EQ(ch->error(), "");
  EXPECT_EQ(seen.load(), eo.threads) << "OpenMP's default on a new thread is " << fresh_default;
  scheduler.stop();
}

// --log-requests: one logfmt line per answered request, written after its
// response, with the token counts of generation requests.
TEST(ServeAccessLog, OneLinePerRequestWithItsStatusAndTokens) {
  std::mutex m;
  std::vector<std::string> lines;
  Served s("", false, 0, 0, [&](const std::string& line) {
    std::lock_guard lk(m);
    lines.push_back(line);
  });
  auto c = s.client();
  const json body = {{"prompt", "In the beginning"}, {"max_tokens", 6}, {"temperature", 0}};
  ASSERT_EQ(c.Post("/v1/completions", body.dump(), kJson)->status, 200);
  json streamed = body;
  streamed["stream"] = true;
  ASSERT_EQ(c.Post("/v1/completions", streamed.dump(), kJson)->status, 200);
  ASSERT_EQ(c.Get("/health")->status, 200);
  ASSERT_EQ(c.Post("/v1/completions", "{not json", kJson)->status, 400);
  ASSERT_EQ(c.Get("/no such \"path\"")->status, 404);
  // The logger runs after the response is written: the last line may come
  // a moment after the client has read its answer.
  for (int i = 0; i < 500; ++i) {
    {
      std::lock_guard lk(m);
      if (lines.size() >= 5) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::lock_guard lk(m);
  ASSERT_EQ(lines.size(), 5u);
  const std::regex common(R"(^time=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z client=127\.0\.0\.1:\d+ method=\w+ path=.* status=\d{3} ms=\d+\.\d.*)");
  for (const std::string& l : lines) EXPECT_TRUE(std::regex_match(l, common)) << l;
  // Each logger runs after its response is written, so a request the client
  // sent later (on another connection) can log first: lines are found by
  // what they hold, not by their place.
  auto line_with = [&](const std::string& needle) -> std::string {
    std::string found;
    for (const std::string& l : lines)
      if (l.find(needle) != std::string::npos) {
        EXPECT_TRUE(found.empty()) << "two lines hold " << needle << ":\n" << found << "\n" << l;
        found = l;
      }
    EXPECT_FALSE(found.empty()) << "no line holds " << needle;
    return found;
  };
  const std::string whole = line_with(" stream=0 "), streamed_line = line_with(" stream=1 "),
                    health = line_with("path=/health"), bad = line_with("status=400"),
                    missing = line_with("status=404");
  EXPECT_NE(whole.find("method=POST path=/v1/completions status=200 "), std::string::npos) << whole;
  EXPECT_NE(whole.find(" stream=0 prompt_tokens=16 completion_tokens=6 cached_tokens="), std::string::npos) << whole;
  EXPECT_NE(streamed_line.find(" stream=1 prompt_tokens=16 completion_tokens=6 cached_tokens="), std::string::npos)
      << streamed_line;
  EXPECT_NE(health.find("method=GET path=/health status=200 ms="), std::string::npos) << health;
  EXPECT_EQ(health.find("stream="), std::string::npos) << health;
  EXPECT_NE(bad.find("method=POST path=/v1/completions status=400"), std::string::npos) << bad;
  EXPECT_EQ(bad.find("tokens="), std::string::npos) << bad;  // refused before it ran
  EXPECT_NE(missing.find(R"(path="/no such \"path\"" status=404)"), std::string::npos) << missing;
}

TEST(ServeTimeout, ARequestOverTheLimitEndsWith504) {
  // The limit must strike mid-generation on fast CPUs too: on a Zen 5 core
  // 400 tokens of the slow model sometimes finished inside a 50 ms limit. So
  // 500 tokens against 20 ms; the first token follows a 3-token prefill, so
  // the stream has started by then.
  Served s("", /*slow=*/true, 0, /*request_timeout_s=*/0.02);
  auto c = s.client();
  const json body = {{"prompt", "And"}, {"max_tokens", 500}, {"temperature", 0}};
  auto r = c.Post("/v1/completions", body.dump(), kJson);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 504);
  const json e = json::parse(r->body);
  EXPECT_NE(e["error"]["message"].get<std::string>().find("--request-timeout"), std::string::npos);
  json streamed = body;
  streamed["stream"] = true;
  auto st = c.Post("/v1/completions", streamed.dump(), kJson);
  ASSERT_TRUE(st);
  EXPECT_EQ(st->status, 200);  // the stream had started: the error comes as an event
  EXPECT_NE(st->body.find("--request-timeout"), std::string::npos);
  EXPECT_NE(st->body.find("data: [DONE]"), std::string::npos);
  // The dropped sequence leaves the engine at its next step, which may come
  // just after the client has its answer.
  double busy = -1;
  for (int i = 0; i < 500 && busy != 0; ++i) {
    busy = metrics_of(c).at("brisk_slots_busy");
    if (busy != 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(busy, 0);
  // Both are counted as 504, the stream too (its headers said 200).
  const std::map<std::string, double> m = metrics_when(
      c, [](auto& m) { return m["brisk_requests_total{path=\"/v1/completions\",status=\"504\"}"] == 2; });
  EXPECT_EQ(m.count("brisk_requests_total{path=\"/v1/completions\",status=\"200\"}"), 0u);
  EXPECT_EQ(c.Get("/v1/models")->status, 200);  // the server goes on
}

}  // namespace
}  // namespace brisk
