// Shared-memory pairing over an authenticated socket (see shm_pairing.h).
#include "transport/shm/shm_pairing.h"

#include "common/status.h"
#include "transport/frame_io.h"

namespace appliance {

namespace {

constexpr uint32_t kSetupSeq = 0;
constexpr uint32_t kSetupMaxPayload = 1024;

void send_msg(int fd, bool ok, const std::string& text, Deadline d, const std::string& what) {
  std::string payload = (ok ? "1" : "0") + text;
  send_frame_fd(fd, FrameType::kControl, kSetupSeq, payload.data(), payload.size(), d, what);
}

bool recv_msg(int fd, Deadline d, const std::string& what, std::string* text) {
  Frame f = recv_frame_fd(fd, kSetupSeq, kSetupMaxPayload, d, what);
  if (f.type != FrameType::kControl || f.payload.empty() || (f.payload[0] != '0' && f.payload[0] != '1'))
    throw Error(Code::kProtocol, "malformed shared-memory setup message from " + what);
  text->assign(f.payload.begin() + 1, f.payload.end());
  return f.payload[0] == '1';
}

}  // namespace

ShmOffer shm_offer(int fd, int me, int peer, uint64_t ring_bytes, Deadline d, const std::string& who) {
  ShmOffer o;
  o.peer = peer;
  o.fd = fd;
  o.name = ShmSegment::make_name(me, peer);
  try {
    o.seg.reset(ShmSegment::create(o.name, ring_bytes));
  } catch (const Error& e) {
    o.why = e.status().message;
  }
  send_msg(fd, o.seg != nullptr, o.seg ? o.name : o.why, d, "shared-memory offer to " + who);
  return o;
}

std::shared_ptr<ShmSegment> shm_accept(int fd, Deadline d, const std::string& who, std::string* why) {
  std::string text;
  bool offered = recv_msg(fd, d, "shared-memory offer from " + who, &text);
  std::shared_ptr<ShmSegment> seg;
  if (!offered) {
    *why = who + " could not create a segment: " + text;
  } else {
    if (text.size() < 2 || text[0] != '/' || text.find('/', 1) != std::string::npos)
      throw Error(Code::kProtocol, "shared-memory offer from " + who + " names no segment: " + text);
    try {
      seg.reset(ShmSegment::open(text));
    } catch (const Error& e) {
      *why = e.status().message;
    }
    ShmSegment::unlink(text);
  }
  send_msg(fd, seg != nullptr, seg ? std::string() : *why, d, "shared-memory answer to " + who);
  return seg;
}

bool shm_confirm(ShmOffer& o, Deadline d, const std::string& who) {
  // The answer is read even after a failed offer: the socket must be empty when a TCP
  // Channel takes it over.
  std::string text;
  bool ok;
  try {
    ok = recv_msg(o.fd, d, "shared-memory answer from " + who, &text);
  } catch (...) {
    if (o.seg) ShmSegment::unlink(o.name);
    throw;
  }
  if (!o.seg) return false;
  ShmSegment::unlink(o.name);
  if (!ok) {
    o.why = who + " could not map our segment: " + text;
    o.seg.reset();
  }
  return ok;
}

}  // namespace appliance
