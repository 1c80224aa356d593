#include "run_log.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "brisk/core/error.h"
#include "brisk/core/safetensors.h"

namespace brisk::train {

void format_duration(double s, char (&out)[32]) {
  if (s >= 3600) std::snprintf(out, sizeof out, "%dh%02dm", int(s / 3600), int(s / 60) % 60);
  else if (s >= 60) std::snprintf(out, sizeof out, "%dm%02ds", int(s / 60), int(s) % 60);
  else std::snprintf(out, sizeof out, "%.0fs", s);
}

namespace {

// " | RSS 610 MiB", or nothing when unknown.
std::string rss_text(const StepRow& m) {
  if (m.rss_mib < 0) return {};
  char buf[32];
  std::snprintf(buf, sizeof buf, " | RSS %.0f MiB", m.rss_mib);
  return buf;
}

}  // namespace

std::string live_line(const StepRow& m, int64_t total, const char* eta, int columns) {
  // Each field with its rank: when the line is wider than the terminal the
  // lowest-ranked fields go first, since a wrapped line is not redrawn in
  // place (\r returns to the start of its last row) and the terminal would
  // fill with one line per step.
  struct Field {
    std::string text;
    int rank;
  };
  constexpr int kBar = 24;
  const int filled = total > 0 ? int(double(kBar) * double(m.step) / double(total)) : 0;
  char buf[96];
  std::vector<Field> fields;
  fields.push_back({"[" + std::string(size_t(std::clamp(filled, 0, kBar)), '#') +
                        std::string(size_t(kBar - std::clamp(filled, 0, kBar)), '.') + "] ",
                    2});
  std::snprintf(buf, sizeof buf, "step %lld/%lld", (long long)m.step, (long long)total);
  fields.push_back({buf, 9});
  std::snprintf(buf, sizeof buf, " | loss %.4f", m.loss);
  fields.push_back({buf, 8});
  std::snprintf(buf, sizeof buf, " | lr %.2e", m.lr);
  fields.push_back({buf, 0});
  std::snprintf(buf, sizeof buf, " | %.0f tok/s", m.tokens_per_s);
  fields.push_back({buf, 5});
  std::snprintf(buf, sizeof buf, " | %.0f ms/step", m.ms_per_step);
  fields.push_back({buf, 3});
  std::snprintf(buf, sizeof buf, " | MFU %.1f%%", 100 * m.mfu);
  fields.push_back({buf, 4});
  fields.push_back({rss_text(m), 1});
  fields.push_back({std::string(" | ETA ") + eta, 7});
  auto width = [&] {
    size_t w = 0;
    for (const Field& f : fields) w += f.text.size();
    return w;
  };
  // One column short of the width: writing the last column wraps some terminals.
  const size_t room = columns > 1 ? size_t(columns - 1) : std::string::npos;
  for (int rank = 0; rank < 8 && width() > room; ++rank)
    std::erase_if(fields, [&](const Field& f) { return f.rank == rank; });
  std::string line;
  for (const Field& f : fields) line += f.text;
  if (line.size() > room) line.resize(room);
  return line;
}

Progress::Progress(bool enabled, bool live, int64_t total, int64_t log_every)
    : enabled_(enabled), tty_(enabled && live && isatty(STDERR_FILENO)), total_(total), log_every_(log_every) {}

void Progress::step(const StepRow& m, double eta_s) {
  if (!enabled_) return;
  char eta[32];
  format_duration(eta_s, eta);
  if (tty_) {
    winsize ws{};
    const int columns = ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 ? int(ws.ws_col) : 0;
    std::fprintf(stderr, "\r\033[K%s", live_line(m, total_, eta, columns).c_str());
    std::fflush(stderr);
  } else if (m.step % log_every_ == 0 || m.step == total_ || m.step == 1) {
    char comm[96] = "";
    if (m.world > 1)
      std::snprintf(comm, sizeof comm, " | %d ranks, comm %.1f ms (%.0f%% hidden)", m.world, m.comm_ms,
                    m.comm_ms > 0 ? 100 * std::max(0.0, m.comm_ms - m.comm_exposed_ms) / m.comm_ms : 0.0);
    std::fprintf(stderr, "step %lld/%lld | loss %.4f | lr %.2e | grad norm %.3f | %.0f tok/s | %.0f ms/step | MFU %.1f%%%s%s | ETA %s\n",
                 (long long)m.step, (long long)total_, m.loss, m.lr, m.grad_norm, m.tokens_per_s, m.ms_per_step,
                 100 * m.mfu, rss_text(m).c_str(), comm, eta);
  }
}

void Progress::line(const std::string& s) {
  if (!enabled_) return;
  std::fprintf(stderr, "%s%s\n", tty_ ? "\r\033[K" : "", s.c_str());
}

void Progress::finish() {
  if (enabled_ && tty_) std::fprintf(stderr, "\n");
}

namespace {

// Rows a resumed run keeps: those of steps up to its checkpoint.
std::string rows_up_to(const std::string& path, int64_t last_step) {
  std::ifstream in(path);
  std::string kept, line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("step") && j["step"].is_number_integer() && j["step"].get<int64_t>() <= last_step)
      kept += line + "\n";
  }
  return kept;
}

// A JSON number, shortest text that reads back as the same double (%.17g
// always does); JSON has no NaN or infinity, so those are written as null.
int put_number(char* p, size_t n, const char* key, double v) {
  if (!std::isfinite(v)) return std::snprintf(p, n, ",\"%s\":null", key);
  char buf[32];
  for (int digits = 15; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return std::snprintf(p, n, ",\"%s\":%s", key, buf);
}

}  // namespace

std::FILE* open_metrics_for_append(const std::string& path, int64_t last_step) {
  const std::string kept =
      last_step > 0 && std::filesystem::exists(path) ? rows_up_to(path, last_step) : std::string();
  core::write_file_atomic(path, kept);
  std::FILE* f = std::fopen(path.c_str(), "ab");
  if (!f) throw core::IoError("cannot open " + path + " for appending");
  return f;
}

MetricsLog::MetricsLog(const std::string& path, int64_t last_step)
    : path_(path), file_(open_metrics_for_append(path, last_step)) {}

MetricsLog::~MetricsLog() {
  if (file_) std::fclose(file_);
}

void MetricsLog::write(const StepRow& r) {
  char row[1024];
  size_t n = size_t(std::snprintf(row, sizeof row, "{\"step\":%lld", (long long)r.step));
  auto number = [&](const char* key, double v) { n += size_t(put_number(row + n, sizeof row - n, key, v)); };
  number("loss", r.loss);
  number("lr", r.lr);
  number("grad_norm", r.grad_norm);
  number("tokens_per_s", r.tokens_per_s);
  number("ms_per_step", r.ms_per_step);
  number("mfu", r.mfu);
  number("data_wait_ms", r.data_wait_ms);
  if (r.rss_mib >= 0) number("rss_mib", r.rss_mib);
  n += size_t(std::snprintf(row + n, sizeof row - n, ",\"precision\":\"%s\",\"precision_path\":\"%s\"", r.precision,
                            r.precision_path));
  number("time_s", r.time_s);
  if (r.scaled) {
    number("loss_scale", r.loss_scale);
    n += size_t(std::snprintf(row + n, sizeof row - n, ",\"skipped\":%s", r.skipped ? "true" : "false"));
  }
  if (r.has_val_loss) number("val_loss", r.val_loss);
  if (r.world > 1) {
    n += size_t(std::snprintf(row + n, sizeof row - n, ",\"world\":%d", r.world));
    number("comm_ms", r.comm_ms);
    number("comm_exposed_ms", r.comm_exposed_ms);
    number("comm_hidden_ms", std::max(0.0, r.comm_ms - r.comm_exposed_ms));
  }
  n += size_t(std::snprintf(row + n, sizeof row - n, "}\n"));
  if (n >= sizeof row) throw core::IoError("metrics row longer than its buffer (" + path_ + ")");
  if (std::fwrite(row, 1, n, file_) != n || std::fflush(file_) != 0)
    throw core::IoError("cannot write " + path_ + ": " + std::strerror(errno));
}

void write_events(monitor::EventWriter& events, const StepRow& r) {
  events.scalar("loss", r.loss);
  events.scalar("lr", r.lr);
  events.scalar("grad_norm", r.grad_norm);
  events.scalar("tokens_per_s", r.tokens_per_s);
  events.scalar("ms_per_step", r.ms_per_step);
  events.scalar("mfu", r.mfu);
  if (r.rss_mib >= 0) events.scalar("rss_mib", r.rss_mib);
  events.scalar("data_wait_ms", r.data_wait_ms);
  events.scalar("time_s", r.time_s);
  if (r.scaled) {
    events.scalar("loss_scale", r.loss_scale);
    events.scalar("skipped", r.skipped ? 1.0 : 0.0);
  }
  if (r.has_val_loss) events.scalar("val_loss", r.val_loss);
  if (r.world > 1) {
    events.scalar("world", r.world);
    events.scalar("comm_ms", r.comm_ms);
    events.scalar("comm_exposed_ms", r.comm_exposed_ms);
    events.scalar("comm_hidden_ms", std::max(0.0, r.comm_ms - r.comm_exposed_ms));
  }
  events.write(r.step);
}

}  // namespace brisk::train
