// `brisk serve` in-process (src/serve/): a small random GPT with the byte
// tokenizer behind a real HTTP server on a free port, driven by
// httplib::Client. Checks the OpenAI shapes, streaming against
// non-streaming text, stop strings, batching independence and the errors.
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <map>
#include <regex>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "brisk/data/tokenizer.h"
#include "brisk/infer/engine.h"
#include "brisk/infer/json_constraint.h"
#include "brisk/infer/json_schema.h"
#include "brisk/serve/chat.h"
#include "brisk/serve/server.h"
#include "../common/tiny_gpt.h"
#include "raw_connection.h"
#include "serve/fields.h"

namespace brisk {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int64_t kContext = 64;

// Usage without prompt_tokens_details: how much of a prompt the prefix
// cache held depends on what was served before, not on the request.
json billed(json usage) {
  usage.erase("prompt_tokens_details");
  return usage;
}

// Where this process keeps its checkpoint; removed when the process ends.
const fs::path& temp_root() {
  static const struct Root {
    fs::path path = fs::temp_directory_path() / ("brisk_serve_test_" + std::to_string(::getpid()));
    ~Root() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  } root;
  return root.path;
}

// A random small GPT saved as a brisk checkpoint (once per process).
const std::string& checkpoint() {
  static const std::string dir = [] {
    const fs::path& root = temp_root();
    fs::remove_all(root);
    testing::TinyGpt t;
    t.width = 64;
    t.context = kContext;
    t.seed = 11;
    t.scale = 4.f;  // logits far from uniform: greedy choices well separated
    return testing::save_tiny_gpt(root.string(), t);
  }();
  return dir;
}

// Engine, scheduler and server on a free port, served from a thread.
struct Running {
  std::unique_ptr<data::Tokenizer> tok = data::make_byte_tokenizer();
  std::unique_ptr<infer::Engine> engine;
  std::unique_ptr<serve::Scheduler> scheduler;
  std::unique_ptr<serve::Server> server;
  std::thread thread;
  int port = 0;

  // model_dir: another checkpoint, given to the server with its own vocabulary
  // (as `brisk serve` does), else the tiny 256-token model.
  Running(int slots, int max_queue, int64_t max_body, const std::string& model_dir = "") {
    infer::EngineOptions eo;
    eo.max_seqs = slots;
    eo.threads = 2;
    eo.max_step_tokens = 64;
    engine = std::make_unique<infer::Engine>(infer::load_model(model_dir.empty() ? checkpoint() : model_dir), eo,
                                             tok.get());
    scheduler = std::make_unique<serve::Scheduler>(*engine, max_queue);
    serve::ServerOptions so;
    so.port = 0;
    so.max_body = max_body;
    so.http_threads = slots + max_queue + 4;
    // As many choices per request as the queue can hold (at least one).
    const serve::ModelInfo info{"tiny", engine->model().config.vocab_size, kContext, std::max(1, max_queue)};
    server = std::make_unique<serve::Server>(*scheduler, *tok, info, so);
    port = server->bind();
    thread = std::thread([this] { server->listen(); });
    server->wait_until_ready();
  }
  ~Running() {
    scheduler->stop();
    server->stop();
    thread.join();
  }
};

class ServeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { srv = new Running(4, 16, 4096); }
  static void TearDownTestSuite() {
    delete srv;
    srv = nullptr;
  }
  static httplib::Client client() {
    httplib::Client c("127.0.0.1", srv->port);
    c.set_read_timeout(60, 0);
    return c;
  }
  static httplib::Result post(const std::string& path, const json& body) {
    return client().Post(path.c_str(), body.dump(), "application/json");
  }
  static Running* srv;
};
Running* ServeTest::srv = nullptr;

// The data of every "data: " event of an SSE body, in order.
std::vector<std::string> sse_events(const std::string& body) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < body.size()) {
    const size_t end = body.find("\n\n", at);
    EXPECT_NE(end, std::string::npos) << "an event without its blank line: " << body.substr(at);
    if (end == std::string::npos) break;
    const std::string ev = body.substr(at, end - at);
    EXPECT_EQ(ev.rfind("data: ", 0), 0u) << ev;
    out.push_back(ev.substr(6));
    at = end + 2;
  }
  return out;
}

// POSTs a streamed request and returns its chunks (without the final
// [DONE]), having checked what every stream shares: 200, text/event-stream,
// [DONE] last, one id and one created throughout, the object type.
std::vector<json> stream_chunks(int port, const std::string& path, const json& body, const std::string& object,
                                std::string& id) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(60, 0);
  auto r = c.Post(path, body.dump(), "application/json");
  EXPECT_TRUE(r);
  if (!r) return {};
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->get_header_value("Content-Type").rfind("text/event-stream", 0), 0u);
  const std::vector<std::string> events = sse_events(r->body);
  EXPECT_GE(events.size(), 2u);
  if (events.size() < 2) return {};
  EXPECT_EQ(events.back(), "[DONE]");
  std::vector<json> chunks;
  int64_t created = -1;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    json ch = json::parse(events[i]);
    if (id.empty()) id = ch.at("id");
    EXPECT_EQ(ch.at("id"), id);
    if (created < 0) created = ch.at("created");
    EXPECT_EQ(ch.at("created"), created);
    EXPECT_EQ(ch.at("object"), object);
    chunks.push_back(std::move(ch));
  }
  return chunks;
}

struct Streamed {
  std::string text, finish_reason, id;
  json usage;
};

// Runs a streamed completion and checks the stream's shape on the way.
Streamed stream(int port, json body, bool include_usage = true) {
  body["stream"] = true;
  if (include_usage) body["stream_options"] = {{"include_usage", true}};
  Streamed s;
  const std::vector<json> chunks = stream_chunks(port, "/v1/completions", body, "text_completion", s.id);
  if (chunks.empty()) return s;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const json& ch = chunks[i];
    EXPECT_EQ(ch.at("model"), "tiny");
    if (ch.at("choices").empty()) {  // the usage chunk: last before [DONE]
      EXPECT_TRUE(include_usage);
      EXPECT_EQ(i + 1, chunks.size());
      s.usage = ch.at("usage");
      continue;
    }
    EXPECT_TRUE(s.finish_reason.empty()) << "a content chunk after the finishing one";
    // OpenAI: with include_usage every other chunk has "usage": null; without it, no usage field.
    if (include_usage) {
      EXPECT_TRUE(ch.contains("usage") && ch["usage"].is_null()) << ch.dump();
    } else {
      EXPECT_FALSE(ch.contains("usage")) << ch.dump();
    }
    const json& c0 = ch.at("choices").at(0);
    s.text += c0.at("text").get<std::string>();
    if (!c0.at("finish_reason").is_null()) s.finish_reason = c0.at("finish_reason");
  }
  EXPECT_FALSE(s.finish_reason.empty());
  EXPECT_EQ(s.id.rfind("cmpl-", 0), 0u);
  if (include_usage) {
    EXPECT_FALSE(s.usage.is_null());
  }
  return s;
}

TEST_F(ServeTest, HealthAndModels) {
  auto h = client().Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  EXPECT_EQ(json::parse(h->body), json({{"status", "ok"}}));
  auto m = client().Get("/v1/models");
  ASSERT_TRUE(m);
  ASSERT_EQ(m->status, 200);
  const json j = json::parse(m->body);
  EXPECT_EQ(j.at("object"), "list");
  ASSERT_EQ(j.at("data").size(), 1u);
  EXPECT_EQ(j["data"][0].at("id"), "tiny");
  EXPECT_EQ(j["data"][0].at("object"), "model");
  // One model by id: the list's entry; another id is a 404 naming both.
  auto one = client().Get("/v1/models/tiny");
  ASSERT_TRUE(one);
  ASSERT_EQ(one->status, 200) << one->body;
  EXPECT_EQ(json::parse(one->body), j["data"][0]);
  auto other = client().Get("/v1/models/gpt-4o");
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 404);
  const json e = json::parse(other->body).at("error");
  EXPECT_NE(e.at("message").get<std::string>().find("'gpt-4o' does not exist"), std::string::npos) << e;
  EXPECT_NE(e.at("message").get<std::string>().find("'tiny'"), std::string::npos) << e;
  EXPECT_EQ(e.at("param"), "model");
}

TEST_F(ServeTest, CompletionShapeAndUsage) {
  auto r = post("/v1/completions", {{"model", "tiny"}, {"prompt", "Hello"}, {"max_tokens", 7}, {"temperature", 0}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->get_header_value("Content-Type"), "application/json");
  const json j = json::parse(r->body);
  EXPECT_EQ(j.at("id").get<std::string>().rfind("cmpl-", 0), 0u);
  EXPECT_EQ(j.at("object"), "text_completion");
  EXPECT_TRUE(j.at("created").is_number_integer());
  EXPECT_NEAR(j["created"].get<double>(), double(std::time(nullptr)), 60);
  EXPECT_EQ(j.at("model"), "tiny");
  ASSERT_EQ(j.at("choices").size(), 1u);
  const json& c = j["choices"][0];
  EXPECT_EQ(c.at("index"), 0);
  EXPECT_TRUE(c.at("text").is_string());
  EXPECT_TRUE(c.at("logprobs").is_null());
  EXPECT_EQ(c.at("finish_reason"), "length");
  EXPECT_EQ(j.at("usage"), json({{"prompt_tokens", 5},
                                 {"completion_tokens", 7},
                                 {"total_tokens", 12},
                                 {"prompt_tokens_details", {{"cached_tokens", 0}}}}));  // 5 tokens: no whole block
  // Token ids as the prompt: the same prompt, the same greedy text.
  auto r2 = post("/v1/completions", {{"prompt", {72, 101, 108, 108, 111}}, {"max_tokens", 7}, {"temperature", 0}});
  ASSERT_TRUE(r2);
  ASSERT_EQ(r2->status, 200) << r2->body;
  EXPECT_EQ(json::parse(r2->body)["choices"][0]["text"], c["text"]);
}

// cached_tokens counts each prompt of a list once, like prompt_tokens: a
// prompt listed twice has its cached blocks counted twice (the second copy
// was taken for a second choice of the first and left out).
TEST_F(ServeTest, CachedTokensCountEveryListedPrompt) {
  const std::string p(40, 'a');  // 2 whole blocks of 16 before its last token
  const json warm = {{"prompt", json::array({p})}, {"max_tokens", 1}, {"temperature", 0}};
  auto r = post("/v1/completions", warm);
  ASSERT_TRUE(r && r->status == 200) << (r ? r->body : "no answer");
  r = post("/v1/completions", {{"prompt", json::array({p, p})}, {"max_tokens", 1}, {"temperature", 0}});
  ASSERT_TRUE(r && r->status == 200) << (r ? r->body : "no answer");
  const json usage = json::parse(r->body)["usage"];
  EXPECT_EQ(usage["prompt_tokens"], 80) << usage;
  EXPECT_EQ(usage["prompt_tokens_details"]["cached_tokens"], 64) << usage;
}

TEST_F(ServeTest, Logprobs) {
  auto r = post("/v1/completions", {{"prompt", "Hi"}, {"max_tokens", 5}, {"temperature", 0}, {"logprobs", 3}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json lp = json::parse(r->body)["choices"][0].at("logprobs");
  ASSERT_EQ(lp.at("tokens").size(), 5u);
  ASSERT_EQ(lp.at("token_logprobs").size(), 5u);
  ASSERT_EQ(lp.at("top_logprobs").size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_LE(lp["token_logprobs"][i].get<double>(), 0.0);
    EXPECT_GE(lp["top_logprobs"][i].size(), 1u);  // tokens of the same text share a key
    EXPECT_LE(lp["top_logprobs"][i].size(), 3u);
    EXPECT_EQ(lp["text_offset"][i], i);  // one byte per token
  }
}

TEST_F(ServeTest, StreamMatchesNonStreamGreedyAndSeeded) {
  for (const json& sampling : {json{{"temperature", 0}}, json{{"temperature", 1.0}, {"seed", 1234}}}) {
    json body = {{"prompt", "The quick"}, {"max_tokens", 24}};
    body.update(sampling);
    auto r = post("/v1/completions", body);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const json j = json::parse(r->body);
    const Streamed s = stream(srv->port, body);
    EXPECT_EQ(s.text, j["choices"][0]["text"].get<std::string>()) << sampling;
    EXPECT_EQ(s.finish_reason, "length");
    EXPECT_EQ(billed(s.usage), billed(j["usage"]));
    EXPECT_NE(s.id, j["id"]);  // every completion its own id
  }
  // Without include_usage there is no usage chunk.
  const Streamed s = stream(srv->port, {{"prompt", "abc"}, {"max_tokens", 3}, {"temperature", 0}}, false);
  EXPECT_TRUE(s.usage.is_null());
}

// Streamed logprobs, chunk by chunk, are the non-streamed ones.
TEST_F(ServeTest, StreamedLogprobsMatch) {
  json body = {{"prompt", "Hi"}, {"max_tokens", 6}, {"temperature", 0.7}, {"seed", 9}, {"logprobs", 2}};
  auto r = post("/v1/completions", body);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json whole = json::parse(r->body)["choices"][0]["logprobs"];
  body["stream"] = true;
  auto s = post("/v1/completions", body);
  ASSERT_TRUE(s);
  ASSERT_EQ(s->status, 200);
  json joined = {{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()},
                 {"text_offset", json::array()}};
  for (const std::string& ev : sse_events(s->body)) {
    if (ev == "[DONE]") break;
    const json lp = json::parse(ev)["choices"][0]["logprobs"];
    ASSERT_FALSE(lp.is_null()) << ev;
    for (auto& [k, v] : lp.items())
      for (const json& x : v) joined[k].push_back(x);
  }
  EXPECT_EQ(joined, whole);
}

// A greedy /v1/completions body whose tokens are ASCII bytes (the others
// biased away): one byte a token, so places in the text are token places.
json ascii_greedy(const std::string& prompt, int max_tokens) {
  json ascii_only;
  for (int b = 128; b < 256; ++b) ascii_only[std::to_string(b)] = -100;
  return {{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"logit_bias", ascii_only}};
}

// min_tokens: a stop string that ends in the first min_tokens tokens does
// not end the text; min_tokens past max_tokens is a 400 naming it.
TEST_F(ServeTest, MinTokensLetsTheTextRunPastAnEarlyStopString) {
  const json plain = ascii_greedy("And God said", 24);
  auto r = post("/v1/completions", plain);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const std::string text = json::parse(r->body)["choices"][0]["text"];
  ASSERT_EQ(text.size(), 24u);
  // The third byte as the stop string, where it first appears.
  const std::string stop = text.substr(2, 1);
  const size_t first = text.find(stop), second = text.find(stop, first + 1);
  for (int64_t min_tokens : {int64_t(0), int64_t(first + 1), int64_t(first + 2), int64_t(24)}) {
    json body = plain;
    body["stop"] = stop;
    body["min_tokens"] = min_tokens;
    r = post("/v1/completions", body);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const json choice = json::parse(r->body)["choices"][0];
    // The string ends in token (place + 1): it stops only if that is min_tokens or later.
    size_t cut = std::string::npos;
    for (size_t at : {first, second})
      if (at != std::string::npos && int64_t(at + 1) >= min_tokens) {
        cut = at;
        break;
      }
    EXPECT_EQ(choice["text"], text.substr(0, cut)) << "min_tokens " << min_tokens;
    EXPECT_EQ(choice["finish_reason"], cut == std::string::npos ? "length" : "stop") << "min_tokens " << min_tokens;
    body["stream"] = true;
    EXPECT_EQ(stream(srv->port, body).text, text.substr(0, cut)) << "streamed, min_tokens " << min_tokens;
  }
  json bad = plain;
  bad["min_tokens"] = 25;
  r = post("/v1/completions", bad);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(json::parse(r->body)["error"]["param"], "min_tokens") << r->body;
  r = post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"min_tokens", -1}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(json::parse(r->body)["error"]["param"], "min_tokens") << r->body;
}

// ignore_eos bans the end-of-text token instead of stopping at it; without
// it the token is a stop token. (The tiny model's byte tokenizer has no
// end-of-text token, so this reads the fields as both routes do.)
TEST(ServeFields, IgnoreEosBansTheEndOfTextTokenInsteadOfStoppingAtIt) {
  infer::SamplingParams sp;
  serve::fields::stop_at_end_of_text(json{{"prompt", "x"}}, 50256, sp);
  EXPECT_EQ(sp.stop_tokens, std::vector<int32_t>{50256});
  EXPECT_TRUE(sp.banned_tokens.empty());
  infer::SamplingParams ig;
  serve::fields::stop_at_end_of_text(json{{"ignore_eos", true}}, 50256, ig);
  EXPECT_TRUE(ig.stop_tokens.empty());
  EXPECT_EQ(ig.banned_tokens, std::vector<int32_t>{50256});
  infer::SamplingParams none;
  serve::fields::stop_at_end_of_text(json{{"ignore_eos", true}}, -1, none);
  EXPECT_TRUE(none.stop_tokens.empty() && none.banned_tokens.empty());
  EXPECT_THROW(serve::fields::stop_at_end_of_text(json{{"ignore_eos", "yes"}}, 50256, none), serve::ApiError);
}

TEST_F(ServeTest, SeedsChangeSampledText) {
  std::set<std::string> texts;
  for (int seed : {1, 2, 3}) {
    auto r = post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 20}, {"temperature", 1.0}, {"seed", seed}});
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200);
    texts.insert(json::parse(r->body)["choices"][0]["text"].get<std::string>());
  }
  EXPECT_GT(texts.size(), 1u);
}

TEST_F(ServeTest, StopStringNeverAppears) {
  // Find an ASCII pair (or one ASCII character) in a greedy completion
  // after its first character, and use it as the stop string.
  std::string prompt, text, stop;
  for (const char* p : {"And God said", "Once upon", "1 2 3", "zz", "The end"}) {
    auto r = post("/v1/completions", {{"prompt", p}, {"max_tokens", 40}, {"temperature", 0}});
    ASSERT_TRUE(r);
    text = json::parse(r->body)["choices"][0]["text"];
    for (size_t len : {2, 1}) {
      for (size_t i = 1; i + len <= text.size() && stop.empty(); ++i) {
        bool ascii = true;
        for (size_t k = 0; k < len; ++k) ascii = ascii && static_cast<unsigned char>(text[i + k]) < 0x80;
        if (ascii) stop = text.substr(i, len);
      }
      if (!stop.empty()) break;
    }
    if (!stop.empty()) {
      prompt = p;
      break;
    }
  }
  ASSERT_FALSE(stop.empty()) << "no ASCII text in any greedy completion";
  const std::string expected = text.substr(0, text.find(stop));
  const json body = {{"prompt", prompt}, {"max_tokens", 40}, {"temperature", 0}, {"stop", {"\x01never", stop}}};
  auto r = post("/v1/completions", body);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  const std::string got = j["choices"][0]["text"];
  EXPECT_EQ(got, expected) << "stop " << json(stop);
  EXPECT_EQ(got.find(stop), std::string::npos);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  const Streamed s = stream(srv->port, body);
  EXPECT_EQ(s.text, expected);
  EXPECT_EQ(s.finish_reason, "stop");
}

TEST_F(ServeTest, ConcurrentRequestsMatchEachAlone) {
  const std::vector<std::string> prompts = {"alpha", "beta beta", "g", "delta delta delta", "eps", "zeta!"};
  auto body = [](const std::string& p) { return json{{"prompt", p}, {"max_tokens", 20}, {"temperature", 0}}; };
  std::vector<std::string> alone;
  for (const std::string& p : prompts) {
    auto r = post("/v1/completions", body(p));
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200);
    alone.push_back(json::parse(r->body)["choices"][0]["text"]);
  }
  std::vector<std::string> together(prompts.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < prompts.size(); ++i)
    threads.emplace_back([&, i] {
      // Half streamed, half not: both go through the same batch.
      if (i % 2) {
        together[i] = stream(srv->port, body(prompts[i])).text;
      } else {
        auto r = post("/v1/completions", body(prompts[i]));
        if (r && r->status == 200) together[i] = json::parse(r->body)["choices"][0]["text"];
      }
    });
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(together[i], alone[i]) << prompts[i];
}

// A client that hangs up mid-stream: its request is cancelled (the write
// fails) and the server goes on answering others with the same text.
TEST_F(ServeTest, ClientHangingUpMidStream) {
  const json body = {{"prompt", "a"}, {"max_tokens", 60}, {"temperature", 0}};
  auto before = post("/v1/completions", body);
  ASSERT_TRUE(before);
  ASSERT_EQ(before->status, 200);
  for (int round = 0; round < 3; ++round) {
    httplib::Client c("127.0.0.1", srv->port);
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    json sb = body;
    sb["stream"] = true;
    req.body = sb.dump();
    req.set_header("Content-Type", "application/json");
    size_t received = 0;
    req.content_receiver = [&](const char*, size_t n, uint64_t, uint64_t) {
      received += n;
      return false;  // hang up after the first piece
    };
    auto r = c.send(req);
    EXPECT_FALSE(r);  // the client cancelled it
    EXPECT_GT(received, 0u);
  }
  auto after = post("/v1/completions", body);
  ASSERT_TRUE(after);
  ASSERT_EQ(after->status, 200);
  EXPECT_EQ(json::parse(after->body)["choices"][0]["text"], json::parse(before->body)["choices"][0]["text"]);
}

void expect_error(const httplib::Result& r, int status, const std::string& param,
                  const std::vector<std::string>& words) {
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, status) << r->body;
  const json j = json::parse(r->body);
  const json& e = j.at("error");
  const std::string msg = e.at("message");
  for (const std::string& w : words) EXPECT_NE(msg.find(w), std::string::npos) << msg << " lacks " << w;
  EXPECT_TRUE(e.at("type").is_string());
  EXPECT_TRUE(e.at("code").is_null() || e.at("code").is_string()) << e;
  if (param.empty())
    EXPECT_TRUE(e.at("param").is_null()) << e;
  else
    EXPECT_EQ(e.at("param"), param);
}

TEST_F(ServeTest, Errors) {
  // Context: 10 prompt tokens + 60 > 64.
  expect_error(post("/v1/completions", {{"prompt", "0123456789"}, {"max_tokens", 60}}), 400, "max_tokens",
               {"64", "70", "10", "60"});
  expect_error(post("/v1/completions", {{"prompt", "x"}, {"max_tokens", INT64_MAX}}), 400, "max_tokens", {"64"});
  expect_error(client().Post("/v1/completions", "{\"prompt\": \"x\",", "application/json"), 400, "", {"JSON"});
  expect_error(post("/v1/completions", {{"prompt", "x"}, {"temperature", "hot"}}), 400, "temperature", {"temperature"});
  expect_error(post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 1.5}}), 400, "max_tokens", {"max_tokens"});
  expect_error(post("/v1/completions", {{"prompt", "x"}, {"stop", 3}}), 400, "stop", {"stop"});
  expect_error(post("/v1/completions", {{"prompt", {1, 999}}}), 400, "prompt", {"999"});
  expect_error(post("/v1/completions", {{"max_tokens", 3}}), 400, "prompt", {"prompt"});
  expect_error(post("/v1/completions", {{"prompt", "x"}, {"n", 17}}), 400, "n", {"17"});  // over the queue of 16
  expect_error(post("/v1/completions", {{"prompt", "x"}, {"top_p", 0}}), 400, "top_p", {"top_p"});
  expect_error(post("/v1/completions", {{"prompt", "x"}, {"top_k", int64_t(1) << 40}}), 400, "top_k", {"top_k"});
  expect_error(post("/v1/completions", {{"prompt", "x"}, {"logprobs", 21}}), 400, "logprobs", {"logprobs"});
  expect_error(post("/v1/completions", {{"prompt", "x"}, {"stream", "yes"}}), 400, "stream", {"stream"});
  expect_error(post("/v1/completions", {{"prompt", {"a", "b"}}, {"n", 9}}), 400, "n", {"9"});  // 2 x 9 > 16
  expect_error(post("/v1/completions", {{"prompt", "x"}, {"model", "other"}}), 404, "model", {"other"});
  // OpenAI's machine-readable codes where it has one.
  EXPECT_EQ(json::parse(post("/v1/completions", {{"prompt", "x"}, {"model", "other"}})->body)["error"]["code"],
            "model_not_found");
  EXPECT_EQ(json::parse(post("/v1/completions", {{"prompt", "0123456789"}, {"max_tokens", 60}})->body)["error"]["code"],
            "context_length_exceeded");
  EXPECT_TRUE(json::parse(post("/v1/completions", {{"prompt", "x"}, {"top_p", 0}})->body)["error"]["code"].is_null());
  // stream_options asks for what only a stream has (OpenAI answers 400 too).
  expect_error(post("/v1/completions", {{"prompt", "x"}, {"stream_options", {{"include_usage", true}}}}), 400,
               "stream_options", {"stream"});
  // top_k -1 is vLLM's "off": accepted, as 0 is.
  auto off = post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 2}, {"top_k", -1}});
  ASSERT_TRUE(off);
  EXPECT_EQ(off->status, 200) << off->body;
  expect_error(post("/v1/completions", {{"prompt", "x"}, {"logit_bias", {{"abc", 1}}}}), 400, "logit_bias", {"abc"});
  expect_error(post("/v1/completions", {{"prompt", "x"}, {"logit_bias", {{"65", 101}}}}), 400, "logit_bias",
               {"[-100, 100]"});
  expect_error(post("/v1/completions", {{"prompt", "x"}, {"logit_bias", {{"999", 1}}}}), 400, "logit_bias", {"999"});
  expect_error(post("/v1/completions", {{"prompt", "x"}, {"logit_bias", {1, 2}}}), 400, "logit_bias", {"object"});
  expect_error(client().Post("/v1/completions", std::string(8192, ' '), "application/json"), 413, "", {"body"});
  // The same body sent chunked (no Content-Length) in pieces of 1 KiB: held
  // to --max-body as it arrives, not read whole.
  auto chunked = [](std::string body) {
    return [body = std::move(body)](size_t offset, httplib::DataSink& sink) {
      if (offset < body.size()) sink.write(body.data() + offset, std::min<size_t>(1024, body.size() - offset));
      else sink.done();
      return true;
    };
  };
  expect_error(client().Post("/v1/completions", chunked(std::string(8192, ' ')), "application/json"), 413, "",
               {"body", "--max-body"});
  auto small = client().Post("/v1/completions", chunked(json{{"prompt", "x"}, {"max_tokens", 2}}.dump()),
                             "application/json");
  ASSERT_TRUE(small);
  EXPECT_EQ(small->status, 200) << small->body;
  expect_error(client().Get("/nope"), 404, "", {"/nope"});
  // The server still answers after all of that.
  auto r = post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 2}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

// One request written by hand on a new connection (what httplib's client
// would not send), and the response's first line, or "" if none came
// within two seconds.
std::string raw_status_line(int port, const std::string& request) {
  const int fd = testing::connect_loopback(port, 2);
  std::string got;
  if (fd >= 0 && write(fd, request.data(), request.size()) == ssize_t(request.size())) {
    char buf[512];
    for (ssize_t n; got.find("\r\n") == std::string::npos && (n = read(fd, buf, sizeof buf)) > 0;)
      got.append(buf, size_t(n));
  }
  if (fd >= 0) close(fd);
  return got.substr(0, got.find("\r\n"));
}

// Paths and methods the routes do not take: 404 for an unknown path
// whatever the method, 405 naming the method a known path takes, and 411
// at once for a POST whose body has no length (not a 400 after the read
// timeout).
TEST_F(ServeTest, UnknownPathsWrongMethodsAndBodiesWithoutLengthAreNamed) {
  expect_error(post("/v1/nope", {{"prompt", "x"}}), 404, "", {"POST", "/v1/nope"});
  auto get_completions = client().Get("/v1/completions");
  expect_error(get_completions, 405, "", {"POST", "GET"});
  EXPECT_EQ(get_completions->get_header_value("Allow"), "POST, OPTIONS");
  auto post_health = post("/health", json::object());
  expect_error(post_health, 405, "", {"GET", "POST"});
  EXPECT_EQ(post_health->get_header_value("Allow"), "GET, HEAD, OPTIONS");
  expect_error(client().Delete("/v1/models/x"), 405, "", {"DELETE"});
  expect_error(client().Put("/tokenize", "{}", "application/json"), 405, "", {"PUT"});
  // The routes themselves still answer, HEAD included.
  EXPECT_EQ(client().Head("/health")->status, 200);
  EXPECT_EQ(client().Get("/v1/models")->status, 200);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(raw_status_line(srv->port,
                            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\r\n{}"),
            "HTTP/1.1 411 Length Required");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(1500));
  // Chunked encoding is a length.
  EXPECT_EQ(raw_status_line(srv->port,
                            "POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: Chunked\r\n\r\n"
                            "10\r\n{\"prompt\": \"ab\"}\r\n0\r\n\r\n"),
            "HTTP/1.1 200 OK");
}

// logit_bias moves the tokens it names, greedy or not: -100 keeps the
// greedy choice out of the text, +100 makes one byte the whole completion;
// the same request without it is not answered from what the biased one ran.
TEST_F(ServeTest, LogitBiasBansAndForcesTokens) {
  const json greedy = {{"prompt", "In the"}, {"max_tokens", 8}, {"temperature", 0}};
  auto text_of = [&](const json& body) {
    auto r = post("/v1/completions", body);
    EXPECT_TRUE(r && r->status == 200) << (r ? r->body : "no answer");
    return r ? json::parse(r->body)["choices"][0]["text"].get<std::string>() : std::string();
  };
  const std::string plain = text_of(greedy);
  ASSERT_FALSE(plain.empty());
  const unsigned char first = static_cast<unsigned char>(plain[0]);
  json banned = greedy;
  banned["logit_bias"] = {{std::to_string(first), -100}};
  const std::string without = text_of(banned);
  EXPECT_EQ(without.find(char(first)), std::string::npos) << without;
  json forced = greedy;
  forced["temperature"] = 0.9;
  forced["seed"] = 3;
  forced["logit_bias"] = {{"122", 100}};  // 'z'
  EXPECT_EQ(text_of(forced), std::string(8, 'z'));
  EXPECT_EQ(text_of(greedy), plain);
}

// echo: the answer starts with the prompt. With logprobs and max_tokens 0
// (how evaluation harnesses score a text) every prompt token has an entry,
// the first a null logprob as OpenAI gives it, the others the model's
// log-probability of that token after the ones before; generating as well
// appends the completion's entries, and streaming gives the same.
TEST_F(ServeTest, EchoScoresThePrompt) {
  const std::string prompt = "The quick brown";
  auto r0 = post("/v1/completions",
                 {{"prompt", prompt}, {"echo", true}, {"logprobs", 2}, {"max_tokens", 0}, {"temperature", 0}});
  ASSERT_TRUE(r0);
  ASSERT_EQ(r0->status, 200) << r0->body;
  const json j0 = json::parse(r0->body);
  const json& c0 = j0["choices"][0];
  EXPECT_EQ(c0.at("text"), prompt);
  EXPECT_EQ(c0.at("finish_reason"), "length");
  EXPECT_EQ(billed(j0.at("usage")), json({{"prompt_tokens", 15}, {"completion_tokens", 0}, {"total_tokens", 15}}));
  const json& lp = c0.at("logprobs");
  ASSERT_EQ(lp.at("tokens").size(), prompt.size());
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  double nll = 0;
  for (size_t i = 0; i < prompt.size(); ++i) {
    EXPECT_EQ(lp["tokens"][i], std::string(1, prompt[i]));
    EXPECT_EQ(lp["text_offset"][i], i);
    if (i == 0) continue;
    const double v = lp["token_logprobs"][i].get<double>();
    EXPECT_LT(v, 0.0);
    nll -= v;
    EXPECT_GE(lp["top_logprobs"][i].size(), 1u);
    for (auto& [tok, top] : lp["top_logprobs"][i].items()) EXPECT_GE(top.get<double>(), v - 1e-6) << tok;
  }
  // The same numbers the engine's own scoring gives (the recompute path's, tested in InferEngine).
  infer::EngineOptions eo;
  eo.max_seqs = 1;
  eo.threads = 1;
  infer::Engine e(infer::load_model(checkpoint()), eo);
  const std::vector<int32_t> ids(prompt.begin(), prompt.end());
  EXPECT_NEAR(nll, e.score(ids).nll_sum, 1e-4 * nll);

  // A prompt of ill-formed bytes: the text shows U+FFFD (3 bytes) for each,
  // and the offsets count the text's bytes, not the prompt's.
  auto bad = post("/v1/completions", {{"prompt", {255, 65, 66, 128, 67}}, {"echo", true}, {"logprobs", 0},
                                      {"max_tokens", 0}, {"temperature", 0}});
  ASSERT_TRUE(bad);
  ASSERT_EQ(bad->status, 200) << bad->body;
  const json cb = json::parse(bad->body)["choices"][0];
  EXPECT_EQ(cb.at("text"), "\xEF\xBF\xBD" "AB" "\xEF\xBF\xBD" "C");
  EXPECT_EQ(cb["logprobs"]["text_offset"], json::array({0, 3, 4, 5, 8}));

  // Generating too: the prompt's entries, then the completion's, offsets running on.
  const json gen = {{"prompt", prompt}, {"echo", true}, {"logprobs", 2}, {"max_tokens", 5}, {"temperature", 0}};
  auto r5 = post("/v1/completions", gen);
  ASSERT_TRUE(r5);
  ASSERT_EQ(r5->status, 200) << r5->body;
  const json c5 = json::parse(r5->body)["choices"][0];
  auto plain = post("/v1/completions", {{"prompt", prompt}, {"max_tokens", 5}, {"temperature", 0}});
  ASSERT_TRUE(plain);
  EXPECT_EQ(c5.at("text"), prompt + json::parse(plain->body)["choices"][0]["text"].get<std::string>());
  ASSERT_EQ(c5["logprobs"]["tokens"].size(), prompt.size() + 5);
  for (const char* list : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
    for (size_t i = 0; i < prompt.size(); ++i) EXPECT_EQ(c5["logprobs"][list][i], lp[list][i]) << list << " " << i;
  EXPECT_EQ(c5["logprobs"]["text_offset"][prompt.size()], prompt.size());
  // Streamed: the same text, and the same logprobs chunk by chunk.
  const Streamed s = stream(srv->port, gen);
  EXPECT_EQ(s.text, c5.at("text").get<std::string>());
  json streamed_gen = gen;
  streamed_gen["stream"] = true;
  auto sr = post("/v1/completions", streamed_gen);
  ASSERT_TRUE(sr);
  json joined = {{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()},
                 {"text_offset", json::array()}};
  for (const std::string& ev : sse_events(sr->body)) {
    if (ev == "[DONE]") break;
    const json l = json::parse(ev)["choices"][0]["logprobs"];
    if (l.is_null()) continue;
    for (auto& [k, v] : l.items())
      for (const json& x : v) joined[k].push_back(x);
  }
  EXPECT_EQ(joined, c5["logprobs"]);

  // echo without logprobs is the text alone; max_tokens 0 needs echo.
  auto t = post("/v1/completions", {{"prompt", prompt}, {"echo", true}, {"max_tokens", 0}});
  ASSERT_TRUE(t);
  ASSERT_EQ(t->status, 200) << t->body;
  EXPECT_EQ(json::parse(t->body)["choices"][0]["text"], prompt);
  EXPECT_TRUE(json::parse(t->body)["choices"][0]["logprobs"].is_null());
  expect_error(post("/v1/completions", {{"prompt", prompt}, {"max_tokens", 0}}), 400, "max_tokens", {"echo"});
}

// best_of: each prompt's best_of sequences are generated and the n with the
// highest mean token logprob come back, best first and numbered p * n + i,
// without logprobs unless asked; usage counts every sequence. The same
// request with n = best_of and logprobs shows all of them to rank by hand.
TEST_F(ServeTest, BestOfKeepsTheChoicesWithTheHighestMeanLogprob) {
  const json base = {{"prompt", {"ab", "xyz"}}, {"max_tokens", 8}, {"temperature", 1.0}, {"seed", 21}};
  json all_body = base;
  all_body["n"] = 4;
  all_body["logprobs"] = 0;
  auto all = post("/v1/completions", all_body);
  ASSERT_TRUE(all);
  ASSERT_EQ(all->status, 200) << all->body;
  const json aj = json::parse(all->body);
  ASSERT_EQ(aj.at("choices").size(), 8u);
  for (const int logprobs : {-1, 1}) {
    SCOPED_TRACE("logprobs " + std::to_string(logprobs));
    json best_body = base;
    best_body["n"] = 2;
    best_body["best_of"] = 4;
    if (logprobs >= 0) best_body["logprobs"] = logprobs;
    auto best = post("/v1/completions", best_body);
    ASSERT_TRUE(best);
    ASSERT_EQ(best->status, 200) << best->body;
    const json bj = json::parse(best->body);
    ASSERT_EQ(bj.at("choices").size(), 4u);
    for (size_t p = 0; p < 2; ++p) {
      std::vector<std::pair<double, size_t>> ranked;  // (-mean logprob, choice): best first, ties by position
      for (size_t i = 0; i < 4; ++i) {
        const json& lp = aj["choices"][p * 4 + i]["logprobs"]["token_logprobs"];
        ASSERT_FALSE(lp.empty());
        double sum = 0;
        for (const json& v : lp) sum += v.get<double>();
        ranked.push_back({-sum / double(lp.size()), p * 4 + i});
      }
      std::stable_sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      for (size_t k = 0; k < 2; ++k) {
        const json& c = bj["choices"][p * 2 + k];
        EXPECT_EQ(c.at("index"), int64_t(p * 2 + k));
        EXPECT_EQ(c.at("text"), aj["choices"][ranked[k].second]["text"]) << "prompt " << p << ", place " << k;
        EXPECT_EQ(c.at("logprobs").is_null(), logprobs < 0) << c;
      }
    }
    EXPECT_EQ(billed(bj.at("usage")), billed(aj.at("usage"))) << "every sequence generated is billed";
  }
  expect_error(post("/v1/completions", {{"prompt", "x"}, {"n", 2}, {"best_of", 1}}), 400, "best_of",
               {"at least n (2)", "got 1"});
  expect_error(post("/v1/completions", {{"prompt", "x"}, {"best_of", 3}, {"stream", true}}), 400, "best_of",
               {"cannot be streamed"});
  expect_error(post("/v1/completions", {{"prompt", "x"}, {"best_of", 17}}), 400, "best_of", {"17"});  // queue of 16
  // best_of = n streams as usual.
  auto same = post("/v1/completions", {{"prompt", "x"}, {"n", 2}, {"best_of", 2}, {"max_tokens", 2}, {"stream", true}});
  ASSERT_TRUE(same);
  EXPECT_EQ(same->status, 200) << same->body;
}

// vLLM's stop_token_ids end a choice at those tokens (finish_reason "stop",
// stop_reason the id); stop_reason is the matched string for a stop string
// and null for the length; include_stop_str_in_output keeps the string.
TEST_F(ServeTest, StopTokenIdsStopReasonAndIncludedStopStrings) {
  const json plain = ascii_greedy("Once upon", 20);
  auto r = post("/v1/completions", plain);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json whole = json::parse(r->body)["choices"][0];
  const std::string text = whole["text"];
  ASSERT_EQ(text.size(), 20u);
  EXPECT_EQ(whole["finish_reason"], "length");
  EXPECT_TRUE(whole.contains("stop_reason") && whole["stop_reason"].is_null()) << whole;

  const int token = static_cast<unsigned char>(text[3]);
  const size_t at = text.find(text[3]);
  json body = plain;
  body["stop_token_ids"] = {token};
  for (bool stream_it : {false, true}) {
    body["stream"] = stream_it;
    if (!stream_it) {
      r = post("/v1/completions", body);
      ASSERT_TRUE(r);
      ASSERT_EQ(r->status, 200) << r->body;
      const json c = json::parse(r->body)["choices"][0];
      EXPECT_EQ(c["text"], text.substr(0, at)) << "a stop token is no part of the text";
      EXPECT_EQ(c["finish_reason"], "stop");
      EXPECT_EQ(c["stop_reason"], token);
    } else {
      EXPECT_EQ(stream(srv->port, body).text, text.substr(0, at));
    }
  }
  expect_error(post("/v1/completions", {{"prompt", "x"}, {"stop_token_ids", {256}}}), 400, "stop_token_ids", {"256"});
  expect_error(post("/v1/completions", {{"prompt", "x"}, {"stop_token_ids", 3}}), 400, "stop_token_ids", {});

  const std::string stop = text.substr(5, 2);
  const size_t cut = text.find(stop);
  body = plain;
  body["stop"] = stop;
  for (bool include : {false, true}) {
    body["include_stop_str_in_output"] = include;
    const std::string want = text.substr(0, cut + (include ? stop.size() : 0));
    body["stream"] = false;
    r = post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"stop", stop},
                                      {"include_stop_str_in_output", include}, {"max_tokens", 1}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
    r = post("/v1/completions", body);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const json c = json::parse(r->body)["choices"][0];
    EXPECT_EQ(c["text"], want) << "include " << include;
    EXPECT_EQ(c["stop_reason"], stop);
    body["stream"] = true;
    EXPECT_EQ(stream(srv->port, body).text, want) << "streamed, include " << include;
  }
}

// response_format {"type": "json_object"}: the text is always (a prefix of)
// one JSON object, and a choice ends with finish_reason "stop" when it
// closes. Nudged toward quotes and braces, the tiny model closes its object.
TEST_F(ServeTest, JsonObjectResponsesAreObjects) {
  int closed = 0;
  for (const char* route : {"/v1/chat/completions", "/v1/completions"}) {
    for (int seed : {1, 2, 3}) {
      json body = {{"max_tokens", 24}, {"temperature", 0.8}, {"seed", seed},
                   {"response_format", {{"type", "json_object"}}},
                   {"logit_bias", {{"34", 4}, {"125", 4}}}};  // '"' and '}'
      if (std::string(route) == "/v1/completions") body["prompt"] = "Data:";
      else body["messages"] = {{{"role", "user"}, {"content", "Answer in JSON."}}};
      auto r = post(route, body);
      ASSERT_TRUE(r);
      ASSERT_EQ(r->status, 200) << r->body;
      const json c = json::parse(r->body)["choices"][0];
      const std::string text = c.contains("message") ? c["message"]["content"] : c["text"];
      infer::JsonConstraint prefix;
      EXPECT_TRUE(prefix.feed(text)) << text;
      if (c["finish_reason"] == "stop") {
        ++closed;
        ASSERT_TRUE(json::accept(text)) << text;
        EXPECT_TRUE(json::parse(text).is_object()) << text;
        EXPECT_TRUE(prefix.done()) << text;
      }
      if (std::string(route) == "/v1/completions") {  // (stream() speaks the completions route)
        body["stream"] = true;
        EXPECT_EQ(stream(srv->port, body).text, text) << route;
      }
    }
  }
  EXPECT_GT(closed, 0) << "no choice closed its object";
  expect_error(post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "x"}}}},
                                             {"response_format", {{"type", "json_schema"}}}}),
               400, "response_format", {"json_schema needs"});
  expect_error(post("/v1/completions", {{"prompt", "x"}, {"response_format", "json"}}), 400, "response_format", {});
}

// response_format json_schema (OpenAI) and guided_json (vLLM): the text is
// an instance of the schema, its keys in the schema's order as the request
// wrote them (the body is sent as text: nlohmann's json would sort them).
TEST_F(ServeTest, JsonSchemaResponsesAreInstancesInTheSchemasKeyOrder) {
  const std::string schema =
      R"({"type":"object","properties":{"z":{"type":"string","maxLength":3},"a":{"enum":["x","y",7]},)"
      R"("m":{"type":"array","items":{"type":"integer"},"maxItems":2}},"required":["z","a","m"],)"
      R"("additionalProperties":false})";
  const auto compiled = infer::JsonSchema::compile_text(schema);
  int closed = 0;
  for (const char* route : {"/v1/chat/completions", "/v1/completions"}) {
    for (int seed : {1, 2, 3}) {
      for (const bool guided : {false, true}) {
        // (The model's context is 64 tokens: the chat prompt takes 32, the rest is its max_tokens.)
        const std::string head = std::string(route) == "/v1/completions"
                                     ? R"({"prompt":"Data:","max_tokens":50)"
                                     : R"({"messages":[{"role":"user","content":"Answer in JSON."}])";
        const std::string format = guided ? R"("guided_json":)" + schema
                                          : R"("response_format":{"type":"json_schema","json_schema":{"name":"t",)"
                                            R"("strict":true,"schema":)" + schema + "}}";
        const std::string body = head + R"(,"temperature":0.8,"seed":)" + std::to_string(seed) +
                                 R"(,"logit_bias":{"34":3,"93":3,"125":3,"9":-100,"10":-100,"13":-100,"32":-100},)" + format +
                                 "}";  // '"' ']' '}' up, whitespace (which this random model favours) out
        auto r = client().Post(route, body, "application/json");
        ASSERT_TRUE(r);
        ASSERT_EQ(r->status, 200) << r->body;
        const json c = json::parse(r->body)["choices"][0];
        const std::string text = c.contains("message") ? c["message"]["content"] : c["text"];
        infer::JsonConstraint prefix(*compiled);
        EXPECT_TRUE(prefix.feed(text)) << text;
        if (c["finish_reason"] != "stop") continue;
        ++closed;
        EXPECT_TRUE(prefix.done()) << text;
        const nlohmann::ordered_json v = nlohmann::ordered_json::parse(text);
        std::vector<std::string> keys;
        for (const auto& [k, unused] : v.items()) keys.push_back(k);
        EXPECT_EQ(keys, (std::vector<std::string>{"z", "a", "m"})) << text;
        const std::string z = v["z"];
        EXPECT_LE(std::count_if(z.begin(), z.end(), [](char ch) { return (ch & 0xC0) != 0x80; }), 3) << text;
        EXPECT_TRUE(v["a"] == "x" || v["a"] == "y" || v["a"] == 7) << text;
        EXPECT_LE(v["m"].size(), 2u) << text;
        for (const auto& i : v["m"]) EXPECT_TRUE(i.is_number_integer()) << text;
      }
    }
  }
  EXPECT_GT(closed, 4) << "too few choices closed their object";
  // A schema that allows one text gets it.
  auto empty = client().Post("/v1/completions",
                             R"({"prompt":"Data:","max_tokens":30,"seed":5,"logit_bias":{"9":-100,"10":-100,)"
                             R"("13":-100,"32":-100},"guided_json":{"type":"array","maxItems":0}})",
                             "application/json");
  ASSERT_TRUE(empty);
  ASSERT_EQ(empty->status, 200) << empty->body;
  EXPECT_EQ(json::parse(empty->body)["choices"][0]["text"], "[]");
  // What cannot be enforced is a 400 naming where in the schema it is.
  const json bad = {{"type", "object"}, {"properties", {{"age", {{"type", "integer"}, {"minimum", 0}}}}}};
  expect_error(post("/v1/chat/completions",
                    {{"messages", {{{"role", "user"}, {"content", "x"}}}},
                     {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "p"}, {"schema", bad}}}}}}),
               400, "response_format", {"response_format.json_schema.schema.properties.age: 'minimum' is not supported"});
  expect_error(post("/v1/completions", {{"prompt", "x"}, {"guided_json", bad}}), 400, "guided_json",
               {"guided_json.properties.age: 'minimum'"});
  expect_error(post("/v1/completions", {{"prompt", "x"}, {"guided_json", "{\"type\":"}}), 400, "guided_json",
               {"not JSON"});
  expect_error(post("/v1/completions", {{"prompt", "x"}, {"guided_json", {{"type", "object"}}},
                                        {"response_format", {{"type", "json_object"}}}}),
               400, "guided_json", {"give one of", "not a JSON response_format and guided_json"});
  expect_error(post("/v1/completions", {{"prompt", "x"},
                                        {"response_format", {{"type", "json_schema"},
                                                             {"json_schema", {{"name", "a b"}, {"schema", bad}}}}}}),
               400, "response_format", {"name must be"});
  expect_error(post("/v1/completions",
                    {{"prompt", "x"}, {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "a"}}}}}}),
               400, "response_format", {"schema is missing"});
}

// vLLM's guided_choice, on both routes: the text is one of the choices.
TEST_F(ServeTest, GuidedChoiceAnswersWithOneOfTheChoices) {
  const std::vector<std::string> choices = {"positive", "negative", "mixed"};
  std::set<std::string> seen;
  for (int seed = 1; seed <= 6; ++seed) {
    for (const char* route : {"/v1/completions", "/v1/chat/completions"}) {
      json body = {{"seed", seed}, {"guided_choice", choices}, {"max_tokens", 20}};
      if (std::string(route) == "/v1/completions") body["prompt"] = "Review: fine. Sentiment:";
      else body["messages"] = {{{"role", "user"}, {"content", "Sentiment?"}}};
      auto r = post(route, body);
      ASSERT_TRUE(r);
      ASSERT_EQ(r->status, 200) << r->body;
      const json c = json::parse(r->body)["choices"][0];
      const std::string text = c.contains("message") ? c["message"]["content"] : c["text"];
      EXPECT_NE(std::find(choices.begin(), choices.end(), text), choices.end()) << text;
      EXPECT_EQ(c["finish_reason"], "stop");
      seen.insert(text);
    }
  }
  EXPECT_GT(seen.size(), 1u) << "every draw chose the same text";
  expect_error(post("/v1/completions", {{"prompt", "x"}, {"guided_choice", {"yes", "yes!"}}}), 400, "guided_choice",
               {"\"yes\" begins \"yes!\""});
  expect_error(post("/v1/completions", {{"prompt", "x"}, {"guided_choice", "yes"}}), 400, "guided_choice",
               {"list of strings"});
  expect_error(post("/v1/completions", {{"prompt", "x"}, {"guided_choice", {"a"}}, {"guided_json", {{"type", "object"}}}}),
               400, "guided_choice", {"give one of", "not guided_json and guided_choice"});
}

// Whether `text` is one the test grammar below derives: "(" 1-3 of a-c ")"
// inside any number of matched "<" ">".
bool nested_in_angles(const std::string& text) {
  size_t open = 0;
  while (open < text.size() && text[open] == '<') ++open;
  const std::string rest = text.substr(open);
  return std::regex_match(rest, std::regex("\\([a-c]{1,3}\\)>*")) && rest.size() - rest.find(')') - 1 == open;
}

// vLLM's guided_regex and guided_grammar and llama.cpp's grammar: the
// answer is a whole text of the regular expression or grammar (checked
// here by std::regex and by hand), on both routes, streamed alike; what
// cannot be compiled, or two constraints at once, is a 400 naming the field.
TEST_F(ServeTest, GuidedRegexAndGrammarAnswersAreWholeTexts) {
  const std::string pattern = "(yes|no), [0-9]{2,3}!";
  const std::string grammar = "root ::= \"(\" [a-c]{1,3} \")\" | \"<\" root \">\"\n";
  std::set<std::string> seen;
  for (int seed = 1; seed <= 4; ++seed) {
    for (const char* route : {"/v1/completions", "/v1/chat/completions"}) {
      for (const char* field : {"guided_regex", "guided_grammar", "grammar"}) {
        const bool regex = std::string(field) == "guided_regex";
        json body = {{"seed", seed}, {field, regex ? pattern : grammar}, {"max_tokens", 40}, {"temperature", 1.0}};
        if (std::string(route) == "/v1/completions") body["prompt"] = "Answer:";
        else body["messages"] = {{{"role", "user"}, {"content", "Answer?"}}};
        auto r = post(route, body);
        ASSERT_TRUE(r);
        ASSERT_EQ(r->status, 200) << r->body;
        const json c = json::parse(r->body)["choices"][0];
        const std::string text = c.contains("message") ? c["message"]["content"] : c["text"];
        // The byte model has no end-of-text token: the text ends where
        // nothing may follow, or at max_tokens as a prefix.
        if (c["finish_reason"] == "stop") {
          if (regex) EXPECT_TRUE(std::regex_match(text, std::regex(pattern))) << text;
          else EXPECT_TRUE(nested_in_angles(text)) << text;
          seen.insert(text);
        } else {
          EXPECT_EQ(c["finish_reason"], "length") << text;
        }
        body["stream"] = true;
        auto st = post(route, body);
        ASSERT_TRUE(st);
        ASSERT_EQ(st->status, 200);
        std::string streamed;
        for (const std::string& ev : sse_events(st->body)) {
          if (ev == "[DONE]") break;
          const json d = json::parse(ev)["choices"][0];
          if (d.contains("text")) streamed += d["text"].get<std::string>();
          else if (d["delta"].contains("content") && d["delta"]["content"].is_string())
            streamed += d["delta"]["content"].get<std::string>();
        }
        EXPECT_EQ(streamed, text) << route << " " << field << " seed " << seed;
      }
    }
  }
  EXPECT_GT(seen.size(), 3u) << "the draws closed too few distinct texts";
  expect_error(post("/v1/completions", {{"prompt", "x"}, {"guided_regex", "a(?=b)"}}), 400, "guided_regex",
               {"guided_regex: lookaround"});
  expect_error(post("/v1/completions", {{"prompt", "x"}, {"grammar", "root ::= root \"a\" | \"b\""}}), 400,
               "grammar", {"grammar: rule 'root' is left-recursive"});
  expect_error(post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "x"}}}},
                                             {"guided_grammar", "root ::= item"}}),
               400, "guided_grammar", {"rule 'item' is used but never defined"});
  expect_error(post("/v1/completions", {{"prompt", "x"}, {"guided_regex", 5}}), 400, "guided_regex",
               {"must be a regular expression"});
  expect_error(post("/v1/completions", {{"prompt", "x"}, {"grammar", ""}}), 400, "grammar", {"must be a GBNF grammar"});
  expect_error(post("/v1/completions", {{"prompt", "x"}, {"guided_regex", "a"}, {"grammar", "root ::= \"a\""}}), 400,
               "grammar", {"not guided_regex and grammar"});
  expect_error(post("/v1/completions", {{"prompt", "x"}, {"response_format", {{"type", "json_object"}}},
                                        {"guided_regex", "a"}}),
               400, "guided_regex", {"not a JSON response_format and guided_regex"});
  // A pattern nested past 256 groups is a 400, not a stack overflow (a
  // body of 100,000 '(' killed the server; this one's --max-body is 4 KiB).
  expect_error(post("/v1/completions", {{"prompt", "x"}, {"guided_regex", std::string(3000, '(') + "a"}}), 400,
               "guided_regex", {"groups nest more than 256 deep"});
  expect_error(post("/v1/completions", {{"prompt", "x"}, {"grammar", "root ::= " + std::string(3000, '(')}}), 400,
               "grammar", {"groups nest more than 256 deep"});
  // llama.cpp's server's json_schema is guided_json by another name.
  auto js = post("/v1/completions", {{"prompt", "x"}, {"json_schema", {{"type", "array"}, {"maxItems", 0}}}});
  ASSERT_TRUE(js);
  ASSERT_EQ(js->status, 200) << js->body;
  EXPECT_EQ(json::parse(json::parse(js->body)["choices"][0]["text"].get<std::string>()), json::array());
  expect_error(post("/v1/completions", {{"prompt", "x"}, {"json_schema", {{"type", "string"}}}}), 400, "json_schema",
               {"json_schema: the root must allow an object or an array"});
  expect_error(post("/v1/completions", {{"prompt", "x"}, {"json_schema", {{"type", "object"}}},
                                        {"guided_json", {{"type", "object"}}}}),
               400, "json_schema", {"not guided_json and json_schema"});
}

// tools with a forced call: the message's tool_calls hold the function's
// name and its arguments, an instance of its parameters schema; streamed,
// the first chunk names the call and the rest carry its arguments.
TEST_F(ServeTest, AForcedToolCallAnswersWithItsArguments) {
  const std::string tools =
      R"("tools":[{"type":"function","function":{"name":"get_weather","description":"Weather in a city",)"
      R"("parameters":{"type":"object","properties":{"city":{"type":"string","maxLength":4},)"
      R"("unit":{"enum":["c","f"]}},"required":["city","unit"]}}},)"
      R"({"type":"function","function":{"name":"noop"}}])";
  const std::string common = R"({"messages":[{"role":"user","content":"Hi"}],"temperature":0.8,)"
                             R"("logit_bias":{"34":3,"125":3,"9":-100,"10":-100,"13":-100,"32":-100},)" + tools;
  int closed = 0;
  for (int seed : {1, 2, 3}) {
    const std::string body = common + R"(,"seed":)" + std::to_string(seed) +
                             R"(,"tool_choice":{"type":"function","function":{"name":"get_weather"}}})";
    auto r = client().Post("/v1/chat/completions", body, "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const json c = json::parse(r->body)["choices"][0];
    const json& m = c["message"];
    EXPECT_TRUE(m["content"].is_null()) << m;
    ASSERT_EQ(m["tool_calls"].size(), 1u) << m;
    const json& call = m["tool_calls"][0];
    EXPECT_EQ(call["type"], "function");
    EXPECT_EQ(call["function"]["name"], "get_weather");
    EXPECT_EQ(call["id"].get<std::string>().rfind("call-", 0), 0u) << call;
    const std::string args = call["function"]["arguments"];
    if (c["finish_reason"] != "stop") continue;  // named: "stop", as OpenAI answers
    ++closed;
    const json a = json::parse(args);
    EXPECT_TRUE(a["unit"] == "c" || a["unit"] == "f") << args;
    EXPECT_TRUE(a["city"].is_string()) << args;

    // Streamed: the same call, its arguments in pieces.
    const std::string streamed = body.substr(0, body.size() - 1) + R"(,"stream":true})";
    auto s = client().Post("/v1/chat/completions", streamed, "application/json");
    ASSERT_TRUE(s);
    ASSERT_EQ(s->status, 200) << s->body;
    std::string joined, name, finish;
    std::istringstream in(s->body);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("data: {", 0) != 0) continue;
      const json ch = json::parse(line.substr(6))["choices"][0];
      if (ch["delta"].contains("tool_calls")) {
        const json& d = ch["delta"]["tool_calls"][0];
        EXPECT_EQ(d["index"], 0);
        if (d.contains("id")) {  // (each response has its own id)
          EXPECT_EQ(d["id"].get<std::string>().rfind("call-", 0), 0u) << line;
        }
        if (d["function"].contains("name")) name = d["function"]["name"];
        joined += d["function"]["arguments"].get<std::string>();
      }
      EXPECT_FALSE(ch["delta"].contains("content") && ch["delta"]["content"].is_string()) << line;
      if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
    }
    EXPECT_EQ(name, "get_weather");
    EXPECT_EQ(joined, args);
    EXPECT_EQ(finish, "stop");
  }
  EXPECT_GT(closed, 0) << "no call's arguments closed";

  // "required" with one tool: finish_reason "tool_calls"; no parameters: {}.
  auto req = client().Post("/v1/chat/completions",
                           R"({"messages":[{"role":"user","content":"Hi"}],"seed":1,"tool_choice":"required",)"
                           R"("logit_bias":{"9":-100,"10":-100,"13":-100,"32":-100},)"
                           R"("tools":[{"type":"function","function":{"name":"noop"}}]})",
                           "application/json");
  ASSERT_TRUE(req);
  ASSERT_EQ(req->status, 200) << req->body;
  const json rc = json::parse(req->body)["choices"][0];
  EXPECT_EQ(rc["finish_reason"], "tool_calls");
  EXPECT_EQ(rc["message"]["tool_calls"][0]["function"]["arguments"], "{}");

  // A conversation that went through a call: the assistant's tool_calls and
  // the tool's answer are part of the prompt.
  auto after = client().Post(
      "/v1/chat/completions",
      R"({"messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":null,"tool_calls":)"
      R"([{"id":"call-1","type":"function","function":{"name":"noop","arguments":"{}"}}]},)"
      R"({"role":"tool","tool_call_id":"call-1","content":"ok"}],"max_tokens":2})",
      "application/json");
  ASSERT_TRUE(after);
  EXPECT_EQ(after->status, 200) << after->body;
  EXPECT_EQ(serve::render_chat({{"assistant", "noop({})"}, {"tool", "ok"}}), "Assistant: noop({})\nTool: ok\nAssistant:");

  const std::string user = R"({"messages":[{"role":"user","content":"Hi"}],)";
  auto bad = [&](const std::string& rest, const std::string& param, const std::string& words) {
    auto r = client().Post("/v1/chat/completions", user + rest, "application/json");
    expect_error(r, 400, param, {words});
  };
  bad(tools + "}", "tool_choice", "\"auto\" (the default with tools) is not supported");
  bad(tools + R"(,"tool_choice":"required"})", "tool_choice", "one tool");
  bad(tools + R"(,"tool_choice":{"type":"function","function":{"name":"other"}}})", "tool_choice", "not in tools");
  bad(R"("tool_choice":"required"})", "tool_choice", "needs tools");
  bad(R"("tools":[{"type":"function","function":{"name":"f","parameters":{"type":"array"}}}],"tool_choice":"required"})",
      "tools", "must be a JSON schema of \"type\": \"object\"");
  bad(R"("tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":)"
      R"({"n":{"type":"integer","minimum":0}}}}}],"tool_choice":"required"})",
      "tools", "tools[0].function.parameters.properties.n: 'minimum' is not supported");
  bad(R"("tools":[{"type":"function","function":{"name":"a b"}}],"tool_choice":"none"})", "tools", "name must be");
  bad(R"("functions":[]})", "functions", "use tools");
  expect_error(post("/v1/chat/completions", {{"messages", {{{"role", "tool"}, {"content", "x"}}}}}), 400, "messages",
               {"tool_call_id"});
  // "none": the tools are there, the answer is text.
  auto none = client().Post("/v1/chat/completions", user + tools + R"(,"tool_choice":"none","max_tokens":3})",
                            "application/json");
  ASSERT_TRUE(none);
  ASSERT_EQ(none->status, 200) << none->body;
  EXPECT_TRUE(json::parse(none->body)["choices"][0]["message"]["content"].is_string());
}

TEST_F(ServeTest, TokenizeRoundTrip) {
  auto t = post("/tokenize", {{"prompt", "hello, world"}});
  ASSERT_TRUE(t);
  ASSERT_EQ(t->status, 200) << t->body;
  const json tj = json::parse(t->body);
  EXPECT_EQ(tj.at("count"), 12);
  EXPECT_EQ(tj.at("tokens").size(), 12u);
  EXPECT_EQ(tj["tokens"][0], int('h'));
  auto d = post("/detokenize", {{"tokens", tj["tokens"]}});
  ASSERT_TRUE(d);
  ASSERT_EQ(d->status, 200) << d->body;
  EXPECT_EQ(json::parse(d->body).at("prompt"), "hello, world");
  expect_error(post("/detokenize", {{"tokens", {1, 300}}}), 400, "tokens", {"300"});
  expect_error(post("/tokenize", {{"prompt", 5}}), 400, "prompt", {"prompt"});
  // vLLM's fields: the served model (another is a 404, as on every route) and its context.
  t = post("/tokenize", {{"prompt", "hi"}, {"model", "tiny"}});
  ASSERT_TRUE(t);
  ASSERT_EQ(t->status, 200) << t->body;
  EXPECT_EQ(json::parse(t->body).at("max_model_len"), kContext);
  expect_error(post("/tokenize", {{"prompt", "hi"}, {"model", "other"}}), 404, "model", {"other"});
  expect_error(post("/detokenize", {{"tokens", {1}}, {"model", "other"}}), 404, "model", {"other"});
}

// A model whose embedding is padded past its tokenizer (GPT-2's 50,257 ids to
// 50,304; here the 256 bytes to 320), given to the server with the model's
// vocabulary as `brisk serve` gives it. A padded id has no text: in a prompt
// of token ids it is refused by name (it was a 500 when echoed), and the
// prompt's logprobs, like a drawn token's, never offer one.
TEST(ServePaddedVocab, PromptIdsPastTheTokenizerAreRefusedAndNeverOffered) {
  testing::TinyGpt t;
  t.vocab = 320;
  t.width = 64;
  t.context = kContext;
  t.seed = 5;
  Running padded(2, 4, 4096, testing::save_tiny_gpt((temp_root() / "padded").string(), t));
  httplib::Client c("127.0.0.1", padded.port);
  c.set_read_timeout(60, 0);
  auto post = [&](const json& body) { return c.Post("/v1/completions", body.dump(), "application/json"); };
  expect_error(post({{"prompt", {65, 300, 66}}, {"echo", true}, {"max_tokens", 0}}), 400, "prompt", {"300"});
  expect_error(post({{"prompt", {65, 300, 66}}, {"max_tokens", 2}}), 400, "prompt", {"300"});
  // The top 20 of 320 random logits hold a padded id at about 99% of
  // positions; each would fail to decode (a 500).
  auto r = post({{"prompt", "padded ids"}, {"echo", true}, {"logprobs", 20}, {"max_tokens", 4}, {"temperature", 0}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json lp = json::parse(r->body)["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 10u + 4u);
  ASSERT_EQ(lp["top_logprobs"].size(), 10u + 4u);
  for (size_t i = 1; i < lp["top_logprobs"].size(); ++i) {
    EXPECT_FALSE(lp["top_logprobs"][i].empty()) << "position " << i;
    for (const auto& [text, v] : lp["top_logprobs"][i].items()) EXPECT_LE(v.get<double>(), 0.0) << "position " << i;
  }
}

TEST(ServeQueue, FullQueueGets429WithRetryAfter) {
  Running full(1, 0, 4096);  // no request may wait
  httplib::Client c("127.0.0.1", full.port);
  auto r = c.Post("/v1/completions", json{{"prompt", "x"}}.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 429) << r->body;
  EXPECT_FALSE(r->get_header_value("Retry-After").empty());
  EXPECT_EQ(json::parse(r->body)["error"]["type"], "rate_limit_exceeded");
}

TEST(TextStream, HoldsBackStopPrefixesAndSplitCharacters) {
  auto tok = data::make_byte_tokenizer();
  serve::TextStream ts(*tok, {"END"});
  std::string out;
  for (char c : std::string("abEN")) out += ts.add(static_cast<unsigned char>(c));
  EXPECT_EQ(out, "ab");  // "EN" may be the start of "END"
  out += ts.add('X');
  EXPECT_EQ(out, "abENX");
  out += ts.add('E');
  out += ts.add('N');
  out += ts.add('D');
  out += ts.finish_at_stop();
  EXPECT_EQ(out, "abENX");
  // A two-byte character split over two tokens comes out whole; a stray
  // continuation byte becomes U+FFFD.
  serve::TextStream u(*tok, {});
  EXPECT_EQ(u.add(0xC3), "");
  EXPECT_EQ(u.add(0xA9), "\xC3\xA9");
  EXPECT_EQ(u.add(0x80), "\xEF\xBF\xBD");
  EXPECT_EQ(u.add(0xE2), "");
  EXPECT_EQ(u.finish(), "\xEF\xBF\xBD");
}

// With min_tokens, a stop string ending before the min_tokens-th token is
// text; one ending in it or later cuts the text, even if it starts earlier.
TEST(TextStream, StopStringsEndingBeforeMinTokensAreText) {
  auto tok = data::make_byte_tokenizer();
  auto feed = [&](int64_t min_tokens, const std::string& tokens) {
    serve::TextStream ts(*tok, {"END"}, min_tokens);
    std::string out;
    for (char c : tokens) out += ts.add(static_cast<unsigned char>(c));
    return out + ts.finish_at_stop();
  };
  EXPECT_EQ(feed(0, "abENDxyENDz"), "ab");
  EXPECT_EQ(feed(5, "abENDxyENDz"), "ab");        // the first END ends in the 5th token
  EXPECT_EQ(feed(6, "abENDxyENDz"), "abENDxy");   // ... too early; the second ends in the 10th
  EXPECT_EQ(feed(11, "abENDxyENDz"), "abENDxyENDz");
  EXPECT_EQ(feed(9, "abcdefgEND"), "abcdefg");    // starts before the 9th token, ends in the 10th
  EXPECT_EQ(feed(10, "abcdefgEND"), "abcdefg");   // ends in the 10th, the min_tokens-th
}

// A tokenizer of whole words (token i is words[i]), for stop strings that
// end inside a token, as GPT-2's often do.
class WordTokenizer : public data::Tokenizer {
 public:
  explicit WordTokenizer(std::vector<std::string> words) : words_(std::move(words)) {}
  std::string name() const override { return "words"; }
  int64_t vocab_size() const override { return int64_t(words_.size()); }
  int32_t eot_token() const override { return -1; }
  std::vector<int32_t> encode(std::string_view) const override { return {}; }
  std::string decode(std::span<const int32_t> ids) const override {
    std::string out;
    for (int32_t id : ids) out += words_[size_t(id)];
    return out;
  }

 private:
  std::vector<std::string> words_;
};

// Stop strings inside tokens: the text ends where the engine's choice (the
// stop starting first, the shorter on a tie) says, after it with
// include_stop, and never after a route's own hidden stop.
TEST(TextStream, StopStringsInsideTokensEndTheTextOnce) {
  const WordTokenizer tok({"Hello", ".\n", "ba", "xy", "\nUser: hi"});
  auto run = [&](std::vector<std::string> stops, bool include, std::vector<int32_t> ids, std::string hidden = "") {
    serve::TextStream ts(tok, std::move(stops), 0, include, std::move(hidden));
    std::string out;
    for (size_t i = 0; i < ids.size(); ++i) {
      out += ts.add(ids[i]);
    }
    return out + ts.finish_at_stop();
  };
  EXPECT_EQ(run({"."}, false, {0, 1}), "Hello");
  EXPECT_EQ(run({"."}, true, {0, 1}), "Hello.");  // not "Hello.\n": the token goes on past the stop
  EXPECT_EQ(run({"a", "b"}, false, {2}), "");      // "b" starts first
  EXPECT_EQ(run({"a", "b"}, true, {2}), "b");
  EXPECT_EQ(run({"\nUser:"}, true, {0, 4}, "\nUser:"), "Hello");  // the chat turn's end stays out
  EXPECT_EQ(run({"\nUser:", "o"}, true, {0, 4}, "\nUser:"), "Hello");
}

// An ill-formed sequence becomes one U+FFFD per maximal subpart, as
// Python's bytes.decode(errors="replace") gives it (these are its answers).
TEST(TextStream, IllFormedBytesAreReplacedPerMaximalSubpart) {
  const std::string r = "\xEF\xBF\xBD";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"\xE2\x82" "A", r + "A"},           // a 3-byte start and one continuation, then ASCII
      {"\xE2" "A", r + "A"},
      {"\xED\xA0\x80", r + r + r},        // a surrogate: ED takes no A0, so three
      {"\xF0\x9F\x98", r},                // a 4-byte start cut by the end
      {"\xF0\x9F\x98\x80", "\xF0\x9F\x98\x80"},
      {"\xC0\xAF", r + r},                 // an overlong start is no start
      {"\xF4\x90\x80\x80", r + r + r + r}, // past U+10FFFF
      {"a\x80\x80" "b", "a" + r + r + "b"},
  };
  for (const auto& [in, want] : cases) EXPECT_EQ(serve::valid_utf8(in), want) << serve::valid_utf8(in).size();
  EXPECT_EQ(serve::valid_utf8_offset("\xE2\x82" "A", 2), 3u);  // "A" lands after the one U+FFFD
  auto tok = data::make_byte_tokenizer();
  serve::TextStream ts(*tok, {});
  std::string out = ts.add(0xE2);
  out += ts.add(0x82);
  EXPECT_EQ(out, "") << "a start that may still complete is held back";
  out += ts.add('A');
  EXPECT_EQ(out, r + "A");
}

// text_offset counts bytes of the text a client gets, where each ill-formed
// byte is the 3 bytes of U+FFFD: raw offsets drift after the first one.
TEST(TextStream, OffsetsCountTheReplacedText) {
  const std::string raw = "\xFF" "AB" "\xC3\xA9" "\x80" "C";  // bad, A, B, e-acute, stray continuation, C
  EXPECT_EQ(serve::valid_utf8(raw), "\xEF\xBF\xBD" "AB" "\xC3\xA9" "\xEF\xBF\xBD" "C");
  const std::vector<std::pair<size_t, size_t>> raw_to_text{{0, 0}, {1, 3}, {2, 4}, {3, 5}, {4, 5}, {5, 7}, {6, 10}, {7, 11}};
  for (const auto& [r, t] : raw_to_text) EXPECT_EQ(serve::valid_utf8_offset(raw, r), t) << "raw " << r;
  auto tok = data::make_byte_tokenizer();
  serve::TextStream ts(*tok, {});
  std::string text;
  for (unsigned char c : raw) {
    text += ts.add(c);
    const size_t at = ts.offset_of_last();
    if (c == 'A' || c == 'B' || c == 'C') {
      EXPECT_EQ(text.substr(at, 1), std::string(1, char(c))) << text;
    }
  }
  text += ts.finish();
  EXPECT_EQ(text, serve::valid_utf8(raw));
}

// ---- /v1/chat/completions, n > 1 and lists of prompts ----

json chat_body(const std::string& user, json extra = json::object()) {
  json body = {{"messages", {{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", user}}}}};
  body.update(extra);
  return body;
}

// What the template renders chat_body(user) to (docs/serving.md).
std::string rendered(const std::string& user) { return "System: Be brief.\nUser: " + user + "\nAssistant:"; }

struct ChatStreamed {
  std::map<int64_t, std::string> content;  // by choice index
  std::map<int64_t, std::string> finish_reason;
  std::vector<int64_t> order;  // the index of every content chunk, in order
  json usage;
  std::string id;
};

// Runs a streamed chat completion and checks the stream's shape on the way:
// one id and created, the role before any content of its choice, no chunk of
// a choice after its finishing one, the usage chunk last, then [DONE].
ChatStreamed chat_stream(int port, json body) {
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  ChatStreamed s;
  const std::vector<json> chunks = stream_chunks(port, "/v1/chat/completions", body, "chat.completion.chunk", s.id);
  EXPECT_GE(chunks.size(), 2u);  // a role chunk at least, and the usage chunk
  std::set<int64_t> has_role;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const json& ch = chunks[i];
    if (ch.at("choices").empty()) {
      EXPECT_EQ(i + 1, chunks.size()) << "the usage chunk is not the last";
      s.usage = ch.at("usage");
      continue;
    }
    EXPECT_EQ(ch["choices"].size(), 1u);
    const json& c0 = ch["choices"][0];
    const int64_t index = c0.at("index");
    const json& delta = c0.at("delta");
    EXPECT_FALSE(s.finish_reason.count(index)) << "a chunk after choice " << index << " finished";
    if (delta.contains("role")) {
      EXPECT_EQ(delta["role"], "assistant");
      EXPECT_EQ(delta.at("content"), "");
      EXPECT_TRUE(has_role.insert(index).second) << "two role chunks for choice " << index;
      continue;
    }
    EXPECT_TRUE(has_role.count(index)) << "content of choice " << index << " before its role";
    if (delta.contains("content")) {
      s.content[index] += delta["content"].get<std::string>();
      s.order.push_back(index);
    }
    if (!c0.at("finish_reason").is_null()) s.finish_reason[index] = c0["finish_reason"];
  }
  EXPECT_EQ(s.id.rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(s.finish_reason.size(), has_role.size()) << "a choice without its finishing chunk";
  return s;
}

TEST_F(ServeTest, ChatShapeUsageAndTemplate) {
  auto r = post("/v1/chat/completions", chat_body("Hello", {{"model", "tiny"}, {"max_tokens", 7}, {"temperature", 0}}));
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  EXPECT_EQ(j.at("id").get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(j.at("object"), "chat.completion");
  EXPECT_NEAR(j.at("created").get<double>(), double(std::time(nullptr)), 60);
  EXPECT_EQ(j.at("model"), "tiny");
  ASSERT_EQ(j.at("choices").size(), 1u);
  const json& c = j["choices"][0];
  EXPECT_EQ(c.at("index"), 0);
  EXPECT_EQ(c.at("message").at("role"), "assistant");
  EXPECT_TRUE(c["message"].at("content").is_string());
  EXPECT_TRUE(c.at("logprobs").is_null());
  // The prompt is the rendered template (one byte, one token).
  const int64_t prompt_tokens = int64_t(rendered("Hello").size());
  const json& u = j.at("usage");
  EXPECT_EQ(u.at("prompt_tokens"), prompt_tokens);
  EXPECT_GE(u.at("completion_tokens").get<int64_t>(), 1);
  EXPECT_LE(u.at("completion_tokens").get<int64_t>(), 7);
  EXPECT_EQ(u.at("total_tokens"), prompt_tokens + u["completion_tokens"].get<int64_t>());
  // The same as completing the rendered text with the template's stop string.
  auto plain = post("/v1/completions",
                    {{"prompt", rendered("Hello")}, {"max_tokens", 7}, {"temperature", 0}, {"stop", "\nUser:"}});
  ASSERT_TRUE(plain);
  ASSERT_EQ(plain->status, 200) << plain->body;
  const json pj = json::parse(plain->body);
  EXPECT_EQ(c["message"]["content"], pj["choices"][0]["text"]);
  EXPECT_EQ(c["finish_reason"], pj["choices"][0]["finish_reason"]);
  EXPECT_EQ(billed(u), billed(pj["usage"]));
  // max_completion_tokens is the same limit under OpenAI's newer name.
  auto alias = post("/v1/chat/completions", chat_body("Hello", {{"max_completion_tokens", 7}, {"temperature", 0}}));
  ASSERT_TRUE(alias);
  ASSERT_EQ(alias->status, 200) << alias->body;
  EXPECT_EQ(json::parse(alias->body)["choices"][0]["message"], c["message"]);
}

TEST_F(ServeTest, ChatStreamMatchesNonStream) {
  const json body = chat_body("Tell me", {{"max_tokens", 20}, {"temperature", 1.0}, {"seed", 77}});
  auto r = post("/v1/chat/completions", body);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  const ChatStreamed s = chat_stream(srv->port, body);
  ASSERT_EQ(s.content.size(), 1u);
  EXPECT_EQ(s.content.at(0), j["choices"][0]["message"]["content"].get<std::string>());
  EXPECT_EQ(s.finish_reason.at(0), j["choices"][0]["finish_reason"]);
  EXPECT_EQ(billed(s.usage), billed(j["usage"]));
  EXPECT_NE(s.id, j["id"]);
}

TEST_F(ServeTest, ChatLogprobs) {
  auto r = post("/v1/chat/completions",
                chat_body("Hi", {{"max_tokens", 5}, {"temperature", 0}, {"logprobs", true}, {"top_logprobs", 2}}));
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  const json& content = j["choices"][0].at("logprobs").at("content");
  EXPECT_EQ(int64_t(content.size()), j["usage"]["completion_tokens"].get<int64_t>());
  // OpenAI's types have `refusal` (string | null) in both: typed clients expect the field.
  EXPECT_TRUE(j["choices"][0].at("logprobs").at("refusal").is_null());
  EXPECT_TRUE(j["choices"][0].at("message").at("refusal").is_null());
  std::string joined;
  for (const json& e : content) {
    EXPECT_LE(e.at("logprob").get<double>(), 0.0);
    ASSERT_EQ(e.at("bytes").size(), 1u);  // one byte per token
    joined += char(e["bytes"][0].get<int>());
    EXPECT_GE(e.at("top_logprobs").size(), 1u);
    EXPECT_LE(e["top_logprobs"].size(), 2u);
    EXPECT_GE(e["top_logprobs"][0].at("logprob").get<double>(), e["logprob"].get<double>() - 1e-5);  // greedy
  }
  // The tokens' bytes are the content (and the stop string, if one ended it);
  // bytes that are no UTF-8 character show as U+FFFD in the content.
  EXPECT_EQ(serve::valid_utf8(joined).rfind(j["choices"][0]["message"]["content"].get<std::string>(), 0), 0u);
}

// A tokenizer's end-of-text token ends a completion or a chat answer with
// finish_reason "stop", as OpenAI's do (the server generated
// "<|endoftext|>" text until max_tokens). A byte tokenizer has none.
TEST(EndOfText, EndsCompletionsAndChatAnswers) {
  struct WithEot : data::Tokenizer {  // bytes, with id 4 as end-of-text
    std::unique_ptr<data::Tokenizer> bytes = data::make_byte_tokenizer();
    std::string name() const override { return "bytes"; }
    int64_t vocab_size() const override { return 256; }
    int32_t eot_token() const override { return 4; }
    std::vector<int32_t> encode(std::string_view t) const override { return bytes->encode(t); }
    std::string decode(std::span<const int32_t> ids) const override { return bytes->decode(ids); }
  } tok;
  const serve::ModelInfo info{"tiny", 256, kContext};
  const serve::Request c = serve::parse_completions(json{{"prompt", "Hi"}, {"max_tokens", 4}}.dump(), info, tok);
  EXPECT_EQ(c.choices[0].params.stop_tokens, std::vector<int32_t>{4});
  const serve::Request chat = serve::parse_chat(chat_body("Hi", json::object()).dump(), info, tok);
  EXPECT_EQ(chat.choices[0].params.stop_tokens, std::vector<int32_t>{4});
  auto bytes = data::make_byte_tokenizer();
  EXPECT_TRUE(serve::parse_completions(json{{"prompt", "Hi"}}.dump(), info, *bytes).choices[0].params.stop_tokens.empty());
  // The engine ends such a sequence with Finish::stop and no stop string:
  // the builder leaves the token out of the text and says "stop".
  serve::CompletionBuilder b(tok, c.choices[0], "cmpl-x", 0, "tiny", serve::Api::completions);
  infer::TokenEvent e;
  e.choice.token = 'A';
  b.add(e);
  e.choice.token = 4;
  e.finish = infer::Finish::stop;
  const json last = b.add(e);
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop") << last.dump();
  EXPECT_EQ(last["choices"][0]["text"], "") << last.dump();
}

// The template's stop string ends the answer where a base model would go
// on to write the user's next turn. Fed through the builder as the engine
// reports such a sequence (the tiny random model never writes it).
TEST(ChatTemplate, DefaultStopEndsBeforeTheNextUserTurn) {
  auto tok = data::make_byte_tokenizer();
  const serve::ModelInfo info{"tiny", 256, kContext};
  const serve::Request r = serve::parse_chat(chat_body("Hi", {{"stop", "###"}}).dump(), info, *tok);
  ASSERT_EQ(r.choices.size(), 1u);
  const std::vector<std::string>& stop = r.choices[0].params.stop;
  EXPECT_EQ(stop, (std::vector<std::string>{"###", "\nUser:"}));
  EXPECT_EQ(tok->decode(r.choices[0].prompt), rendered("Hi"));
  EXPECT_EQ(r.prompt_tokens, int64_t(rendered("Hi").size()));
  EXPECT_EQ(r.choices[0].params.max_tokens, kContext - int64_t(rendered("Hi").size()));  // the rest of the context
  serve::CompletionBuilder b(*tok, r.choices[0], "chatcmpl-x", 0, "tiny", serve::Api::chat);
  const std::string out = " Sure.\nUser: and now";
  std::string streamed;
  for (size_t i = 0; i < out.size(); ++i) {
    infer::TokenEvent e;
    e.choice.token = static_cast<unsigned char>(out[i]);
    if (out.compare(0, i + 1, " Sure.\nUser:") == 0 && i + 1 == std::string(" Sure.\nUser:").size()) {
      e.finish = infer::Finish::stop;
      e.stop_matched = "\nUser:";
    }
    const json chunk = b.add(e);
    if (!chunk.is_null()) {
      const json& delta = chunk["choices"][0]["delta"];
      if (delta.contains("content")) streamed += delta["content"].get<std::string>();
    }
    if (b.finished()) break;
  }
  const json c = b.choice();
  EXPECT_EQ(c["message"]["content"], " Sure.");
  EXPECT_EQ(c["finish_reason"], "stop");
  EXPECT_EQ(streamed, " Sure.");
  EXPECT_EQ(serve::render_chat({{"system", "S"}, {"user", "U"}, {"assistant", "A"}, {"user", "V"}}),
            "System: S\nUser: U\nAssistant: A\nUser: V\nAssistant:");
}

// "developer" is OpenAI's newer name for the system message: the same prompt.
TEST_F(ServeTest, ChatDeveloperRoleIsTheSystemMessage) {
  auto ask = [&](const char* role) {
    const json body = {{"messages", {{{"role", role}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Hi"}}}},
                       {"max_tokens", 4},
                       {"temperature", 0}};
    auto r = post("/v1/chat/completions", body);
    EXPECT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
    return json::parse(r->body);
  };
  const json system = ask("system"), developer = ask("developer");
  EXPECT_EQ(developer["usage"]["prompt_tokens"], system["usage"]["prompt_tokens"]);
  EXPECT_EQ(developer["choices"][0]["message"]["content"], system["choices"][0]["message"]["content"]);
}

TEST_F(ServeTest, ChatErrorsNameTheField) {
  expect_error(post("/v1/chat/completions", {{"max_tokens", 3}}), 400, "messages", {"messages"});
  expect_error(post("/v1/chat/completions", {{"messages", json::array()}}), 400, "messages", {"messages"});
  expect_error(post("/v1/chat/completions", {{"messages", "hi"}}), 400, "messages", {"messages"});
  expect_error(post("/v1/chat/completions", {{"messages", {{{"role", "function"}, {"content", "x"}}}}}), 400, "messages",
               {"messages[0].role", "function"});
  expect_error(post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "x"}}, {{"role", "user"}}}}}),
               400, "messages", {"messages[1].content"});
  expect_error(post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", 5}}}}}), 400, "messages",
               {"content"});
  expect_error(post("/v1/chat/completions", {{"messages", {"just text"}}}), 400, "messages", {"messages[0]"});
  expect_error(post("/v1/chat/completions", chat_body("x", {{"top_logprobs", 2}})), 400, "top_logprobs",
               {"logprobs"});
  expect_error(post("/v1/chat/completions", chat_body("x", {{"logprobs", true}, {"top_logprobs", 21}})), 400,
               "top_logprobs", {"20"});
  expect_error(post("/v1/chat/completions", chat_body("x", {{"max_tokens", 60}})), 400, "max_tokens", {"64"});
  expect_error(post("/v1/chat/completions", chat_body("x", {{"temperature", -1}})), 400, "temperature",
               {"temperature"});
  expect_error(post("/v1/chat/completions", chat_body("x", {{"model", "other"}})), 404, "model", {"other"});
  expect_error(post("/v1/chat/completions", chat_body("x", {{"n", 0}})), 400, "n", {"n"});
  // 16 sequences may wait in this server's queue: 17 choices never could.
  expect_error(post("/v1/chat/completions", chat_body("x", {{"n", 17}})), 400, "n", {"16", "queue"});
  auto r = post("/v1/chat/completions", chat_body("x", {{"max_tokens", 2}}));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
}

TEST_F(ServeTest, ChatNChoices) {
  const json body = chat_body("Pick", {{"max_tokens", 20}, {"temperature", 1.0}, {"seed", 500}, {"n", 3}});
  auto r = post("/v1/chat/completions", body);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  ASSERT_EQ(j.at("choices").size(), 3u);
  std::set<std::string> distinct;
  int64_t completion_tokens = 0;
  for (int64_t i = 0; i < 3; ++i) {
    const json& c = j["choices"][size_t(i)];
    EXPECT_EQ(c.at("index"), i);
    distinct.insert(c["message"]["content"].get<std::string>());
    // Choice i samples with seed + i: a single request with that seed gets it.
    json one = body;
    one["n"] = 1;
    one["seed"] = 500 + i;
    auto r1 = post("/v1/chat/completions", one);
    ASSERT_TRUE(r1);
    ASSERT_EQ(r1->status, 200) << r1->body;
    const json j1 = json::parse(r1->body);
    EXPECT_EQ(j1["choices"][0]["message"], c["message"]) << "choice " << i;
    completion_tokens += j1["usage"]["completion_tokens"].get<int64_t>();
  }
  EXPECT_EQ(distinct.size(), 3u);
  // The prompt is counted once, the completions of every choice.
  EXPECT_EQ(j["usage"]["prompt_tokens"], int64_t(rendered("Pick").size()));
  EXPECT_EQ(j["usage"]["completion_tokens"], completion_tokens);
  // Greedy choices are all the same.
  auto g = post("/v1/chat/completions", chat_body("Pick", {{"max_tokens", 12}, {"temperature", 0}, {"n", 3}}));
  ASSERT_TRUE(g);
  ASSERT_EQ(g->status, 200) << g->body;
  const json gj = json::parse(g->body);
  ASSERT_EQ(gj["choices"].size(), 3u);
  for (size_t i = 1; i < 3; ++i) EXPECT_EQ(gj["choices"][i]["message"], gj["choices"][0]["message"]);
}

TEST_F(ServeTest, ChatStreamWithNInterleaves) {
  // Both sequences decode in the same steps, so their chunks alternate
  // rather than one choice's all coming first. A stream lasts a few
  // milliseconds, and on a loaded machine (ctest -j2 beside a build) a
  // reader thread can start after it is over; so up to 20 streams are tried
  // (a few ms each), and one must interleave.
  bool interleaved = false;
  for (int seed = 31; seed < 51 && !interleaved; ++seed) {
    const json body = chat_body("Go", {{"max_tokens", 24}, {"temperature", 1.0}, {"seed", seed}, {"n", 2}});
    auto r = post("/v1/chat/completions", body);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const json j = json::parse(r->body);
    const ChatStreamed s = chat_stream(srv->port, body);
    ASSERT_EQ(s.content.size(), 2u);
    for (int64_t i = 0; i < 2; ++i) {
      EXPECT_EQ(s.content.at(i), j["choices"][size_t(i)]["message"]["content"].get<std::string>());
      EXPECT_EQ(s.finish_reason.at(i), j["choices"][size_t(i)]["finish_reason"]);
    }
    EXPECT_EQ(billed(s.usage), billed(j["usage"]));
    const auto first1 = std::find(s.order.begin(), s.order.end(), 1);
    const auto last0 = std::find(s.order.rbegin(), s.order.rend(), 0);
    ASSERT_NE(first1, s.order.end());
    ASSERT_NE(last0, s.order.rend());
    interleaved = first1 - s.order.begin() < s.order.rend() - last0 - 1;
  }
  EXPECT_TRUE(interleaved) << "in no stream did a chunk of choice 1 come before choice 0 ended";
}

// /v1/completions' reading of n and prompt lists, run as the server runs a
// request (serve::Generation on the server's scheduler).
TEST_F(ServeTest, CompletionPromptListTimesN) {
  const serve::ModelInfo info{"tiny", 256, kContext, 16};
  const json body = {{"prompt", {"ab", "xyz"}}, {"n", 2}, {"max_tokens", 10}, {"temperature", 1.0}, {"seed", 8}};
  const serve::Request req = serve::parse_completions(body.dump(), info, *srv->tok);
  ASSERT_EQ(req.choices.size(), 4u);
  EXPECT_EQ(req.prompt_tokens, 5);
  json whole;
  {
    serve::Generation g(*srv->scheduler, *srv->tok, req, "cmpl-t", 1, "tiny");
    whole = g.response();
  }
  ASSERT_EQ(whole.at("choices").size(), 4u);
  int64_t completion_tokens = 0;
  for (size_t k = 0; k < 4; ++k) {
    const json& c = whole["choices"][k];
    EXPECT_EQ(c.at("index"), int64_t(k));
    // index = prompt * n + i, sampled with seed + i.
    auto one = post("/v1/completions", {{"prompt", k < 2 ? "ab" : "xyz"},
                                        {"max_tokens", 10},
                                        {"temperature", 1.0},
                                        {"seed", 8 + int(k % 2)}});
    ASSERT_TRUE(one);
    ASSERT_EQ(one->status, 200) << one->body;
    const json oj = json::parse(one->body);
    EXPECT_EQ(c["text"], oj["choices"][0]["text"]) << "choice " << k;
    completion_tokens += oj["usage"]["completion_tokens"].get<int64_t>();
  }
  EXPECT_NE(whole["choices"][0]["text"], whole["choices"][1]["text"]);
  EXPECT_EQ(billed(whole["usage"]), json({{"prompt_tokens", 5},
                                          {"completion_tokens", completion_tokens},
                                          {"total_tokens", 5 + completion_tokens}}));
  // Streamed: the same texts by index, interleaved, then usage and [DONE].
  serve::Request sreq = req;
  sreq.stream = true;
  sreq.include_usage = true;
  std::vector<std::string> events;
  {
    serve::Generation g(*srv->scheduler, *srv->tok, sreq, "cmpl-s", 1, "tiny");
    while (!g.done())
      ASSERT_TRUE(g.pump([&](const std::string& d) {
        events.push_back(d);
        return true;
      }));
  }
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::map<int64_t, std::string> texts;
  for (size_t i = 0; i + 2 < events.size(); ++i) {
    const json ch = json::parse(events[i]);
    EXPECT_EQ(ch.at("object"), "text_completion");
    texts[ch["choices"][0]["index"].get<int64_t>()] += ch["choices"][0]["text"].get<std::string>();
  }
  ASSERT_EQ(texts.size(), 4u);
  for (size_t k = 0; k < 4; ++k) EXPECT_EQ(texts[int64_t(k)], whole["choices"][k]["text"]);
  EXPECT_EQ(json::parse(events[events.size() - 2]).at("usage"), whole["usage"]);
  // Lists of token-id lists are prompts too; more choices than the queue holds are refused.
  const serve::Request ids = serve::parse_completions(json{{"prompt", {{97, 98}, {120}}}}.dump(), info, *srv->tok);
  ASSERT_EQ(ids.choices.size(), 2u);
  EXPECT_EQ(ids.choices[1].prompt, std::vector<int32_t>{120});
  try {
    serve::parse_completions(json{{"prompt", {"a", "b"}}, {"n", 9}}.dump(), info, *srv->tok);
    ADD_FAILURE() << "18 choices accepted with room for 16";
  } catch (const serve::ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, "n");
  }
}

}  // namespace
}  // namespace brisk
