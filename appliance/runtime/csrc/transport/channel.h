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
//
// IMPLEMENTATION OWNER: see csrc/README.md (data-plane work package).
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

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

  int peer() const { return link_->peer(); }
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
  LinkPtr link_;
  uint32_t max_payload_;
  uint32_t send_seq_ = 0, recv_seq_ = 0;
  // send state
  uint8_t send_hdr_[kFrameHeaderSize];
  size_t send_hdr_off_ = kFrameHeaderSize;
  const uint8_t* send_ptr_ = nullptr;
  size_t send_len_ = 0, send_off_ = 0;
  bool send_active_ = false;
  // recv state
  uint8_t recv_hdr_[kFrameHeaderSize];
  size_t recv_hdr_off_ = 0;
  uint8_t* recv_ptr_ = nullptr;
  size_t recv_len_ = 0, recv_off_ = 0;
  bool recv_active_ = false;
  std::vector<uint8_t> partial_;  // message API: bytes of a frame being assembled
};

}  // namespace appliance
