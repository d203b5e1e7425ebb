// Transports of a pair: how each channel between two ranks travels, decided here and only here.
//
// Every channel first exists as a TCP connection that proved the job secret (bootstrap/links.h).
// The table (pair_transports()) lists the transports best first, as NCCL's does: a pair takes
// the first whose can_connect holds (select_transport, NCCL's selectTransport). Shared memory
// needs both ranks on one machine and IPC namespace with the same /dev/shm (peers.h
// shm_possible) and MeshOptions::allow_shm; TCP carries any pair. A transport with a pairing
// step runs it on the channel's socket, from both ends (the rank that connected, and the one
// that accepted); connect then turns the socket into the channel's Link. Shared memory: each
// channel of the pair gets its own segment (transport/shm), and the channel's authenticated
// socket stays as its doorbell and liveness. A channel whose pairing fails is not an error: it
// falls back to TCP, the table's last entry (no pairing, connects any pair).
//
// report_unshared() prints one line naming the ranks that share this rank's kernel but not
// its /dev/shm (containers without --ipc host or a common /dev/shm); report_fallback() one per
// channel that fell back.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "bootstrap/options.h"
#include "bootstrap/peers.h"
#include "transport/channel.h"
#include "transport/link.h"
#include "transport/shm/shm_segment.h"

namespace appliance {

struct PairTransport;

// One channel of a pair between connection and Link.
struct ChannelSocket {
  int peer = -1;
  int channel = 0;                // kDataChannel or kControlChannel
  int fd = -1;                    // connected and authenticated; connect() takes it
  std::string peer_host;
  const PairTransport* transport = nullptr;  // chosen for the pair
  // What pairing prepared (shared memory: the channel's segment, and this rank's side of it).
  std::shared_ptr<ShmSegment> shm;
  int shm_side = 0;
  std::string why;  // why pairing could not prepare the channel (it falls back to TCP)
};

struct PairTransport {
  const char* name;  // what Link::kind() of its links says: "shm", "tcp"
  bool (*can_connect)(const PeerInfo& me, const PeerInfo& peer, const MeshOptions& o);
  // Prepares one channel from one end (`initiator`: this rank connected); null: nothing to
  // prepare. Throws as a handshake does when the peer dies or times out during it.
  void (*pair)(ChannelSocket& c, bool initiator, const MeshOptions& o, Deadline d);
  // The channel's Link over its socket; null when pairing could not prepare the channel.
  LinkPtr (*connect)(ChannelSocket& c);
};

// The transports, best first; the last one (TCP) connects every pair.
const std::vector<PairTransport>& pair_transports();
const PairTransport& select_transport(const PeerInfo& me, const PeerInfo& peer, const MeshOptions& o);

// Pairs the channel on its transport (if it has a pairing step) and returns its Link: the
// transport's, or TCP's when pairing could not prepare it (c.why says why).
LinkPtr link_channel(ChannelSocket& c, bool initiator, const MeshOptions& o, Deadline d);
// The stderr lines about pairs that could have shared memory and do not (see above).
void report_unshared(const PeerInfo& me, const std::vector<PeerInfo>& peers, const MeshOptions& o);
void report_fallback(const MeshOptions& o, const ChannelSocket& c);

}  // namespace appliance
