// The transport table of a pair and its shared-memory setup (see transports.h).
#include "bootstrap/transports.h"

#include <cstdio>

#include "transport/auth.h"
#include "transport/shm/shm_link.h"
#include "transport/shm/shm_pairing.h"
#include "transport/tcp/tcp_link.h"

namespace appliance {

namespace {

std::string who(const ChannelSocket& c) {
  return "rank " + std::to_string(c.peer) + (c.channel == kControlChannel ? " (control)" : "");
}

std::string join_ints(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}

// ---- shared memory ----------------------------------------------------------------------------

bool shm_can_connect(const PeerInfo& me, const PeerInfo& peer, const MeshOptions& o) {
  return o.allow_shm && shm_possible(me, peer);
}

// The connecting rank offers a segment and reads the answer; the accepting rank maps it and
// answers (transport/shm/shm_pairing.h). Only the initiator waits on the other, and the other
// answers from its acceptor thread, so no rank waits on one that is itself waiting.
void shm_pair(ChannelSocket& c, bool initiator, const MeshOptions& o, Deadline d) {
  if (initiator) {
    ShmOffer offer = shm_offer(c.fd, o.rank, c.peer, o.shm_ring_bytes, d, who(c));
    if (shm_confirm(offer, d, who(c))) {
      c.shm = offer.seg;
      c.shm_side = 0;
    } else {
      c.why = offer.why;
    }
  } else {
    c.shm = shm_accept(c.fd, d, who(c), &c.why);
    c.shm_side = 1;
  }
}

LinkPtr shm_connect(ChannelSocket& c) {
  if (!c.shm) return nullptr;
  LinkPtr link = std::make_unique<ShmLink>(c.shm, c.shm_side, c.fd, c.peer, c.peer_host);
  c.fd = -1;
  return link;
}

// ---- TCP --------------------------------------------------------------------------------------

bool tcp_can_connect(const PeerInfo&, const PeerInfo&, const MeshOptions&) { return true; }

LinkPtr tcp_connect(ChannelSocket& c) {
  LinkPtr link = std::make_unique<TcpLink>(c.fd, c.peer, c.peer_host);
  c.fd = -1;
  return link;
}

}  // namespace

const std::vector<PairTransport>& pair_transports() {
  static const std::vector<PairTransport> table{
      {"shm", shm_can_connect, shm_pair, shm_connect},
      {"tcp", tcp_can_connect, nullptr, tcp_connect},
  };
  return table;
}

const PairTransport& select_transport(const PeerInfo& me, const PeerInfo& peer, const MeshOptions& o) {
  for (const PairTransport& t : pair_transports())
    if (t.can_connect(me, peer, o)) return t;
  return pair_transports().back();
}

LinkPtr link_channel(ChannelSocket& c, bool initiator, const MeshOptions& o, Deadline d) {
  if (c.transport->pair) c.transport->pair(c, initiator, o, d);
  if (LinkPtr link = c.transport->connect(c)) return link;
  return pair_transports().back().connect(c);
}

void report_unshared(const PeerInfo& me, const std::vector<PeerInfo>& peers, const MeshOptions& o) {
  std::vector<int> unshared;  // same kernel, no common /dev/shm
  if (o.allow_shm)
    for (const PeerInfo& p : peers)
      if (p.rank != me.rank && !shm_possible(me, p) && same_kernel(me, p)) unshared.push_back(p.rank);
  if (!unshared.empty())
    std::fprintf(stderr,
                 "appliance: rank %d: rank(s) %s share this machine but not its /dev/shm (separate containers, "
                 "without --ipc host or a common /dev/shm): TCP with them, not shared memory\n",
                 me.rank, join_ints(unshared).c_str());
}

void report_fallback(const MeshOptions& o, const ChannelSocket& c) {
  if (!c.why.empty())
    std::fprintf(stderr, "appliance: rank %d: shared memory with %s: %s; using TCP\n", o.rank, who(c).c_str(), c.why.c_str());
}

}  // namespace appliance
