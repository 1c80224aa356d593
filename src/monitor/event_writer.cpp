// TensorBoard event files (event_writer.h): TFRecord framing around Event
// messages from tfevent.proto, filled through the protobuf library.
//
// The trainer calls write() once per step, and a step in the steady state
// must not allocate (tests/unit/no_alloc_test.cpp). So one Event message is
// kept and reused: clearing a repeated field keeps its Value objects, and
// clearing a Value keeps its tag string's buffer, so the same tags next step
// are filled in place; the record buffer only grows.
#include "brisk/monitor/event_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "brisk/core/error.h"
#include "tfevent.pb.h"

namespace brisk::monitor {

namespace {

constexpr std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kCrc32cTable = make_crc32c_table();

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "localhost";
  // A file name component: no path separators.
  for (char* p = buf; *p; ++p)
    if (*p == '/') *p = '_';
  return buf;
}

// Opens a new file, never an existing one (O_EXCL): two runs in the same
// second, or a resume right after a stop, each get a file of their own.
std::FILE* create_events_file(const std::string& dir, std::string* path) {
  char stamp[32];
  std::snprintf(stamp, sizeof stamp, "%010lld", (long long)unix_seconds());
  const std::string base = (std::filesystem::path(dir) / ("events.out.tfevents." + std::string(stamp) + "." + host_name())).string();
  for (int n = 0; n < 1000; ++n) {
    *path = n == 0 ? base : base + "." + std::to_string(n);
    const int fd = ::open(path->c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) {
      if (std::FILE* f = ::fdopen(fd, "wb")) return f;
      ::close(fd);
      break;
    }
    if (errno != EEXIST) break;
  }
  throw core::IoError("cannot create TensorBoard event file " + *path + ": " + std::strerror(errno));
}

void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = uint8_t(v >> (8 * i));
}

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) c = kCrc32cTable[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return ~c;
}

uint32_t mask_crc32c(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

struct EventWriter::Impl {
  std::string path;
  std::FILE* file = nullptr;
  tb::Event step_event;           // reused for every step's scalars
  tb::Summary* summary = nullptr;  // step_event's
  std::vector<uint8_t> record;    // framing + serialized event; grows, never shrinks

  ~Impl() {
    if (file) std::fclose(file);
  }

  // One TFRecord holding `event`, written and flushed.
  void write_record(const tb::Event& event) {
    const size_t n = event.ByteSizeLong();
    if (record.size() < n + 16) record.resize(n + 16);
    uint8_t* p = record.data();
    const uint64_t len = n;
    for (int i = 0; i < 8; ++i) p[i] = uint8_t(len >> (8 * i));
    put_u32(p + 8, mask_crc32c(crc32c(p, 8)));
    event.SerializeWithCachedSizesToArray(p + 12);
    put_u32(p + 12 + n, mask_crc32c(crc32c(p + 12, n)));
    if (std::fwrite(p, 1, n + 16, file) != n + 16 || std::fflush(file) != 0)
      throw core::IoError("cannot write " + path + ": " + std::strerror(errno));
  }
};

EventWriter::EventWriter(const std::string& dir) : impl_(std::make_unique<Impl>()) {
  impl_->file = create_events_file(dir, &impl_->path);
  impl_->summary = impl_->step_event.mutable_summary();
  tb::Event version;
  version.set_wall_time(unix_seconds());
  version.set_file_version("brain.Event:2");  // the format TensorBoard's reader expects
  impl_->write_record(version);
}

EventWriter::~EventWriter() = default;

void EventWriter::scalar(std::string_view tag, double value) {
  tb::Summary::Value* v = impl_->summary->add_value();
  v->mutable_tag()->assign(tag.data(), tag.size());  // in place: set_tag(ptr, n) would build a temporary string
  v->set_simple_value(float(value));
}

void EventWriter::write(int64_t step) {
  if (impl_->summary->value_size() == 0) return;
  impl_->step_event.set_wall_time(unix_seconds());
  impl_->step_event.set_step(step);
  impl_->write_record(impl_->step_event);
  impl_->summary->clear_value();  // keeps the Value objects for the next step
}

void EventWriter::session_start(int64_t step) {
  tb::Event start;
  start.set_wall_time(unix_seconds());
  start.set_step(step);
  start.mutable_session_log()->set_status(tb::SessionLog::START);
  impl_->write_record(start);
}

const std::string& EventWriter::path() const { return impl_->path; }

}  // namespace brisk::monitor
