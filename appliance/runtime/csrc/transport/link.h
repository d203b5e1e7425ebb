// Link: an ordered, reliable byte stream to one peer rank. The one transport interface.
//
// Implementations: TCP (transport/tcp, any pair of hosts) and shared memory
// (transport/shm, same host). Which one serves a pair is decided in one place,
// bootstrap/transports.h. Everything above a Link speaks frames (wire/frame.h)
// through a Channel (transport/channel.h); a Link itself knows nothing of frames.
//
// A Link is used by one thread at a time and is non-blocking: send_some/recv_some move what
// they can and return at once. To wait, callers poll `wait_handle()` for the events that
// `arm_wait()` returns. For TCP that is the socket and POLLIN/POLLOUT. Shared memory moves
// bytes without syscalls, so callers first spin a little (`spins()`), then arm_wait() sets
// the link's doorbell flags and says POLLIN on its doorbell socket, which the peer writes to
// when it moves bytes while we sleep, and which the kernel makes readable when the peer dies:
// a dead shm peer is seen as fast as a TCP reset. arm_wait() returns 0 when the link can
// already progress (the caller pumps again instead of sleeping). A link with no handle at
// all (-1) is waited on by backing off.
// Failures throw Error(kPeerLost) naming the peer rank: EOF, reset, broken pipe.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace appliance {

class Link {
 public:
  virtual ~Link() = default;

  int peer() const { return peer_; }
  const std::string& peer_host() const { return peer_host_; }
  virtual const char* kind() const = 0;  // "tcp" or "shm"

  // Move up to `len` bytes; return how many moved (0 = would block). Throw on peer loss.
  virtual size_t send_some(const void* data, size_t len) = 0;
  virtual size_t recv_some(void* data, size_t len) = 0;

  // A pollable fd that becomes ready with the link (see arm_wait), or -1.
  virtual int wait_handle() const = 0;

  // Poll events to wait for on wait_handle() before the caller sleeps for reading and/or
  // writing; 0 = progress is possible now, do not sleep.
  virtual short arm_wait(bool for_read, bool for_write) = 0;

  // True when progress costs no syscall, so spinning briefly beats sleeping (shared memory).
  virtual bool spins() const { return false; }

  // Stop both directions; later calls throw. Idempotent.
  virtual void close() = 0;

 protected:
  Link(int peer, std::string peer_host) : peer_(peer), peer_host_(std::move(peer_host)) {}

 private:
  int peer_;
  std::string peer_host_;
};

using LinkPtr = std::unique_ptr<Link>;

}  // namespace appliance
