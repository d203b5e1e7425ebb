// TcpLink: a Link over a connected, non-blocking TCP socket (or any stream socket, which
// is how tests pair two links with socketpair()). Owns the fd.
#pragma once

#include "transport/link.h"

namespace appliance {

class TcpLink final : public Link {
 public:
  // Takes ownership of `fd` and makes it non-blocking.
  TcpLink(int fd, int peer, std::string peer_host);
  ~TcpLink() override;

  const char* kind() const override { return "tcp"; }
  size_t send_some(const void* data, size_t len) override;
  size_t recv_some(void* data, size_t len) override;
  int wait_handle() const override { return fd_; }
  short arm_wait(bool for_read, bool for_write) override;
  void close() override;

 private:
  [[noreturn]] void lost(const char* during, int err);
  int fd_;
};

// Two connected links (peer ranks a and b) over a socketpair, for tests.
std::pair<LinkPtr, LinkPtr> make_socketpair_links(int rank_a, int rank_b);

}  // namespace appliance
