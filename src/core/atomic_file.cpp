// AtomicFile (atomic_file.h): POSIX write, fsync and rename.
#include "brisk/core/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <set>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "brisk/core/error.h"

namespace brisk::core {

void check_output_file(const std::string& path) {
  namespace fs = std::filesystem;
  if (path.empty()) throw ConfigError("empty output path; give a file name");
  const fs::path p(path);
  std::error_code ec;
  if (fs::is_directory(p, ec))
    throw ConfigError(path + ": is a directory; give a file name, e.g. " + (p / "out").string());
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  if (!fs::exists(dir, ec)) throw ConfigError(path + ": directory " + dir.string() + " does not exist");
  if (!fs::is_directory(dir, ec)) throw ConfigError(path + ": " + dir.string() + " is not a directory");
  if (::access(dir.c_str(), W_OK) != 0)
    throw IoError(path + ": directory " + dir.string() + " is not writable (" + std::strerror(errno) + ")");
}

void check_output_not_input(const std::string& out, const std::string& input) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (out.empty() || input.empty() || !fs::exists(out, ec)) return;  // a new file overwrites nothing
  if (fs::equivalent(out, input, ec))
    throw ConfigError(out + ": is the input " + input + "; write the output to another file");
  if (!fs::is_directory(input, ec)) return;
  // The files a checkpoint, a run directory or a Hugging Face model
  // directory keeps; an earlier export next to them may be replaced.
  static const std::set<std::string> kept = {"model.safetensors", "optimizer.safetensors", "state.json",
                                             "config.json",       "config.toml",           "metrics.jsonl",
                                             "run_summary.json",  "recommendations.json",  "report.json"};
  const fs::path o = fs::weakly_canonical(out, ec), in = fs::weakly_canonical(input, ec);
  if (kept.count(o.filename().string()) &&
      std::mismatch(in.begin(), in.end(), o.begin(), o.end()).first == in.end())  // in is a prefix of out
    throw ConfigError(out + ": is a file of the input " + input + "; write the output outside it");
}

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {
  // rename() over a directory fails only after the whole file is written.
  std::error_code ec;
  if (std::filesystem::is_directory(path_, ec)) throw IoError(path_ + ": is a directory, not a file");
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd_ < 0) throw IoError(tmp_ + ": cannot create (" + std::strerror(errno) + ")");
}

AtomicFile::~AtomicFile() {
  if (fd_ < 0) return;
  ::close(fd_);
  ::unlink(tmp_.c_str());
}

void AtomicFile::write(const void* data, size_t bytes) {
  if (fd_ < 0) throw IoError(tmp_ + ": write after commit");
  const char* p = static_cast<const char*>(data);
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::write(fd_, p + done, bytes - done);
    if (n < 0 && errno == EINTR) continue;  // a signal (e.g. the stop request) interrupted it
    if (n < 0) throw IoError(tmp_ + ": write failed (" + std::strerror(errno) + ")");
    done += size_t(n);
  }
}

void AtomicFile::commit() {
  if (fd_ < 0) throw IoError(tmp_ + ": committed twice");
  const bool synced = ::fsync(fd_) == 0;
  const std::string why = synced ? "" : std::strerror(errno);
  ::close(fd_);
  fd_ = -1;
  if (!synced) {
    ::unlink(tmp_.c_str());
    throw IoError(tmp_ + ": fsync failed (" + why + ")");
  }
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const std::string err = std::strerror(errno);
    ::unlink(tmp_.c_str());
    throw IoError(path_ + ": rename failed (" + err + ")");
  }
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  AtomicFile f(path);
  f.write(bytes.data(), bytes.size());
  f.commit();
}

}  // namespace brisk::core
