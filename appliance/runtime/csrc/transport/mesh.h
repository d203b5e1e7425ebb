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
// horovodrun lays them out. Exactly horovodrun's rule: the cross group of a rank is every
// rank with the same local_rank; cross_rank is its index there (hosts in order of first
// appearance) and cross_size the group's size. With the same number of ranks per host that
// is "index of my host" and "number of hosts"; with uneven hosts (A:2, B:1) rank 1 (A,
// local 1) has cross_size 1, as in Horovod.
//
// Connections: every rank runs an acceptor (a thread polling the listener and all pending
// handshakes, so a silent stranger never stalls the rest) while it connects to the ranks
// above it. Accepted connections are matched by the (rank, channel) their HELLO proved, in
// whatever order they come; strangers and unexpected duplicates are logged to stderr and
// dropped. Failures: Error(kTimeout) naming the ranks that never published their PeerInfo,
// never connected, or could not be reached; Error(kAuth) when a peer refuses our proof or
// fails to prove the job secret; Error(kMismatch) when ranks disagree on the job size.
// Every wait is bounded by MeshOptions::timeout_ms overall. The listener is closed before
// build_mesh returns.
//
// IMPLEMENTATION OWNER: see csrc/README.md (bootstrap work package).
#pragma once

#include <cstdint>
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

// Pure: topology of `rank` from everyone's host names (rank order).
Topology compute_topology(const std::vector<std::string>& hosts, int rank);

// The one place the transport of a pair is decided. Shared memory needs both ranks on one
// machine and IPC namespace with the same /dev/shm (same host_key) and allow_shm. Each
// channel of such a pair (data; control, when one of the two is rank 0) becomes a ShmLink
// (transport/shm) with its own segment, whose doorbell is the channel's authenticated socket
// (the engine arms control links before it sleeps on their doorbells with epoll). A
// pair whose shm setup fails stays on TCP and this rank prints one line saying why; so does
// a rank whose peers share its kernel (boot id) but not its /dev/shm (containers without
// --ipc host or a shared /dev/shm).
enum class TransportKind { kTcp, kShm };
bool shm_possible(const PeerInfo& a, const PeerInfo& b);
TransportKind choose_transport(const PeerInfo& me, const PeerInfo& peer, bool allow_shm);

// This process's host_key: "<gethostname()>/<boot id>/ipc:<IPC namespace inode>/shm:<st_dev
// of /dev/shm>". Read from the kernel, not from HOROVOD_HOSTNAME, so two simulated "hosts"
// on one machine differ in PeerInfo::host but the key still tells that shm could work.
std::string local_host_key();

// The address build_mesh listens on and publishes for `opts` (see MeshOptions::bind_addr).
std::string choose_listen_address(const MeshOptions& opts);

}  // namespace appliance
