// Transports of a pair: how each channel between two ranks travels, decided here and only here.
//
// Every channel first exists as a TCP connection that proved the job secret (build_mesh). The
// table (pair_transports()) lists the transports best first, as NCCL's does: a pair takes the
// first whose can_connect holds (select_transport, NCCL's selectTransport). Shared memory
// needs both ranks on one machine and IPC namespace with the same /dev/shm (peers.h
// shm_possible) and MeshOptions::allow_shm; TCP carries any pair. A transport with a setup
// step prepares all the channels that chose it at once; connect then turns a channel's socket
// into its Link. Shared memory: each channel of the pair (data; control, when one of the two is
// rank 0) gets its own segment (transport/shm), and the channel's authenticated socket stays
// as its doorbell and liveness. A channel whose setup fails is not an error: it falls back to
// TCP, the table's last entry (no setup, connects any pair).
//
// report_transports() prints one line per fallback, and one naming the ranks that share this
// rank's kernel but not its /dev/shm (containers without --ipc host or a common /dev/shm).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "bootstrap/mesh.h"
#include "bootstrap/peers.h"
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
  // What setup prepared (shared memory: the channel's segment, and this rank's side of it).
  std::shared_ptr<ShmSegment> shm;
  int shm_side = 0;
  std::string why;  // why setup could not prepare the channel (it falls back to TCP)
};

struct PairTransport {
  const char* name;  // what Link::kind() of its links says: "shm", "tcp"
  bool (*can_connect)(const PeerInfo& me, const PeerInfo& peer, const MeshOptions& o);
  // Prepares every channel that chose this transport, all at once; null: nothing to prepare.
  // Throws as a handshake does when a peer dies or times out during it.
  void (*setup)(std::vector<ChannelSocket*>& chans, const MeshOptions& o, Deadline d);
  // The channel's Link over its socket; null when setup could not prepare the channel.
  LinkPtr (*connect)(ChannelSocket& c);
};

// The transports, best first; the last one (TCP) connects every pair.
const std::vector<PairTransport>& pair_transports();
const PairTransport& select_transport(const PeerInfo& me, const PeerInfo& peer, const MeshOptions& o);

// Runs each transport's setup over the channels that chose it (in (peer, channel) order).
void setup_transports(std::vector<ChannelSocket>& chans, const MeshOptions& o, Deadline d);
// The Link of a prepared channel: its transport's, or TCP's when that could not prepare it.
LinkPtr connect_channel(ChannelSocket& c);
// The stderr lines about pairs that could have shared memory and do not (see above).
void report_transports(const PeerInfo& me, const std::vector<PeerInfo>& peers, const std::vector<ChannelSocket>& chans,
                       const MeshOptions& o);

}  // namespace appliance
