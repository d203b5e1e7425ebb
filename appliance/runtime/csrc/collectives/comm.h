// Comm: what collective algorithms see of the world. Ranks 0..size-1, one data Channel per
// peer, and a progress engine that moves several sends and receives at once.
//
// Channels are opened when an exchange first needs them (the job's Comm asks its Opener, which
// may wait for the peer, servicing the Watch meanwhile), so a job holds links only to the peers
// its algorithms talk to; a Comm built from a full set of channels opens nothing.
// A process set's Comm is a view of the job's Comm (the constructor taking a parent and the
// members' job ranks): ranks 0..members-1 in member order, the parent's channels to those
// members (opened through the parent), the parent's Watch, its own workspace. Both are used
// from one thread, one collective at a time, so their frames never interleave on a shared
// channel.
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
// Progress: every pending op is pumped without blocking; when nothing moved, exchange()
// poll()s all involved fds plus the Watch fd (links without an fd: spin/yield/sleep backoff).
// The Watch is serviced when its fd is readable and at least every ~100 ms (kWatchPeriodMs),
// even while data flows. RecvOp::on_piece runs on the calling thread between pumps.
// Comm also owns a reusable, 64-byte aligned workspace for the algorithms' scratch (grown on
// demand, never shrunk), so large collectives do not allocate on the hot path.
//
// Failure modes: Error(kPeerLost) naming the lost rank (from the link), Error(kProtocol)
// naming the peer (from the channel), whatever the Watch callback throws. After any throw
// the Comm is unusable (frames may be half sent); the engine tears it down.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <vector>

#include "transport/channel.h"

namespace appliance {

struct SendOp {
  int peer;
  const void* data;
  size_t len;
  // Frame size for this message: frames of min(piece, max_frame) bytes (0 = max_frame).
  // Sender and receiver must use the same value (both derive it from the same options).
  size_t piece = 0;
};

struct RecvOp {
  int peer;
  void* data;
  size_t len;
  // Optional: called as contiguous prefixes of `data` complete, with granularity `grain`
  // bytes (the last piece may be shorter), so callers can reduce while more arrives.
  // Never called for an empty message.
  size_t grain = 0;
  std::function<void(size_t offset, size_t len)> on_piece;
  // Frame size, as SendOp::piece (must match the sender's).
  size_t piece = 0;
  // Optional staging buffer of at least one frame: each frame lands here instead of in
  // `data` (which is then unused) and on_piece(offset, n) fires once per frame, with the
  // frame's bytes at stage[0, n). Keeps reductions in cache and scratch memory small.
  void* stage = nullptr;
};

struct Watch {
  int fd = -1;                    // polled for readability while waiting; -1 = none
  std::function<void()> service;  // called when fd is readable, and now and then anyway
  // Called before each poll (may be empty): arms the wake-ups of what fd stands for (links that
  // only signal when armed, as shm's); true when something is readable already (then service).
  std::function<bool()> arm;
};

class Comm {
 public:
  // Opens the channel to a peer (blocking; throws as Links::open does).
  using Opener = std::function<std::unique_ptr<Channel>(int peer)>;
  // channels[r] is the channel to rank r (nullptr for r == rank).
  Comm(int rank, int size, std::vector<std::unique_ptr<Channel>> channels, size_t max_frame);
  // Channels opened by `open` on first use.
  Comm(int rank, int size, size_t max_frame, Opener open);
  // A view for a process set: `members` are job ranks (sorted, holding parent.rank()). The
  // parent must outlive the view.
  Comm(Comm& parent, const std::vector<int>& members);
  ~Comm();

  int rank() const { return rank_; }
  int size() const { return size_; }
  size_t max_frame() const { return max_frame_; }
  // DATA frames this Comm and its views have sent (any thread may read it).
  uint64_t frames_sent() const { return frames_sent_.load(std::memory_order_relaxed); }
  // The channel to `peer`, opened now if it is not yet.
  Channel& channel(int peer);
  bool has_channel(int peer) const { return peers_[peer] != nullptr; }

  static constexpr int kWatchPeriodMs = 100;

  void set_watch(Watch w) { watch_ = std::move(w); }

  // Progress all sends and receives together; return when all are complete.
  // At most one SendOp and one RecvOp per peer per call.
  void exchange(const std::vector<SendOp>& sends, std::vector<RecvOp>& recvs);

  // Conveniences over exchange().
  void send(int peer, const void* data, size_t len);
  void recv(int peer, void* data, size_t len);
  void sendrecv(int dst, const void* sdata, size_t slen, int src, void* rdata, size_t rlen);

  // Scratch of at least `bytes` bytes, 64-byte aligned; stays valid until a later call
  // asks for more (contents are not preserved when it grows).
  void* workspace(size_t bytes);

 private:
  struct SendState;
  struct RecvState;
  bool pump(std::vector<SendState>& ss, std::vector<RecvState>& rs, bool* all_done);
  void wait_for_progress(const std::vector<SendState>& ss, const std::vector<RecvState>& rs);
  void service_watch();
  size_t frame_size(size_t piece) const;

  int rank_, size_;
  std::vector<std::unique_ptr<Channel>> channels_;  // owned (the job's Comm; empty in a view)
  std::vector<Channel*> peers_;                      // by rank of this Comm (nullptr: self, or not open yet)
  Opener open_;                                      // the job's Comm: opens a missing channel
  Comm* parent_ = nullptr;                           // a view: opens through its parent
  std::vector<int> members_;                         // a view: job rank of each of its ranks
  size_t max_frame_;
  std::atomic<uint64_t> frames_sent_{0};  // one writer (the engine's turn): a plain add
  Watch watch_;
  Clock::time_point last_service_;
  Backoff backoff_;
  struct AlignedFree {
    void operator()(uint8_t* p) const;
  };
  std::unique_ptr<uint8_t, AlignedFree> workspace_;
  size_t workspace_size_ = 0;
};

}  // namespace appliance
