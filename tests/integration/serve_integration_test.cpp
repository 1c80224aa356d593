// `brisk serve` as a child process: it prints its listening line, answers
// over HTTP, and stops cleanly (exit code 0) on SIGTERM and SIGINT, also
// with a streamed request in flight. Encoder checkpoints too: a classifier
// answers /classify as `brisk classify` labels files, a sequence
// autoencoder /v1/embeddings (through the official OpenAI client as well).
#include <gtest/gtest.h>
#include <httplib.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cmath>
#include <set>
#include <sstream>
#include <thread>

#include "../common/tiny_gpt.h"
#include "../common/random_params.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/cpu/cpu_features.h"
#include "brisk/data/converters.h"
#include "brisk/models/encoder.h"
#include "brisk/models/seq_autoencoder.h"
#include "brisk/train/checkpoint.h"
#include "integration_util.h"

namespace brisk::itest {
namespace {

using nlohmann::json;

std::string tiny_checkpoint(const TempDir& dir) { return testing::save_tiny_gpt(dir.file("run")); }

// A running `brisk serve --port 0`: its pid and the port from its first line.
struct ServeChild {
  pid_t pid = -1;
  int port = 0;
  std::string first_line;
  int out_fd = -1;

  // `load_delay_ms` > 0: the child sleeps that long before loading its model
  // (BRISK_SERVE_LOAD_DELAY_MS), and this returns without waiting for the
  // listening line (read it with wait_ready()).
  explicit ServeChild(const std::vector<std::string>& args, int load_delay_ms = 0) {
    int out_pipe[2];
    if (::pipe(out_pipe) != 0) return;
    pid = ::fork();
    if (pid == 0) {
      if (load_delay_ms > 0) ::setenv("BRISK_SERVE_LOAD_DELAY_MS", std::to_string(load_delay_ms).c_str(), 1);
      ::dup2(out_pipe[1], STDOUT_FILENO);
      ::close(out_pipe[0]);
      ::close(out_pipe[1]);
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      std::vector<char*> argv{const_cast<char*>(cli_path()), const_cast<char*>("serve")};
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(cli_path(), argv.data());
      ::_exit(127);
    }
    ::close(out_pipe[1]);
    out_fd = out_pipe[0];
    if (load_delay_ms == 0) wait_ready();
  }
  // Reads the listening line, printed once the model is loaded (within 60 s).
  void wait_ready() {
    read_until(out_fd, "\n", first_line);
    const size_t at = first_line.find("http://127.0.0.1:");
    if (at != std::string::npos) port = std::atoi(first_line.c_str() + at + 17);
  }
  // Sends `sig` and waits (at most 30 s) for the exit code; -1 if it did not exit.
  int stop(int sig) {
    ::kill(pid, sig);
    for (int i = 0; i < 300; ++i) {
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        pid = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return -1;
  }
  ~ServeChild() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    if (out_fd >= 0) ::close(out_fd);
  }
};

TEST(ServeCli, ListensAnswersAndStopsOnSignals) {
  TempDir dir;
  const std::string ckpt = tiny_checkpoint(dir);
  for (int sig : {SIGTERM, SIGINT}) {
    ServeChild s({"--model", ckpt, "--model-name", "tiny", "--port", "0", "--threads", "1", "--slots", "2"});
    ASSERT_GT(s.port, 0) << "no listening line: " << s.first_line;
    EXPECT_NE(s.first_line.find("tiny"), std::string::npos) << s.first_line;
    httplib::Client c("127.0.0.1", s.port);
    auto h = c.Get("/health");
    ASSERT_TRUE(h);
    EXPECT_EQ(h->status, 200);
    auto r = c.Post("/v1/completions", json{{"model", "tiny"}, {"prompt", "Hi"}, {"max_tokens", 4}}.dump(),
                    "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(json::parse(r->body)["usage"]["completion_tokens"], 4);
    // A stream still open when the signal comes must not keep the server up.
    std::thread client([port = s.port] {
      httplib::Client sc("127.0.0.1", port);
      sc.Post("/v1/completions", json{{"prompt", "Hi"}, {"max_tokens", 60}, {"stream", true}}.dump(),
              "application/json");
    });
    EXPECT_EQ(s.stop(sig), 0) << "signal " << sig;
    client.join();
  }
}

// The official OpenAI client for Node.js (npm `openai`) against the real
// server: listing models, completions with logprobs, streams with a usage
// chunk, chat, n with a seed, stop strings, and its error classes for a
// request beyond the context and a wrong key (openai_client.js). A missing
// node or package fails the test with what to install; it never skips.
TEST(ServeCli, TheOfficialOpenAiClientWorksAgainstIt) {
  const char* env = std::getenv("BRISK_NPM_MODULES");
  const std::string modules = env && *env ? env : BRISK_NPM_MODULES;
  ASSERT_TRUE(fs::exists(fs::path(modules) / "openai" / "package.json"))
      << "the npm package openai is not installed under " << modules
      << ": run `bash scripts/fetch_data.sh` (`make test` does it), or point BRISK_NPM_MODULES at a "
         "node_modules that has it";
  TempDir dir;
  testing::TinyGpt t;
  t.scale = 4.f;  // greedy choices well separated: the streamed and whole texts agree
  const std::string ckpt = testing::save_tiny_gpt(dir.file("run"), t);
  ServeChild s({"--model", ckpt, "--model-name", "tiny", "--port", "0", "--threads", "1", "--slots", "4",
                "--api-key", "sk-test"});
  ASSERT_GT(s.port, 0) << "no listening line: " << s.first_line;
  CliHooks hooks;
  hooks.timeout_s = 120;
  const CliResult r = run_program("/usr/bin/env",  // finds node on PATH; 127 when there is none
                                  {"node", std::string(BRISK_INTEGRATION_TEST_DIR) + "/openai_client.js", modules,
                                   "http://127.0.0.1:" + std::to_string(s.port) + "/v1", "sk-test", "tiny",
                                   std::to_string(t.context)},
                                  hooks);
  ASSERT_NE(r.exit_code, 127) << "could not start node: install Node.js and npm (Debian: apt-get install nodejs "
                                 "npm), then run scripts/fetch_data.sh";
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  std::printf("%s", r.out.c_str());
  EXPECT_EQ(s.stop(SIGTERM), 0);
}

// The server listens while its model loads: /health and the API say 503
// (so a load balancer keeps it out of rotation), then 200 once it is ready.
// A stop signal while loading ends the process at once, exit code 0.
TEST(ServeCli, HealthSays503WhileTheModelLoads) {
  TempDir dir;
  const std::string ckpt = tiny_checkpoint(dir);
  const int port = free_port();
  ASSERT_GT(port, 0);
  const std::vector<std::string> args = {"--model", ckpt, "--port", std::to_string(port), "--threads", "1"};
  {
    ServeChild s(args, /*load_delay_ms=*/3000);
    httplib::Client c("127.0.0.1", port);
    auto h = c.Get("/health");
    for (int i = 0; i < 200 && !h; ++i) {  // until it listens (well before the 3 s delay ends)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      h = c.Get("/health");
    }
    ASSERT_TRUE(h) << "not listening during the load";
    EXPECT_EQ(h->status, 503);
    EXPECT_EQ(json::parse(h->body)["status"], "loading");
    auto r = c.Post("/v1/completions", json{{"prompt", "Hi"}, {"max_tokens", 2}}.dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 503);
    EXPECT_NE(json::parse(r->body)["error"]["message"].get<std::string>().find("loading"), std::string::npos) << r->body;
    s.wait_ready();
    ASSERT_EQ(s.port, port) << s.first_line;
    h = c.Get("/health");
    ASSERT_TRUE(h);
    EXPECT_EQ(h->status, 200);
    r = c.Post("/v1/completions", json{{"prompt", "Hi"}, {"max_tokens", 2}}.dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(s.stop(SIGTERM), 0);
  }
  ServeChild loading(args, /*load_delay_ms=*/20000);
  httplib::Client c("127.0.0.1", port);
  for (int i = 0; i < 200 && !c.Get("/health"); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(loading.stop(SIGTERM), 0);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0)
      << "a stop signal while loading waited for the load";
}

TEST(ServeCli, BadFlagsAndModelsAreClearErrors) {
  TempDir dir;
  const CliResult missing = run_cli({"serve", "--model", dir.file("nowhere")});
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.err.find("nowhere"), std::string::npos) << missing.err;
  const CliResult slots = run_cli({"serve", "--model", tiny_checkpoint(dir), "--slots", "0"});
  EXPECT_EQ(slots.exit_code, 2);
  EXPECT_NE(slots.err.find("--slots"), std::string::npos) << slots.err;
  const CliResult precision = run_cli({"serve", "--model", tiny_checkpoint(dir), "--precision", "bf16", "--port", "0"});
  EXPECT_EQ(precision.exit_code, 2);
  EXPECT_NE(precision.err.find("--precision bf16 is for encoder classifiers"), std::string::npos) << precision.err;
}


// ---- encoder checkpoints ------------------------------------------------------------------

// A random classifier of message bodies (bytes), 2 classes, max_len 48, as
// training saves one.
std::string classifier_checkpoint(const TempDir& dir) {
  models::EncoderConfig c;
  c.vocab_size = 256, c.n_layer = 2, c.n_embd = 32, c.n_head = 2, c.max_len = 48, c.n_classes = 2;
  cpu::CpuBackend backend(1);
  models::Encoder enc(c, backend);
  testing::randomize(enc, 34);  // a seed whose model labels these messages both ways
  return train::save_encoder_checkpoint(dir.file("clf"), enc, nullptr, {c, {"ham", "spam"}, "bytes", true, 5, 1, {}}, 1);
}

// POST /classify with the texts of message files, against `brisk classify`
// on the files: the same labels, the probabilities to the 4 decimals
// classify prints; a text with no body is a 400 naming it; SIGTERM stops it.
TEST(ServeCli, AnEncoderClassifierAnswersClassifyAsBriskClassify) {
  TempDir dir;
  const std::string ckpt = classifier_checkpoint(dir);
  std::vector<std::string> texts{"Subject: a\n\nWin money now, click!", "From: x\r\n\r\nMeeting at 3pm, Bob",
                                 "\nA body alone, after an empty line", "Subject: b\n\n" + std::string(80, 'z')};
  std::vector<std::string> files;
  for (size_t i = 0; i < texts.size(); ++i) {
    files.push_back(dir.file("m" + std::to_string(i) + ".eml"));
    write_text(files.back(), texts[i]);
  }
  std::vector<std::string> classify{"classify", "--checkpoint", dir.file("clf"), "--threads", "1"};
  classify.insert(classify.end(), files.begin(), files.end());
  const CliResult want = run_cli(classify);
  ASSERT_EQ(want.exit_code, 0) << want.err;

  ServeChild s({"--model", dir.file("clf"), "--model-name", "clf", "--port", "0", "--threads", "1"});
  ASSERT_GT(s.port, 0) << "no listening line: " << s.first_line;
  EXPECT_NE(s.first_line.find("encoder classifier, 2 classes [\"ham\",\"spam\"]"), std::string::npos) << s.first_line;
  EXPECT_NE(s.first_line.find("POST /classify"), std::string::npos) << s.first_line;
  httplib::Client c("127.0.0.1", s.port);
  auto r = c.Post("/classify", json{{"model", "clf"}, {"input", texts}}.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json got = json::parse(r->body);
  std::istringstream lines(want.out);
  std::string line;
  std::set<std::string> labels;
  for (size_t i = 0; i < texts.size(); ++i) {
    ASSERT_TRUE(std::getline(lines, line)) << want.out;
    const std::string label = line.substr(0, line.find('\t'));
    const double prob = std::stod(line.substr(line.find('\t') + 1));
    const json& d = got["data"][i];
    EXPECT_EQ(d["label"], label) << line;
    labels.insert(label);
    const int k = label == "ham" ? 0 : 1;
    EXPECT_NEAR(d["probs"][k].get<double>(), prob, 5.01e-5) << line;
    std::printf("%s | served: %s %.6f\n", line.c_str(), d["label"].get<std::string>().c_str(),
                d["probs"][k].get<double>());
  }
  EXPECT_EQ(labels.size(), 2u) << "both labels, or a wrong label could pass unseen";
  EXPECT_EQ(got["usage"]["prompt_tokens"], 21 + 19 + 33 + 48) << "bodies only, the long one cut to max_len 48";
  r = c.Post("/classify", json{{"input", {"Subject: only headers"}}}.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(json::parse(r->body)["error"]["param"], "input[0]");
  EXPECT_NE(r->body.find("has no body"), std::string::npos) << r->body;
  EXPECT_EQ(s.stop(SIGTERM), 0);
}

// --precision bf16: the listening line says so, and the answers are
// `brisk classify --precision bf16`'s (its batches have other shapes, so
// within 1e-3 rather than to the digit).
TEST(ServeCli, ABf16ClassifierAnswersAsClassifyInBf16) {
  if (cpu::cpu_features().bf16 != cpu::Bf16Path::native)
    GTEST_SKIP() << "this CPU has no bf16 dot products: bf16 serving is not checked here";
  TempDir dir;
  classifier_checkpoint(dir);
  const std::vector<std::string> texts{"Subject: a\n\nWin money now, click!", "From: x\r\n\r\nMeeting at 3pm, Bob"};
  std::vector<std::string> classify{"classify", "--checkpoint", dir.file("clf"), "--threads", "1", "--precision", "bf16"};
  for (size_t i = 0; i < texts.size(); ++i) {
    classify.push_back(dir.file("m" + std::to_string(i) + ".eml"));
    write_text(classify.back(), texts[i]);
  }
  const CliResult want = run_cli(classify);
  ASSERT_EQ(want.exit_code, 0) << want.err;
  ServeChild s({"--model", dir.file("clf"), "--port", "0", "--threads", "1", "--precision", "bf16"});
  ASSERT_GT(s.port, 0) << "no listening line: " << s.first_line;
  EXPECT_NE(s.first_line.find("of message bodies, bf16"), std::string::npos) << s.first_line;
  httplib::Client c("127.0.0.1", s.port);
  auto r = c.Post("/classify", json{{"input", texts}}.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json got = json::parse(r->body);
  std::istringstream lines(want.out);
  std::string line;
  for (size_t i = 0; i < texts.size() && std::getline(lines, line); ++i) {
    const std::string label = line.substr(0, line.find('\t'));
    const double prob = std::stod(line.substr(line.find('\t') + 1));
    EXPECT_EQ(got["data"][i]["label"], label) << line;
    EXPECT_NEAR(got["data"][i]["probs"][label == "ham" ? 0 : 1].get<double>(), prob, 1e-3) << line;
  }
  EXPECT_EQ(s.stop(SIGTERM), 0);
}

// Residue strings (either case, line breaks between them ignored) to
// latents, against models::SeqAutoencoder::encode() of the same checkpoint
// on the FASTA tokens; through httplib and through the official OpenAI
// client (whose default asks for base64 and decodes it).
TEST(ServeCli, ASequenceAutoencoderAnswersEmbeddings) {
  const char* env = std::getenv("BRISK_NPM_MODULES");
  const std::string modules = env && *env ? env : BRISK_NPM_MODULES;
  TempDir dir;
  models::SeqAutoencoderConfig cfg;
  cfg.n_layer = 2, cfg.n_embd = 32, cfg.n_head = 2, cfg.max_len = 64, cfg.latent = 8;
  cpu::CpuBackend backend(1);
  models::SeqAutoencoder ae(cfg, backend);
  testing::randomize(ae, 77);
  train::save_autoencoder_checkpoint(dir.file("ae"), ae, nullptr, {cfg, "fasta", 9, 1, {}}, 1);
  const CliResult bf16 = run_cli({"serve", "--model", dir.file("ae"), "--precision", "bf16", "--port", "0"});
  EXPECT_EQ(bf16.exit_code, 2);
  EXPECT_NE(bf16.err.find("serves in fp32 only"), std::string::npos) << bf16.err;

  ServeChild s({"--model", dir.file("ae"), "--port", "0", "--threads", "1"});
  ASSERT_GT(s.port, 0) << "no listening line: " << s.first_line;
  EXPECT_NE(s.first_line.find("POST /v1/embeddings"), std::string::npos) << s.first_line;
  const std::vector<std::string> seqs{"MKTAYIAKQRQISFVKSHFSRQ", "mkta\nyiak", "ACDEFGHIKLMNPQRSTVWYBZXUO*-"};
  auto reference = [&](const std::string& text) {
    std::vector<int32_t> ids;
    for (unsigned char ch : text)
      if (ch != '\n') ids.push_back(data::fasta_token(ch));
    const int32_t n = int32_t(ids.size());
    const float* z = ae.encode(ids.data(), &n, 1, n);
    return std::vector<float>(z, z + cfg.latent);
  };
  httplib::Client c("127.0.0.1", s.port);
  auto r = c.Post("/v1/embeddings", json{{"input", seqs}}.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json got = json::parse(r->body);
  double worst = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const std::vector<float> want = reference(seqs[i]);
    for (int64_t k = 0; k < cfg.latent; ++k)
      worst = std::max(worst, std::fabs(got["data"][i]["embedding"][size_t(k)].get<double>() - want[size_t(k)]));
  }
  std::printf("max |served - SeqAutoencoder::encode| = %.3g\n", worst);
  EXPECT_LE(worst, 1e-5);
  r = c.Post("/v1/embeddings", json{{"input", "MKTJ"}}.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(r->body.find("invalid residue 'J' (0x4A) at byte 3"), std::string::npos) << r->body;

  ASSERT_TRUE(fs::exists(fs::path(modules) / "openai" / "package.json"))
      << "the npm package openai is not installed under " << modules << ": run `bash scripts/fetch_data.sh`";
  const std::string out = dir.file("client.json");
  CliHooks hooks;
  hooks.timeout_s = 120;
  const CliResult client = run_program(
      "/usr/bin/env",
      {"node", std::string(BRISK_INTEGRATION_TEST_DIR) + "/openai_embeddings.js", modules,
       "http://127.0.0.1:" + std::to_string(s.port) + "/v1", "ae", json(seqs).dump(), out},
      hooks);
  ASSERT_NE(client.exit_code, 127) << "could not start node: install Node.js and npm, then run scripts/fetch_data.sh";
  ASSERT_EQ(client.exit_code, 0) << client.out << client.err;
  const json via_client = json::parse(read_text(out));
  for (size_t i = 0; i < seqs.size(); ++i) {
    EXPECT_EQ(via_client["float"][i], got["data"][i]["embedding"]) << seqs[i];
    // base64 carries the float32 bits exactly; JSON numbers print them as doubles.
    for (int64_t k = 0; k < cfg.latent; ++k)
      EXPECT_EQ(float(via_client["base64"][i][size_t(k)].get<double>()),
                float(got["data"][i]["embedding"][size_t(k)].get<double>()));
  }
  EXPECT_EQ(via_client["usage"]["prompt_tokens"], 22 + 8 + 27);
  EXPECT_EQ(s.stop(SIGTERM), 0);
}

}  // namespace
}  // namespace brisk::itest
