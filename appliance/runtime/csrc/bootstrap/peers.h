// Peers: what each rank publishes about itself at the rendezvous (PeerInfo and its bytes), and
// what follows from everyone's: the topology (horovodrun's local and cross ranks) and whether
// two ranks can share memory (their host keys). Pure logic, except local_host_key(), which
// reads this process's kernel and namespaces.
//
// Topology, exactly horovodrun's rule: local_rank/local_size count the ranks with the same
// host name, in rank order; the cross group of a rank is every rank with the same local_rank,
// cross_rank is its index there (hosts in order of first appearance) and cross_size the
// group's size. With the same number of ranks per host that is "index of my host" and
// "number of hosts"; with uneven hosts (A:2, B:1) rank 1 (A, local 1) has cross_size 1, as in
// Horovod.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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

// Topology of `rank` from everyone's host names (rank order).
Topology compute_topology(const std::vector<std::string>& hosts, int rank);

// PeerInfo as published under the store key "peer/<rank>", with the job size its rank was
// started with. decode_peer throws Error(kProtocol) on malformed bytes, a wrong rank or port,
// and Error(kMismatch) naming the rank when its size differs from `my_size`.
std::vector<uint8_t> encode_peer(const PeerInfo& p, int size);
PeerInfo decode_peer(const std::vector<uint8_t>& b, int expect_rank, int my_size);

// This process's host_key: "<gethostname()>/<boot id>/ipc:<IPC namespace inode>/shm:<st_dev
// of /dev/shm>". Read from the kernel, not from HOROVOD_HOSTNAME, so two simulated "hosts"
// on one machine differ in PeerInfo::host but the key still tells that shm could work.
std::string local_host_key();
// gethostname(), or "localhost".
std::string local_hostname();

// Shared memory needs one kernel, IPC namespace and /dev/shm (host keys equal after the host
// name, which does not matter: containers have their own).
bool shm_possible(const PeerInfo& a, const PeerInfo& b);
// One kernel instance (the boot id field), whether or not /dev/shm is shared.
bool same_kernel(const PeerInfo& a, const PeerInfo& b);

}  // namespace appliance
