// TcpLink: a Link over a connected stream socket (see tcp_link.h).
#include "transport/tcp/tcp_link.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "common/status.h"

namespace appliance {

TcpLink::TcpLink(int fd, int peer, std::string peer_host) : Link(peer, std::move(peer_host)), fd_(fd) {
  int flags = fcntl(fd_, F_GETFL, 0);
  fcntl(fd_, F_SETFL, flags | O_NONBLOCK);
}

TcpLink::~TcpLink() { close(); }

void TcpLink::close() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

void TcpLink::lost(const char* during, int err) {
  std::string why = err == 0 ? std::string("connection closed by peer") : std::string(std::strerror(err));
  throw Error(Code::kPeerLost, why + " while " + during, peer(), peer_host());
}

short TcpLink::arm_wait(bool for_read, bool for_write) {
  return static_cast<short>((for_read ? POLLIN : 0) | (for_write ? POLLOUT : 0));
}

size_t TcpLink::send_some(const void* data, size_t len) {
  if (fd_ < 0) lost("sending on a closed link", EBADF);
  if (len == 0) return 0;
  for (;;) {
    ssize_t n = ::send(fd_, data, len, MSG_NOSIGNAL);
    if (n >= 0) return static_cast<size_t>(n);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    lost("sending", errno);
  }
}

size_t TcpLink::recv_some(void* data, size_t len) {
  if (fd_ < 0) lost("receiving on a closed link", EBADF);
  if (len == 0) return 0;
  for (;;) {
    ssize_t n = ::recv(fd_, data, len, 0);
    if (n > 0) return static_cast<size_t>(n);
    if (n == 0) lost("receiving", 0);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    lost("receiving", errno);
  }
}

std::pair<LinkPtr, LinkPtr> make_socketpair_links(int rank_a, int rank_b) {
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0)
    throw Error(Code::kInternal, std::string("socketpair: ") + std::strerror(errno));
  // Link on rank a talks to peer b and vice versa.
  return {std::make_unique<TcpLink>(fds[0], rank_b, "local"), std::make_unique<TcpLink>(fds[1], rank_a, "local")};
}

}  // namespace appliance
