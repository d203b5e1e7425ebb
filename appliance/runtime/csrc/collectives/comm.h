// Comm: what collective algorithms see of the world. Ranks 0..size-1, one data Channel per
// peer, and a progress engine that moves several sends and receives at once.
//
// Messages are DATA frames; a message longer than `max_frame` goes as several frames. A
// receive must name the exact byte count the sender sends (plans make both sides agree);
// any other length is a protocol error naming the peer. Zero-byte messages are legal and
// still travel (they keep both sides in step).
//
// While it waits, exchange() also services a Watch: a file descriptor plus a callback that
// the engine uses to read control frames (an ABORT from the coordinator throws out of the
// callback and therefore out of the collective). So a rank blocked in a collective learns
// of a failure anywhere in the job, not only from its ring neighbours.
//
// IMPLEMENTATION OWNER: see csrc/README.md (data-plane work package).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "transport/channel.h"

namespace appliance {

struct SendOp {
  int peer;
  const void* data;
  size_t len;
};

struct RecvOp {
  int peer;
  void* data;
  size_t len;
  // Optional: called as contiguous prefixes of `data` complete, with granularity `grain`
  // bytes (the last piece may be shorter), so callers can reduce while more arrives.
  size_t grain = 0;
  std::function<void(size_t offset, size_t len)> on_piece;
};

struct Watch {
  int fd = -1;                    // polled for readability while waiting; -1 = none
  std::function<void()> service;  // called when fd is readable, and now and then anyway
};

class Comm {
 public:
  // channels[r] is the channel to rank r (nullptr for r == rank).
  Comm(int rank, int size, std::vector<std::unique_ptr<Channel>> channels, size_t max_frame);
  ~Comm();

  int rank() const { return rank_; }
  int size() const { return size_; }
  size_t max_frame() const { return max_frame_; }
  Channel& channel(int peer) { return *channels_[peer]; }

  void set_watch(Watch w) { watch_ = std::move(w); }

  // Progress all sends and receives together; return when all are complete.
  // At most one SendOp and one RecvOp per peer per call.
  void exchange(const std::vector<SendOp>& sends, std::vector<RecvOp>& recvs);

  // Conveniences over exchange().
  void send(int peer, const void* data, size_t len);
  void recv(int peer, void* data, size_t len);
  void sendrecv(int dst, const void* sdata, size_t slen, int src, void* rdata, size_t rlen);

 private:
  int rank_, size_;
  std::vector<std::unique_ptr<Channel>> channels_;
  size_t max_frame_;
  Watch watch_;
};

}  // namespace appliance
