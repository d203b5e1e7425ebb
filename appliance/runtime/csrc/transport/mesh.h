// Mesh: turns a Store and this rank's identity into authenticated links to its peers.
//
// Each rank listens on an ephemeral port of its data address, publishes
// {host name, host identity, address, port} under "peer/<rank>", reads everyone's, and then
// each pair connects (the lower rank connects to the higher one). Per pair it opens the
// channels asked for: channel 0 (data) between every pair; channel 1 (control) only between
// rank 0 and each other rank. The transport of a pair is chosen here and only here: shared
// memory when both ranks share a host identity and shm is enabled, TCP otherwise.
//
// The same exchange yields the topology: local_rank/local_size (ranks with the same host
// name, in rank order) and cross_rank/cross_size (hosts in order of their lowest rank), as
// horovodrun lays them out.
//
// IMPLEMENTATION OWNER: see csrc/README.md (bootstrap work package).
#pragma once

#include <string>
#include <vector>

#include "store/store.h"
#include "transport/link.h"

namespace appliance {

struct PeerInfo {
  int rank = -1;
  std::string host;      // host name as the launcher names it (HOROVOD_HOSTNAME) or gethostname()
  std::string host_key;  // identity of the machine + IPC namespace: same key => shm possible
  std::string addr;      // address peers connect to
  int port = 0;
};

struct Topology {
  int local_rank = 0, local_size = 1, cross_rank = 0, cross_size = 1;
};

struct MeshOptions {
  int rank = 0, size = 1;
  std::string host;          // see PeerInfo::host
  std::string bind_addr;     // address to listen on and publish ("" = pick one that routes)
  bool allow_shm = false;    // shared memory between ranks of one host
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

// Pure: topology of `rank` from everyone's host names (rank order).
Topology compute_topology(const std::vector<std::string>& hosts, int rank);

}  // namespace appliance
