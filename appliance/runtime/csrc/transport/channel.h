// Channel: frames (wire/frame.h) over one Link, with per-direction sequence numbers.
//
// Two ways to use it:
//  * message API (control plane, store): send_frame / recv_frame move one whole frame,
//    blocking until a Deadline; try_recv_frame assembles a frame from whatever bytes have
//    arrived without blocking (partial frames are buffered inside the channel).
//  * streaming API (data plane, used by Comm): begin_send/pump_send and
//    begin_recv/pump_recv move one DATA frame in pieces without blocking, receiving the
//    payload straight into the caller's buffer (no copy, no allocation).
// A decode failure or an ABORT frame where data was expected throws Error naming the peer;
// an ABORT carries the origin status of the job failure and is rethrown as that status.
// Frames of other types (control, heartbeat...) where DATA was expected are protocol errors:
// on a data channel only DATA and ABORT travel.
//
// Small DATA frames (<= kSmallFrame payload bytes) go out as one send and come in with one
// receive (header and payload together) to halve syscalls on the latency path; larger ones
// move the payload straight between the link and the caller's buffer.
//
// Failure modes: Error(kProtocol) naming the peer rank/host for a malformed or unexpected
// frame; Error(kPeerLost) from the link; Error(kTimeout) from the message API's deadlines.
// A send that times out mid-frame leaves the stream torn; the channel then refuses to send.
// Not thread-safe: one thread drives a channel at a time (sends and receives may interleave).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "transport/backoff.h"
#include "transport/link.h"
#include "wire/frame.h"

namespace appliance {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;
inline Deadline deadline_after_ms(int64_t ms) { return Clock::now() + std::chrono::milliseconds(ms); }
inline Deadline no_deadline() { return Deadline::max(); }

struct Frame {
  FrameType type = FrameType::kData;
  std::vector<uint8_t> payload;
};

class Channel {
 public:
  // max_payload bounds every incoming frame; a larger one is a protocol error.
  Channel(LinkPtr link, uint32_t max_payload);

  static constexpr size_t kSmallFrame = 4096;

  int peer() const { return link_->peer(); }
  uint32_t max_payload() const { return max_payload_; }
  // Total bytes moved through the link in both directions (progress detection).
  uint64_t bytes_moved() const { return moved_; }
  const std::string& peer_host() const { return link_->peer_host(); }
  Link& link() { return *link_; }

  // ---- message API ----
  void send_frame(FrameType type, const void* payload, size_t len, Deadline deadline);
  Frame recv_frame(Deadline deadline);  // throws kTimeout when the deadline passes
  bool try_recv_frame(Frame& out);      // non-blocking; true when a whole frame is in `out`

  // ---- streaming API: one DATA frame at a time per direction ----
  void begin_send(const void* payload, size_t len);  // len <= peer's max_payload
  bool pump_send();                                  // true when the frame is fully sent
  bool sending() const;
  void begin_recv(void* dst, size_t len);            // expects a DATA frame of exactly len bytes
  bool pump_recv();                                  // true when the frame is fully received
  bool receiving() const;
  size_t received_bytes() const;                     // payload bytes of the current frame so far

  // Block on the link's wait handle (or back off when it has none) until it may progress.
  void wait(bool for_read, bool for_write, Deadline deadline);

 private:
  enum class RecvPhase : uint8_t { kIdle, kHeader, kPayload, kAbortPayload };

  FrameHeader decode_or_throw(const uint8_t* hdr);
  void on_stream_header();  // the streaming receive's header is complete
  [[noreturn]] void throw_abort(const uint8_t* payload, size_t len);
  [[noreturn]] void protocol_error(const std::string& what, uint32_t seq) const;
  size_t recv_link(void* dst, size_t len);
  size_t send_link(const void* src, size_t len);
  void start_frame(FrameType type, const void* payload, size_t len);

  LinkPtr link_;
  uint32_t max_payload_;
  uint32_t send_seq_ = 0, recv_seq_ = 0;
  uint64_t moved_ = 0;
  bool torn_ = false;  // a send timed out mid-frame
  Backoff backoff_;         // waiting on a link without a pollable handle
  size_t frame_sent_ = 0;   // bytes of the current outgoing frame already sent

  // send state (streaming): up to two segments, [header(+small payload)] [large payload]
  uint8_t send_buf_[kFrameHeaderSize + kSmallFrame];
  const uint8_t* seg_ptr_[2] = {nullptr, nullptr};
  size_t seg_len_[2] = {0, 0};
  int seg_ = 2;  // index of the segment being sent; 2 = idle

  // recv state (streaming)
  RecvPhase phase_ = RecvPhase::kIdle;
  uint8_t recv_buf_[kFrameHeaderSize + kSmallFrame];  // header (+ small payload) lands here
  size_t recv_buf_have_ = 0;
  uint8_t* recv_ptr_ = nullptr;
  size_t recv_len_ = 0, recv_off_ = 0;
  std::vector<uint8_t> abort_buf_;
  size_t abort_have_ = 0;

  // message API receive: header bytes then the payload being assembled
  uint8_t msg_hdr_[kFrameHeaderSize];
  size_t msg_hdr_have_ = 0;
  bool msg_in_payload_ = false;
  FrameType msg_type_ = FrameType::kData;
  std::vector<uint8_t> partial_;
  size_t partial_have_ = 0;
};

}  // namespace appliance
