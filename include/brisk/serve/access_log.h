// The access log of `brisk serve --log-requests`: one logfmt line per
// answered request (the format Loki, Vector and `grep key=value` read):
//
//   time=2026-11-28T02:31:07.412Z client=127.0.0.1:51234 method=POST path=/v1/completions status=200
//   ms=152.3 stream=0 prompt_tokens=12 completion_tokens=8 cached_tokens=0
//
// The token fields appear on generation routes once their answer is known
// (not for a stream that broke off); prompt_tokens on the encoder routes. httplib answers a request on one thread,
// from its pre-routing handler through the handler to its logger, so what the
// handler learns travels to the line in a per-thread note.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace brisk::serve {

struct RequestNote {
  std::chrono::steady_clock::time_point start{};  // unset: the request never reached routing
  int stream = -1;                                 // -1: not a generation request
  int64_t prompt_tokens = -1, completion_tokens = -1, cached_tokens = -1;
  // Takes the counts of an OpenAI `usage` object.
  void set_usage(const nlohmann::json& usage);
};

// This thread's note: reset when a request arrives, read by the logger.
RequestNote& request_note();

// The line for one request (no newline). `client` is "addr:port".
std::string access_log_line(std::chrono::system_clock::time_point now, const std::string& client,
                            const std::string& method, const std::string& path, int status, const RequestNote& note,
                            std::chrono::steady_clock::time_point end);

}  // namespace brisk::serve
