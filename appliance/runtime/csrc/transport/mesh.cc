// build_mesh: Store rendezvous -> authenticated links to every peer (see mesh.h).
#include "transport/mesh.h"

#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <arpa/inet.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "common/log_limit.h"
#include "common/status.h"
#include "transport/auth.h"
#include "transport/shm/shm_link.h"
#include "transport/shm/shm_pairing.h"
#include "transport/tcp/socket.h"
#include "transport/tcp/tcp_link.h"
#include "wire/codec.h"

namespace appliance {

namespace {

constexpr int64_t kPeerHandshakeTimeoutMs = 10000;  // per accepted connection

std::string peer_key(int rank) { return "peer/" + std::to_string(rank); }

std::string fmt_seconds(int64_t ms) {
  std::ostringstream os;
  os.precision(1);
  os << std::fixed << ms / 1000.0 << " s";
  return os.str();
}

std::string join_ints(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}

int64_t remaining_ms(Deadline d) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(d - Clock::now()).count();
  return std::max<int64_t>(0, ms);
}

std::string hostname() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

std::vector<uint8_t> encode_peer(const PeerInfo& p, int size) {
  Writer w;
  w.i32(p.rank);
  w.i32(size);
  w.str(p.host);
  w.str(p.host_key);
  w.str(p.addr);
  w.i32(p.port);
  return w.take();
}

PeerInfo decode_peer(const std::vector<uint8_t>& b, int expect_rank, int my_size) {
  Reader r(b.data(), b.size(), "peer info of rank " + std::to_string(expect_rank));
  PeerInfo p;
  p.rank = r.i32();
  int size = r.i32();
  p.host = r.str(1024);
  p.host_key = r.str(4096);
  p.addr = r.str(1024);
  p.port = r.i32();
  r.expect_done();
  if (p.rank != expect_rank) r.fail("it claims rank " + std::to_string(p.rank));
  if (size != my_size)
    throw Error(Code::kMismatch,
                "rank " + std::to_string(p.rank) + " was started with size " + std::to_string(size) + ", this rank with " +
                    std::to_string(my_size),
                p.rank, p.host);
  if (p.port <= 0 || p.port > 65535) r.fail("port " + std::to_string(p.port));
  return p;
}

// ---- the acceptor thread ----------------------------------------------------------------------

using PairKey = std::pair<int, int>;  // (peer rank, channel)

const char* channel_name(int ch) { return ch == kControlChannel ? "control" : "data"; }

class Acceptor {
 public:
  Acceptor(const Listener& l, const MeshOptions& o, std::set<PairKey> expected, Deadline d)
      : listener_(l), opts_(o), expected_(std::move(expected)), deadline_(d) {
    stop_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (stop_fd_ < 0) throw Error(Code::kInternal, std::string("eventfd: ") + std::strerror(errno));
    thread_ = std::thread([this] {
      try {
        run();
      } catch (...) {
        error_ = std::current_exception();
      }
    });
  }
  ~Acceptor() {
    stop();
    for (auto& kv : got_) ::close(kv.second);
    ::close(stop_fd_);
  }
  void stop() {
    if (!thread_.joinable()) return;
    uint64_t one = 1;
    ssize_t rc = ::write(stop_fd_, &one, sizeof(one));
    (void)rc;
    thread_.join();
  }
  // Waits for the thread to finish by itself (all expected connections or the deadline).
  std::map<PairKey, int> finish() {
    if (thread_.joinable()) thread_.join();
    if (error_) std::rethrow_exception(error_);
    return std::move(got_);
  }

 private:
  struct Pending {
    int fd;
    std::unique_ptr<AcceptorHandshake> hs;
    Deadline deadline;
  };

  void log(const std::string& msg) {
    std::fprintf(stderr, "[appliance mesh rank %d] %s\n", opts_.rank, msg.c_str());
    std::fflush(stderr);
  }
  // A line about a connection from `addr`, rate-limited per source (common/log_limit.h).
  void log_conn(const std::string& addr, const std::string& msg) {
    for (const auto& line : limiter_.admit(LogLimiter::source_of(addr), msg, Clock::now())) log(line);
  }

  void run();
  void step(Pending& p);  // drive one handshake; sets p.fd = -1 once it is over

  const Listener& listener_;
  const MeshOptions& opts_;
  std::set<PairKey> expected_;
  Deadline deadline_;
  int stop_fd_ = -1;
  std::thread thread_;
  std::exception_ptr error_;
  std::map<PairKey, int> got_;
  std::vector<Pending> pending_;
  LogLimiter limiter_;
};

void Acceptor::step(Pending& p) {
  AcceptorHandshake& hs = *p.hs;
  while (hs.state() == AcceptorHandshake::State::kRunning) {
    if (!hs.output().empty()) {
      try {
        flush_some_fd(p.fd, hs.output(), hs.peer_addr());
      } catch (const Error& e) {
        hs.fail(e.status().message);
        break;
      }
    }
    ssize_t k = ::recv(p.fd, hs.dst(), hs.want(), MSG_DONTWAIT);
    if (k > 0) {
      hs.received(static_cast<size_t>(k));
    } else if (k == 0) {
      hs.closed();
    } else if (errno == EINTR) {
      continue;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      break;
    } else {
      hs.fail(std::string(std::strerror(errno)) + " during the handshake");
    }
  }
  if (hs.state() == AcceptorHandshake::State::kRunning) return;
  // Verdict or refusal: a few dozen bytes, which a fresh socket always takes.
  if (!hs.output().empty()) {
    try {
      write_all(p.fd, hs.output().data(), hs.output().size(), deadline_after_ms(1000),
                "sending the handshake verdict to " + hs.peer_addr());
    } catch (const Error& e) {
      if (hs.state() == AcceptorHandshake::State::kAccepted) hs.fail(e.status().message);
    }
    hs.output().clear();
  }
  if (hs.state() == AcceptorHandshake::State::kAccepted) {
    PairKey key{hs.peer().rank, hs.peer().channel};
    if (!expected_.count(key)) {
      log_conn(hs.peer_addr(), "dropped an authenticated but unexpected " + std::string(channel_name(key.second)) + " connection from rank " +
          std::to_string(key.first) + " at " + hs.peer_addr());
    } else if (got_.count(key)) {
      log_conn(hs.peer_addr(), "dropped a duplicate " + std::string(channel_name(key.second)) + " connection from rank " +
          std::to_string(key.first) + " at " + hs.peer_addr());
    } else {
      got_[key] = p.fd;
      p.fd = -1;
    }
  } else {
    log_conn(hs.peer_addr(), hs.failure().message);
  }
  if (p.fd >= 0) ::close(p.fd);
  p.fd = -1;
}

void Acceptor::run() {
  struct Drain {  // what the limiter left out, said once when the acceptor ends
    Acceptor* a;
    ~Drain() {
      for (const auto& line : a->limiter_.drain(Clock::now())) a->log(line);
    }
  } drain{this};
  while (got_.size() < expected_.size()) {
    std::vector<pollfd> fds{pollfd{stop_fd_, POLLIN, 0}, pollfd{listener_.fd, POLLIN, 0}};
    Deadline wake = deadline_;
    for (auto& p : pending_) {
      fds.push_back(pollfd{p.fd, static_cast<short>(POLLIN | (p.hs->output().empty() ? 0 : POLLOUT)), 0});
      wake = std::min(wake, p.deadline);
    }
    int rc = ::poll(fds.data(), fds.size(), poll_timeout_ms(wake));
    if (rc < 0 && errno != EINTR) throw Error(Code::kInternal, std::string("poll: ") + std::strerror(errno));
    if (rc > 0 && fds[0].revents) {
      for (auto& p : pending_) ::close(p.fd);
      pending_.clear();
      return;  // stopped by build_mesh (it failed elsewhere)
    }
    if (rc > 0) {
      for (size_t i = 2; i < fds.size(); ++i)
        if (fds[i].revents) step(pending_[i - 2]);
      if (fds[1].revents) {
        for (;;) {
          std::string addr;
          int fd = accept_tcp(listener_, Clock::now(), &addr, opts_.peer_timeout_ms);
          if (fd < 0) break;
          fcntl(fd, F_SETFL, fcntl(fd, F_GETFL, 0) | O_NONBLOCK);
          pending_.push_back(Pending{fd, std::make_unique<AcceptorHandshake>(
                                             opts_.auth, addr, (1u << kDataChannel) | (1u << kControlChannel)),
                                     std::min(deadline_, deadline_after_ms(kPeerHandshakeTimeoutMs))});
        }
      }
    }
    const auto now = Clock::now();
    for (auto& p : pending_) {
      if (p.fd >= 0 && now >= p.deadline) {
        p.hs->fail("no complete handshake in time");
        log_conn(p.hs->peer_addr(), p.hs->failure().message);
        ::close(p.fd);
        p.fd = -1;
      }
    }
    pending_.erase(std::remove_if(pending_.begin(), pending_.end(), [](const Pending& p) { return p.fd < 0; }),
                   pending_.end());
    if (got_.size() < expected_.size() && now >= deadline_) {
      std::vector<std::string> missing;
      int first = -1;
      for (const auto& k : expected_) {
        if (got_.count(k)) continue;
        if (first < 0) first = k.first;
        missing.push_back("rank " + std::to_string(k.first) + " (" + channel_name(k.second) + ")");
      }
      std::string list;
      for (size_t i = 0; i < missing.size(); ++i) list += (i ? ", " : "") + missing[i];
      for (auto& p : pending_) ::close(p.fd);
      pending_.clear();
      throw Error(Code::kTimeout,
                  "rank " + std::to_string(opts_.rank) + " timed out after " + fmt_seconds(opts_.timeout_ms) +
                      " waiting for connections from " + list,
                  first);
    }
  }
  for (auto& p : pending_) ::close(p.fd);
  pending_.clear();
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

std::string read_first_line(const char* path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}

}  // namespace

// ---- public helpers ---------------------------------------------------------------------------

Topology compute_topology(const std::vector<std::string>& hosts, int rank) {
  APPLIANCE_ASSERT(rank >= 0 && rank < static_cast<int>(hosts.size()), "rank outside the host list");
  const int n = static_cast<int>(hosts.size());
  std::vector<int> local(n, 0);
  std::map<std::string, int> per_host;
  for (int r = 0; r < n; ++r) local[r] = per_host[hosts[r]]++;
  Topology t;
  t.local_rank = local[rank];
  t.local_size = per_host[hosts[rank]];
  // Cross group: ranks with my local_rank, in rank order (= hosts in order of appearance).
  t.cross_rank = 0;
  t.cross_size = 0;
  for (int r = 0; r < n; ++r) {
    if (local[r] != t.local_rank) continue;
    if (r < rank) ++t.cross_rank;
    ++t.cross_size;
  }
  return t;
}

namespace {

// Fields of a host key after the host name: "<boot id>/ipc:<ns>/shm:<dev>" (local_host_key()).
std::string machine_part(const std::string& key) {
  size_t i = key.find('/');
  return i == std::string::npos ? std::string() : key.substr(i + 1);
}

// Same kernel instance: the boot id field.
bool same_kernel(const PeerInfo& a, const PeerInfo& b) {
  std::string x = machine_part(a.host_key), y = machine_part(b.host_key);
  x = x.substr(0, x.find('/'));
  return !x.empty() && x == y.substr(0, y.find('/'));
}

}  // namespace

// The host name does not matter (containers have their own); kernel, IPC namespace and
// /dev/shm do.
bool shm_possible(const PeerInfo& a, const PeerInfo& b) {
  std::string x = machine_part(a.host_key);
  return !x.empty() && x == machine_part(b.host_key);
}

TransportKind choose_transport(const PeerInfo& me, const PeerInfo& peer, bool allow_shm) {
  return allow_shm && shm_possible(me, peer) ? TransportKind::kShm : TransportKind::kTcp;
}

std::string local_host_key() {
  std::string key = hostname();
  key += "/" + read_first_line("/proc/sys/kernel/random/boot_id");
  struct stat st;
  key += "/ipc:" + (stat("/proc/self/ns/ipc", &st) == 0 ? std::to_string(st.st_ino) : std::string("?"));
  key += "/shm:" + (stat("/dev/shm", &st) == 0 ? std::to_string(st.st_dev) : std::string("?"));
  return key;
}

bool is_wildcard(const std::string& a) { return a.empty() || a == "0.0.0.0" || a == "*"; }

std::string choose_listen_address(const MeshOptions& opts) {
  if (!is_wildcard(opts.bind_addr)) return opts.bind_addr;
  std::string a = route_address(opts.store_host);
  if (!a.empty()) return a;
  a = first_non_loopback_ipv4();
  return a.empty() ? "127.0.0.1" : a;
}

// ---- build_mesh -------------------------------------------------------------------------------

Mesh build_mesh(Store& store, const MeshOptions& opts) {
  if (opts.size < 1 || opts.rank < 0 || opts.rank >= opts.size)
    throw Error(Code::kInvalid, "rank " + std::to_string(opts.rank) + " outside a job of size " + std::to_string(opts.size));
  const Deadline deadline = deadline_after_ms(opts.timeout_ms);
  const int me = opts.rank, n = opts.size;

  PeerInfo self;
  self.rank = me;
  self.host = opts.host.empty() ? hostname() : opts.host;
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

  Mesh mesh;
  mesh.peers.resize(n);
  for (int r = 0; r < n; ++r) mesh.peers[r] = decode_peer(store.get(peer_key(r), remaining_ms(deadline)), r, n);
  std::vector<std::string> hosts;
  for (const auto& p : mesh.peers) hosts.push_back(p.host);
  mesh.topo = compute_topology(hosts, me);

  // Lower rank connects to higher: data to every higher rank, control from rank 0.
  std::map<PairKey, int> mine;
  try {
    for (int r = me + 1; r < n; ++r) {
      const PeerInfo& p = mesh.peers[r];
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
    std::map<PairKey, int> theirs = acceptor.finish();
    mine.insert(theirs.begin(), theirs.end());
  } catch (...) {
    acceptor.stop();
    for (auto& kv : mine) ::close(kv.second);
    throw;
  }

  // Same-host pairs: their channels (data; control too, between rank 0 and a rank on its
  // host) move to shared memory, one segment per channel, data first (phases: shm_pairing.h).
  std::map<PairKey, std::shared_ptr<ShmSegment>> shm_seg;  // (peer rank, channel) -> segment
  std::map<PairKey, int> shm_side;
  std::vector<std::string> fallbacks;
  std::vector<int> unshared;  // same kernel, no common /dev/shm
  auto channels_with = [&](int r) {
    std::vector<int> chs{kDataChannel};
    if (me == 0 || r == 0) chs.push_back(kControlChannel);
    return chs;
  };
  auto who = [](int r, int ch) {
    return "rank " + std::to_string(r) + (ch == kControlChannel ? " (control)" : "");
  };
  try {
    std::vector<std::pair<int, ShmOffer>> offers;  // (channel, offer)
    for (int r = me + 1; r < n; ++r)
      if (choose_transport(self, mesh.peers[r], opts.allow_shm) == TransportKind::kShm)
        for (int ch : channels_with(r))
          offers.emplace_back(ch, shm_offer(mine.at({r, ch}), me, r, opts.shm_ring_bytes, deadline, who(r, ch)));
    for (int r = 0; r < me; ++r)
      if (choose_transport(self, mesh.peers[r], opts.allow_shm) == TransportKind::kShm)
        for (int ch : channels_with(r)) {
          std::string why;
          auto seg = shm_accept(mine.at({r, ch}), deadline, who(r, ch), &why);
          if (seg) {
            shm_seg[{r, ch}] = seg;
            shm_side[{r, ch}] = 1;
          } else {
            fallbacks.push_back(who(r, ch) + ": " + why);
          }
        }
    for (auto& [ch, o] : offers) {
      if (shm_confirm(o, deadline, who(o.peer, ch))) {
        shm_seg[{o.peer, ch}] = o.seg;
        shm_side[{o.peer, ch}] = 0;
      } else {
        fallbacks.push_back(who(o.peer, ch) + ": " + o.why);
      }
    }
  } catch (...) {
    for (auto& kv : mine) ::close(kv.second);
    throw;
  }
  if (opts.allow_shm)
    for (int r = 0; r < n; ++r)
      if (r != me && !shm_possible(self, mesh.peers[r]) && same_kernel(self, mesh.peers[r])) unshared.push_back(r);
  if (!unshared.empty())
    std::fprintf(stderr,
                 "appliance: rank %d: rank(s) %s share this machine but not its /dev/shm (separate containers, "
                 "without --ipc host or a common /dev/shm): TCP with them, not shared memory\n",
                 me, join_ints(unshared).c_str());
  for (const std::string& f : fallbacks)
    std::fprintf(stderr, "appliance: rank %d: shared memory with %s; using TCP\n", me, f.c_str());

  mesh.data.resize(n);
  mesh.control.resize(me == 0 ? n : 1);
  for (auto& kv : mine) {
    const int r = kv.first.first;
    const bool data = kv.first.second == kDataChannel;
    LinkPtr link;
    if (shm_seg.count(kv.first)) {
      link = std::make_unique<ShmLink>(shm_seg[kv.first], shm_side[kv.first], kv.second, r, mesh.peers[r].host);
    } else {
      link = std::make_unique<TcpLink>(kv.second, r, mesh.peers[r].host);
    }
    if (data) {
      mesh.data[r] = std::move(link);
    } else {
      mesh.control[me == 0 ? r : 0] = std::move(link);
    }
  }
  return mesh;
}

}  // namespace appliance
