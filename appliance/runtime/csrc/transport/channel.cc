// Channel implementation: frame state machines over a non-blocking Link. See channel.h.
#include "transport/channel.h"

#include <poll.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>

#include "common/status.h"
#include "wire/codec.h"

namespace appliance {

Channel::Channel(LinkPtr link, uint32_t max_payload) : link_(std::move(link)), max_payload_(max_payload) {
  APPLIANCE_ASSERT(link_ != nullptr, "channel needs a link");
}

// ---------------------------------------------------------------------------------------
// helpers

size_t Channel::recv_link(void* dst, size_t len) {
  size_t n = link_->recv_some(dst, len);
  if (n > 0) {
    moved_ += n;
    backoff_.reset();
  }
  return n;
}

size_t Channel::send_link(const void* src, size_t len) {
  size_t n = link_->send_some(src, len);
  if (n > 0) {
    moved_ += n;
    backoff_.reset();
  }
  return n;
}

void Channel::protocol_error(const std::string& what, uint32_t seq) const {
  throw Error(Code::kProtocol,
              what + " (frame #" + std::to_string(seq) + " received from this peer over " + link_->kind() + ")",
              link_->peer(), link_->peer_host());
}

FrameHeader Channel::decode_or_throw(const uint8_t* hdr) {
  DecodeResult r = decode_frame_header(hdr, kFrameHeaderSize, recv_seq_, max_payload_);
  if (r.error != DecodeError::kNone) protocol_error(r.describe(), recv_seq_);
  ++recv_seq_;
  return r.header;
}

void Channel::throw_abort(const uint8_t* payload, size_t len) {
  Status st;
  try {
    Reader rd(payload, len, "abort frame from rank " + std::to_string(peer()));
    st = rd.status();
  } catch (const Error& e) {
    throw Error(Code::kProtocol, e.status().message, peer(), peer_host());
  }
  if (st.ok()) throw Error(Code::kProtocol, "abort frame carries an ok status", peer(), peer_host());
  throw Error(std::move(st));
}

// ---------------------------------------------------------------------------------------
// sending (shared by both APIs)

void Channel::start_frame(FrameType type, const void* payload, size_t len) {
  APPLIANCE_ASSERT(seg_ == 2, "a frame is already being sent to rank " + std::to_string(peer()));
  if (torn_)
    throw Error(Code::kInternal, "channel unusable: an earlier send timed out in the middle of a frame", peer(),
                peer_host());
  if (len > std::numeric_limits<uint32_t>::max())
    throw Error(Code::kInvalid, "frame payload of " + std::to_string(len) + " bytes is too large", peer(), peer_host());
  FrameHeader h;
  h.type = type;
  h.length = static_cast<uint32_t>(len);
  h.seq = send_seq_++;
  encode_frame_header(h, send_buf_);
  frame_sent_ = 0;
  seg_ = 0;
  seg_ptr_[0] = send_buf_;
  if (len <= kSmallFrame) {
    if (len) std::memcpy(send_buf_ + kFrameHeaderSize, payload, len);
    seg_len_[0] = kFrameHeaderSize + len;
    seg_ptr_[1] = nullptr;
    seg_len_[1] = 0;
  } else {
    seg_len_[0] = kFrameHeaderSize;
    seg_ptr_[1] = static_cast<const uint8_t*>(payload);
    seg_len_[1] = len;
  }
}

bool Channel::pump_send() {
  while (seg_ < 2) {
    if (seg_len_[seg_] == 0) {
      ++seg_;
      continue;
    }
    size_t n = send_link(seg_ptr_[seg_], seg_len_[seg_]);
    if (n == 0) return false;
    seg_ptr_[seg_] += n;
    seg_len_[seg_] -= n;
    frame_sent_ += n;
  }
  return true;
}

bool Channel::sending() const { return seg_ < 2; }

void Channel::begin_send(const void* payload, size_t len) { start_frame(FrameType::kData, payload, len); }

void Channel::send_frame(FrameType type, const void* payload, size_t len, Deadline deadline) {
  start_frame(type, payload, len);
  for (;;) {
    if (pump_send()) return;
    if (Clock::now() >= deadline) {
      if (frame_sent_ == 0) {  // nothing on the wire: undo the frame, the stream stays intact
        --send_seq_;
        seg_ = 2;
      } else {
        torn_ = true;
        seg_ = 2;
      }
      throw Error(Code::kTimeout,
                  std::string("timed out sending a ") + frame_type_name(type) + " frame of " + std::to_string(len) +
                      " bytes (peer not reading)",
                  peer(), peer_host());
    }
    wait(false, true, deadline);
  }
}

// ---------------------------------------------------------------------------------------
// streaming receive

void Channel::begin_recv(void* dst, size_t len) {
  APPLIANCE_ASSERT(phase_ == RecvPhase::kIdle, "a frame is already being received from rank " + std::to_string(peer()));
  APPLIANCE_ASSERT(msg_hdr_have_ == 0 && !msg_in_payload_, "streaming receive while a message frame is half read");
  recv_ptr_ = static_cast<uint8_t*>(dst);
  recv_len_ = len;
  recv_off_ = 0;
  recv_buf_have_ = 0;
  phase_ = RecvPhase::kHeader;
}

bool Channel::receiving() const { return phase_ != RecvPhase::kIdle; }

size_t Channel::received_bytes() const { return recv_off_; }

void Channel::on_stream_header() {
  FrameHeader h = decode_or_throw(recv_buf_);
  size_t extra = recv_buf_have_ - kFrameHeaderSize;  // payload bytes that came with the header
  if (h.type == FrameType::kData) {
    if (h.length != recv_len_)
      protocol_error("data frame of " + std::to_string(h.length) + " bytes where " + std::to_string(recv_len_) +
                     " were expected (the ranks disagree on the message size)",
                     recv_seq_ - 1);
    if (extra) std::memcpy(recv_ptr_, recv_buf_ + kFrameHeaderSize, extra);
    recv_off_ = extra;
    phase_ = RecvPhase::kPayload;
    return;
  }
  if (h.type == FrameType::kAbort) {
    abort_buf_.assign(h.length, 0);  // bounded by max_payload_ (checked by the decoder)
    abort_have_ = std::min<size_t>(extra, h.length);
    if (abort_have_) std::memcpy(abort_buf_.data(), recv_buf_ + kFrameHeaderSize, abort_have_);
    phase_ = RecvPhase::kAbortPayload;
    return;
  }
  protocol_error(std::string("unexpected ") + frame_type_name(h.type) + " frame (" + std::to_string(h.length) +
                 " bytes) where data was expected",
                 recv_seq_ - 1);
}

bool Channel::pump_recv() {
  for (;;) {
    switch (phase_) {
      case RecvPhase::kIdle:
        return true;
      case RecvPhase::kHeader: {
        // Small frames: read header and payload in one go. Never reads past the expected
        // frame, so a well-formed stream is consumed exactly.
        size_t want = (recv_len_ <= kSmallFrame ? kFrameHeaderSize + recv_len_ : kFrameHeaderSize) - recv_buf_have_;
        size_t n = recv_link(recv_buf_ + recv_buf_have_, want);
        if (n == 0) return false;
        recv_buf_have_ += n;
        if (recv_buf_have_ >= kFrameHeaderSize) on_stream_header();
        break;
      }
      case RecvPhase::kPayload: {
        if (recv_off_ == recv_len_) {
          phase_ = RecvPhase::kIdle;
          return true;
        }
        size_t n = recv_link(recv_ptr_ + recv_off_, recv_len_ - recv_off_);
        if (n == 0) return false;
        recv_off_ += n;
        break;
      }
      case RecvPhase::kAbortPayload: {
        if (abort_have_ == abort_buf_.size()) {
          phase_ = RecvPhase::kIdle;
          throw_abort(abort_buf_.data(), abort_buf_.size());
        }
        size_t n = recv_link(abort_buf_.data() + abort_have_, abort_buf_.size() - abort_have_);
        if (n == 0) return false;
        abort_have_ += n;
        break;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// message receive

bool Channel::try_recv_frame(Frame& out) {
  APPLIANCE_ASSERT(phase_ == RecvPhase::kIdle, "message receive while a streaming receive is active");
  for (;;) {
    if (!msg_in_payload_) {
      size_t n = recv_link(msg_hdr_ + msg_hdr_have_, kFrameHeaderSize - msg_hdr_have_);
      if (n == 0) return false;
      msg_hdr_have_ += n;
      if (msg_hdr_have_ < kFrameHeaderSize) continue;
      FrameHeader h = decode_or_throw(msg_hdr_);
      msg_type_ = h.type;
      partial_.resize(h.length);  // bounded by max_payload_ before this allocation
      partial_have_ = 0;
      msg_in_payload_ = true;
    }
    if (partial_have_ < partial_.size()) {
      size_t n = recv_link(partial_.data() + partial_have_, partial_.size() - partial_have_);
      if (n == 0) return false;
      partial_have_ += n;
      continue;
    }
    out.type = msg_type_;
    out.payload = std::move(partial_);
    partial_ = std::vector<uint8_t>();
    partial_have_ = 0;
    msg_hdr_have_ = 0;
    msg_in_payload_ = false;
    return true;
  }
}

Frame Channel::recv_frame(Deadline deadline) {
  Frame f;
  for (;;) {
    if (try_recv_frame(f)) return f;
    if (Clock::now() >= deadline)
      throw Error(Code::kTimeout,
                  std::string("timed out waiting for a frame") + (msg_hdr_have_ ? " (one is half received)" : ""),
                  peer(), peer_host());
    wait(true, false, deadline);
  }
}

// ---------------------------------------------------------------------------------------
// waiting

void Channel::wait(bool for_read, bool for_write, Deadline deadline) {
  if (!for_read && !for_write) return;
  int fd = link_->wait_handle();
  // No handle: back off. A link that moves bytes without syscalls: spin a little first.
  if (fd < 0 || (link_->spins() && backoff_.next_sleep_us() == 0)) {
    backoff_.step();
    return;
  }
  short events = link_->arm_wait(for_read, for_write);
  if (events == 0) return;  // it can progress already
  int timeout_ms = -1;
  if (deadline != no_deadline()) {
    auto left = deadline - Clock::now();
    if (left <= Clock::duration::zero()) return;
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(left).count() + 1;  // round up
    timeout_ms = static_cast<int>(std::min<int64_t>(ms, 60000));
  }
  pollfd p{fd, events, 0};
  ::poll(&p, 1, timeout_ms);  // EINTR or a timeout just return: callers loop
  backoff_.reset();
}

}  // namespace appliance
