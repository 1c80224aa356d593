// What `brisk bench serve` needs to talk to a server: `brisk serve` as a
// child process (its port, health, RSS and CPU time, a clean stop), and one
// streamed /v1/completions request timed from the client's side. The server
// library is not linked: the benchmark sees only what an HTTP client sees.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace httplib {
class Client;
}

namespace brisk::bench {

double steady_now();  // seconds on the monotonic clock

class ServerProcess {
 public:
  // Runs `exe serve <args>`, reads the start-up line for the port (the
  // server prints it once it listens) and waits for /health to answer 200.
  // Throws core::Error when it exits or does not come up within timeout_s.
  ServerProcess(const std::string& exe, const std::vector<std::string>& args, double timeout_s);
  ~ServerProcess();  // kills it if stop() was not called
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  const std::string& start_line() const { return start_line_; }
  double rss_mib() const;    // VmRSS from /proc/<pid>/status; -1 when unreadable
  double cpu_ticks() const;  // user + system time so far, clock ticks
  // SIGTERM, then waits up to timeout_s. Returns the exit code, or -1 when
  // it died of a signal or had to be killed; *how says which in words.
  int stop(double timeout_s, std::string* how);

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1;
  int port_ = 0;
  std::string start_line_;
};

// One streamed request as the client saw it. Times are from the moment the
// request is handed to the HTTP client.
struct StreamResult {
  std::string error;  // empty: 200, no error event, [DONE] and the expected token count
  double ttft_s = 0;  // to the first content chunk
  double e2e_s = 0;   // to [DONE]
  std::vector<double> gaps_s;  // between consecutive content chunks
  int64_t chunks = 0;          // content chunks (one per token unless text was held back)
  int64_t tokens = -1;         // usage.completion_tokens; -1 when no usage came
};

// A keep-alive connection to the server, for one client thread.
class StreamClient {
 public:
  explicit StreamClient(int port);
  ~StreamClient();
  // Greedy (temperature 0) or sampled without a seed, no stop strings,
  // usage requested; an answer with other than `max_tokens` tokens counts
  // as an error (the server stops early only at a stop string or token).
  StreamResult complete(const std::vector<int32_t>& prompt, int64_t max_tokens, double temperature = 0);

 private:
  std::unique_ptr<httplib::Client> http_;
};

double own_cpu_ticks();  // this process's user + system time, clock ticks

}  // namespace brisk::bench
