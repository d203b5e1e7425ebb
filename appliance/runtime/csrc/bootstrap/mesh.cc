// build_mesh: Store rendezvous -> authenticated links to every peer (see mesh.h).
#include "bootstrap/mesh.h"

#include <ifaddrs.h>
#include <netinet/in.h>
#include <unistd.h>
#include <arpa/inet.h>

#include <algorithm>
#include <map>
#include <set>

#include "bootstrap/acceptor.h"
#include "bootstrap/transports.h"
#include "common/status.h"
#include "transport/auth.h"
#include "transport/tcp/socket.h"

namespace appliance {

namespace {

std::string peer_key(int rank) { return "peer/" + std::to_string(rank); }

std::string join_ints(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}

int64_t remaining_ms(Deadline d) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(d - Clock::now()).count();
  return std::max<int64_t>(0, ms);
}

std::string first_non_loopback_ipv4() {
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) return "";
  std::string out;
  for (ifaddrs* i = ifs; i && out.empty(); i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    auto* a = reinterpret_cast<sockaddr_in*>(i->ifa_addr);
    if ((ntohl(a->sin_addr.s_addr) >> 24) == 127) continue;
    char buf[INET_ADDRSTRLEN];
    if (inet_ntop(AF_INET, &a->sin_addr, buf, sizeof(buf))) out = buf;
  }
  freeifaddrs(ifs);
  return out;
}

bool is_wildcard(const std::string& a) { return a.empty() || a == "0.0.0.0" || a == "*"; }

// Publishes `self` and reads every rank's PeerInfo (rank order), naming the ranks that never
// published theirs when the deadline passes.
std::vector<PeerInfo> exchange_peers(Store& store, const PeerInfo& self, const MeshOptions& opts, Deadline deadline) {
  const int me = opts.rank, n = opts.size;
  store.set(peer_key(me), encode_peer(self, n));
  std::vector<std::string> keys;
  for (int r = 0; r < n; ++r) keys.push_back(peer_key(r));
  try {
    store.wait(keys, remaining_ms(deadline));
  } catch (const Error& e) {
    if (e.status().code != Code::kTimeout) throw;
    std::vector<int> missing;
    for (int r = 0; r < n; ++r) {
      try {
        store.get(peer_key(r), 0);
      } catch (const Error& e2) {
        if (e2.status().code != Code::kTimeout) throw;
        missing.push_back(r);
      }
    }
    if (missing.empty()) throw;
    throw Error(Code::kTimeout,
                "rank " + std::to_string(me) + " timed out after " + fmt_seconds(opts.timeout_ms) +
                    " waiting for rank(s) " + join_ints(missing) + " to join (" +
                    std::to_string(n - static_cast<int>(missing.size())) + " of " + std::to_string(n) + " arrived)",
                missing.front());
  }
  std::vector<PeerInfo> peers(n);
  for (int r = 0; r < n; ++r) peers[r] = decode_peer(store.get(peer_key(r), remaining_ms(deadline)), r, n);
  return peers;
}

// The channels this rank opens itself, authenticated: data to every higher rank, and control
// to every other rank when this is rank 0. Throws naming the channel and the rank.
void connect_up(const std::vector<PeerInfo>& peers, const MeshOptions& opts, Deadline deadline,
                std::map<PairKey, int>& mine) {
  const int me = opts.rank, n = opts.size;
  for (int r = me + 1; r < n; ++r) {
    const PeerInfo& p = peers[r];
    std::vector<int> channels{kDataChannel};
    if (me == 0) channels.push_back(kControlChannel);
    for (int ch : channels) {
      const std::string what = "rank " + std::to_string(r) + " (" + p.host + ")";
      int fd = -1;
      try {
        fd = connect_tcp(p.addr, p.port, deadline, what, opts.peer_timeout_ms);
        auth_connect(fd, opts.auth, r, ch, deadline);
      } catch (const Error& e) {
        if (fd >= 0) ::close(fd);
        Status s = e.status();
        if (s.origin_rank < 0) s.origin_rank = r;
        if (s.host.empty()) s.host = p.host;
        s.message = std::string(channel_name(ch)) + " link from rank " + std::to_string(me) + ": " + s.message;
        throw Error(s);
      }
      mine[{r, ch}] = fd;
    }
  }
}

}  // namespace

std::string choose_listen_address(const MeshOptions& opts) {
  if (!is_wildcard(opts.bind_addr)) return opts.bind_addr;
  std::string a = route_address(opts.store_host);
  if (!a.empty()) return a;
  a = first_non_loopback_ipv4();
  return a.empty() ? "127.0.0.1" : a;
}

Mesh build_mesh(Store& store, const MeshOptions& opts) {
  if (opts.size < 1 || opts.rank < 0 || opts.rank >= opts.size)
    throw Error(Code::kInvalid, "rank " + std::to_string(opts.rank) + " outside a job of size " + std::to_string(opts.size));
  const Deadline deadline = deadline_after_ms(opts.timeout_ms);
  const int me = opts.rank, n = opts.size;

  PeerInfo self;
  self.rank = me;
  self.host = opts.host.empty() ? local_hostname() : opts.host;
  self.host_key = local_host_key();
  self.addr = choose_listen_address(opts);
  // A wildcard bind_addr listens everywhere but publishes the address that routes.
  Listener listener = listen_tcp(is_wildcard(opts.bind_addr) && !opts.bind_addr.empty() ? "" : self.addr, 0);
  self.port = listener.port;

  // Who connects to us: every lower rank on data, rank 0 on control.
  std::set<PairKey> expected;
  for (int r = 0; r < me; ++r) expected.insert({r, kDataChannel});
  if (me > 0) expected.insert({0, kControlChannel});
  Acceptor acceptor(listener, opts, expected, deadline);

  Mesh mesh;
  mesh.peers = exchange_peers(store, self, opts, deadline);
  std::vector<std::string> hosts;
  for (const auto& p : mesh.peers) hosts.push_back(p.host);
  mesh.topo = compute_topology(hosts, me);

  // Every channel as an authenticated socket, keyed and ordered by (peer rank, channel).
  std::map<PairKey, int> sockets;
  try {
    connect_up(mesh.peers, opts, deadline, sockets);
    std::map<PairKey, int> theirs = acceptor.finish();
    sockets.insert(theirs.begin(), theirs.end());
  } catch (...) {
    acceptor.stop();
    for (auto& kv : sockets) ::close(kv.second);
    throw;
  }

  // Per pair, the first transport that can carry it; each prepares its channels.
  std::vector<ChannelSocket> chans;
  for (const auto& [key, fd] : sockets) {
    ChannelSocket c;
    c.peer = key.first;
    c.channel = key.second;
    c.fd = fd;
    c.peer_host = mesh.peers[c.peer].host;
    c.transport = &select_transport(self, mesh.peers[c.peer], opts);
    chans.push_back(std::move(c));
  }
  try {
    setup_transports(chans, opts, deadline);
  } catch (...) {
    for (auto& c : chans) ::close(c.fd);
    throw;
  }
  report_transports(self, mesh.peers, chans, opts);

  mesh.data.resize(n);
  mesh.control.resize(me == 0 ? n : 1);
  for (ChannelSocket& c : chans) {
    LinkPtr link = connect_channel(c);
    if (c.channel == kDataChannel) {
      mesh.data[c.peer] = std::move(link);
    } else {
      mesh.control[me == 0 ? c.peer : 0] = std::move(link);
    }
  }
  return mesh;
}

}  // namespace appliance
