// The live progress line fitted to the terminal (src/train/run_log.cpp): a
// line wider than the terminal wraps, and a wrapped line is not redrawn in
// place, so an 80-column terminal filled with one line per step.
#include <gtest/gtest.h>

#include <string>

#include "../../src/train/run_log.h"

namespace brisk {
namespace {

train::StepRow row() {
  train::StepRow r{};
  r.step = 120;
  r.loss = 2.345678;
  r.lr = 3e-4;
  r.tokens_per_s = 50663;
  r.ms_per_step = 81;
  r.mfu = 0.123;
  r.rss_mib = 610;
  return r;
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(LiveLine, FitsTheTerminalDroppingTheLeastUsefulFieldsFirst) {
  const std::string whole = train::live_line(row(), 400, "1m05s", 0);  // width unknown: everything
  for (const char* part : {"[#######.....", "step 120/400", "loss 2.3457", "lr 3.00e-04", "50663 tok/s", "81 ms/step",
                           "MFU 12.3%", "RSS 610 MiB", "ETA 1m05s"})
    EXPECT_TRUE(has(whole, part)) << part << " missing from " << whole;
  EXPECT_EQ(train::live_line(row(), 400, "1m05s", int(whole.size()) + 1), whole);  // it fits as it is

  for (int columns : {200, 120, 100, 80, 60, 40, 20, 5}) {
    const std::string line = train::live_line(row(), 400, "1m05s", columns);
    EXPECT_LT(int(line.size()), columns) << line;
    if (columns >= 80) {  // lr and RSS go before the step, the loss, tok/s and the ETA
      for (const char* part : {"step 120/400", "loss 2.3457", "50663 tok/s", "ETA 1m05s"})
        EXPECT_TRUE(has(line, part)) << columns << ": " << part << " missing from " << line;
      EXPECT_EQ(has(line, "lr "), columns > int(whole.size())) << line;
    }
    if (columns == 40) {
      EXPECT_EQ(line, "step 120/400 | loss 2.3457 | ETA 1m05s");
    }
  }
}

}  // namespace
}  // namespace brisk
