// Links: the rendezvous, the acceptor thread, and links opened on first use (see links.h).
#include "bootstrap/links.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "bootstrap/transports.h"
#include "common/log_limit.h"
#include "common/status.h"
#include "transport/auth.h"
#include "transport/frame_io.h"
#include "transport/tcp/socket.h"

namespace appliance {

namespace {

constexpr int64_t kPeerHandshakeTimeoutMs = 10000;  // per connection, handshake and pairing
constexpr int64_t kConnectTimeoutMs = 10000;        // a published peer that refuses this long is gone

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

// Publishes `self` and reads every rank's PeerInfo (rank order) in one request, naming the
// ranks that never published theirs when the deadline passes.
std::vector<PeerInfo> exchange_peers(Store& store, const PeerInfo& self, const MeshOptions& opts, Deadline deadline) {
  const int me = opts.rank, n = opts.size;
  store.set(peer_key(me), encode_peer(self, n));
  std::vector<std::string> keys;
  for (int r = 0; r < n; ++r) keys.push_back(peer_key(r));
  std::vector<std::vector<uint8_t>> values;
  try {
    values = store.get_many(keys, remaining_ms(deadline));
  } catch (const StoreTimeout& e) {
    std::vector<int> missing;
    for (const std::string& k : e.missing)
      for (int r = 0; r < n; ++r)
        if (k == keys[r]) missing.push_back(r);
    if (missing.empty()) throw;
    std::sort(missing.begin(), missing.end());
    throw Error(Code::kTimeout,
                "rank " + std::to_string(me) + " timed out after " + fmt_seconds(opts.timeout_ms) +
                    " waiting for rank(s) " + join_ints(missing) + " to join (" +
                    std::to_string(n - static_cast<int>(missing.size())) + " of " + std::to_string(n) + " arrived)",
                missing.front());
  }
  std::vector<PeerInfo> peers(n);
  for (int r = 0; r < n; ++r) peers[r] = decode_peer(values[r], r, n);
  return peers;
}

using PairKey = std::pair<int, int>;  // (peer rank, channel)

}  // namespace

const char* channel_name(int ch) { return ch == kControlChannel ? "control" : "data"; }

std::string fmt_seconds(int64_t ms) {
  std::ostringstream os;
  os.precision(1);
  os << std::fixed << ms / 1000.0 << " s";
  return os.str();
}

std::string choose_listen_address(const MeshOptions& opts) {
  if (!is_wildcard(opts.bind_addr)) return opts.bind_addr;
  std::string a = route_address(opts.store_host);
  if (!a.empty()) return a;
  a = first_non_loopback_ipv4();
  return a.empty() ? "127.0.0.1" : a;
}

struct Links::Impl {
  MeshOptions o;
  PeerInfo self;
  std::vector<PeerInfo> peers;
  Topology topo;
  Listener listener;
  int stop_fd = -1;     // closes the acceptor thread
  int arrival_fd = -1;  // readable when the acceptor delivered a link
  std::thread thread;

  std::mutex mu;                           // guards arrived, failed, opened, known, stopping
  std::condition_variable cv;              // known or stopping
  bool known = false;                      // peers read (the acceptor thread waits for it to pair)
  bool stopping = false;
  std::map<PairKey, LinkPtr> arrived;      // made by the acceptor thread, not yet taken
  std::set<PairKey> opened;                // asked for by open() (each once)
  std::set<PairKey> taken;                 // delivered by the acceptor thread and taken
  std::exception_ptr failed;               // the acceptor thread's own failure

  // acceptor thread only
  struct Handshaking {
    int fd;
    std::unique_ptr<AcceptorHandshake> hs;
    Deadline deadline;
  };
  std::vector<Handshaking> handshaking;
  LogLimiter limiter;

  void log(const std::string& msg) {
    std::fprintf(stderr, "[appliance mesh rank %d] %s\n", o.rank, msg.c_str());
    std::fflush(stderr);
  }
  // A line about a connection from `addr`, rate-limited per source.
  void log_conn(const std::string& addr, const std::string& msg) {
    for (const auto& line : limiter.admit(LogLimiter::source_of(addr), msg, Clock::now())) log(line);
  }
  ChannelSocket socket_of(int peer, int channel, int fd) const {
    ChannelSocket c;
    c.peer = peer;
    c.channel = channel;
    c.fd = fd;
    c.peer_host = peers[peer].host;
    c.transport = &select_transport(self, peers[peer], o);
    return c;
  }
  ~Impl() {
    stop();
    for (auto& h : handshaking) ::close(h.fd);
    if (stop_fd >= 0) ::close(stop_fd);
    if (arrival_fd >= 0) ::close(arrival_fd);
  }
  void stop();
  void run();
  void step(Handshaking& h);  // drive one handshake; sets h.fd = -1 once it is over
  void deliver(PairKey key, int fd, const std::string& addr);
  LinkPtr connect(int peer, int channel, Deadline d);
};

Links::Links(Store& store, const MeshOptions& opts) : impl_(new Impl) {
  Impl& m = *impl_;
  m.o = opts;
  if (opts.size < 1 || opts.rank < 0 || opts.rank >= opts.size)
    throw Error(Code::kInvalid, "rank " + std::to_string(opts.rank) + " outside a job of size " + std::to_string(opts.size));
  const Deadline deadline = deadline_after_ms(opts.timeout_ms);
  m.self.rank = opts.rank;
  m.self.host = opts.host.empty() ? local_hostname() : opts.host;
  m.self.host_key = local_host_key();
  m.self.addr = choose_listen_address(opts);
  // A wildcard bind_addr listens everywhere but publishes the address that routes.
  m.listener = listen_tcp(is_wildcard(opts.bind_addr) && !opts.bind_addr.empty() ? "" : m.self.addr, 0);
  m.self.port = m.listener.port;
  m.stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  m.arrival_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (m.stop_fd < 0 || m.arrival_fd < 0) throw Error(Code::kInternal, std::string("eventfd: ") + std::strerror(errno));
  // Accepting before publishing: a peer that read our address can connect at once, and a
  // stranger is answered (refused) even while we wait for the others.
  if (opts.size > 1) {
    Impl* p = impl_.get();
    m.thread = std::thread([p] {
      try {
        p->run();
      } catch (...) {
        std::lock_guard<std::mutex> g(p->mu);
        p->failed = std::current_exception();
      }
      uint64_t one = 1;
      (void)!::write(p->arrival_fd, &one, sizeof(one));
    });
  }
  std::vector<PeerInfo> peers = exchange_peers(store, m.self, opts, deadline);
  std::vector<std::string> hosts;
  for (const auto& p : peers) hosts.push_back(p.host);
  m.topo = compute_topology(hosts, opts.rank);
  report_unshared(m.self, peers, opts);
  {
    std::lock_guard<std::mutex> g(m.mu);
    m.peers = std::move(peers);
    m.known = true;
  }
  m.cv.notify_all();
}

Links::~Links() = default;

void Links::close() { impl_->stop(); }

void Links::Impl::stop() {
  Impl& m = *this;
  {
    std::lock_guard<std::mutex> g(m.mu);
    m.stopping = true;
  }
  m.cv.notify_all();
  if (m.thread.joinable()) {
    uint64_t one = 1;
    (void)!::write(m.stop_fd, &one, sizeof(one));
    m.thread.join();
  }
  m.listener = Listener();  // nobody can connect any more
  std::lock_guard<std::mutex> g(m.mu);
  m.arrived.clear();
}

const std::vector<PeerInfo>& Links::peers() const { return impl_->peers; }
const Topology& Links::topology() const { return impl_->topo; }

bool Links::connects(int peer, int channel) const {
  return channel == kControlChannel ? peer < impl_->o.rank : peer > impl_->o.rank;
}

const char* Links::kind(int peer) const {
  if (peer == impl_->o.rank) return "self";
  return select_transport(impl_->self, impl_->peers.at(peer), impl_->o).name;
}

LinkPtr Links::Impl::connect(int peer, int channel, Deadline d) {
  const PeerInfo& p = peers[peer];
  const std::string what = "rank " + std::to_string(peer) + " (" + p.host + ")";
  int fd = -1;
  try {
    fd = connect_tcp(p.addr, p.port, std::min(d, deadline_after_ms(kConnectTimeoutMs)), what, o.peer_timeout_ms);
    auth_connect(fd, o.auth, peer, channel, d);
    ChannelSocket c = socket_of(peer, channel, fd);
    LinkPtr link = link_channel(c, true, o, d);
    fd = -1;  // the link owns it
    report_fallback(o, c);
    return link;
  } catch (const Error& e) {
    if (fd >= 0) ::close(fd);
    Status s = e.status();
    if (s.origin_rank < 0) s.origin_rank = peer;
    if (s.host.empty()) s.host = p.host;
    s.message = std::string(channel_name(channel)) + " link from rank " + std::to_string(o.rank) + ": " + s.message;
    throw Error(s);
  }
}

LinkPtr Links::open(int peer, int channel, Deadline d, const Wait& wait) {
  Impl& m = *impl_;
  APPLIANCE_ASSERT(peer >= 0 && peer < m.o.size && peer != m.o.rank, "link to rank " + std::to_string(peer));
  const PairKey key{peer, channel};
  {
    std::lock_guard<std::mutex> g(m.mu);
    APPLIANCE_ASSERT(!m.opened.count(key), std::string(channel_name(channel)) + " link to rank " + std::to_string(peer) + " opened twice");
    m.opened.insert(key);
  }
  if (connects(peer, channel)) return m.connect(peer, channel, d);
  // The peer connects: take what the acceptor thread made of it, or wait for it.
  for (;;) {
    {
      std::lock_guard<std::mutex> g(m.mu);
      auto it = m.arrived.find(key);
      if (it != m.arrived.end()) {
        LinkPtr link = std::move(it->second);
        m.arrived.erase(it);
        m.taken.insert(key);
        return link;
      }
      if (m.failed) std::rethrow_exception(m.failed);
    }
    if (Clock::now() >= d)
      throw Error(Code::kTimeout,
                  "rank " + std::to_string(m.o.rank) + " timed out after " + fmt_seconds(m.o.timeout_ms) +
                      " waiting for the " + channel_name(channel) + " link from rank " + std::to_string(peer),
                  peer, m.peers[peer].host);
    if (wait) {
      wait(m.arrival_fd);
    } else {
      pollfd f{m.arrival_fd, POLLIN, 0};
      ::poll(&f, 1, static_cast<int>(std::min<int64_t>(100, remaining_ms(d) + 1)));
    }
    uint64_t v;
    (void)!::read(m.arrival_fd, &v, sizeof(v));
  }
}

// --- the acceptor thread ----------------------------------------------------------------------

void Links::Impl::deliver(PairKey key, int fd, const std::string& addr) {
  const int peer = key.first;
  {
    // A peer may connect as soon as it read every address, just before our own read returns.
    std::unique_lock<std::mutex> g(mu);
    cv.wait(g, [this] { return known || stopping; });
    if (stopping) {
      ::close(fd);
      return;
    }
    if (arrived.count(key) || taken.count(key)) {
      log_conn(addr, "dropped a duplicate " + std::string(channel_name(key.second)) + " connection from rank " +
                         std::to_string(peer) + " at " + addr);
      ::close(fd);
      return;
    }
  }
  ChannelSocket c = socket_of(peer, key.second, fd);
  LinkPtr link;
  try {
    link = link_channel(c, false, o, deadline_after_ms(kPeerHandshakeTimeoutMs));
  } catch (const Error& e) {
    ::close(fd);
    log_conn(addr, "dropped the " + std::string(channel_name(key.second)) + " connection from rank " +
                       std::to_string(peer) + ": " + e.status().message);
    return;
  }
  report_fallback(o, c);
  {
    std::lock_guard<std::mutex> g(mu);
    arrived[key] = std::move(link);
  }
  uint64_t one = 1;
  (void)!::write(arrival_fd, &one, sizeof(one));
}

void Links::Impl::step(Handshaking& h) {
  AcceptorHandshake& hs = *h.hs;
  while (hs.state() == AcceptorHandshake::State::kRunning) {
    if (!hs.output().empty()) {
      try {
        flush_some_fd(h.fd, hs.output(), hs.peer_addr());
      } catch (const Error& e) {
        hs.fail(e.status().message);
        break;
      }
    }
    ssize_t k = ::recv(h.fd, hs.dst(), hs.want(), MSG_DONTWAIT);
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
      write_all(h.fd, hs.output().data(), hs.output().size(), deadline_after_ms(1000),
                "sending the handshake verdict to " + hs.peer_addr());
    } catch (const Error& e) {
      if (hs.state() == AcceptorHandshake::State::kAccepted) hs.fail(e.status().message);
    }
    hs.output().clear();
  }
  if (hs.state() == AcceptorHandshake::State::kAccepted) {
    const PairKey key{hs.peer().rank, hs.peer().channel};
    const bool theirs = key.first >= 0 && key.first < o.size && key.first != o.rank &&
                        (key.second == kControlChannel ? key.first > o.rank : key.first < o.rank);
    if (!theirs) {
      // Data: the lower rank of a pair connects; control: the higher. Anything else is not ours to take.
      log_conn(hs.peer_addr(), "dropped an authenticated but unexpected " + std::string(channel_name(key.second)) +
                                   " connection from rank " + std::to_string(key.first) + " at " + hs.peer_addr());
      ::close(h.fd);
    } else {
      deliver(key, h.fd, hs.peer_addr());
    }
  } else {
    log_conn(hs.peer_addr(), hs.failure().message);
    ::close(h.fd);
  }
  h.fd = -1;
}

void Links::Impl::run() {
  struct Drain {  // what the limiter left out, said once when the acceptor ends
    Impl* m;
    ~Drain() {
      for (const auto& line : m->limiter.drain(Clock::now())) m->log(line);
    }
  } drain{this};
  for (;;) {
    std::vector<pollfd> fds{pollfd{stop_fd, POLLIN, 0}, pollfd{listener.fd, POLLIN, 0}};
    Deadline wake = std::min(deadline_after_ms(60000), limiter.next_flush());
    for (auto& h : handshaking) {
      fds.push_back(pollfd{h.fd, static_cast<short>(POLLIN | (h.hs->output().empty() ? 0 : POLLOUT)), 0});
      wake = std::min(wake, h.deadline);
    }
    int rc = ::poll(fds.data(), fds.size(), poll_timeout_ms(wake));
    if (rc < 0 && errno != EINTR) throw Error(Code::kInternal, std::string("poll: ") + std::strerror(errno));
    if (rc > 0 && fds[0].revents) {
      for (auto& h : handshaking) ::close(h.fd);
      handshaking.clear();
      return;
    }
    if (rc > 0) {
      for (size_t i = 2; i < fds.size(); ++i)
        if (fds[i].revents) step(handshaking[i - 2]);
      if (fds[1].revents) {
        for (;;) {
          std::string addr;
          int fd = accept_tcp(listener, Clock::now(), &addr, o.peer_timeout_ms);
          if (fd < 0) break;
          fcntl(fd, F_SETFL, fcntl(fd, F_GETFL, 0) | O_NONBLOCK);
          handshaking.push_back(Handshaking{fd, std::make_unique<AcceptorHandshake>(
                                                    o.auth, addr, (1u << kDataChannel) | (1u << kControlChannel)),
                                            deadline_after_ms(kPeerHandshakeTimeoutMs)});
        }
      }
    }
    const auto now = Clock::now();
    for (auto& h : handshaking) {
      if (h.fd >= 0 && now >= h.deadline) {
        h.hs->fail("no complete handshake in time");
        log_conn(h.hs->peer_addr(), h.hs->failure().message);
        ::close(h.fd);
        h.fd = -1;
      }
    }
    handshaking.erase(std::remove_if(handshaking.begin(), handshaking.end(), [](const Handshaking& h) { return h.fd < 0; }),
                      handshaking.end());
    for (const auto& line : limiter.flush(now)) log(line);
  }
}

}  // namespace appliance
