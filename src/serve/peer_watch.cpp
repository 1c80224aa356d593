// Finding a request's socket and watching it for the client's hang-up; see
// brisk/serve/peer_watch.h.
#include "brisk/serve/peer_watch.h"

#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstdlib>

namespace brisk::serve {

namespace {

// addr:port of a socket address in getnameinfo's numeric form.
bool numeric_name(const sockaddr_storage& a, socklen_t len, std::string& host, int& port) {
  char h[NI_MAXHOST], s[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, h, sizeof h, s, sizeof s,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return false;
  host = h;
  port = std::atoi(s);
  return true;
}

bool is_connection(int fd, const std::string& local_addr, int local_port, const std::string& remote_addr,
                   int remote_port) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  std::string host;
  int port = 0;
  // getpeername fails with ENOTSOCK on files and ENOTCONN on listeners.
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0 || !numeric_name(a, len, host, port) ||
      port != remote_port || host != remote_addr)
    return false;
  len = sizeof a;
  return getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0 && numeric_name(a, len, host, port) &&
         port == local_port && host == local_addr;
}

}  // namespace

int find_connection_socket(const std::string& local_addr, int local_port, const std::string& remote_addr,
                           int remote_port) {
  if (local_port <= 0 || remote_port <= 0) return -1;
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return -1;
  int found = -1;
  while (const dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    if (is_connection(int(fd), local_addr, local_port, remote_addr, remote_port)) {
      found = int(fd);
      break;
    }
  }
  closedir(dir);
  return found;
}

bool peer_hung_up(int fd) {
  pollfd p{fd, short(POLLIN | POLLRDHUP), 0};
  if (poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

PeerWatch::PeerWatch(int fd, std::function<void()> on_gone, std::chrono::milliseconds every) {
  if (fd < 0) return;
  thread_ = std::thread([this, fd, every, on_gone = std::move(on_gone)] {
    std::unique_lock lk(m_);
    while (!cv_.wait_for(lk, every, [&] { return stop_; }))
      if (peer_hung_up(fd)) {
        lk.unlock();
        on_gone();
        return;
      }
  });
}

PeerWatch::~PeerWatch() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard lk(m_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

}  // namespace brisk::serve
