// AtomicFile (atomic_file.h): POSIX write, fsync and rename.
#include "brisk/core/atomic_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
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

int open_locked_temporary(const std::string& tmp, const std::string& target) {
  for (;;) {
    // A leftover symbolic link would have the output written through it (and
    // renamed into place as the link), a hard link empty the file it shares:
    // either is removed and the name made afresh.
    struct stat named{};
    if (::lstat(tmp.c_str(), &named) == 0 && (!S_ISREG(named.st_mode) || named.st_nlink > 1)) {
      if (S_ISDIR(named.st_mode)) throw IoError(tmp + ": is a directory, in the way of the temporary file");
      ::unlink(tmp.c_str());
    }
    const int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0 && errno == ELOOP) continue;  // a link put there since: removed on the next pass
    if (fd < 0) throw IoError(tmp + ": cannot create (" + std::strerror(errno) + ")");
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      if (err == EWOULDBLOCK) {
        ::close(fd);
        throw IoError(target + ": another writer is writing it (its temporary file " + tmp +
                      " is locked); wait for that one to finish, or write to another path");
      }
      // A filesystem without locks (some FUSE mounts): write unguarded, as
      // before the lock existed, rather than not at all.
    }
    // The file locked must still be the one named tmp: a writer that just
    // finished renamed it into place, and emptying it would empty its output.
    struct stat held{};
    if (::fstat(fd, &held) == 0 && ::lstat(tmp.c_str(), &named) == 0 && held.st_ino == named.st_ino &&
        held.st_dev == named.st_dev && held.st_nlink == 1) {
      if (::ftruncate(fd, 0) != 0) {
        const int err = errno;
        ::close(fd);
        throw IoError(tmp + ": cannot empty (" + std::strerror(err) + ")");
      }
      return fd;
    }
    ::close(fd);  // renamed away under us: open the name afresh
  }
}

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {
  // rename() over a directory fails only after the whole file is written.
  std::error_code ec;
  if (std::filesystem::is_directory(path_, ec)) throw IoError(path_ + ": is a directory, not a file");
  fd_ = open_locked_temporary(tmp_, path_);
}

AtomicFile::~AtomicFile() {
  if (fd_ < 0) return;
  ::unlink(tmp_.c_str());  // before the lock goes with the descriptor
  ::close(fd_);
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

void AtomicFile::write_at(uint64_t offset, const void* data, size_t bytes) {
  if (fd_ < 0) throw IoError(tmp_ + ": write after commit");
  const char* p = static_cast<const char*>(data);
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::pwrite(fd_, p + done, bytes - done, off_t(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw IoError(tmp_ + ": write failed (" + std::strerror(errno) + ")");
    done += size_t(n);
  }
}

void AtomicFile::commit() {
  if (fd_ < 0) throw IoError(tmp_ + ": committed twice");
  const bool synced = ::fsync(fd_) == 0;
  const std::string why = synced ? "" : std::strerror(errno);
  const int fd = fd_;
  fd_ = -1;
  if (!synced) {
    ::unlink(tmp_.c_str());
    ::close(fd);
    throw IoError(tmp_ + ": fsync failed (" + why + ")");
  }
  // Renamed while still locked: a writer waiting on the lock then finds the
  // name gone or new (open_locked_temporary), never this file.
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const std::string err = std::strerror(errno);
    ::unlink(tmp_.c_str());
    ::close(fd);
    throw IoError(path_ + ": rename failed (" + err + ")");
  }
  ::close(fd);
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  AtomicFile f(path);
  f.write(bytes.data(), bytes.size());
  f.commit();
}

}  // namespace brisk::core
