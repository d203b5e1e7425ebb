// ControlPlane: this rank's control links (the peers its negotiator talks to), the frames on
// them, heartbeats, and the job-wide abort.
//
// What it owns: one Channel per control peer, an epoll set of their wait handles (the engine
// sleeps on it; a collective's Watch polls it), and per peer when a frame last came and went.
// read() drains every link without blocking: CONTROL payloads go to the caller's inbox, a BYE
// marks the peer gone (the caller hears of it through `left`), and so does the negotiator's
// GONE (which goes to the inbox too): after either the peer may close its end at any time, and
// that is not a failure. Heartbeats only prove life.
// An ABORT throws its status (the origin rank is inside); abort() sends one to every peer but
// the one it came from, so an abort floods whatever topology the links form.
//
// Heartbeats: every link that has been quiet for the interval gets one; a peer silent past
// the timeout is first-hand evidence of a lost rank (heartbeat_verdict, pure: time passed in).
// Failure modes: Error(kPeerLost) naming the peer (EOF, reset, silence), Error(kProtocol)
// naming it (a frame that has no business on a control link), an ABORT's status.
#pragma once

#include <chrono>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "transport/channel.h"

namespace appliance {

// Of the peers silent for longer than `timeout` (last_recv per peer, -1 entries ignored), the
// one silent the longest; -1 when none is.
int heartbeat_verdict(const std::vector<Clock::time_point>& last_recv, const std::vector<int>& peers,
                      Clock::time_point now, Clock::duration timeout);
// How often a quiet link carries a heartbeat for a timeout of `timeout_s` (a quarter of it,
// between 50 ms and 1 s).
int64_t heartbeat_interval_ms(double timeout_s);

class ControlPlane {
 public:
  struct Inbound {
    int from;
    std::vector<uint8_t> payload;
  };

  ControlPlane(int rank, int size, double heartbeat_timeout_s, std::vector<std::string> hosts);
  ~ControlPlane();
  ControlPlane(const ControlPlane&) = delete;
  ControlPlane& operator=(const ControlPlane&) = delete;

  // A control link to `peer`, from now on read, heartbeaten and aborted through.
  void add(int peer, std::unique_ptr<Channel> ch);
  bool has(int peer) const { return peer >= 0 && peer < static_cast<int>(peers_.size()) && peers_[peer].ch; }
  bool live(int peer) const { return has(peer) && !peers_[peer].gone; }
  const std::vector<int>& peers() const { return ranks_; }
  int epoll_fd() const { return epoll_fd_; }

  // Drains every live link: CONTROL payloads into `inbox`, peers that said BYE into `left`.
  void read(std::deque<Inbound>& inbox, std::vector<int>& left);
  // Sends one CONTROL frame (to a live peer; a peer that left is skipped).
  void send(int peer, const std::vector<uint8_t>& payload);
  // Heartbeats due at `now`; throws kPeerLost naming a peer silent past the timeout.
  void heartbeats(Clock::time_point now);
  // Milliseconds until the next heartbeat is due at the latest (-1: none).
  int64_t next_heartbeat_ms() const;
  // Before sleeping: arms the links that wake only when armed (shm); true when one of them has
  // bytes already (do not sleep).
  bool arm();
  // Sends ABORT(s) to every live peer but `skip_peer`; never throws.
  void abort(const Status& s, int skip_peer);
  // Orderly shutdown: BYE to every live peer; never throws.
  void bye();

  // The peer the last ABORT came from (-1: none), and whether the failure is silence seen here.
  int abort_from() const { return abort_from_; }
  bool silence_seen() const { return silence_seen_; }
  // A closed data link may only mean the peer gave up because of someone else: waits up to a
  // second for an ABORT naming the real origin and returns it, else `s`.
  Status await_better_cause(const Status& s, std::deque<Inbound>& inbox, std::vector<int>& left);

 private:
  struct Peer {
    std::unique_ptr<Channel> ch;
    Clock::time_point last_recv, last_send;
    bool gone = false;  // said BYE
  };
  std::string host_of(int rank) const;

  int rank_, size_;
  double timeout_s_;
  int64_t interval_ms_;
  std::vector<std::string> hosts_;
  std::vector<Peer> peers_;  // by rank
  std::vector<int> ranks_;   // the ranks with a link, ascending
  int epoll_fd_ = -1;
  int abort_from_ = -1;
  bool silence_seen_ = false;
};

}  // namespace appliance
