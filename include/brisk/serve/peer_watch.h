// Noticing that the client of a non-streamed request has hung up.
//
// A stream learns it at its next failed write; a non-streamed request
// writes nothing until its answer is complete, so without a watch a client
// that gave up (a timeout, Ctrl-C) would hold its slot until every token it
// asked for was generated. cpp-httplib does not hand a handler its socket,
// but a TCP connection is named by its two addresses: the socket whose
// local and peer addresses are the request's is the connection's. While the
// handler runs that socket is open (httplib closes it after the handler
// returns), so the descriptor found cannot be another connection's.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace brisk::serve {

// The descriptor of this process's TCP socket connected from
// local_addr:local_port to remote_addr:remote_port (numeric addresses, as
// getnameinfo(NI_NUMERICHOST) writes them), or -1 when there is none.
int find_connection_socket(const std::string& local_addr, int local_port, const std::string& remote_addr,
                           int remote_port);

// The peer has closed its side of the connection (or reset it). Data it
// sent that nobody has read yet (a pipelined request) does not count.
bool peer_hung_up(int fd);

// Polls a connection every `every` in a thread of its own and calls
// `on_gone` once, from that thread, when the peer has hung up. Stops (and
// joins) when destroyed. A connection whose socket is not found is not
// watched (watching() is false).
class PeerWatch {
 public:
  PeerWatch(int fd, std::function<void()> on_gone,
            std::chrono::milliseconds every = std::chrono::milliseconds(20));
  ~PeerWatch();
  PeerWatch(const PeerWatch&) = delete;
  PeerWatch& operator=(const PeerWatch&) = delete;
  bool watching() const { return thread_.joinable(); }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace brisk::serve
