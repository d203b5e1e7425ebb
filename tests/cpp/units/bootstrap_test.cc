// The pure parts of bootstrap/: what a rank publishes (PeerInfo's bytes), the topology
// horovodrun would give, which pairs may share memory, and the transport table's choice.
#include <gtest/gtest.h>

#include "bootstrap/peers.h"
#include "bootstrap/transports.h"

namespace appliance {
namespace {

PeerInfo peer(int rank, const std::string& key) {
  PeerInfo p;
  p.rank = rank;
  p.host = "h" + std::to_string(rank);
  p.host_key = key;
  p.addr = "10.0.0." + std::to_string(rank + 1);
  p.port = 4000 + rank;
  return p;
}

TEST(Topology, counts_local_ranks_per_host_and_cross_ranks_per_local_rank) {
  const std::vector<std::string> hosts{"A", "A", "B", "B"};
  Topology t = compute_topology(hosts, 3);
  EXPECT_EQ(t.local_rank, 1);
  EXPECT_EQ(t.local_size, 2);
  EXPECT_EQ(t.cross_rank, 1);
  EXPECT_EQ(t.cross_size, 2);
}

TEST(Topology, on_uneven_hosts_follows_horovodrun) {
  const std::vector<std::string> hosts{"A", "A", "B"};  // A:2, B:1
  Topology r1 = compute_topology(hosts, 1);
  EXPECT_EQ(r1.local_rank, 1);
  EXPECT_EQ(r1.cross_rank, 0);
  EXPECT_EQ(r1.cross_size, 1);  // no other host has a local rank 1
  Topology r2 = compute_topology(hosts, 2);
  EXPECT_EQ(r2.local_rank, 0);
  EXPECT_EQ(r2.local_size, 1);
  EXPECT_EQ(r2.cross_rank, 1);
  EXPECT_EQ(r2.cross_size, 2);
}

TEST(PeerInfo, round_trips_through_the_bytes_a_rank_publishes) {
  PeerInfo p = peer(2, "h/boot/ipc:1/shm:2");
  PeerInfo back = decode_peer(encode_peer(p, 4), 2, 4);
  EXPECT_EQ(back.rank, 2);
  EXPECT_EQ(back.host, p.host);
  EXPECT_EQ(back.host_key, p.host_key);
  EXPECT_EQ(back.addr, p.addr);
  EXPECT_EQ(back.port, p.port);
}

Code decode_error(const std::vector<uint8_t>& b, int expect_rank, int size) {
  try {
    decode_peer(b, expect_rank, size);
  } catch (const Error& e) {
    return e.status().code;
  }
  return Code::kOk;
}

TEST(PeerInfo, a_wrong_rank_size_port_or_truncation_is_refused) {
  PeerInfo p = peer(1, "k");
  EXPECT_EQ(decode_error(encode_peer(p, 2), 0, 2), Code::kProtocol);  // claims another rank
  EXPECT_EQ(decode_error(encode_peer(p, 3), 1, 2), Code::kMismatch);  // started with another size
  p.port = 70000;
  EXPECT_EQ(decode_error(encode_peer(p, 2), 1, 2), Code::kProtocol);
  p.port = 1;
  std::vector<uint8_t> b = encode_peer(p, 2);
  b.pop_back();
  EXPECT_EQ(decode_error(b, 1, 2), Code::kProtocol);
  b.push_back(0);
  b.push_back(0);
  EXPECT_EQ(decode_error(b, 1, 2), Code::kProtocol);  // trailing bytes
}

TEST(HostKey, shared_memory_needs_the_same_kernel_ipc_namespace_and_dev_shm) {
  PeerInfo a = peer(0, "hostA/boot1/ipc:5/shm:9"), b = peer(1, "hostB/boot1/ipc:5/shm:9");
  EXPECT_TRUE(shm_possible(a, b));  // the host name does not matter (containers have their own)
  PeerInfo other_ns = peer(1, "hostA/boot1/ipc:6/shm:9");
  EXPECT_FALSE(shm_possible(a, other_ns));
  EXPECT_TRUE(same_kernel(a, other_ns));
  PeerInfo other_machine = peer(1, "hostA/boot2/ipc:5/shm:9");
  EXPECT_FALSE(shm_possible(a, other_machine));
  EXPECT_FALSE(same_kernel(a, other_machine));
  EXPECT_FALSE(shm_possible(peer(0, "nokey"), peer(1, "nokey")));
}

TEST(HostKey, this_process_has_one_with_every_field) {
  const std::string k = local_host_key();
  EXPECT_NE(k.find("/ipc:"), std::string::npos) << k;
  EXPECT_NE(k.find("/shm:"), std::string::npos) << k;
  PeerInfo me = peer(0, k), twin = peer(1, k);
  EXPECT_TRUE(shm_possible(me, twin));
}

TEST(PairTransports, shared_memory_comes_first_and_tcp_connects_any_pair) {
  const std::vector<PairTransport>& table = pair_transports();
  ASSERT_EQ(table.size(), 2u);
  EXPECT_STREQ(table.front().name, "shm");
  EXPECT_STREQ(table.back().name, "tcp");
  EXPECT_EQ(table.back().pair, nullptr);
  PeerInfo a = peer(0, "h/boot/ipc:1/shm:1"), same = peer(1, "x/boot/ipc:1/shm:1"), far = peer(1, "y/other/ipc:1/shm:1");
  MeshOptions o;
  o.allow_shm = true;
  EXPECT_STREQ(select_transport(a, same, o).name, "shm");
  EXPECT_STREQ(select_transport(a, far, o).name, "tcp");
  o.allow_shm = false;
  EXPECT_STREQ(select_transport(a, same, o).name, "tcp");
}

}  // namespace
}  // namespace appliance
