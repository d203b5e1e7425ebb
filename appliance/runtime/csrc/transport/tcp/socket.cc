// TCP plumbing (see socket.h): IPv4 listen/accept/connect with deadlines, socket tuning and
// blocking raw-fd I/O for handshakes. Every fd is close-on-exec (workers fork helpers).
#include "transport/tcp/socket.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <sstream>
#include <thread>

#include "common/status.h"

namespace appliance {

namespace {

std::string errno_text(int err) { return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")"; }

std::string format_addr(const sockaddr_in& a) {
  char buf[INET_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET, &a.sin_addr, buf, sizeof(buf));
  return std::string(buf) + ":" + std::to_string(ntohs(a.sin_port));
}

// Resolve an IPv4 address; "" = INADDR_ANY. Returns 0 or a getaddrinfo error code.
int resolve_v4(const std::string& host, int port, sockaddr_in* out) {
  std::memset(out, 0, sizeof(*out));
  out->sin_family = AF_INET;
  out->sin_port = htons(static_cast<uint16_t>(port));
  if (host.empty() || host == "0.0.0.0" || host == "*") {
    out->sin_addr.s_addr = htonl(INADDR_ANY);
    return 0;
  }
  if (inet_pton(AF_INET, host.c_str(), &out->sin_addr) == 1) return 0;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0) return rc;
  out->sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
  freeaddrinfo(res);
  return 0;
}

void set_blocking(int fd, bool blocking) {
  int flags = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, blocking ? (flags & ~O_NONBLOCK) : (flags | O_NONBLOCK));
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string fmt_seconds(double s) {
  std::ostringstream os;
  os.precision(1);
  os << std::fixed << s << " s";
  return os.str();
}

// errno values after which retrying a connect is pointless.
bool connect_error_is_permanent(int err) {
  return err == EACCES || err == EPERM || err == EINVAL || err == EAFNOSUPPORT || err == EPROTONOSUPPORT;
}

}  // namespace

// ---- Listener -----------------------------------------------------------------------------

Listener::Listener(Listener&& o) noexcept : fd(o.fd), port(o.port) { o.fd = -1; }
Listener& Listener::operator=(Listener&& o) noexcept {
  if (this != &o) {
    if (fd >= 0) ::close(fd);
    fd = o.fd;
    port = o.port;
    o.fd = -1;
  }
  return *this;
}
Listener::~Listener() {
  if (fd >= 0) ::close(fd);
}

Listener listen_tcp(const std::string& host, int port, int backlog) {
  const std::string where = (host.empty() ? std::string("0.0.0.0") : host) + ":" + std::to_string(port);
  sockaddr_in addr;
  int rc = resolve_v4(host, port, &addr);
  if (rc != 0) throw Error(Code::kInvalid, "cannot listen on " + where + ": " + gai_strerror(rc));
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) throw Error(Code::kInternal, "socket(): " + errno_text(errno));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, backlog) != 0) {
    int err = errno;
    ::close(fd);
    throw Error(Code::kInternal, "cannot listen on " + where + ": " + errno_text(err));
  }
  sockaddr_in bound{};
  socklen_t len = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  Listener l;
  l.fd = fd;
  l.port = ntohs(bound.sin_port);
  return l;
}

int accept_tcp(const Listener& l, Deadline deadline, std::string* peer_addr, int peer_timeout_ms) {
  for (;;) {
    if (!wait_fd(l.fd, POLLIN, deadline)) return -1;
    sockaddr_in a{};
    socklen_t len = sizeof(a);
    int fd = ::accept4(l.fd, reinterpret_cast<sockaddr*>(&a), &len, SOCK_CLOEXEC);
    if (fd >= 0) {
      set_blocking(fd, true);
      tune_socket(fd, peer_timeout_ms);
      if (peer_addr) *peer_addr = format_addr(a);
      return fd;
    }
    int err = errno;
    // Transient: the client gave up between poll and accept, a signal, fd pressure.
    if (err == EINTR || err == EAGAIN || err == EWOULDBLOCK || err == ECONNABORTED || err == EPROTO) continue;
    if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      if (Clock::now() >= deadline) return -1;
      continue;
    }
    throw Error(Code::kInternal, "accept(): " + errno_text(err));
  }
}

int connect_tcp(const std::string& host, int port, Deadline deadline, const std::string& what,
                int peer_timeout_ms) {
  const auto t0 = Clock::now();
  const std::string target = what + " at " + host + ":" + std::to_string(port);
  std::string last_error = "none (no attempt before the deadline)";
  int attempts = 0;
  auto backoff = std::chrono::milliseconds(10);
  for (;;) {
    ++attempts;
    sockaddr_in addr;
    int rc = resolve_v4(host, port, &addr);
    if (rc != 0) {
      last_error = std::string("cannot resolve ") + host + ": " + gai_strerror(rc);
    } else {
      int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      if (fd < 0) throw Error(Code::kInternal, "socket(): " + errno_text(errno));
      int err = 0;
      if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
        err = errno;
        if (err == EINPROGRESS || err == EINTR) {
          // A lost SYN is retransmitted by the kernel; cap one attempt so a host that
          // comes back late is retried with a fresh socket.
          Deadline attempt_end = std::min(deadline, Clock::now() + std::chrono::seconds(3));
          if (wait_fd(fd, POLLOUT, attempt_end)) {
            socklen_t len = sizeof(err);
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
          } else {
            err = ETIMEDOUT;
          }
        }
      }
      if (err == 0) {
        set_blocking(fd, true);
        tune_socket(fd, peer_timeout_ms);
        return fd;
      }
      ::close(fd);
      last_error = errno_text(err);
      if (connect_error_is_permanent(err))
        throw Error(Code::kInternal, "cannot connect to " + target + ": " + last_error);
    }
    auto now = Clock::now();
    if (now + backoff >= deadline) break;
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(250));
  }
  throw Error(Code::kTimeout, "could not connect to " + target + " within " + fmt_seconds(seconds_since(t0)) +
                                  " (" + std::to_string(attempts) + " attempts; last error: " + last_error + ")");
}

void tune_socket(int fd, int peer_timeout_ms) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  // Probe after half the budget, then `cnt` probes spread over the other half, so a
  // vanished host is declared dead within about peer_timeout_ms.
  const int budget_s = std::max(2, peer_timeout_ms / 1000);
  int idle = std::max(1, budget_s / 2);
  int cnt = 3;
  int intvl = std::max(1, (budget_s - idle) / cnt);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
#ifdef TCP_USER_TIMEOUT
  unsigned int user_timeout = static_cast<unsigned int>(std::max(1000, peer_timeout_ms));
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof(user_timeout));
#endif
}

// ---- blocking I/O with deadlines ------------------------------------------------------------

int poll_timeout_ms(Deadline d) {
  if (d == Deadline::max()) return -1;
  auto now = Clock::now();
  if (d <= now) return 0;
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(d - now).count() + 1;  // round up
  return static_cast<int>(std::min<int64_t>(ms, INT_MAX));
}

bool wait_fd(int fd, short events, Deadline d) {
  for (;;) {
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, poll_timeout_ms(d));
    if (rc > 0) return true;
    if (rc == 0) {
      if (Clock::now() >= d) return false;
      continue;  // rounding: woke a hair early
    }
    if (errno != EINTR) throw Error(Code::kInternal, "poll(): " + errno_text(errno));
  }
}

void write_all(int fd, const void* p, size_t n, Deadline d, const std::string& what) {
  const uint8_t* b = static_cast<const uint8_t*>(p);
  size_t off = 0;
  while (off < n) {
    ssize_t k = ::send(fd, b + off, n - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k > 0) {
      off += static_cast<size_t>(k);
      continue;
    }
    int err = errno;
    if (k < 0 && err == EINTR) continue;
    if (k < 0 && (err == EAGAIN || err == EWOULDBLOCK)) {
      if (!wait_fd(fd, POLLOUT, d))
        throw Error(Code::kTimeout, "timed out " + what + " (sent " + std::to_string(off) + " of " +
                                        std::to_string(n) + " bytes)");
      continue;
    }
    throw Error(Code::kPeerLost, errno_text(err) + " while " + what);
  }
}

void read_all(int fd, void* p, size_t n, Deadline d, const std::string& what) {
  uint8_t* b = static_cast<uint8_t*>(p);
  size_t off = 0;
  while (off < n) {
    ssize_t k = ::recv(fd, b + off, n - off, MSG_DONTWAIT);
    if (k > 0) {
      off += static_cast<size_t>(k);
      continue;
    }
    if (k == 0) throw Error(Code::kPeerLost, "connection closed by peer while " + what);
    int err = errno;
    if (err == EINTR) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) {
      if (!wait_fd(fd, POLLIN, d))
        throw Error(Code::kTimeout, "timed out " + what + " (got " + std::to_string(off) + " of " +
                                        std::to_string(n) + " bytes)");
      continue;
    }
    throw Error(Code::kPeerLost, errno_text(err) + " while " + what);
  }
}

// ---- addresses --------------------------------------------------------------------------------

std::string peer_address(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0 || a.sin_family != AF_INET) return "?";
  return format_addr(a);
}

std::string route_address(const std::string& host) {
  if (host.empty()) return "";
  sockaddr_in dst;
  if (resolve_v4(host, 9, &dst) != 0) return "";
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";
  std::string out;
  // A datagram "connect" only picks the route and source address; nothing is sent.
  if (::connect(fd, reinterpret_cast<sockaddr*>(&dst), sizeof(dst)) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof(local);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char buf[INET_ADDRSTRLEN];
      if (inet_ntop(AF_INET, &local.sin_addr, buf, sizeof(buf))) out = buf;
    }
  }
  ::close(fd);
  return out == "0.0.0.0" ? "" : out;
}

std::string server_bind_address(const std::string& host) {
  if (host.empty() || host == "*" || host == "0.0.0.0") return "";
  in_addr lit{};
  if (inet_pton(AF_INET, host.c_str(), &lit) == 1) return host;
  sockaddr_in a{};
  if (resolve_v4(host, 0, &a) != 0) return "";
  const bool loopback = (ntohl(a.sin_addr.s_addr) >> 24) == 127;
  // A name that is loopback only here (Debian maps the own hostname to 127.0.1.1) may be
  // what other hosts reach this one by: listen everywhere then.
  if (loopback && host != "localhost") return "";
  char buf[INET_ADDRSTRLEN];
  return inet_ntop(AF_INET, &a.sin_addr, buf, sizeof(buf)) ? std::string(buf) : std::string();
}

}  // namespace appliance
