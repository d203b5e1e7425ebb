// The acceptor thread of build_mesh (see acceptor.h).
#include "bootstrap/acceptor.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "common/status.h"
#include "transport/frame_io.h"

namespace appliance {

namespace {
constexpr int64_t kPeerHandshakeTimeoutMs = 10000;  // per accepted connection
}  // namespace

const char* channel_name(int ch) { return ch == kControlChannel ? "control" : "data"; }

std::string fmt_seconds(int64_t ms) {
  std::ostringstream os;
  os.precision(1);
  os << std::fixed << ms / 1000.0 << " s";
  return os.str();
}

Acceptor::Acceptor(const Listener& l, const MeshOptions& o, std::set<PairKey> expected, Deadline d)
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

Acceptor::~Acceptor() {
  stop();
  for (auto& kv : got_) ::close(kv.second);
  ::close(stop_fd_);
}

void Acceptor::stop() {
  if (!thread_.joinable()) return;
  uint64_t one = 1;
  ssize_t rc = ::write(stop_fd_, &one, sizeof(one));
  (void)rc;
  thread_.join();
}

std::map<PairKey, int> Acceptor::finish() {
  if (thread_.joinable()) thread_.join();
  if (error_) std::rethrow_exception(error_);
  return std::move(got_);
}

void Acceptor::log(const std::string& msg) {
  std::fprintf(stderr, "[appliance mesh rank %d] %s\n", opts_.rank, msg.c_str());
  std::fflush(stderr);
}

void Acceptor::log_conn(const std::string& addr, const std::string& msg) {
  for (const auto& line : limiter_.admit(LogLimiter::source_of(addr), msg, Clock::now())) log(line);
}

void Acceptor::step(Handshaking& h) {
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
    PairKey key{hs.peer().rank, hs.peer().channel};
    if (!expected_.count(key)) {
      log_conn(hs.peer_addr(), "dropped an authenticated but unexpected " + std::string(channel_name(key.second)) + " connection from rank " +
          std::to_string(key.first) + " at " + hs.peer_addr());
    } else if (got_.count(key)) {
      log_conn(hs.peer_addr(), "dropped a duplicate " + std::string(channel_name(key.second)) + " connection from rank " +
          std::to_string(key.first) + " at " + hs.peer_addr());
    } else {
      got_[key] = h.fd;
      h.fd = -1;
    }
  } else {
    log_conn(hs.peer_addr(), hs.failure().message);
  }
  if (h.fd >= 0) ::close(h.fd);
  h.fd = -1;
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
    for (auto& h : handshaking_) {
      fds.push_back(pollfd{h.fd, static_cast<short>(POLLIN | (h.hs->output().empty() ? 0 : POLLOUT)), 0});
      wake = std::min(wake, h.deadline);
    }
    int rc = ::poll(fds.data(), fds.size(), poll_timeout_ms(wake));
    if (rc < 0 && errno != EINTR) throw Error(Code::kInternal, std::string("poll: ") + std::strerror(errno));
    if (rc > 0 && fds[0].revents) {
      for (auto& h : handshaking_) ::close(h.fd);
      handshaking_.clear();
      return;  // stopped by build_mesh (it failed elsewhere)
    }
    if (rc > 0) {
      for (size_t i = 2; i < fds.size(); ++i)
        if (fds[i].revents) step(handshaking_[i - 2]);
      if (fds[1].revents) {
        for (;;) {
          std::string addr;
          int fd = accept_tcp(listener_, Clock::now(), &addr, opts_.peer_timeout_ms);
          if (fd < 0) break;
          fcntl(fd, F_SETFL, fcntl(fd, F_GETFL, 0) | O_NONBLOCK);
          handshaking_.push_back(Handshaking{fd, std::make_unique<AcceptorHandshake>(
                                                     opts_.auth, addr, (1u << kDataChannel) | (1u << kControlChannel)),
                                             std::min(deadline_, deadline_after_ms(kPeerHandshakeTimeoutMs))});
        }
      }
    }
    const auto now = Clock::now();
    for (auto& h : handshaking_) {
      if (h.fd >= 0 && now >= h.deadline) {
        h.hs->fail("no complete handshake in time");
        log_conn(h.hs->peer_addr(), h.hs->failure().message);
        ::close(h.fd);
        h.fd = -1;
      }
    }
    handshaking_.erase(
        std::remove_if(handshaking_.begin(), handshaking_.end(), [](const Handshaking& h) { return h.fd < 0; }),
        handshaking_.end());
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
      for (auto& h : handshaking_) ::close(h.fd);
      handshaking_.clear();
      throw Error(Code::kTimeout,
                  "rank " + std::to_string(opts_.rank) + " timed out after " + fmt_seconds(opts_.timeout_ms) +
                      " waiting for connections from " + list,
                  first);
    }
  }
  for (auto& h : handshaking_) ::close(h.fd);
  handshaking_.clear();
}

}  // namespace appliance
