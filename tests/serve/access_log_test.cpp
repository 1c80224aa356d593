// The access log's line (src/serve/access_log.cpp): time in UTC with
// milliseconds, logfmt quoting of values that need it, and fields only
// where they are known.
#include <gtest/gtest.h>

#include "brisk/serve/access_log.h"

namespace brisk {
namespace {

using namespace std::chrono;

TEST(AccessLog, LineHoldsWhatIsKnownInLogfmt) {
  const system_clock::time_point when{milliseconds(1795833067412)};  // 2026-11-28T02:31:07.412Z
  const steady_clock::time_point t0 = steady_clock::now();
  serve::RequestNote note;
  note.start = t0;
  note.stream = 1;
  note.set_usage({{"prompt_tokens", 12}, {"completion_tokens", 8}, {"total_tokens", 20},
                  {"prompt_tokens_details", {{"cached_tokens", 4}}}});
  EXPECT_EQ(serve::access_log_line(when, "10.0.0.7:51234", "POST", "/v1/completions", 200, note,
                                   t0 + microseconds(152345)),
            "time=2026-11-28T02:31:07.412Z client=10.0.0.7:51234 method=POST path=/v1/completions status=200 "
            "ms=152.3 stream=1 prompt_tokens=12 completion_tokens=8 cached_tokens=4");
  serve::RequestNote none;
  none.set_usage(nullptr);  // no usage object: nothing known, nothing thrown
  EXPECT_EQ(none.prompt_tokens, -1);
  EXPECT_EQ(none.completion_tokens, -1);
  // A request that never reached routing has no start, so no duration; not a generation request: no tokens.
  EXPECT_EQ(serve::access_log_line(when, "[::1]:80", "POST", "/v1/completions", 413, serve::RequestNote{}, t0),
            "time=2026-11-28T02:31:07.412Z client=[::1]:80 method=POST path=/v1/completions status=413");
  // Values with spaces, quotes, '=', control bytes or nothing at all are quoted and escaped.
  const std::string line =
      serve::access_log_line(when, "1.2.3.4:5", "", "/a b=\"c\"\\\n", 404, serve::RequestNote{}, t0);
  EXPECT_EQ(line, "time=2026-11-28T02:31:07.412Z client=1.2.3.4:5 method=\"\" path=\"/a b=\\\"c\\\"\\\\\\x0a\" "
                  "status=404");
}

}  // namespace
}  // namespace brisk
