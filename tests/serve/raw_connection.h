// A plain loopback TCP connection to a test server, for requests written by
// hand (what httplib's client would not send: a reset, a hang-up, a kept
// connection left idle).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

namespace brisk::testing {

// A socket connected to 127.0.0.1:port (-1 if the connect failed); reads
// give up after `read_timeout_s` seconds (0: never).
inline int connect_loopback(int port, int read_timeout_s = 0) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (read_timeout_s > 0) {
    const timeval wait{read_timeout_s, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
  }
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

}  // namespace brisk::testing
