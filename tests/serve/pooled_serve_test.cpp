// `brisk serve` of the encoder models in-process (brisk/serve/pooled.h): a
// small random encoder classifier behind POST /classify and a small random
// sequence autoencoder's encoder behind POST /v1/embeddings, each through a
// PooledService and a real HTTP server on a free port, driven by
// httplib::Client. Checks every answer against the model run on each input
// alone, that concurrent requests share forwards, the OpenAI/vLLM shapes,
// base64 embeddings, and the errors (400s naming the field, 404 for the
// routes the model does not serve, 429 when full, 503 when stopped).
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <future>
#include <stdexcept>
#include <mutex>
#include <set>
#include <nlohmann/json.hpp>
#include <thread>

#include "../common/random_params.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/data/tokenizer.h"
#include "brisk/models/encoder.h"
#include "brisk/models/seq_autoencoder.h"
#include "brisk/serve/api.h"
#include "brisk/serve/pooled.h"
#include "brisk/serve/server.h"
#include "brisk/serve/pooled_api.h"
#include "raw_connection.h"

namespace brisk {
namespace {

using nlohmann::json;

constexpr int64_t kMaxLen = 40;

std::vector<float> softmax(const float* z, int64_t k) {
  std::vector<float> p(z, z + k);
  const float mx = *std::max_element(p.begin(), p.end());
  float sum = 0;
  for (float& x : p) sum += (x = std::exp(x - mx));
  for (float& x : p) x /= sum;
  return p;
}

// A model behind a PooledService and a server on a free port. The forward
// counts its calls and the rows it was given, and can be held (`gate`) so
// that requests queue up behind it.
struct Pooled {
  cpu::CpuBackend backend{2};
  std::unique_ptr<models::Encoder> classifier;
  std::unique_ptr<models::SeqAutoencoder> embedder;
  std::unique_ptr<data::Tokenizer> tok = data::make_byte_tokenizer();
  serve::Metrics metrics;
  std::unique_ptr<serve::PooledService> service;
  std::unique_ptr<serve::Server> server;
  std::thread thread;
  int port = 0;
  std::atomic<int> forwards{0}, max_rows{0};
  std::mutex gate;  // held by a test (Hold): the forward waits for it
  std::promise<void> first_forward;
  std::atomic<bool> first_seen{false};
  std::atomic<int64_t> fail_width{0};  // a forward of this width throws
  std::vector<float> probs;            // the classifier forward's output

  int64_t max_len;

  Pooled(serve::PooledModel::Kind kind, int64_t max_batch, int64_t max_waiting, int64_t max_len = kMaxLen,
         double request_timeout_s = 0)
      : max_len(max_len) {
    serve::PooledModel m;
    m.kind = kind;
    m.max_len = max_len;
    if (kind == serve::PooledModel::Kind::classifier) {
      models::EncoderConfig c;
      c.vocab_size = 256, c.n_layer = 2, c.n_embd = 32, c.n_head = 2, c.max_len = max_len, c.n_classes = 3;
      classifier = std::make_unique<models::Encoder>(c, backend);
      testing::randomize(*classifier, 101);
      m.width = 3, m.vocab = 256, m.labels = {"a", "b", "c"};
    } else {
      models::SeqAutoencoderConfig c;
      c.vocab_size = 28, c.n_layer = 2, c.n_embd = 32, c.n_head = 2, c.max_len = max_len, c.latent = 8;
      embedder = std::make_unique<models::SeqAutoencoder>(c, backend);
      testing::randomize(*embedder, 202);
      m.width = 8, m.vocab = 28;
    }
    m.forward = [this](const int32_t* ids, const int32_t* lengths, int64_t B, int64_t T) {
      if (!first_seen.exchange(true)) first_forward.set_value();
      std::lock_guard lk(gate);
      ++forwards;
      max_rows = std::max<int>(max_rows, int(B));
      if (T == fail_width) throw std::runtime_error("a forward of width " + std::to_string(T) + " failed");
      if (!classifier) return embedder->encode(ids, lengths, B, T);
      const float* z = classifier->logits(ids, lengths, B, T);  // a classifier's forward answers probabilities
      probs.clear();
      for (int64_t b = 0; b < B; ++b) {
        const std::vector<float> p = softmax(z + b * 3, 3);
        probs.insert(probs.end(), p.begin(), p.end());
      }
      return static_cast<const float*>(probs.data());
    };
    service = std::make_unique<serve::PooledService>(m, max_batch, max_waiting, metrics, request_timeout_s);
    serve::ServerOptions so;
    so.port = 0;
    so.http_threads = 40;
    server = std::make_unique<serve::Server>(so);
    // Bytes for the classifier; letters a..z as ids 1..26 for the embedder (the
    // CLI's FASTA reading is checked in the integration tests).
    serve::PooledEncode encode = [kind](const std::string& text, const std::string& param) {
      std::vector<int32_t> ids;
      for (unsigned char c : text) {
        if (kind == serve::PooledModel::Kind::classifier) {
          ids.push_back(c);
        } else {
          if (c < 'a' || c > 'z') throw serve::ApiError(400, param + ": not a letter", param);
          ids.push_back(int32_t(c - 'a' + 1));
        }
      }
      return ids;
    };
    server->attach(*service, encode, serve::ModelInfo{"enc", m.vocab, max_len});
    port = server->bind();
    thread = std::thread([this] { server->listen(); });
    server->wait_until_ready();
  }
  ~Pooled() {
    service->stop();
    server->stop();
    thread.join();
  }

  httplib::Result post(const std::string& path, const std::string& body) const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60, 0);
    return c.Post(path, body, "application/json");
  }
  httplib::Result post(const std::string& path, const json& body) const { return post(path, body.dump()); }

  // What the model gives `ids` alone (cut to max_len): probabilities or a latent.
  std::vector<float> reference(std::vector<int32_t> ids) {
    if (int64_t(ids.size()) > max_len) ids.resize(size_t(max_len));
    const int32_t n = int32_t(ids.size());
    std::lock_guard lk(gate);  // the service's worker may run the model too
    if (classifier) return softmax(classifier->logits(ids.data(), &n, 1, n), 3);
    const float* z = embedder->encode(ids.data(), &n, 1, n);
    return {z, z + 8};
  }
};

std::vector<int32_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }

// Holds the model's forward until it goes out of scope (or release()), so
// that requests queue up behind it; an assertion that returns early still
// lets the requests in flight finish.
struct Hold {
  std::unique_lock<std::mutex> lock;
  explicit Hold(Pooled& p) : lock(p.gate) {}
  void release() {
    if (lock.owns_lock()) lock.unlock();
  }
};

// A request from another thread; its status and body (status 0: no answer).
struct Sent {
  int status = 0;
  json body;
};
std::future<Sent> send(const Pooled& p, const std::string& path, json body) {
  return std::async(std::launch::async, [&p, path, body] {
    Sent out;
    if (auto r = p.post(path, body)) {
      out.status = r->status;
      out.body = json::parse(r->body, nullptr, false);
    }
    return out;
  });
}

// A first request whose forward is held, so that the requests sent after it
// queue up behind it. The answer's future comes before the Hold: a test
// that returns early releases the gate before waiting on the answer.
struct HeldForward {
  std::future<Sent> first;
  Hold hold;
  explicit HeldForward(Pooled& p) : hold(p) { first = send(p, "/classify", json{{"input", "z"}}); }
};

// Waits (up to 30 s) for the first forward to start, behind a Hold.
bool first_forward_started(Pooled& p) {
  return p.first_forward.get_future().wait_for(std::chrono::seconds(30)) == std::future_status::ready;
}

// Waits (up to 10 s) until `n` inputs wait in the service's queue.
bool queued(const Pooled& p, int64_t n) {
  for (int i = 0; i < 2000 && p.metrics.queue_length.load() < n; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return p.metrics.queue_length.load() == n;
}

double max_diff(const std::vector<float>& a, const json& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) d = std::max(d, std::fabs(double(a[i]) - b[i].get<double>()));
  return d;
}

TEST(PooledServe, ClassifyAnswersEachInputAsTheModelAlone) {
  Pooled p(serve::PooledModel::Kind::classifier, 64, 16);
  const std::vector<std::string> texts{"hello there", "x", std::string(70, 'q') + "long, cut to max_len"};
  auto r = p.post("/classify", json{{"model", "enc"}, {"input", texts}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "list");
  EXPECT_EQ(j["model"], "enc");
  EXPECT_EQ(j["id"].get<std::string>().rfind("classify-", 0), 0u);
  ASSERT_EQ(j["data"].size(), texts.size());
  std::set<std::string> labels;
  for (size_t i = 0; i < texts.size(); ++i) {
    const json& d = j["data"][i];
    EXPECT_EQ(d["index"], i);
    EXPECT_EQ(d["object"], "classification");
    EXPECT_EQ(d["num_classes"], 3);
    const std::vector<float> want = p.reference(bytes_of(texts[i]));
    EXPECT_LE(max_diff(want, d["probs"]), 1e-5) << texts[i];
    const size_t k = size_t(std::max_element(want.begin(), want.end()) - want.begin());
    EXPECT_EQ(d["label"], std::string(1, char('a' + k)));
    labels.insert(d["label"]);
  }
  // usage counts what the model read: the long input cut to max_len.
  EXPECT_EQ(j["usage"]["prompt_tokens"], 11 + 1 + kMaxLen);
  EXPECT_EQ(j["usage"]["total_tokens"], 11 + 1 + kMaxLen);

  // One string, a list of ids, and a list of lists of ids, as vLLM takes them.
  const json one = json::parse(p.post("/classify", json{{"input", "hello there"}})->body);
  const json ids = json::parse(p.post("/classify", json{{"input", bytes_of("hello there")}})->body);
  const json lists = json::parse(p.post("/classify", json{{"input", {bytes_of("x"), bytes_of("hello there")}}})->body);
  EXPECT_EQ(one["data"][0]["probs"], ids["data"][0]["probs"]);
  EXPECT_EQ(lists["data"][1]["probs"], ids["data"][0]["probs"]);
  EXPECT_EQ(lists["data"][0]["probs"], j["data"][1]["probs"]);
}

// One request per text, all sent while a first request's forward is held,
// so that they wait together; then each answer against the model on its
// text alone.
void expect_queued_requests_answered(Pooled& p, const std::vector<std::string>& texts) {
  std::vector<std::future<Sent>> answers;
  HeldForward held(p);
  ASSERT_TRUE(first_forward_started(p));
  for (const std::string& t : texts) answers.push_back(send(p, "/classify", json{{"input", t}}));
  EXPECT_TRUE(queued(p, int64_t(texts.size()))) << p.metrics.queue_length.load();
  held.hold.release();
  EXPECT_EQ(held.first.get().status, 200);
  for (size_t i = 0; i < texts.size(); ++i) {
    const Sent a = answers[i].get();
    ASSERT_EQ(a.status, 200) << a.body.dump();
    EXPECT_LE(max_diff(p.reference(bytes_of(texts[i])), a.body["data"][0]["probs"]), 1e-5) << texts[i];
  }
}

// Requests that arrive while a forward runs wait, and the next forward takes
// all of them: fewer forwards than inputs, each answer still its input's own.
TEST(PooledServe, ConcurrentRequestsShareForwards) {
  Pooled p(serve::PooledModel::Kind::classifier, 64, 64);
  std::vector<std::string> texts;  // 2 to 32 bytes: one width
  for (int i = 0; i < 24; ++i) texts.push_back(std::string(size_t(1 + (i * 7) % 31), char('a' + i % 26)) + "!");
  expect_queued_requests_answered(p, texts);
  std::printf("%zu requests after the first: %d forwards in all, up to %d rows\n", texts.size(), p.forwards.load(),
              p.max_rows.load());
  EXPECT_EQ(p.forwards.load(), 2) << "the 24 queued inputs fit one forward";
  EXPECT_EQ(p.max_rows.load(), 24) << "24 rows of width 32";
  EXPECT_EQ(p.metrics.engine_steps.load(), 2u);
  EXPECT_EQ(p.metrics.queue_length.load(), 0);
}

// --max-batch below what waits: one request's 10 inputs run over several
// takes of 4, each answered as its own input.
TEST(PooledServe, ARequestLargerThanMaxBatchRunsOverSeveralForwards) {
  Pooled p(serve::PooledModel::Kind::classifier, 4, 16);
  std::vector<std::string> texts;
  for (int i = 0; i < 10; ++i) texts.push_back("input number " + std::to_string(i * 37));
  auto r = p.post("/classify", json{{"input", texts}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  for (size_t i = 0; i < texts.size(); ++i)
    EXPECT_LE(max_diff(p.reference(bytes_of(texts[i])), j["data"][i]["probs"]), 1e-5) << texts[i];
  EXPECT_EQ(p.forwards.load(), 3) << "takes of 4, 4 and 2";
  EXPECT_EQ(p.max_rows.load(), 4);
}

// A long input waiting with short ones runs in a forward of its own: the
// short ones do not pay for its width (9 rows of width 32, then 1 of 256).
TEST(PooledServe, ALongInputDoesNotWidenTheShortOnesForward) {
  Pooled p(serve::PooledModel::Kind::classifier, 64, 64, 256);
  std::vector<std::string> texts(8, "abc");
  texts.push_back("z");
  texts.push_back(std::string(250, 'L'));
  expect_queued_requests_answered(p, texts);
  EXPECT_EQ(p.forwards.load(), 3) << "the first request, the 9 short inputs, the long one";
  EXPECT_EQ(p.max_rows.load(), 16) << "9 rows of width 32, padded to 16";
}

// The width rule's edge: 64 is twice 32 and joins it; 96 does not.
TEST(PooledServe, AForwardIsAtMostTwiceItsShortestInputsWidth) {
  Pooled p(serve::PooledModel::Kind::classifier, 64, 64, 256);
  expect_queued_requests_answered(p, {std::string(3, 'a'), std::string(60, 'b'), std::string(90, 'c')});
  EXPECT_EQ(p.forwards.load(), 3) << "the first request, widths 32 and 64 together, 96 alone";
  EXPECT_EQ(p.max_rows.load(), 2);
}

// A forward that fails answers its own inputs with 500; the other forwards
// of the same take still answer theirs.
TEST(PooledServe, AFailedForwardFailsOnlyItsOwnInputs) {
  Pooled p(serve::PooledModel::Kind::classifier, 64, 64, 256);
  p.fail_width = 256;
  std::future<Sent> short_one, long_one;
  HeldForward held(p);
  ASSERT_TRUE(first_forward_started(p));
  short_one = send(p, "/classify", json{{"input", "short"}});
  long_one = send(p, "/classify", json{{"input", std::string(250, 'L')}});
  EXPECT_TRUE(queued(p, 2));
  held.hold.release();
  EXPECT_EQ(held.first.get().status, 200);
  const Sent s = short_one.get(), l = long_one.get();
  EXPECT_EQ(s.status, 200) << s.body.dump();
  EXPECT_EQ(l.status, 500) << l.body.dump();
  EXPECT_NE(l.body.dump().find("a forward of width 256 failed"), std::string::npos) << l.body.dump();
  EXPECT_EQ(p.post("/classify", json{{"input", "after"}})->status, 200) << "the service goes on";
}

// stop() with inputs waiting: those requests end with 503 (the running
// forward's finish), and so does any request after it.
TEST(PooledServe, StopAnswersWaitingRequestsWith503) {
  Pooled p(serve::PooledModel::Kind::classifier, 64, 64);
  std::future<Sent> waiting;
  HeldForward held(p);
  ASSERT_TRUE(first_forward_started(p));
  waiting = send(p, "/classify", json{{"input", {"a", "b"}}});
  EXPECT_TRUE(queued(p, 2));
  p.service->stop();
  held.hold.release();
  EXPECT_EQ(held.first.get().status, 200) << "a forward under way finishes";
  const Sent w = waiting.get();
  EXPECT_EQ(w.status, 503) << w.body.dump();
  EXPECT_EQ(p.metrics.queue_length.load(), 0);
  EXPECT_EQ(p.post("/classify", json{{"input", "y"}})->status, 503);
}

// --request-timeout: a request whose inputs still wait at its deadline
// answers 504 then, without waiting for the forward ahead of it, and its
// inputs never run; one whose forward overran it answers 504 once the
// forward is done.
TEST(PooledServe, ARequestPastItsTimeoutIs504AndItsWaitingInputsNeverRun) {
  Pooled p(serve::PooledModel::Kind::classifier, 64, 64, kMaxLen, 1.0);
  std::future<Sent> waiting;
  HeldForward held(p);
  ASSERT_TRUE(first_forward_started(p));
  waiting = send(p, "/classify", json{{"input", {"a", "b", "c"}}});
  EXPECT_TRUE(queued(p, 3));
  ASSERT_EQ(waiting.wait_for(std::chrono::seconds(10)), std::future_status::ready) << "it waited for the forward";
  const Sent w = waiting.get();
  EXPECT_EQ(w.status, 504) << w.body.dump();
  EXPECT_NE(w.body.dump().find("limit of 1 s (--request-timeout)"), std::string::npos) << w.body.dump();
  EXPECT_EQ(p.metrics.queue_length.load(), 0);
  held.hold.release();
  const Sent f = held.first.get();
  EXPECT_EQ(f.status, 504) << f.body.dump();
  EXPECT_EQ(p.forwards.load(), 1) << "the timed-out inputs ran";
  EXPECT_EQ(p.post("/classify", json{{"input", "in time"}})->status, 200);
}

// A client that hangs up while its inputs wait takes them out of the queue
// (the server watches its connection): they never run, and the request is
// counted as 499.
TEST(PooledServe, AClientThatHangsUpLeavesTheQueue) {
  Pooled p(serve::PooledModel::Kind::classifier, 64, 64);
  HeldForward held(p);
  ASSERT_TRUE(first_forward_started(p));
  const int fd = testing::connect_loopback(p.port);
  ASSERT_GE(fd, 0);
  const std::string body = json{{"input", {"a", "b", "c"}}}.dump();
  const std::string request = "POST /classify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                              "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  ASSERT_EQ(write(fd, request.data(), request.size()), ssize_t(request.size()));
  EXPECT_TRUE(queued(p, 3));
  close(fd);
  for (int i = 0; i < 2000 && p.metrics.queue_length.load() > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(p.metrics.queue_length.load(), 0) << "still queued while the forward is held";
  held.hold.release();
  EXPECT_EQ(held.first.get().status, 200);
  EXPECT_EQ(p.forwards.load(), 1) << "the inputs of the client that left ran";
  std::string metrics;
  for (int i = 0; i < 200 && metrics.find("status=\"499\"") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // counted after the handler returns
    metrics = p.metrics.render();
  }
  EXPECT_NE(metrics.find("brisk_requests_total{path=\"/classify\",status=\"499\"} 1"), std::string::npos) << metrics;
}

TEST(PooledServe, AFullQueueIsA429AndAStoppedServiceA503) {
  Pooled p(serve::PooledModel::Kind::classifier, 64, 1);
  HeldForward held(p);
  ASSERT_TRUE(first_forward_started(p));
  auto r = p.post("/classify", json{{"input", "y"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 429) << r->body;
  EXPECT_EQ(r->get_header_value("Retry-After"), "1");
  EXPECT_NE(r->body.find("--max-queue 1"), std::string::npos) << r->body;
  held.hold.release();
  EXPECT_EQ(held.first.get().status, 200);
  p.service->stop();
  r = p.post("/classify", json{{"input", "y"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503) << r->body;
}

TEST(PooledServe, BadRequestsNameTheField) {
  Pooled p(serve::PooledModel::Kind::classifier, 64, 16);
  struct Bad {
    std::string body;
    int status;
    std::string param, says;
  };
  const std::vector<Bad> bad{
      {R"({})", 400, "input", "input is required"},
      {R"({"input": ""})", 400, "input", "input is empty"},
      {R"({"input": []})", 400, "input", "input is empty"},
      {R"({"input": ["ok", ""]})", 400, "input[1]", "input[1] is empty"},
      {R"({"input": 7})", 400, "input", "must be a string or a list of token ids"},
      {R"({"input": [1, "a"]})", 400, "input", "must be a list of token ids"},
      {R"({"input": ["ok", [1, 256]]})", 400, "input[1]", "token 256 is outside the vocabulary [0, 256)"},
      {R"({"input": [-1]})", 400, "input", "token -1 is outside"},
      {R"({"input": "ok", "model": "other"})", 404, "model", "does not exist"},
      {R"({"input": "ok", "user": 3})", 400, "user", "user must be a string"},
      {R"({"input": )", 400, "", "not valid JSON"},
      {json{{"input", std::vector<std::string>(2049, "x")}}.dump(), 400, "input", "at most 2048"},
  };
  for (const Bad& b : bad) {
    auto r = p.post("/classify", b.body);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, b.status) << b.body << "\n" << r->body;
    const json e = json::parse(r->body)["error"];
    if (!b.param.empty()) {
      EXPECT_EQ(e["param"], b.param) << b.body;
    }
    EXPECT_NE(e["message"].get<std::string>().find(b.says), std::string::npos) << b.body << "\n" << r->body;
  }
  EXPECT_EQ(p.forwards.load(), 0) << "nothing ran for a refused request";
  // The routes this model does not serve, by name.
  auto r = p.post("/v1/completions", json{{"prompt", "x"}});
  EXPECT_EQ(r->status, 404);
  EXPECT_NE(r->body.find("this server serves an encoder classifier (POST /classify)"), std::string::npos) << r->body;
  r = p.post("/v1/embeddings", json{{"input", "x"}});
  EXPECT_EQ(r->status, 404);
  httplib::Client c("127.0.0.1", p.port);
  auto g = c.Get("/classify");
  EXPECT_EQ(g->status, 405);
  EXPECT_EQ(g->get_header_value("Allow"), "POST, OPTIONS");
  g = c.Get("/v1/models");
  EXPECT_EQ(json::parse(g->body)["data"][0]["max_model_len"], kMaxLen);
  // Its requests have a series of their own in /metrics.
  g = c.Get("/metrics");
  EXPECT_NE(g->body.find("brisk_requests_total{path=\"/classify\",status=\"400\"}"), std::string::npos);
}

TEST(PooledServe, EmbeddingsAsFloatsAndBase64) {
  Pooled p(serve::PooledModel::Kind::embedder, 64, 16);
  const std::vector<std::string> seqs{"mkta", "acdefghiklmnpqrstvwy", std::string(60, 'k')};
  auto r = p.post("/v1/embeddings", json{{"input", seqs}, {"model", "enc"}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "list");
  EXPECT_EQ(j["model"], "enc");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 4 + 20 + kMaxLen);
  ASSERT_EQ(j["data"].size(), seqs.size());
  auto ids = [](const std::string& s) {
    std::vector<int32_t> v;
    for (char c : s) v.push_back(int32_t(c - 'a' + 1));
    return v;
  };
  for (size_t i = 0; i < seqs.size(); ++i) {
    EXPECT_EQ(j["data"][i]["object"], "embedding");
    EXPECT_EQ(j["data"][i]["index"], i);
    EXPECT_LE(max_diff(p.reference(ids(seqs[i])), j["data"][i]["embedding"]), 1e-5) << seqs[i];
  }
  // base64: the same floats' little-endian bytes (OpenAI's encoding).
  r = p.post("/v1/embeddings", json{{"input", seqs[1]}, {"encoding_format", "base64"}, {"dimensions", 8}});
  ASSERT_EQ(r->status, 200) << r->body;
  const std::vector<float> floats = j["data"][1]["embedding"].get<std::vector<float>>();
  EXPECT_EQ(json::parse(r->body)["data"][0]["embedding"], serve::base64(floats.data(), floats.size() * 4));
  // Bad fields.
  r = p.post("/v1/embeddings", json{{"input", "mk"}, {"encoding_format", "hex"}});
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(json::parse(r->body)["error"]["param"], "encoding_format");
  r = p.post("/v1/embeddings", json{{"input", "mk"}, {"dimensions", 4}});
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(r->body.find("have 8 dimensions"), std::string::npos) << r->body;
  r = p.post("/v1/embeddings", json{{"input", {"mk", "m1"}}});
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(json::parse(r->body)["error"]["param"], "input[1]");
  r = p.post("/classify", json{{"input", "mk"}});
  EXPECT_EQ(r->status, 404);
  EXPECT_NE(r->body.find("POST /v1/embeddings"), std::string::npos) << r->body;
}

TEST(PooledServe, Base64IsRfc4648) {
  EXPECT_EQ(serve::base64("", 0), "");
  EXPECT_EQ(serve::base64("f", 1), "Zg==");
  EXPECT_EQ(serve::base64("fo", 2), "Zm8=");
  EXPECT_EQ(serve::base64("foo", 3), "Zm9v");
  EXPECT_EQ(serve::base64("foobar", 6), "Zm9vYmFy");
  const unsigned char high[] = {0xff, 0xfe, 0xfd, 0x00};
  EXPECT_EQ(serve::base64(high, 4), "//79AA==");
}

}  // namespace
}  // namespace brisk
