// Links: the rendezvous, and this rank's links to the others, each opened when first needed.
//
// At construction this rank listens on an ephemeral port of its data address, publishes its
// PeerInfo (bootstrap/peers.h) under "peer/<rank>" and reads every rank's in one bulk read
// (Store::get_many), which also yields the topology: two store requests per rank, whatever the
// job's size. From then on an acceptor thread takes the connections peers open to this rank.
//
// open(peer, channel) gives the Link of one channel (data or control) to one peer. One rank of
// the pair connects (data: the lower rank; control: the higher one, so a rank connects to its
// parent in a control tree, and every rank to rank 0 in a star), proves the job secret
// (transport/auth.h) and, when the pair can share memory, sets the channel's segment up
// (bootstrap/transports.h); the other rank's acceptor thread answers all of that by itself, and
// open() on that side takes the link the thread made, waiting for it if need be. A connecting
// rank only ever waits on the other's acceptor thread, never on its caller, so opens never
// deadlock, whatever order ranks open in.
// A job pays for the links its algorithms use: an allreduce-only job holds O(log N) of them.
//
// Failure modes: construction throws Error(kTimeout) naming the ranks that never published
// their PeerInfo, Error(kMismatch) naming a rank started with another job size, Error(kAuth)
// as the store's handshake does. open() throws Error(kPeerLost / kTimeout) naming the peer it
// could not reach or that never connected by the deadline, Error(kAuth) when a peer refuses
// our proof, or whatever the waiting callback throws. Strangers at the listener are refused
// and logged, rate-limited per source (common/log_limit.h).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bootstrap/options.h"
#include "bootstrap/peers.h"
#include "store/store.h"
#include "transport/channel.h"

namespace appliance {

const char* channel_name(int ch);     // "data" or "control"
std::string fmt_seconds(int64_t ms);  // "12.0 s", for timeout messages

// The address this rank listens on and publishes for `opts` (see MeshOptions::bind_addr).
std::string choose_listen_address(const MeshOptions& opts);

class Links {
 public:
  Links(Store& store, const MeshOptions& o);
  ~Links();
  Links(const Links&) = delete;
  Links& operator=(const Links&) = delete;

  const std::vector<PeerInfo>& peers() const;
  const Topology& topology() const;
  // The transport a link to `peer` takes ("shm", "tcp"; "self" for this rank).
  const char* kind(int peer) const;

  // Called while open() waits for a peer's connection: `fd` turns readable when a link
  // arrives; the callback returns after a while (a few ms) either way, and may throw.
  using Wait = std::function<void(int fd)>;
  // The Link of `channel` to `peer`, opened now; each (peer, channel) is opened once.
  LinkPtr open(int peer, int channel, Deadline d, const Wait& wait = {});
  // Whether this rank is the one that connects `channel` to `peer`.
  bool connects(int peer, int channel) const;
  // Stops accepting (the job failed or ends); idempotent.
  void close();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace appliance
