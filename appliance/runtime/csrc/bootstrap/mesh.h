// Mesh: turns a Store and this rank's identity into authenticated links to its peers.
//
// Each rank listens on an ephemeral port of its data address, publishes its PeerInfo
// (bootstrap/peers.h: host name, host identity, address, port) under "peer/<rank>", reads
// everyone's, and then each pair connects (the lower rank connects to the higher one). Per pair
// it opens the channels asked for: channel 0 (data) between every pair; channel 1 (control)
// only between rank 0 and each other rank. Each channel connects over TCP and proves the job
// secret (transport/auth.h); then the pair's transport (bootstrap/transports.h: shared memory
// on one host, TCP otherwise) turns it into a Link. The same exchange yields the topology
// (peers.h compute_topology).
//
// Connections: every rank runs an acceptor (bootstrap/acceptor.h) while it connects to the
// ranks above it. Failures: Error(kTimeout) naming the ranks that never published their
// PeerInfo, never connected, or could not be reached; Error(kAuth) when a peer refuses our proof
// or fails to prove the job secret; Error(kMismatch) when ranks disagree on the job size. Every
// wait is bounded by MeshOptions::timeout_ms overall. The listener is closed before build_mesh
// returns.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bootstrap/peers.h"
#include "store/store.h"
#include "transport/link.h"

namespace appliance {

struct MeshOptions {
  int rank = 0, size = 1;
  std::string host;          // see PeerInfo::host
  std::string bind_addr;     // address to listen on and publish ("" = pick one that routes;
                             // "0.0.0.0" = listen on all, publish the one that routes)
  std::string store_host;    // with bind_addr "": listen on the interface that routes here
  bool allow_shm = false;    // shared memory between ranks of one host
  uint64_t shm_ring_bytes = 1 << 20;  // per direction and pair
  int64_t timeout_ms = 60000;
  int peer_timeout_ms = 10000;  // TCP_USER_TIMEOUT / keepalive budget
  AuthParams auth;
};

struct Mesh {
  std::vector<PeerInfo> peers;       // indexed by rank
  std::vector<LinkPtr> data;         // indexed by rank; null for self
  std::vector<LinkPtr> control;      // rank 0: indexed by rank (null for self); others: [0] only
  Topology topo;
};

Mesh build_mesh(Store& store, const MeshOptions& opts);

// The address build_mesh listens on and publishes for `opts` (see MeshOptions::bind_addr).
std::string choose_listen_address(const MeshOptions& opts);

}  // namespace appliance
