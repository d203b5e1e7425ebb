// Frames on raw fds (see frame_io.h).
#include "transport/frame_io.h"

#include <errno.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "common/status.h"
#include "transport/tcp/socket.h"

namespace appliance {

std::vector<uint8_t> encode_frame(FrameType type, uint32_t seq, const void* payload, size_t len) {
  APPLIANCE_ASSERT(len <= UINT32_MAX, "frame payload over 4 GiB");
  std::vector<uint8_t> out(kFrameHeaderSize + len);
  FrameHeader h;
  h.type = type;
  h.length = static_cast<uint32_t>(len);
  h.seq = seq;
  encode_frame_header(h, out.data());
  if (len) std::memcpy(out.data() + kFrameHeaderSize, payload, len);
  return out;
}

void send_frame_fd(int fd, FrameType type, uint32_t seq, const void* payload, size_t len, Deadline d,
                   const std::string& what) {
  std::vector<uint8_t> bytes = encode_frame(type, seq, payload, len);
  write_all(fd, bytes.data(), bytes.size(), d, what);
}

Frame recv_frame_fd(int fd, uint32_t expected_seq, uint32_t max_payload, Deadline d, const std::string& what) {
  uint8_t hdr[kFrameHeaderSize];
  read_all(fd, hdr, sizeof(hdr), d, what);
  DecodeResult r = decode_frame_header(hdr, sizeof(hdr), expected_seq, max_payload);
  if (r.error != DecodeError::kNone) throw Error(Code::kProtocol, "malformed frame while " + what + ": " + r.describe());
  Frame f;
  f.type = r.header.type;
  f.payload.resize(r.header.length);
  if (r.header.length) read_all(fd, f.payload.data(), f.payload.size(), d, what);
  return f;
}

uint8_t* FrameAssembler::dst() {
  return in_payload_ ? frame_.payload.data() + pay_off_ : hdr_ + hdr_off_;
}

size_t FrameAssembler::want() const {
  if (ready_) return 0;
  return in_payload_ ? frame_.payload.size() - pay_off_ : kFrameHeaderSize - hdr_off_;
}

bool FrameAssembler::advance(size_t n, const std::string& what) {
  APPLIANCE_ASSERT(n <= want(), "assembler fed more than it asked for");
  if (!in_payload_) {
    hdr_off_ += n;
    // Judge the magic as soon as it is there: a stranger that sends a few bytes of
    // something else is dropped at once, not when its handshake times out.
    static const uint8_t kMagic[4] = {'A', 'P', 'L', 'F'};  // wire/frame.h, offset 0
    for (size_t i = hdr_off_ - n; i < std::min<size_t>(hdr_off_, 4); ++i)
      if (hdr_[i] != kMagic[i]) {
        char hex[3 * 4 + 1] = {0};
        for (size_t k = 0; k < std::min<size_t>(hdr_off_, 4); ++k) std::snprintf(hex + 3 * k, 4, "%02x ", hdr_[k]);
        throw Error(Code::kProtocol, "malformed frame from " + what + ": bad frame magic (stream torn or not our "
                                     "protocol), starts with " + std::string(hex, std::strlen(hex) - 1));
      }
    if (hdr_off_ < kFrameHeaderSize) return false;
    DecodeResult r = decode_frame_header(hdr_, kFrameHeaderSize, seq_, max_payload_);
    if (r.error != DecodeError::kNone) throw Error(Code::kProtocol, "malformed frame from " + what + ": " + r.describe());
    frame_.type = r.header.type;
    frame_.payload.assign(r.header.length, 0);
    pay_off_ = 0;
    in_payload_ = true;
  } else {
    pay_off_ += n;
  }
  if (pay_off_ < frame_.payload.size()) return false;
  ready_ = true;
  return true;
}

Frame FrameAssembler::take() {
  APPLIANCE_ASSERT(ready_, "take() without a complete frame");
  Frame f = std::move(frame_);
  frame_ = Frame{};
  ready_ = false;
  in_payload_ = false;
  hdr_off_ = 0;
  pay_off_ = 0;
  ++seq_;
  return f;
}

bool pump_frame_fd(int fd, FrameAssembler& a, const std::string& what) {
  for (;;) {
    size_t want = a.want();
    if (want == 0) return true;  // a frame is waiting to be taken
    ssize_t k = ::recv(fd, a.dst(), want, MSG_DONTWAIT);
    if (k > 0) {
      if (a.advance(static_cast<size_t>(k), what)) return true;
      continue;
    }
    if (k == 0) throw Error(Code::kPeerLost, "connection closed by " + what);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
    throw Error(Code::kPeerLost, std::string(std::strerror(errno)) + " on the connection from " + what);
  }
}

bool flush_some_fd(int fd, std::vector<uint8_t>& out, const std::string& what) {
  size_t off = 0;
  while (off < out.size()) {
    ssize_t k = ::send(fd, out.data() + off, out.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k > 0) {
      off += static_cast<size_t>(k);
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    int err = errno;
    out.erase(out.begin(), out.begin() + off);
    throw Error(Code::kPeerLost, std::string(std::strerror(err)) + " while sending to " + what);
  }
  out.erase(out.begin(), out.begin() + off);
  return out.empty();
}

}  // namespace appliance
