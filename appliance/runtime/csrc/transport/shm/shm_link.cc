// ShmLink: byte rings in shared memory, a socket as doorbell and liveness (see shm_link.h).
#include "transport/shm/shm_link.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/status.h"

namespace appliance {

namespace {

// Bytes published per call: the peer can start on the first piece while the rest is copied
// (and a full ring frees up in pieces), at the price of one fence per piece.
constexpr size_t kPublishBytes = 64 << 10;

}  // namespace

ShmLink::ShmLink(std::shared_ptr<ShmSegment> seg, int side, int doorbell_fd, int peer, std::string peer_host)
    : Link(peer, std::move(peer_host)), seg_(std::move(seg)), fd_(doorbell_fd) {
  APPLIANCE_ASSERT(side == 0 || side == 1, "shm side " + std::to_string(side));
  out_ = seg_->ring(side);
  in_ = seg_->ring(1 - side);
  out_data_ = seg_->data(side);
  in_data_ = seg_->data(1 - side);
  cap_ = seg_->capacity();
  int flags = fcntl(fd_, F_GETFL, 0);
  fcntl(fd_, F_SETFL, flags | O_NONBLOCK);
}

ShmLink::~ShmLink() { close(); }

void ShmLink::close() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

void ShmLink::lost(const char* during, int err) {
  std::string why = err == 0 ? std::string("peer process gone (shared-memory link closed)") : std::string(std::strerror(err));
  throw Error(Code::kPeerLost, why + " while " + during, peer(), peer_host());
}

void ShmLink::ring(std::atomic<uint32_t>& flag) {
  if (!flag.exchange(0, std::memory_order_acq_rel)) return;
  char b = 1;
  for (;;) {
    ssize_t n = ::send(fd_, &b, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0 || errno == EAGAIN || errno == EWOULDBLOCK) return;  // a full socket already wakes it
    if (errno == EINTR) continue;
    if (errno == EPIPE || errno == ECONNRESET) {
      // The peer has gone. What we published stays in the ring (it may even have read it
      // already, without needing this wake); the next send fails, a receive drains then fails.
      peer_closed_ = true;
      return;
    }
    lost("waking the peer", errno);
  }
}

void ShmLink::after_wait() {
  armed_ = false;
  in_->consumer_waiting.store(0, std::memory_order_relaxed);
  out_->producer_waiting.store(0, std::memory_order_relaxed);
  char buf[64];
  for (;;) {
    ssize_t n = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) continue;
    if (n == 0) {  // bytes it wrote before it went are still ours to read
      peer_closed_ = true;
      return;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return;
    lost("waiting on shared memory", errno);
  }
}

size_t ShmLink::send_some(const void* data, size_t len) {
  if (fd_ < 0) lost("sending on a closed link", EBADF);
  if (armed_) after_wait();
  if (peer_closed_) lost("sending", 0);
  if (len == 0) return 0;
  const uint64_t head = out_->head.load(std::memory_order_relaxed);
  const uint64_t tail = out_->tail.load(std::memory_order_acquire);
  const size_t n = static_cast<size_t>(std::min<uint64_t>({len, cap_ - (head - tail), kPublishBytes}));
  if (n == 0) return 0;
  const size_t pos = static_cast<size_t>(head & (cap_ - 1));
  const size_t first = std::min<size_t>(n, static_cast<size_t>(cap_) - pos);
  std::memcpy(out_data_ + pos, data, first);
  if (n > first) std::memcpy(out_data_, static_cast<const uint8_t*>(data) + first, n - first);
  out_->head.store(head + n, std::memory_order_release);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (out_->consumer_waiting.load(std::memory_order_relaxed)) ring(out_->consumer_waiting);
  return n;
}

size_t ShmLink::recv_some(void* data, size_t len) {
  if (fd_ < 0) lost("receiving on a closed link", EBADF);
  if (armed_) after_wait();
  if (len == 0) return 0;
  const uint64_t tail = in_->tail.load(std::memory_order_relaxed);
  const uint64_t head = in_->head.load(std::memory_order_acquire);
  const size_t n = static_cast<size_t>(std::min<uint64_t>({len, head - tail, kPublishBytes}));
  if (n == 0) {
    if (peer_closed_) lost("receiving", 0);
    return 0;
  }
  const size_t pos = static_cast<size_t>(tail & (cap_ - 1));
  const size_t first = std::min<size_t>(n, static_cast<size_t>(cap_) - pos);
  std::memcpy(data, in_data_ + pos, first);
  if (n > first) std::memcpy(static_cast<uint8_t*>(data) + first, in_data_, n - first);
  in_->tail.store(tail + n, std::memory_order_release);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (in_->producer_waiting.load(std::memory_order_relaxed)) ring(in_->producer_waiting);
  return n;
}

short ShmLink::arm_wait(bool for_read, bool for_write) {
  if (fd_ < 0 || peer_closed_) return 0;  // the next call reads what is left, then throws
  armed_ = true;
  if (for_read) in_->consumer_waiting.store(1, std::memory_order_relaxed);
  if (for_write) out_->producer_waiting.store(1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (for_read && in_->head.load(std::memory_order_acquire) != in_->tail.load(std::memory_order_relaxed)) return 0;
  if (for_write &&
      out_->head.load(std::memory_order_relaxed) - out_->tail.load(std::memory_order_acquire) < cap_)
    return 0;
  return POLLIN;
}

std::pair<LinkPtr, LinkPtr> make_shm_link_pair(int rank_a, int rank_b, uint64_t ring_bytes) {
  std::shared_ptr<ShmSegment> seg(ShmSegment::anonymous(ring_bytes));
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0)
    throw Error(Code::kInternal, std::string("socketpair: ") + std::strerror(errno));
  return {std::make_unique<ShmLink>(seg, 0, fds[0], rank_b, "local"),
          std::make_unique<ShmLink>(seg, 1, fds[1], rank_a, "local")};
}

}  // namespace appliance
