// TcpStoreServer: one thread, one poll() loop over an eventfd (stop), the listener and every
// connection. Connections authenticate first (AcceptorHandshake, non-blocking, bounded by
// store_proto::kHandshakeTimeoutMs); a connection that fails is logged to stderr, with its
// address and the reason, and dropped, without affecting anyone else. Those lines are
// rate-limited (LogLimiter: a few per source, then one summary per minute with the count). GET,
// WAIT and GET_MANY are parked server-side until their keys appear or their timeout passes,
// then answered; the reply to a timeout lists the missing keys. A parked request counts its
// missing keys and is listed under each of them, so a SET wakes only the requests that wait
// for its key. ADD is atomic because one thread owns the map.
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <atomic>
#include <map>
#include <sstream>
#include <unordered_map>

#include "common/log_limit.h"
#include "common/status.h"
#include "store/store.h"
#include "store/store_protocol.h"
#include "transport/frame_io.h"
#include "transport/tcp/socket.h"
#include "wire/codec.h"

namespace appliance {

using namespace store_proto;

namespace {

struct Conn {
  int fd = -1;
  std::string addr;
  std::unique_ptr<AcceptorHandshake> hs;  // null once authenticated
  Deadline hs_deadline;
  FrameAssembler in{kMaxFrame};
  std::vector<uint8_t> out;
  uint32_t send_seq = 0;
  bool closing = false;  // flush `out` (a refusal) then drop
};

struct Parked {
  uint64_t conn;
  uint64_t id;
  Op op;
  std::vector<std::string> keys;
  int64_t timeout_ms;
  Deadline deadline;
  size_t missing = 0;  // keys not in the map yet
};

std::string quote_keys(const std::vector<std::string>& keys) {
  std::string s;
  for (size_t i = 0; i < keys.size(); ++i) s += (i ? ", '" : "'") + keys[i] + "'";
  return s;
}

}  // namespace

struct TcpStoreServer::Impl {
  AuthParams auth;
  Listener listener;
  int wake_fd = -1;
  std::thread thread;
  std::map<uint64_t, Conn> conns;
  uint64_t next_conn = 1;
  std::unordered_map<std::string, std::vector<uint8_t>> data;
  std::unordered_map<uint64_t, Parked> parked;  // by parking number
  uint64_t next_parked = 1;
  std::unordered_map<std::string, std::vector<uint64_t>> waiters;  // missing key -> parked requests
  std::atomic<uint64_t> served{0};  // requests handled (read by other threads)

  LogLimiter limiter;  // strangers must not flood the log

  void log(const std::string& msg) {
    std::fprintf(stderr, "[appliance store :%d] %s\n", listener.port, msg.c_str());
    std::fflush(stderr);
  }
  // A line about a connection from `addr`, rate-limited per source (common/log_limit.h).
  void log_conn(const std::string& addr, const std::string& msg) {
    for (const auto& line : limiter.admit(LogLimiter::source_of(addr), msg, Clock::now())) log(line);
  }

  void run();
  void accept_all();
  void on_readable(uint64_t id, Conn& c);
  void handle(uint64_t id, Conn& c, const Frame& f);
  void reply(Conn& c, uint64_t req, Code code, const std::vector<uint8_t>& body, const std::string& msg = {},
             const std::vector<std::string>& missing = {});
  void drop(uint64_t id);
  void park(Parked p);
  void stored(const std::string& key);  // a key appeared: wake what waits for it
  void answer(Parked& p);               // every key is there
  void expire();                        // parked requests past their deadline
  void flush_all();
  Deadline next_wakeup() const;
};

TcpStoreServer::TcpStoreServer(const std::string& bind_host, int port, AuthParams auth) : impl_(new Impl) {
  impl_->auth = std::move(auth);
  impl_->auth.rank = kStoreServerRank;  // the store is not a rank, whoever hosts it
  impl_->listener = listen_tcp(bind_host, port);
  impl_->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (impl_->wake_fd < 0) throw Error(Code::kInternal, std::string("eventfd: ") + std::strerror(errno));
  Impl* p = impl_.get();
  impl_->thread = std::thread([p] {
    try {
      p->run();
    } catch (const std::exception& e) {
      p->log(std::string("stopped by an internal error: ") + e.what());
    }
  });
}

TcpStoreServer::~TcpStoreServer() {
  uint64_t one = 1;
  ssize_t rc = ::write(impl_->wake_fd, &one, sizeof(one));
  (void)rc;
  if (impl_->thread.joinable()) impl_->thread.join();
  for (auto& kv : impl_->conns) ::close(kv.second.fd);
  ::close(impl_->wake_fd);
}

int TcpStoreServer::port() const { return impl_->listener.port; }

uint64_t TcpStoreServer::served() const { return impl_->served.load(std::memory_order_relaxed); }

Deadline TcpStoreServer::Impl::next_wakeup() const {
  Deadline d = no_deadline();
  for (const auto& kv : parked) d = std::min(d, kv.second.deadline);
  for (const auto& kv : conns)
    if (kv.second.hs) d = std::min(d, kv.second.hs_deadline);
  return std::min(d, limiter.next_flush());
}

void TcpStoreServer::Impl::run() {
  std::vector<pollfd> fds;
  std::vector<uint64_t> ids;
  for (;;) {
    fds.assign({pollfd{wake_fd, POLLIN, 0}, pollfd{listener.fd, POLLIN, 0}});
    ids.assign(2, 0);
    for (auto& kv : conns) {
      short ev = kv.second.closing ? 0 : POLLIN;
      if (!kv.second.out.empty()) ev |= POLLOUT;
      fds.push_back(pollfd{kv.second.fd, ev, 0});
      ids.push_back(kv.first);
    }
    int rc = ::poll(fds.data(), fds.size(), poll_timeout_ms(next_wakeup()));
    if (rc < 0 && errno != EINTR) throw Error(Code::kInternal, std::string("poll: ") + std::strerror(errno));
    if (rc > 0) {
      if (fds[0].revents) {
        for (const auto& line : limiter.drain(Clock::now())) log(line);
        return;
      }
      if (fds[1].revents) accept_all();
      for (size_t i = 2; i < fds.size(); ++i) {
        if (!fds[i].revents) continue;
        auto it = conns.find(ids[i]);
        if (it == conns.end()) continue;
        Conn& c = it->second;
        try {
          if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) on_readable(ids[i], c);
          if (!c.out.empty()) flush_some_fd(c.fd, c.out, c.addr);
          if (c.closing && c.out.empty()) drop(ids[i]);
        } catch (const Error& e) {
          if (c.hs) {
            const bool was_running = c.hs->state() == AcceptorHandshake::State::kRunning;
            c.hs->fail(e.status().message);
            if (was_running) log_conn(c.addr, c.hs->failure().message);
          } else if (e.status().code != Code::kPeerLost) {
            log_conn(c.addr, "dropped the client at " + c.addr + ": " + e.status().message);
          }
          drop(ids[i]);
        }
      }
    }
    // Handshakes that ran out of time.
    const auto now = Clock::now();
    for (auto it = conns.begin(); it != conns.end();) {
      auto next = std::next(it);
      Conn& c = it->second;
      if (c.hs && !c.closing && now >= c.hs_deadline) {
        c.hs->fail("no complete handshake within " + std::to_string(kHandshakeTimeoutMs / 1000) + " s");
        log_conn(c.addr, c.hs->failure().message);
        drop(it->first);
      } else if (c.closing && now >= c.hs_deadline) {
        drop(it->first);  // a refused peer that does not read its refusal
      }
      it = next;
    }
    expire();
    flush_all();
    for (const auto& line : limiter.flush(now)) log(line);
  }
}

void TcpStoreServer::Impl::accept_all() {
  for (;;) {
    sockaddr_in a{};
    socklen_t len = sizeof(a);
    int fd = ::accept4(listener.fd, reinterpret_cast<sockaddr*>(&a), &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) log_conn("accept", std::string("accept: ") + std::strerror(errno));
      return;
    }
    tune_socket(fd, kDefaultPeerTimeoutMs);
    Conn c;
    c.fd = fd;
    c.addr = peer_address(fd);
    c.hs = std::make_unique<AcceptorHandshake>(auth, c.addr, 1u << kStoreChannel);
    c.hs_deadline = deadline_after_ms(kHandshakeTimeoutMs);
    conns.emplace(next_conn++, std::move(c));
  }
}

void TcpStoreServer::Impl::on_readable(uint64_t id, Conn& c) {
  if (c.hs) {
    while (c.hs->state() == AcceptorHandshake::State::kRunning) {
      size_t want = c.hs->want();
      ssize_t k = ::recv(c.fd, c.hs->dst(), want, MSG_DONTWAIT);
      if (k > 0) {
        c.hs->received(static_cast<size_t>(k));
      } else if (k == 0) {
        c.hs->closed();
      } else if (errno == EINTR) {
        continue;
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        break;
      } else {
        c.hs->fail(std::string(std::strerror(errno)) + " during the handshake");
      }
    }
    auto& o = c.hs->output();
    c.out.insert(c.out.end(), o.begin(), o.end());
    o.clear();
    if (c.hs->state() == AcceptorHandshake::State::kAccepted) {
      c.hs.reset();
    } else if (c.hs->state() == AcceptorHandshake::State::kRefused) {
      log_conn(c.addr, c.hs->failure().message);
      c.closing = true;  // flush the refusal (if any), then drop
      c.hs_deadline = deadline_after_ms(1000);
    }
    return;
  }
  while (pump_frame_fd(c.fd, c.in, "store client " + c.addr)) handle(id, c, c.in.take());
}

void TcpStoreServer::Impl::reply(Conn& c, uint64_t req, Code code, const std::vector<uint8_t>& body,
                                 const std::string& msg, const std::vector<std::string>& missing) {
  Writer w;
  w.u64(req);
  w.u8(static_cast<uint8_t>(code));
  if (code == Code::kOk) {
    w.buffer().insert(w.buffer().end(), body.begin(), body.end());
  } else {
    w.str(msg);
    w.u32(static_cast<uint32_t>(missing.size()));
    for (const auto& k : missing) w.str(k);
  }
  auto bytes = encode_frame(FrameType::kStoreReply, c.send_seq++, w.buffer().data(), w.buffer().size());
  c.out.insert(c.out.end(), bytes.begin(), bytes.end());
}

void TcpStoreServer::Impl::handle(uint64_t id, Conn& c, const Frame& f) {
  const std::string what = "store request from " + c.addr;
  if (f.type != FrameType::kStoreRequest)
    throw Error(Code::kProtocol, what + ": unexpected " + frame_type_name(f.type) + " frame");
  Reader r(f.payload.data(), f.payload.size(), what);
  served.fetch_add(1, std::memory_order_relaxed);
  const uint64_t req = r.u64();
  const uint8_t op = r.u8();
  switch (op) {
    case kSet: {
      std::string key = r.str(kMaxKey);
      std::vector<uint8_t> value = r.bytes(kMaxValue);
      r.expect_done();
      const bool fresh = data.count(key) == 0;
      data[key] = std::move(value);
      reply(c, req, Code::kOk, {});
      if (fresh) stored(key);
      return;
    }
    case kAdd: {
      std::string key = r.str(kMaxKey);
      int64_t delta = r.i64();
      r.expect_done();
      int64_t cur = 0;
      auto it = data.find(key);
      if (it != data.end()) {
        std::string s(it->second.begin(), it->second.end());
        char* end = nullptr;
        errno = 0;
        long long v = std::strtoll(s.c_str(), &end, 10);
        if (s.empty() || errno != 0 || *end != '\0') {
          reply(c, req, Code::kInvalid, {}, "store key '" + key + "' does not hold an integer; cannot add to it");
          return;
        }
        cur = v;
      }
      int64_t next;
      if (__builtin_add_overflow(cur, delta, &next)) {
        reply(c, req, Code::kInvalid, {}, "adding " + std::to_string(delta) + " to store key '" + key + "' overflows");
        return;
      }
      std::string s = std::to_string(next);
      const bool fresh = data.count(key) == 0;
      data[key] = std::vector<uint8_t>(s.begin(), s.end());
      Writer w;
      w.i64(next);
      reply(c, req, Code::kOk, w.buffer());
      if (fresh) stored(key);
      return;
    }
    case kGet:
    case kWait:
    case kGetMany: {
      Parked p;
      p.conn = id;
      p.id = req;
      p.op = static_cast<Op>(op);
      if (op == kGet) {
        p.keys.push_back(r.str(kMaxKey));
      } else {
        uint32_t n = r.u32();
        if (n > kMaxWaitKeys) r.fail("wait for " + std::to_string(n) + " keys");
        for (uint32_t i = 0; i < n; ++i) p.keys.push_back(r.str(kMaxKey));
      }
      p.timeout_ms = r.i64();
      r.expect_done();
      if (p.timeout_ms < 0) r.fail("negative timeout");
      p.deadline = deadline_after_ms(p.timeout_ms);
      park(std::move(p));
      return;
    }
    default:
      r.fail("unknown store operation " + std::to_string(op));
  }
}

void TcpStoreServer::Impl::park(Parked p) {
  for (const auto& k : p.keys)
    if (!data.count(k)) ++p.missing;
  if (p.missing == 0) return answer(p);
  const uint64_t n = next_parked++;
  for (const auto& k : p.keys)
    if (!data.count(k)) waiters[k].push_back(n);
  parked.emplace(n, std::move(p));
}

void TcpStoreServer::Impl::stored(const std::string& key) {
  auto w = waiters.find(key);
  if (w == waiters.end()) return;
  std::vector<uint64_t> ids = std::move(w->second);
  waiters.erase(w);
  for (uint64_t n : ids) {
    auto it = parked.find(n);
    if (it == parked.end()) continue;
    // A request may list a key twice: it counted it twice and is listed twice.
    if (--it->second.missing > 0) continue;
    answer(it->second);
    parked.erase(it);
  }
}

void TcpStoreServer::Impl::answer(Parked& p) {
  auto cit = conns.find(p.conn);
  if (cit == conns.end()) return;  // its client left
  Writer w;
  if (p.op == kGet) {
    const auto& v = data[p.keys[0]];
    w.bytes(v.data(), v.size());
  } else if (p.op == kGetMany) {
    size_t total = 0;
    for (const auto& k : p.keys) total += data[k].size() + 4;
    if (total > kMaxValue) {
      reply(cit->second, p.id, Code::kInvalid, {}, "the values of " + std::to_string(p.keys.size()) + " keys (" +
                                                       std::to_string(total) + " bytes) do not fit in one reply");
      return;
    }
    w.u32(static_cast<uint32_t>(p.keys.size()));
    for (const auto& k : p.keys) {
      const auto& v = data[k];
      w.bytes(v.data(), v.size());
    }
  }
  reply(cit->second, p.id, Code::kOk, w.buffer());
}

void TcpStoreServer::Impl::expire() {
  const auto now = Clock::now();
  for (auto it = parked.begin(); it != parked.end();) {
    Parked& p = it->second;
    if (!conns.count(p.conn)) {  // its client left
      it = parked.erase(it);
      continue;
    }
    if (now < p.deadline) {
      ++it;
      continue;
    }
    std::vector<std::string> missing;
    for (const auto& k : p.keys)
      if (!data.count(k)) missing.push_back(k);
    std::ostringstream os;
    os.precision(1);
    os << std::fixed << "timed out after " << p.timeout_ms / 1000.0 << " s waiting for store key(s) "
       << quote_keys(missing);
    reply(conns[p.conn], p.id, Code::kTimeout, {}, os.str(), missing);
    it = parked.erase(it);  // its entries under `waiters` find nothing and go with their key
  }
}

void TcpStoreServer::Impl::flush_all() {
  // Replies were queued; the poll loop flushes them (POLLOUT) on its next turn. Try now too.
  for (auto it = conns.begin(); it != conns.end();) {
    auto next = std::next(it);
    if (!it->second.out.empty() && !it->second.hs) {
      try {
        flush_some_fd(it->second.fd, it->second.out, it->second.addr);
      } catch (const Error&) {
        drop(it->first);
      }
    }
    it = next;
  }
}

void TcpStoreServer::Impl::drop(uint64_t id) {
  auto it = conns.find(id);
  if (it == conns.end()) return;
  ::close(it->second.fd);
  conns.erase(it);
}

}  // namespace appliance
