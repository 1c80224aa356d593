// Finding a connection's socket by its addresses and seeing its peer hang
// up (src/serve/peer_watch.cpp), on real loopback TCP connections.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "brisk/serve/peer_watch.h"

namespace brisk {
namespace {

int port_of(int fd, bool peer) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  if (peer) getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len);
  else getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  return ntohs(a.sin_port);
}

// A loopback connection: the listening socket, the client's end and the
// server's accepted end.
struct Connection {
  int listener = -1, client = -1, server = -1;
  Connection() {
    listener = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(listen(listener, 4), 0);
    a.sin_port = htons(uint16_t(port_of(listener, false)));
    client = socket(AF_INET, SOCK_STREAM, 0);
    EXPECT_EQ(connect(client, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    server = accept(listener, nullptr, nullptr);
    EXPECT_GE(server, 0);
  }
  ~Connection() {
    for (int fd : {listener, client, server})
      if (fd >= 0) close(fd);
  }
  // What httplib puts in a Request of this connection.
  int find() const {
    return serve::find_connection_socket("127.0.0.1", port_of(server, false), "127.0.0.1", port_of(server, true));
  }
};

// Waits up to a second for the kernel to pass a close across loopback.
bool hung_up_soon(int fd) {
  for (int i = 0; i < 1000; ++i) {
    if (serve::peer_hung_up(fd)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

// Waits up to a second for `pred`.
template <class Pred>
bool soon(Pred pred) {
  for (int i = 0; i < 1000 && !pred(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return pred();
}

TEST(PeerWatch, FindsTheAcceptedSocketOfAConnection) {
  Connection a, b;  // two connections: each is found as itself
  EXPECT_EQ(a.find(), a.server);
  EXPECT_EQ(b.find(), b.server);
  // The client's end has the addresses the other way round.
  EXPECT_EQ(serve::find_connection_socket("127.0.0.1", port_of(a.client, false), "127.0.0.1",
                                          port_of(a.client, true)),
            a.client);
  // No socket has these addresses, or a wrong host.
  EXPECT_EQ(serve::find_connection_socket("127.0.0.1", port_of(a.server, false), "127.0.0.1",
                                          port_of(b.server, true)),
            -1);
  EXPECT_EQ(serve::find_connection_socket("127.0.0.2", port_of(a.server, false), "127.0.0.1",
                                          port_of(a.server, true)),
            -1);
  EXPECT_EQ(serve::find_connection_socket("127.0.0.1", -1, "127.0.0.1", port_of(a.server, true)), -1);
}

// A client that resets the connection (a proxy's abort, SO_LINGER 0) before
// the request is looked up leaves a socket with no peer address: it cannot
// be found by its addresses, and is reported as reset instead of "nothing
// to watch", so its request is cancelled rather than run to its end.
TEST(PeerWatch, AConnectionResetBeforeTheLookupIsReportedAsReset) {
  Connection c, other;
  const int local = port_of(c.server, false), remote = port_of(c.server, true);
  // Before the reset: found; the listener alone (ENOTCONN too) is not a reset.
  EXPECT_EQ(c.find(), c.server);
  EXPECT_EQ(serve::find_connection_socket("127.0.0.1", local, "127.0.0.1", 1), -1);
  const linger abort_on_close{1, 0};
  ASSERT_EQ(setsockopt(c.client, SOL_SOCKET, SO_LINGER, &abort_on_close, sizeof abort_on_close), 0);
  close(c.client);
  c.client = -1;
  EXPECT_TRUE(soon([&] { return serve::find_connection_socket("127.0.0.1", local, "127.0.0.1", remote) ==
                                serve::kConnectionReset; }));
  // httplib reads the peer address after the reset: port 0.
  EXPECT_EQ(serve::find_connection_socket("127.0.0.1", local, "127.0.0.1", 0), serve::kConnectionReset);
  // A live connection of the same server is still found as itself.
  EXPECT_EQ(other.find(), other.server);
  // Another server's port has no reset socket.
  EXPECT_EQ(serve::find_connection_socket("127.0.0.1", port_of(other.server, false), "127.0.0.1", 1), -1);
}

TEST(PeerWatch, AClosedClientIsSeenAndUnreadDataIsNot) {
  Connection c;
  EXPECT_FALSE(serve::peer_hung_up(c.server));
  // A pipelined request waiting to be read is a live client.
  ASSERT_EQ(write(c.client, "GET / HTTP/1.1\r\n\r\n", 18), 18);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(serve::peer_hung_up(c.server));
  close(c.client);
  c.client = -1;
  EXPECT_TRUE(hung_up_soon(c.server));
}

TEST(PeerWatch, OneWatcherCallsBackOnceForTheConnectionThatLeft) {
  serve::PeerWatcher watcher(std::chrono::milliseconds(2));
  Connection a, b;
  std::atomic<int> a_calls{0}, b_calls{0};
  auto wa = watcher.watch(a.find(), [&] { ++a_calls; });
  auto wb = watcher.watch(b.find(), [&] { ++b_calls; });
  ASSERT_TRUE(wa && wb);
  EXPECT_EQ(watcher.watching(), 2u);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_EQ(a_calls + b_calls, 0);  // both clients are still there
  close(a.client);
  a.client = -1;
  EXPECT_TRUE(soon([&] { return a_calls == 1; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(a_calls, 1);  // once, though the peer stays gone
  EXPECT_EQ(b_calls, 0);
  EXPECT_EQ(watcher.watching(), 1u);  // a called back is no longer watched
  wa.reset();                         // ending it after the callback is fine
  // A watch that ended before its client left calls nothing.
  wb.reset();
  EXPECT_EQ(watcher.watching(), 0u);
  close(b.client);
  b.client = -1;
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(b_calls, 0);
  EXPECT_EQ(watcher.watch(-1, [&] { ++b_calls; }), nullptr);  // no socket found: nothing to watch
}


// Ending a watch whose callback is under way waits for that callback, so
// what the callback uses need only outlive the watch; a callback may end
// its own watch.
TEST(PeerWatch, EndingAWatchWaitsForItsCallbackUnderWay) {
  serve::PeerWatcher watcher(std::chrono::milliseconds(2));
  Connection a;
  std::atomic<bool> started{false}, finished{false};
  auto wa = watcher.watch(a.find(), [&] {
    started = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    finished = true;
  });
  ASSERT_TRUE(wa);
  close(a.client);
  a.client = -1;
  ASSERT_TRUE(soon([&] { return started.load(); }));
  wa.reset();
  EXPECT_TRUE(finished);  // a reset that did not wait returns ~200 ms early

  Connection b;
  std::unique_ptr<serve::PeerWatcher::Watch> wb;
  std::mutex m;  // wb is set before the callback can read it
  std::atomic<bool> ended{false};
  {
    std::lock_guard lk(m);
    wb = watcher.watch(b.find(), [&] {
      {
        std::lock_guard lk2(m);
        wb.reset();  // its own watch, from the watcher's thread: must not wait on itself
      }
      ended = true;  // after the lock: the test may end (and m go) once it is set
    });
  }
  close(b.client);
  b.client = -1;
  EXPECT_TRUE(soon([&] { return ended.load(); }));
  EXPECT_EQ(watcher.watching(), 0u);
}

// A callback that ends another watch whose client left in the same poll
// calls that watch's callback off: it does not run after its watch ended.
TEST(PeerWatch, ACallbackThatEndsAnotherWatchCallsItOff) {
  serve::PeerWatcher watcher(std::chrono::milliseconds(50));  // both hang-ups land in one poll
  Connection a, b;
  std::unique_ptr<serve::PeerWatcher::Watch> wa, wb;
  std::mutex m;  // both watches are set before a callback can read them
  std::atomic<bool> b_ended{false};
  std::atomic<int> calls{0}, late{0};
  {
    std::lock_guard lk(m);
    // b first: the watcher calls the later watch's callback first (a's).
    wb = watcher.watch(b.find(), [&] {
      if (b_ended) ++late;
      ++calls;
    });
    wa = watcher.watch(a.find(), [&] {
      {
        std::lock_guard lk2(m);
        wb.reset();
        wa.reset();
      }
      b_ended = true;
      ++calls;
    });
  }
  close(a.client);
  close(b.client);
  a.client = b.client = -1;
  EXPECT_TRUE(soon([&] { return calls.load() >= 1 && watcher.watching() == 0; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(late.load(), 0) << "b's callback ran after a's callback ended its watch";
}

}  // namespace
}  // namespace brisk
