// `brisk serve` as a child process: it prints its listening line, answers
// over HTTP, and stops cleanly (exit code 0) on SIGTERM and SIGINT, also
// with a streamed request in flight.
#include <gtest/gtest.h>
#include <httplib.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <thread>

#include "../common/tiny_gpt.h"
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
}

}  // namespace
}  // namespace brisk::itest
