// Finding a connection's socket by its addresses and seeing its peer hang
// up (src/serve/peer_watch.cpp), on real loopback TCP connections.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
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

TEST(PeerWatch, CallsBackOnceWhenThePeerLeavesAndNotAfterItIsDestroyed) {
  Connection c;
  std::atomic<int> calls{0};
  {
    serve::PeerWatch watch(c.find(), [&] { ++calls; }, std::chrono::milliseconds(2));
    EXPECT_TRUE(watch.watching());
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    EXPECT_EQ(calls, 0);  // the client is still there
    close(c.client);
    c.client = -1;
    for (int i = 0; i < 1000 && calls == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_EQ(calls, 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(calls, 1);  // once, though the peer stays gone
  serve::PeerWatch unwatched(-1, [&] { ++calls; });
  EXPECT_FALSE(unwatched.watching());
  Connection live;
  { serve::PeerWatch stopped(live.find(), [&] { ++calls; }, std::chrono::milliseconds(2)); }
  close(live.client);  // after the watch ended: no call
  live.client = -1;
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace brisk
