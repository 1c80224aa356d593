// Noticing that the client of a request (a generation, an encoder's) has
// hung up.
//
// A stream learns it at its next failed write; a non-streamed request
// writes nothing until its answer is complete, and a stream nothing while it
// waits in the queue, so without a watch a client that gave up (a timeout,
// Ctrl-C) would hold its slot until every token it asked for was generated.
// cpp-httplib does not hand a handler its socket, but a TCP connection is
// named by its two addresses: the socket whose local and peer addresses are
// the request's is the connection's. While the request is answered that
// socket is open (httplib closes it after the response is destroyed), so
// the descriptor found cannot be another connection's.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace brisk::serve {

// What find_connection_socket returns for a connection its client has
// already reset: the socket is still open but has no peer address.
constexpr int kConnectionReset = -2;

// The descriptor of this process's TCP socket connected from
// local_addr:local_port to remote_addr:remote_port (numeric addresses, as
// getnameinfo(NI_NUMERICHOST) writes them); kConnectionReset when none is
// and a socket accepted on local_addr:local_port has lost its peer; -1 when
// neither (nothing to watch).
int find_connection_socket(const std::string& local_addr, int local_port, const std::string& remote_addr,
                           int remote_port);

// shutdown(how) on every connected TCP socket of this process whose local
// port is `local_port` (a stopping server's accepted connections) and whose
// peer `busy` does not name. SHUT_RD: a connection idle between requests
// reads end-of-file and closes (not a busy one: httplib checks that a
// socket still reads before each write, so it could not send its answer).
// SHUT_RDWR: whatever it was doing ends.
void shut_connections(int local_port, int how,
                      const std::function<bool(const std::string& peer_addr, int peer_port)>& busy);

// The peer has closed its side of the connection (or reset it). Data it
// sent that nobody has read yet (a pipelined request) does not count.
bool peer_hung_up(int fd);

// One thread that polls every watched connection together, every `every`
// (one poll() over all of them, however many requests are open), and calls
// a watch's `on_gone` once, from that thread, when its peer has hung up.
class PeerWatcher {
 public:
  explicit PeerWatcher(std::chrono::milliseconds every = std::chrono::milliseconds(20));
  ~PeerWatcher();
  PeerWatcher(const PeerWatcher&) = delete;
  PeerWatcher& operator=(const PeerWatcher&) = delete;

  // Watching one connection until destroyed. Once destroyed its descriptor
  // is never polled again (it may be closed and reused), and its `on_gone`
  // has either run to its end or will never run: destroying a watch waits
  // for its callback under way (a watch destroyed by its own callback, or
  // by another callback on the watcher's thread, calls its callback off
  // instead), so what the callback uses need only outlive the watch.
  class Watch {
   public:
    ~Watch();
    Watch(const Watch&) = delete;
    Watch& operator=(const Watch&) = delete;

   private:
    friend class PeerWatcher;
    Watch(PeerWatcher& w, uint64_t id) : watcher_(w), id_(id) {}
    PeerWatcher& watcher_;
    uint64_t id_;
  };
  // nullptr for fd < 0 (a connection whose socket was not found).
  std::unique_ptr<Watch> watch(int fd, std::function<void()> on_gone);
  size_t watching() const;  // connections watched now

 private:
  struct Entry {
    uint64_t id;
    int fd;
    std::function<void()> on_gone;
  };
  void run();
  void unwatch(uint64_t id);
  bool calling(uint64_t id) const;  // its on_gone is running now (m_ held)

  const std::chrono::milliseconds every_;
  mutable std::mutex m_;
  std::condition_variable cv_, called_cv_;
  bool stop_ = false;
  uint64_t next_id_ = 0;
  std::vector<Entry> entries_;
  std::vector<uint64_t> calling_;  // the watches whose on_gone runs now
  std::thread thread_;
};

}  // namespace brisk::serve
