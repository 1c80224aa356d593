// Finding a request's socket and watching it for the client's hang-up; see
// brisk/serve/peer_watch.h.
#include "brisk/serve/peer_watch.h"

#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>

namespace brisk::serve {

namespace {

// What poll() reports for a peer that is gone: it closed its side (FIN), reset
// the connection, or the descriptor is no longer a socket.
constexpr short kHungUp = POLLRDHUP | POLLHUP | POLLERR | POLLNVAL;

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

// The numeric address and port of a socket's own end, or (peer) of the
// other end; false when it has none (getpeername sets errno: ENOTCONN).
bool socket_name(int fd, bool peer, std::string& host, int& port) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  const int rc = peer ? getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len)
                      : getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  return rc == 0 && numeric_name(a, len, host, port);
}

// What the scan makes of one descriptor.
enum class Match { other, connection, reset_on_local };

Match match_socket(int fd, const std::string& local_addr, int local_port, const std::string& remote_addr,
                   int remote_port) {
  std::string host;
  int port = 0;
  if (!socket_name(fd, false, host, port) || port != local_port || host != local_addr) return Match::other;
  errno = 0;
  if (socket_name(fd, true, host, port))
    return port == remote_port && host == remote_addr ? Match::connection : Match::other;
  // ENOTCONN on a socket bound to the server's address is either the
  // listener or an accepted connection whose peer reset it (a TCP socket
  // in CLOSE has no peer address any more).
  int listening = 0;
  socklen_t optlen = sizeof listening;
  if (errno != ENOTCONN || getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &optlen) != 0 || listening)
    return Match::other;
  return Match::reset_on_local;
}

// Calls f(fd) for each descriptor this process has open, until f returns
// false.
template <class F>
void for_each_open_fd(F f) {
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return;
  while (const dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    if (!f(int(fd))) break;
  }
  closedir(dir);
}

}  // namespace

int find_connection_socket(const std::string& local_addr, int local_port, const std::string& remote_addr,
                           int remote_port) {
  if (local_port <= 0) return -1;
  int found = -1;
  bool reset_seen = false;
  for_each_open_fd([&](int fd) {
    const Match m = match_socket(fd, local_addr, local_port, remote_addr, remote_port);
    if (m == Match::connection && remote_port > 0) {
      found = fd;
      return false;
    }
    reset_seen = reset_seen || m == Match::reset_on_local;
    return true;
  });
  // The request's socket is open while it is answered, so when no socket
  // has its addresses and one of the server's has lost its peer, that one
  // is the request's: its client reset the connection before we looked (a
  // proxy's abort, SO_LINGER 0). httplib itself reads the peer address with
  // getpeername, so remote_port 0 means the reset came before that.
  return found < 0 && reset_seen ? kConnectionReset : found;
}

void shut_connections(int local_port, int how,
                      const std::function<bool(const std::string& peer_addr, int peer_port)>& busy) {
  for_each_open_fd([&](int fd) {
    std::string host;
    int port = 0;
    if (socket_name(fd, false, host, port) && port == local_port && socket_name(fd, true, host, port) &&
        !busy(host, port))  // connected (not the listener), and not busy
      shutdown(fd, how);
    return true;
  });
}

bool peer_hung_up(int fd) {
  pollfd p{fd, short(POLLIN | POLLRDHUP), 0};
  if (poll(&p, 1, 0) <= 0) return false;
  return (p.revents & kHungUp) != 0;
}

PeerWatcher::PeerWatcher(std::chrono::milliseconds every) : every_(every), thread_([this] { run(); }) {}

PeerWatcher::~PeerWatcher() {
  {
    std::lock_guard lk(m_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::unique_ptr<PeerWatcher::Watch> PeerWatcher::watch(int fd, std::function<void()> on_gone) {
  if (fd < 0) return nullptr;
  uint64_t id;
  {
    std::lock_guard lk(m_);
    id = next_id_++;
    entries_.push_back({id, fd, std::move(on_gone)});
  }
  cv_.notify_all();  // the thread sleeps while there is nothing to watch
  return std::unique_ptr<Watch>(new Watch(*this, id));
}

PeerWatcher::Watch::~Watch() { watcher_.unwatch(id_); }

void PeerWatcher::unwatch(uint64_t id) {
  std::unique_lock lk(m_);
  for (size_t i = 0; i < entries_.size(); ++i)
    if (entries_[i].id == id) {
      entries_.erase(entries_.begin() + std::ptrdiff_t(i));
      return;
    }
  // Called back already, or its callback is due or running. On the
  // watcher's thread (a callback ending a watch) a callback still due is
  // called off; elsewhere the call is waited for.
  if (std::this_thread::get_id() == thread_.get_id()) std::erase(calling_, id);
  else called_cv_.wait(lk, [&] { return !calling(id); });
}

bool PeerWatcher::calling(uint64_t id) const {
  return std::find(calling_.begin(), calling_.end(), id) != calling_.end();
}

size_t PeerWatcher::watching() const {
  std::lock_guard lk(m_);
  return entries_.size();
}

// The descriptors are polled under the lock, so one whose watch has ended
// (and that may have been closed and reused since) is never polled; the
// callbacks of the hung-up ones run after it is released, so a callback may
// take its time or end watches. A callback's id stays in calling_ until it
// has run and its function (with what it captured) is destroyed; one whose
// id a callback before it took out (its watch ended) is skipped.
void PeerWatcher::run() {
  std::vector<pollfd> fds;
  std::vector<std::pair<uint64_t, std::function<void()>>> gone;
  std::unique_lock lk(m_);
  while (true) {
    if (entries_.empty()) cv_.wait(lk, [&] { return stop_ || !entries_.empty(); });
    else cv_.wait_for(lk, every_, [&] { return stop_; });
    if (stop_) return;
    fds.clear();
    for (const Entry& e : entries_) fds.push_back({e.fd, short(POLLIN | POLLRDHUP), 0});
    if (fds.empty() || poll(fds.data(), fds.size(), 0) <= 0) continue;
    for (size_t i = fds.size(); i-- > 0;)
      if (fds[i].revents & kHungUp) {
        gone.emplace_back(entries_[i].id, std::move(entries_[i].on_gone));
        calling_.push_back(entries_[i].id);
        entries_.erase(entries_.begin() + std::ptrdiff_t(i));
      }
    for (auto& [id, f] : gone) {
      const bool due = calling(id);
      lk.unlock();
      if (due) f();
      f = nullptr;  // what it captured goes outside the lock too
      lk.lock();
      std::erase(calling_, id);
      called_cv_.notify_all();
    }
    gone.clear();
  }
}

}  // namespace brisk::serve
