// Comm: the progress engine behind every collective. See comm.h.
#include "collectives/comm.h"

#include <poll.h>

#include <algorithm>
#include <cstdlib>
#include <new>
#include <string>

#include "common/status.h"

namespace appliance {

struct Comm::SendState {
  const SendOp* op;
  Channel* ch;
  size_t off = 0;   // bytes of the message whose frames are completely sent
  size_t cur = 0;   // length of the frame in flight
  bool started = false;
  bool done = false;
};

struct Comm::RecvState {
  RecvOp* op;
  Channel* ch;
  size_t off = 0;        // bytes of the message whose frames are completely received
  size_t cur = 0;        // length of the frame in flight
  size_t delivered = 0;  // prefix already handed to on_piece
  bool started = false;
  bool done = false;
};

void Comm::AlignedFree::operator()(uint8_t* p) const { ::operator delete[](p, std::align_val_t(64)); }

Comm::Comm(int rank, int size, std::vector<std::unique_ptr<Channel>> channels, size_t max_frame)
    : rank_(rank), size_(size), channels_(std::move(channels)), max_frame_(max_frame), last_service_(Clock::now()) {
  APPLIANCE_ASSERT(size >= 1 && rank >= 0 && rank < size, "rank " + std::to_string(rank) + " of " + std::to_string(size));
  APPLIANCE_ASSERT(static_cast<int>(channels_.size()) == size, "one channel slot per rank");
  APPLIANCE_ASSERT(max_frame_ >= 1, "max_frame must be positive");
  for (int r = 0; r < size; ++r) {
    if (r == rank) {
      APPLIANCE_ASSERT(channels_[r] == nullptr, "no channel to self");
      continue;
    }
    APPLIANCE_ASSERT(channels_[r] != nullptr, "missing channel to rank " + std::to_string(r));
    APPLIANCE_ASSERT(channels_[r]->peer() == r, "channel slot " + std::to_string(r) + " leads to rank " +
                                                     std::to_string(channels_[r]->peer()));
    APPLIANCE_ASSERT(max_frame_ <= channels_[r]->max_payload(), "max_frame above the channel's frame bound");
  }
  for (auto& ch : channels_) peers_.push_back(ch.get());
}

Comm::Comm(int rank, int size, size_t max_frame, Opener open)
    : rank_(rank), size_(size), channels_(size), peers_(size, nullptr), max_frame_(max_frame), open_(std::move(open)),
      last_service_(Clock::now()) {
  APPLIANCE_ASSERT(size >= 1 && rank >= 0 && rank < size, "rank " + std::to_string(rank) + " of " + std::to_string(size));
  APPLIANCE_ASSERT(max_frame_ >= 1, "max_frame must be positive");
}

Comm::Comm(Comm& parent, const std::vector<int>& members)
    : rank_(-1), size_(static_cast<int>(members.size())), max_frame_(parent.max_frame_), watch_(parent.watch_),
      last_service_(Clock::now()) {
  for (int i = 0; i < size_; ++i) {
    const int r = members[i];
    APPLIANCE_ASSERT(r >= 0 && r < parent.size_ && (i == 0 || r > members[i - 1]), "process set members must be sorted job ranks");
    if (r == parent.rank_) rank_ = i;
    peers_.push_back(parent.peers_[r]);
  }
  APPLIANCE_ASSERT(rank_ >= 0, "a process set's Comm on a rank outside the set");
  parent_ = &parent;
  members_ = members;
}

Channel& Comm::channel(int peer) {
  APPLIANCE_ASSERT(peer >= 0 && peer < size_ && peer != rank_, "channel to rank " + std::to_string(peer));
  if (!peers_[peer]) {
    if (parent_) {
      peers_[peer] = &parent_->channel(members_[peer]);
    } else {
      APPLIANCE_ASSERT(open_ != nullptr, "no channel to rank " + std::to_string(peer) + " and none to open");
      std::unique_ptr<Channel> ch = open_(peer);
      APPLIANCE_ASSERT(ch && ch->peer() == peer && max_frame_ <= ch->max_payload(), "opened a channel to rank " + std::to_string(peer));
      channels_[peer] = std::move(ch);
      peers_[peer] = channels_[peer].get();
    }
  }
  return *peers_[peer];
}

Comm::~Comm() = default;

void* Comm::workspace(size_t bytes) {
  if (bytes > workspace_size_) {
    size_t grown = std::max(bytes, workspace_size_ + workspace_size_ / 2);
    grown = (grown + 4095) & ~size_t{4095};
    workspace_.reset();  // release first: peak memory stays at one workspace
    workspace_.reset(static_cast<uint8_t*>(::operator new[](grown, std::align_val_t(64))));
    workspace_size_ = grown;
  }
  return workspace_.get();
}

void Comm::service_watch() {
  last_service_ = Clock::now();
  if (watch_.service) watch_.service();
}

size_t Comm::frame_size(size_t piece) const { return piece ? std::min(piece, max_frame_) : max_frame_; }

// One non-blocking pass over every pending op. Returns whether any byte moved.
bool Comm::pump(std::vector<SendState>& ss, std::vector<RecvState>& rs, bool* all_done) {
  bool moved = false;
  bool done = true;
  for (SendState& s : ss) {
    if (s.done) continue;
    Channel& ch = *s.ch;
    uint64_t before = ch.bytes_moved();
    for (;;) {
      if (!ch.sending()) {
        if (s.started && s.off == s.op->len) {
          s.done = true;
          break;
        }
        s.cur = std::min(frame_size(s.op->piece), s.op->len - s.off);
        ch.begin_send(static_cast<const uint8_t*>(s.op->data) + s.off, s.cur);
        std::atomic<uint64_t>& sent = (parent_ ? parent_ : this)->frames_sent_;
        sent.store(sent.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
        s.started = true;
      }
      if (!ch.pump_send()) break;
      s.off += s.cur;
    }
    moved |= ch.bytes_moved() != before;
    done &= s.done;
  }
  for (RecvState& r : rs) {
    if (r.done) continue;
    Channel& ch = *r.ch;
    RecvOp& op = *r.op;
    uint64_t before = ch.bytes_moved();
    for (;;) {
      if (!ch.receiving()) {
        if (r.started && r.off == op.len) {
          r.done = true;
          break;
        }
        r.cur = std::min(frame_size(op.piece), op.len - r.off);
        ch.begin_recv(op.stage ? op.stage : static_cast<uint8_t*>(op.data) + r.off, r.cur);
        r.started = true;
      }
      bool complete = ch.pump_recv();
      if (op.stage) {
        if (complete && r.cur && op.on_piece) op.on_piece(r.off, r.cur);
      } else if (op.on_piece && op.len > 0) {
        size_t have = r.off + ch.received_bytes();
        size_t grain = op.grain ? op.grain : op.len;
        while (r.delivered < have) {
          size_t piece = std::min(grain, op.len - r.delivered);
          if (r.delivered + piece > have) break;
          op.on_piece(r.delivered, piece);
          r.delivered += piece;
        }
      }
      if (!complete) break;
      r.off += r.cur;
    }
    moved |= ch.bytes_moved() != before;
    done &= r.done;
  }
  *all_done = done;
  return moved;
}

// Nothing moved: sleep until some involved link can progress (or the Watch fd is readable),
// at most until the Watch is due. Every link is spun on first (Backoff's spin and yield
// rounds, pumping between them): shared memory moves bytes without syscalls, and a TCP peer
// that answers within tens of microseconds is then met without a sleep and a wake-up.
// Then every pending link arms its doorbell (Link::arm_wait) and we poll. Links without any
// handle make this a backoff step.
void Comm::wait_for_progress(const std::vector<SendState>& ss, const std::vector<RecvState>& rs) {
  if (backoff_.next_sleep_us() == 0) {
    backoff_.step();
    return;
  }

  pollfd fds[64];
  std::vector<pollfd> many;
  size_t cap = 2 * static_cast<size_t>(size_) + 1;
  pollfd* p = fds;
  if (cap > 64) {
    many.resize(cap);
    p = many.data();
  }
  size_t n = 0;
  bool fdless = false, ready = false;
  auto add = [&](Link& link, bool rd, bool wr) {
    int fd = link.wait_handle();
    if (fd < 0) {
      fdless = true;
      return;
    }
    short ev = link.arm_wait(rd, wr);
    if (ev == 0) ready = true;
    for (size_t i = 0; i < n; ++i)
      if (p[i].fd == fd) {
        p[i].events |= ev;
        return;
      }
    p[n++] = pollfd{fd, ev, 0};
  };
  for (const SendState& s : ss)
    if (!s.done) add(s.ch->link(), false, true);
  for (const RecvState& r : rs)
    if (!r.done) add(r.ch->link(), true, false);
  if (ready) return;  // a link can progress already: pump again
  int watch_slot = -1;
  if (watch_.arm && watch_.arm()) {
    service_watch();
    return;
  }
  if (watch_.fd >= 0) {
    watch_slot = static_cast<int>(n);
    p[n++] = pollfd{watch_.fd, POLLIN, 0};
  }

  auto since = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - last_service_).count();
  int timeout_ms = static_cast<int>(std::max<int64_t>(0, kWatchPeriodMs - since));
  if (fdless) {
    int64_t us = std::max<int64_t>(backoff_.next_sleep_us(), 20);
    timeout_ms = std::min<int>(timeout_ms, static_cast<int>((us + 999) / 1000));
    backoff_.advance();
  }
  if (n == 0) {
    backoff_.step();
    return;
  }
  int rc = ::poll(p, n, timeout_ms);
  if (rc > 0 && watch_slot >= 0 && (p[watch_slot].revents & (POLLIN | POLLHUP | POLLERR))) service_watch();
}

void Comm::exchange(const std::vector<SendOp>& sends, std::vector<RecvOp>& recvs) {
  // Channels not open yet: the higher peers first (this rank connects to them, which costs no
  // wait on their callers), then the lower ones (they connect to us: we may wait for them).
  bool missing = false;
  for (const SendOp& s : sends) missing |= s.peer >= 0 && s.peer < size_ && !peers_[s.peer];
  for (const RecvOp& r : recvs) missing |= r.peer >= 0 && r.peer < size_ && !peers_[r.peer];
  if (missing) {
    std::vector<int> need;
    for (const SendOp& s : sends) need.push_back(s.peer);
    for (const RecvOp& r : recvs) need.push_back(r.peer);
    std::sort(need.begin(), need.end(), [this](int a, int b) { return (a > rank_) != (b > rank_) ? a > rank_ : a < b; });
    for (int p : need)
      if (p >= 0 && p < size_ && p != rank_) channel(p);
  }
  std::vector<SendState> ss;
  std::vector<RecvState> rs;
  ss.reserve(sends.size());
  rs.reserve(recvs.size());
  // At most one send and one receive per peer: frames of one channel direction are a queue.
  std::vector<uint8_t> seen(static_cast<size_t>(size_), 0);
  for (const SendOp& s : sends) {
    APPLIANCE_ASSERT(s.peer >= 0 && s.peer < size_ && s.peer != rank_, "send to rank " + std::to_string(s.peer));
    APPLIANCE_ASSERT(!(seen[s.peer] & 1), "two sends to rank " + std::to_string(s.peer) + " in one exchange");
    APPLIANCE_ASSERT(!channel(s.peer).sending(), "channel to rank " + std::to_string(s.peer) + " mid-frame");
    seen[s.peer] |= 1;
    ss.push_back(SendState{&s, &channel(s.peer)});
  }
  for (RecvOp& r : recvs) {
    APPLIANCE_ASSERT(r.peer >= 0 && r.peer < size_ && r.peer != rank_, "receive from rank " + std::to_string(r.peer));
    APPLIANCE_ASSERT(!(seen[r.peer] & 2), "two receives from rank " + std::to_string(r.peer) + " in one exchange");
    APPLIANCE_ASSERT(!channel(r.peer).receiving(), "channel from rank " + std::to_string(r.peer) + " mid-frame");
    seen[r.peer] |= 2;
    rs.push_back(RecvState{&r, &channel(r.peer)});
  }
  backoff_.reset();
  for (;;) {
    bool all_done = false;
    bool moved = pump(ss, rs, &all_done);
    if (all_done) return;
    if (Clock::now() - last_service_ >= std::chrono::milliseconds(kWatchPeriodMs)) service_watch();
    if (moved) {
      backoff_.reset();
    } else {
      wait_for_progress(ss, rs);
    }
  }
}

void Comm::send(int peer, const void* data, size_t len) {
  std::vector<SendOp> s{SendOp{peer, data, len}};
  std::vector<RecvOp> r;
  exchange(s, r);
}

void Comm::recv(int peer, void* data, size_t len) {
  std::vector<SendOp> s;
  std::vector<RecvOp> r(1);
  r[0].peer = peer;
  r[0].data = data;
  r[0].len = len;
  exchange(s, r);
}

void Comm::sendrecv(int dst, const void* sdata, size_t slen, int src, void* rdata, size_t rlen) {
  std::vector<SendOp> s{SendOp{dst, sdata, slen}};
  std::vector<RecvOp> r(1);
  r[0].peer = src;
  r[0].data = rdata;
  r[0].len = rlen;
  exchange(s, r);
}

}  // namespace appliance
