// The control plane: control links, heartbeats, abort (see control.h).
#include "engine/control.h"

#include <poll.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>

#include "common/status.h"
#include "engine/messages.h"
#include "wire/codec.h"

namespace appliance {

int heartbeat_verdict(const std::vector<Clock::time_point>& last_recv, const std::vector<int>& peers,
                      Clock::time_point now, Clock::duration timeout) {
  int silent = -1;
  for (int r : peers) {
    if (r < 0) continue;
    if (now - last_recv[r] > timeout && (silent < 0 || last_recv[r] < last_recv[silent])) silent = r;
  }
  return silent;
}

int64_t heartbeat_interval_ms(double timeout_s) {
  return std::max<int64_t>(50, std::min<int64_t>(1000, static_cast<int64_t>(timeout_s * 250)));
}

ControlPlane::ControlPlane(int rank, int size, double heartbeat_timeout_s, std::vector<std::string> hosts)
    : rank_(rank), size_(size), timeout_s_(heartbeat_timeout_s), interval_ms_(heartbeat_interval_ms(heartbeat_timeout_s)),
      hosts_(std::move(hosts)), peers_(size) {
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0) throw Error(Code::kInternal, "cannot create an epoll set");
}

ControlPlane::~ControlPlane() {
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
}

std::string ControlPlane::host_of(int rank) const {
  return rank >= 0 && rank < static_cast<int>(hosts_.size()) ? hosts_[rank] : std::string();
}

void ControlPlane::add(int peer, std::unique_ptr<Channel> ch) {
  APPLIANCE_ASSERT(peer >= 0 && peer < size_ && peer != rank_ && !peers_[peer].ch, "control link to rank " + std::to_string(peer));
  Peer& p = peers_[peer];
  p.ch = std::move(ch);
  p.last_recv = p.last_send = Clock::now();
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u32 = static_cast<uint32_t>(peer);
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, p.ch->link().wait_handle(), &ev);
  ranks_.insert(std::upper_bound(ranks_.begin(), ranks_.end(), peer), peer);
}

void ControlPlane::read(std::deque<Inbound>& inbox, std::vector<int>& left) {
  for (int r : ranks_) {
    Peer& c = peers_[r];
    if (c.gone) continue;
    Frame f;
    while (c.ch->try_recv_frame(f)) {
      c.last_recv = Clock::now();
      if (f.type == FrameType::kHeartbeat) continue;
      if (f.type == FrameType::kAbort) {
        Reader rd(f.payload.data(), f.payload.size(), "ABORT from rank " + std::to_string(r));
        Status s = rd.status();
        abort_from_ = r;
        throw Error(s);
      }
      if (f.type != FrameType::kControl)
        throw Error(Code::kProtocol, std::string("unexpected ") + frame_type_name(f.type) + " frame on the control link", r,
                    host_of(r));
      const CtrlType type = peek_ctrl_type(f.payload, "rank " + std::to_string(r));
      if (type == CtrlType::kBye || type == CtrlType::kGone) {
        // The peer sends nothing more and may close at any time (GONE: its negotiation ended,
        // the negotiator hears of it; BYE: it shut down).
        c.gone = true;
        epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c.ch->link().wait_handle(), nullptr);
        if (type == CtrlType::kBye) left.push_back(r);
        else inbox.push_back(Inbound{r, std::move(f.payload)});
        break;
      }
      inbox.push_back(Inbound{r, std::move(f.payload)});
    }
  }
}

void ControlPlane::send(int peer, const std::vector<uint8_t>& payload) {
  Peer& c = peers_.at(peer);
  APPLIANCE_ASSERT(c.ch, "no control link to rank " + std::to_string(peer));
  if (c.gone) return;
  const int64_t budget = std::max<int64_t>(5000, static_cast<int64_t>(timeout_s_ * 1000));
  c.ch->send_frame(FrameType::kControl, payload.data(), payload.size(), deadline_after_ms(budget));
  c.last_send = Clock::now();
}

void ControlPlane::heartbeats(Clock::time_point now) {
  if (timeout_s_ <= 0 || ranks_.empty()) return;
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s_ * 1000));
  std::vector<Clock::time_point> last(size_);
  std::vector<int> live;
  for (int r : ranks_) {
    if (peers_[r].gone) continue;
    last[r] = peers_[r].last_recv;
    live.push_back(r);
  }
  const int silent = heartbeat_verdict(last, live, now, timeout);
  if (silent >= 0) {
    // Silence is seen first-hand (unlike a closed link, which may be a peer giving up because of
    // someone else): the engine reports it at once, without waiting for a better cause.
    silence_seen_ = true;
    throw Error(Code::kPeerLost,
                "no sign of life for " + std::to_string(static_cast<int>(timeout_s_)) +
                    " s (host down, network cut or process stopped; APPLIANCE_HEARTBEAT_TIMEOUT)",
                silent, host_of(silent));
  }
  const int64_t budget = std::max<int64_t>(5000, static_cast<int64_t>(timeout_s_ * 1000));
  for (int r : live) {
    Peer& c = peers_[r];
    if (now - c.last_send < std::chrono::milliseconds(interval_ms_)) continue;
    c.ch->send_frame(FrameType::kHeartbeat, nullptr, 0, deadline_after_ms(budget));
    c.last_send = Clock::now();
  }
}

int64_t ControlPlane::next_heartbeat_ms() const { return timeout_s_ > 0 && !ranks_.empty() ? interval_ms_ : -1; }

bool ControlPlane::arm() {
  bool ready = false;
  for (int r : ranks_) {
    Peer& c = peers_[r];
    if (!c.gone && c.ch->link().spins() && c.ch->link().arm_wait(true, false) == 0) ready = true;
  }
  return ready;
}

void ControlPlane::abort(const Status& s, int skip_peer) {
  Writer w;
  w.status(s);
  for (int r : ranks_) {
    if (r == skip_peer || peers_[r].gone) continue;
    try {
      peers_[r].ch->send_frame(FrameType::kAbort, w.buffer().data(), w.buffer().size(), deadline_after_ms(1000));
    } catch (const Error&) {
    }
  }
}

void ControlPlane::bye() {
  const std::vector<uint8_t> b = encode_bye();
  for (int r : ranks_) {
    if (peers_[r].gone) continue;
    try {
      peers_[r].ch->send_frame(FrameType::kControl, b.data(), b.size(), deadline_after_ms(1000));
    } catch (const Error&) {
    }
  }
}

Status ControlPlane::await_better_cause(const Status& s, std::deque<Inbound>& inbox, std::vector<int>& left) {
  auto until = Clock::now() + std::chrono::milliseconds(1000);
  while (Clock::now() < until && !ranks_.empty()) {
    pollfd fd{epoll_fd_, POLLIN, 0};
    arm();
    ::poll(&fd, 1, 50);
    try {
      read(inbox, left);
    } catch (const Error& e) {
      return e.status();
    }
  }
  return s;
}

}  // namespace appliance
