// ShmLink: a Link between two ranks of one machine over a shared-memory segment.
//
// The segment (shm_segment.h) holds two single-producer/single-consumer byte rings, one per
// direction. send_some copies into the outgoing ring and publishes the new head; recv_some
// copies out of the incoming ring and publishes the new tail. No syscall on either path
// while both ranks are busy: that is what makes it faster than loopback TCP, whose every
// send and receive is a syscall and two copies through the kernel.
//
// The authenticated TCP connection that set the pair up stays open as the link's doorbell
// and liveness handle (wait_handle()). A rank about to sleep calls arm_wait(): it raises its
// "waiting" flag in the ring it waits on and re-checks the ring (Dekker-style, with full
// fences on both sides, so a wake-up is never lost); the peer, after moving bytes, sees the
// flag, clears it and writes one byte to the socket. When the peer dies the kernel closes its
// socket, the socket turns readable, and the next send_some/recv_some reads EOF and throws
// Error(kPeerLost) naming the peer: as fast as a TCP reset, not a heartbeat later.
//
// Used by one thread at a time, like every Link. Owns the mapping and the socket.
#pragma once

#include <cstdint>
#include <memory>

#include "transport/link.h"
#include "transport/shm/shm_segment.h"

namespace appliance {

class ShmLink final : public Link {
 public:
  // `doorbell_fd`: connected stream socket to the same peer (owned from now on).
  // `side`: 0 for the rank that created the segment (it sends on ring 0), 1 for the other.
  ShmLink(std::shared_ptr<ShmSegment> seg, int side, int doorbell_fd, int peer, std::string peer_host);
  ~ShmLink() override;

  const char* kind() const override { return "shm"; }
  size_t send_some(const void* data, size_t len) override;
  size_t recv_some(void* data, size_t len) override;
  int wait_handle() const override { return fd_; }
  short arm_wait(bool for_read, bool for_write) override;
  bool spins() const override { return true; }
  void close() override;

 private:
  void after_wait();  // drain doorbell bytes (EOF = peer lost) once after an armed wait
  void ring(std::atomic<uint32_t>& flag);
  [[noreturn]] void lost(const char* during, int err);

  std::shared_ptr<ShmSegment> seg_;
  ShmRing* out_;
  ShmRing* in_;
  uint8_t* out_data_;
  uint8_t* in_data_;
  uint64_t cap_;
  int fd_;
  bool armed_ = false;
  bool peer_closed_ = false;  // EOF seen on the doorbell, or the peer's end refused a wake
};

// Two connected shm links (peer ranks a and b) over an anonymous segment and a socketpair
// doorbell, for tests and the in-process data-plane harness.
std::pair<LinkPtr, LinkPtr> make_shm_link_pair(int rank_a, int rank_b, uint64_t ring_bytes);

}  // namespace appliance
