// monitor::EventWriter at the byte level: CRC-32C against the published
// check values, the TFRecord framing of every record (length, masked CRC of
// the length, data, masked CRC of the data), one new file per writer, and
// what a step holds. Decoding the messages with TensorBoard's definitions is
// the job of the independent reader, tests/monitor/read_tfevents.py (ctest
// tfevents_check).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "brisk/core/error.h"
#include "brisk/monitor/event_writer.h"

using namespace brisk;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path = fs::temp_directory_path() / ("brisk_events_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

uint32_t u32(const std::string& s, size_t at) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | uint8_t(s[at + size_t(i)]);
  return v;
}

// The data of every record, with both CRCs checked.
std::vector<std::string> records(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string s{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < s.size()) {
    EXPECT_GE(s.size() - pos, 16u) << "truncated record at " << pos;
    if (s.size() - pos < 16) break;
    uint64_t len = 0;
    for (int i = 7; i >= 0; --i) len = (len << 8) | uint8_t(s[pos + size_t(i)]);
    EXPECT_EQ(u32(s, pos + 8), monitor::mask_crc32c(monitor::crc32c(s.data() + pos, 8))) << "length CRC at " << pos;
    EXPECT_LE(pos + 16 + len, s.size());
    if (pos + 16 + len > s.size()) break;
    out.push_back(s.substr(pos + 12, size_t(len)));
    EXPECT_EQ(u32(s, pos + 12 + size_t(len)), monitor::mask_crc32c(monitor::crc32c(out.back().data(), len)))
        << "data CRC at " << pos;
    pos += 16 + size_t(len);
  }
  return out;
}

bool contains(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

}  // namespace

TEST(Crc32c, PublishedCheckValues) {
  const char* digits = "123456789";
  EXPECT_EQ(monitor::crc32c(digits, 9), 0xE3069283u);  // the CRC catalogue's check value
  const std::vector<uint8_t> zeros(32, 0), ones(32, 0xFF);
  EXPECT_EQ(monitor::crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);  // RFC 3720 B.4
  EXPECT_EQ(monitor::crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  EXPECT_EQ(monitor::crc32c(nullptr, 0), 0u);
}

TEST(Crc32c, MaskIsTfRecords) {
  EXPECT_EQ(monitor::mask_crc32c(0), 0xA282EAD8u);
  const uint32_t c = 0xE3069283u;
  EXPECT_EQ(monitor::mask_crc32c(c), uint32_t(((c >> 15) | (c << 17)) + 0xA282EAD8u));
}

TEST(EventWriter, FramesEveryRecordAndFlushesEachStep) {
  TempDir dir;
  monitor::EventWriter w(dir.path.string());
  const std::string name = fs::path(w.path()).filename().string();
  EXPECT_EQ(name.rfind("events.out.tfevents.", 0), 0u) << name;
  EXPECT_EQ(fs::path(w.path()).parent_path(), dir.path);

  std::vector<std::string> r = records(w.path());  // the file version is on disk already
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(contains(r[0], "brain.Event:2"));

  w.write(1);  // nothing pending: nothing written
  EXPECT_EQ(records(w.path()).size(), 1u);

  w.scalar("loss", 2.5);
  w.scalar("comm_exposed_ms", 0.0);  // a 0 is still written (a oneof in the message)
  w.write(7);
  w.session_start(8);
  w.scalar("loss", 2.25);
  w.write(8);
  r = records(w.path());  // flushed: readable without closing the writer
  ASSERT_EQ(r.size(), 4u);
  EXPECT_TRUE(contains(r[1], "loss"));
  EXPECT_TRUE(contains(r[1], "comm_exposed_ms"));
  float v = 2.5f;
  EXPECT_TRUE(contains(r[1], std::string("\x15", 1) + std::string(reinterpret_cast<const char*>(&v), 4)))
      << "simple_value (field 2, fixed32) = 2.5";
  EXPECT_FALSE(contains(r[3], "comm_exposed_ms")) << "the step's values were not cleared";
  // TensorFlow's Event: session_log is field 7 (tag 0x3a); 6 (0x32) is the
  // deprecated log_message, on which TensorBoard never purges.
  EXPECT_TRUE(contains(r[2], std::string("\x3a\x02\x08\x01", 4))) << "session_log (field 7) { status: START }";
  EXPECT_FALSE(contains(r[2], std::string("\x32\x02\x08\x01", 4))) << "a log_message (field 6)";
}

TEST(EventWriter, EveryWriterMakesANewFile) {
  TempDir dir;
  monitor::EventWriter a(dir.path.string()), b(dir.path.string()), c(dir.path.string());
  EXPECT_NE(a.path(), b.path());
  EXPECT_NE(b.path(), c.path());
  EXPECT_NE(a.path(), c.path());
  EXPECT_EQ(records(b.path()).size(), 1u);
}

TEST(EventWriter, UnwritableDirectoryIsAnIoErrorNamingTheFile) {
  TempDir dir;
  try {
    monitor::EventWriter w((dir.path / "missing" / "deeper").string());
    FAIL() << "expected IoError";
  } catch (const core::IoError& e) {
    EXPECT_TRUE(contains(e.what(), "events.out.tfevents.")) << e.what();
    EXPECT_TRUE(contains(e.what(), "missing")) << e.what();
  }
}
