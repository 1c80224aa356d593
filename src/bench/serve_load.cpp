// The server child process and the timed streaming client (serve_load.h).
#include "serve_load.h"

#include <httplib.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "brisk/core/error.h"

extern char** environ;

namespace brisk::bench {

using nlohmann::json;

double steady_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

namespace {

// utime + stime of a process, from /proc/<pid>/stat (fields 14 and 15; the
// command name before them may hold spaces, so counting starts after ')').
double ticks_of(const std::string& stat_path) {
  std::ifstream f(stat_path);
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t close = s.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream in(s.substr(close + 1));
  std::string field;
  double utime = 0, stime = 0;
  for (int i = 3; i <= 15 && in >> field; ++i) {
    if (i == 14) utime = std::atof(field.c_str());
    if (i == 15) stime = std::atof(field.c_str());
  }
  return utime + stime;
}

}  // namespace

double own_cpu_ticks() { return ticks_of("/proc/self/stat"); }

ServerProcess::ServerProcess(const std::string& exe, const std::vector<std::string>& args, double timeout_s) {
  int fds[2];
  if (::pipe(fds) != 0) throw core::Error(std::string("pipe: ") + std::strerror(errno));
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  posix_spawn_file_actions_addclose(&fa, fds[1]);
  std::vector<std::string> argv = {exe, "serve"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  const int rc = posix_spawn(&pid_, exe.c_str(), &fa, nullptr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    pid_ = -1;
    throw core::Error("cannot start " + exe + " serve: " + std::strerror(rc));
  }
  out_fd_ = fds[0];
  // The start-up line comes once the model is loaded and the socket bound.
  const double deadline = steady_now() + timeout_s;
  std::string out;
  while (out.find('\n') == std::string::npos && steady_now() < deadline) {
    pollfd p{out_fd_, POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) continue;
    char buf[512];
    const ssize_t k = ::read(out_fd_, buf, sizeof buf);
    if (k <= 0) break;  // it exited (its stderr, passed through, says why)
    out.append(buf, size_t(k));
  }
  start_line_ = out.substr(0, out.find('\n'));
  const size_t at = start_line_.find("http://");
  const size_t colon = at == std::string::npos ? at : start_line_.find(':', at + 7);
  if (colon != std::string::npos) port_ = std::atoi(start_line_.c_str() + colon + 1);
  if (port_ <= 0) throw core::Error("brisk serve did not report a port; its output: '" + out + "'");
  httplib::Client c("127.0.0.1", port_);
  c.set_connection_timeout(1);
  while (steady_now() < deadline) {
    if (auto r = c.Get("/health"); r && r->status == 200) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  throw core::Error("brisk serve on port " + std::to_string(port_) + ": /health did not answer 200 in time");
}

ServerProcess::~ServerProcess() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  if (out_fd_ >= 0) ::close(out_fd_);
}

double ServerProcess::rss_mib() const {
  std::ifstream f("/proc/" + std::to_string(pid_) + "/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::atof(line.c_str() + 6) / 1024.0;  // kB
  return -1;
}

double ServerProcess::cpu_ticks() const { return ticks_of("/proc/" + std::to_string(pid_) + "/stat"); }

int ServerProcess::stop(double timeout_s, std::string* how) {
  if (pid_ <= 0) return -1;
  ::kill(pid_, SIGTERM);
  const double deadline = steady_now() + timeout_s;
  int status = 0;
  pid_t done = 0;
  while ((done = ::waitpid(pid_, &status, WNOHANG)) == 0 && steady_now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  int code = -1;
  if (done == pid_ && WIFEXITED(status)) {
    code = WEXITSTATUS(status);
    *how = "exit " + std::to_string(code);
  } else if (done == pid_ && WIFSIGNALED(status)) {
    *how = std::string("killed by ") + strsignal(WTERMSIG(status));
  } else {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    *how = "still running " + std::to_string(int(timeout_s)) + " s after SIGTERM (killed)";
  }
  pid_ = -1;
  return code;
}

StreamClient::StreamClient(int port) : http_(std::make_unique<httplib::Client>("127.0.0.1", port)) {
  http_->set_keep_alive(true);
  // The request goes out as two writes (headers, body); with Nagle's
  // algorithm the body could wait for the server's delayed ACK, a client
  // artefact that would land in TTFT.
  http_->set_tcp_nodelay(true);
  // A request may wait for a slot behind others; only a stuck server is an error.
  http_->set_read_timeout(300, 0);
}

StreamClient::~StreamClient() = default;

StreamResult StreamClient::complete(const std::vector<int32_t>& prompt, int64_t max_tokens, double temperature) {
  const json body = {{"prompt", prompt},          {"max_tokens", max_tokens},
                     {"temperature", temperature}, {"stream", true},
                     {"stream_options", {{"include_usage", true}}}};
  StreamResult r;
  std::string pending, error_event;
  bool done = false;
  double last = 0;
  double t0 = 0;
  // Server-Sent Events: "data: <payload>\n\n". A content chunk has a
  // non-empty `choices`; the usage chunk has an empty one.
  auto on_event = [&](const std::string& ev, double t) {
    if (ev.rfind("data: ", 0) != 0) return;
    const std::string payload = ev.substr(6);
    if (payload == "[DONE]") {
      done = true;
      r.e2e_s = t - t0;
      return;
    }
    const json j = json::parse(payload, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      error_event = "unparsable event: " + payload.substr(0, 200);
    } else if (j.contains("error")) {
      error_event = "error event: " + j["error"].value("message", std::string("?"));
    } else if (j.contains("choices") && j["choices"].is_array() && !j["choices"].empty()) {
      if (r.chunks == 0) r.ttft_s = t - t0;
      else r.gaps_s.push_back(t - last);
      last = t;
      ++r.chunks;
    }
    if (j.is_object() && j.contains("usage") && j["usage"].is_object())
      r.tokens = j["usage"].value("completion_tokens", int64_t(-1));
  };
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    const double t = steady_now();
    pending.append(data, n);
    for (size_t end; (end = pending.find("\n\n")) != std::string::npos;) {
      on_event(pending.substr(0, end), t);
      pending.erase(0, end + 2);
    }
    return true;
  };
  t0 = steady_now();
  const httplib::Result res = http_->send(req);
  if (!done) r.e2e_s = steady_now() - t0;
  if (!res) r.error = "HTTP client: " + httplib::to_string(res.error());
  else if (res->status != 200) r.error = "HTTP " + std::to_string(res->status) + ": " + pending.substr(0, 200);
  else if (!error_event.empty()) r.error = error_event;
  else if (!done) r.error = "no [DONE]";
  else if (r.chunks == 0) r.error = "no content chunk";
  else if (r.tokens != max_tokens)
    r.error = "completion_tokens " + std::to_string(r.tokens) + ", expected " + std::to_string(max_tokens);
  return r;
}

}  // namespace brisk::bench
