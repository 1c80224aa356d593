// The access log's note and line; see brisk/serve/access_log.h.
#include "brisk/serve/access_log.h"

#include <cstdio>
#include <ctime>

namespace brisk::serve {

void RequestNote::set_usage(const nlohmann::json& usage) {
  if (!usage.is_object()) return;
  prompt_tokens = usage.value("prompt_tokens", int64_t(-1));
  completion_tokens = usage.value("completion_tokens", int64_t(-1));
  const auto details = usage.find("prompt_tokens_details");
  if (details != usage.end() && details->is_object()) cached_tokens = details->value("cached_tokens", int64_t(-1));
}

RequestNote& request_note() {
  thread_local RequestNote note;
  return note;
}

namespace {

// A value with a space, quote or '=' (a path could hold one) is quoted, as
// logfmt wants; httplib has decoded the path, so it may hold anything.
std::string logfmt_value(const std::string& v) {
  bool plain = !v.empty();
  for (unsigned char c : v) plain = plain && c > ' ' && c != '"' && c != '=' && c < 0x7f;
  if (plain) return v;
  std::string out = "\"";
  for (unsigned char c : v) {
    if (c == '"' || c == '\\') out += '\\', out += char(c);
    else if (c < ' ' || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += char(c);
    }
  }
  return out + "\"";
}

}  // namespace

std::string access_log_line(std::chrono::system_clock::time_point now, const std::string& client,
                            const std::string& method, const std::string& path, int status, const RequestNote& note,
                            std::chrono::steady_clock::time_point end) {
  const auto ms_since_epoch = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count();
  const std::time_t secs = std::time_t(ms_since_epoch / 1000);
  std::tm utc{};
  gmtime_r(&secs, &utc);
  char when[64];
  std::snprintf(when, sizeof when, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", utc.tm_year + 1900, utc.tm_mon + 1,
                utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec, int(ms_since_epoch % 1000));
  std::string line = std::string("time=") + when + " client=" + logfmt_value(client) +
                     " method=" + logfmt_value(method) + " path=" + logfmt_value(path) +
                     " status=" + std::to_string(status);
  if (note.start != std::chrono::steady_clock::time_point{}) {
    char ms[32];
    std::snprintf(ms, sizeof ms, "%.1f", std::chrono::duration<double, std::milli>(end - note.start).count());
    line += std::string(" ms=") + ms;
  }
  if (note.stream >= 0) line += " stream=" + std::to_string(note.stream);
  if (note.prompt_tokens >= 0) line += " prompt_tokens=" + std::to_string(note.prompt_tokens);
  if (note.completion_tokens >= 0) line += " completion_tokens=" + std::to_string(note.completion_tokens);
  if (note.cached_tokens >= 0) line += " cached_tokens=" + std::to_string(note.cached_tokens);
  return line;
}

}  // namespace brisk::serve
