// Frames on a raw socket fd, for the code that runs before (or instead of) a Channel: the
// auth handshake, the store server and client. Two styles:
//  * blocking with a deadline: send_frame_fd / recv_frame_fd (connector side, store client);
//  * incremental: FrameAssembler collects a frame from whatever bytes a non-blocking fd
//    yields and asks for exactly the bytes of the current part, so it never reads past a
//    frame (bytes after a handshake stay in the socket for whoever owns it next).
// Every incoming header is validated (wire/frame.h) against the expected sequence number and
// a payload bound before anything is allocated; failures are Error(kProtocol) naming `what`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "transport/channel.h"  // Frame, Deadline

namespace appliance {

std::vector<uint8_t> encode_frame(FrameType type, uint32_t seq, const void* payload, size_t len);

void send_frame_fd(int fd, FrameType type, uint32_t seq, const void* payload, size_t len, Deadline d,
                   const std::string& what);
// Reads one frame carrying `expected_seq` whose payload is at most `max_payload` bytes.
Frame recv_frame_fd(int fd, uint32_t expected_seq, uint32_t max_payload, Deadline d, const std::string& what);

class FrameAssembler {
 public:
  explicit FrameAssembler(uint32_t max_payload) : max_payload_(max_payload) {}
  void set_max_payload(uint32_t m) { max_payload_ = m; }
  uint32_t next_seq() const { return seq_; }
  bool idle() const { return hdr_off_ == 0 && !in_payload_; }

  // Where the next bytes go and exactly how many the current part (header or payload) lacks.
  uint8_t* dst();
  size_t want() const;
  // `n` (<= want()) bytes were stored at dst(). True when a whole frame is ready: take() it
  // before feeding more. Throws Error(kProtocol) "malformed frame from <what>: ..." on a bad
  // header.
  bool advance(size_t n, const std::string& what);
  Frame take();

 private:
  uint32_t max_payload_;
  uint32_t seq_ = 0;
  uint8_t hdr_[kFrameHeaderSize];
  size_t hdr_off_ = 0;
  bool in_payload_ = false, ready_ = false;
  size_t pay_off_ = 0;
  Frame frame_;
};

// Non-blocking: receive into the assembler what the fd has, up to one whole frame. Returns
// true when a frame is ready. Throws Error(kPeerLost) on EOF/reset, kProtocol on garbage.
bool pump_frame_fd(int fd, FrameAssembler& a, const std::string& what);

// Non-blocking: write what the socket takes from the front of `out` and erase it. Throws
// Error(kPeerLost) on reset. True when `out` is empty.
bool flush_some_fd(int fd, std::vector<uint8_t>& out, const std::string& what);

}  // namespace appliance
