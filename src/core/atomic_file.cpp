// AtomicFile (atomic_file.h): POSIX write, fsync and rename.
#include "brisk/core/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "brisk/core/error.h"

namespace brisk::core {

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {
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
