// Frames: the unit of everything the core puts on a link (TCP or shared memory).
//
//   offset size field
//   0      4    magic   'A','P','L','F'
//   4      1    version kWireVersion
//   5      1    type    FrameType
//   6      2    reserved, must be 0
//   8      4    length  payload bytes that follow the header (little endian)
//   12     4    seq     per link and direction, starts at 0, +1 per frame
//   16     4    crc     CRC-32C of bytes 0..15
//
// The decoder is a pure function over bytes so it can be fuzzed on its own. A length is
// checked against the caller's bound before anything is allocated. Payloads are not
// checksummed (that would cost memory bandwidth on the data path); headers are, so a torn
// or shifted stream is caught at the next frame boundary and named.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace appliance {

constexpr uint8_t kWireVersion = 2;  // 2: PLAN carries lateness (Plan::late)
constexpr size_t kFrameHeaderSize = 20;

enum class FrameType : uint8_t {
  kData = 1,       // collective payload
  kHello = 2,      // handshake: connector introduces itself
  kChallenge = 3,  // handshake: acceptor's proof and nonce
  kProof = 4,      // handshake: connector's proof
  kControl = 5,    // negotiation message (engine <-> coordinator)
  kHeartbeat = 6,  // liveness, empty payload
  kAbort = 7,      // job-wide failure, payload = encoded Status
  kStoreRequest = 8,
  kStoreReply = 9,
  kBye = 10,       // orderly shutdown of a link
};
bool frame_type_valid(uint8_t raw);
const char* frame_type_name(FrameType t);

struct FrameHeader {
  FrameType type = FrameType::kData;
  uint32_t length = 0;
  uint32_t seq = 0;
};

void encode_frame_header(const FrameHeader& h, uint8_t out[kFrameHeaderSize]);

enum class DecodeError : uint8_t {
  kNone = 0,
  kBadMagic,
  kBadVersion,
  kBadCrc,
  kBadType,
  kReserved,
  kTooLong,
  kBadSeq,
};

struct DecodeResult {
  DecodeError error = DecodeError::kNone;
  FrameHeader header;
  std::string describe() const;  // "bad magic 0x..", "frame of 123456789 bytes exceeds limit 4194304"...
  uint32_t got = 0, want = 0;    // detail for kBadSeq / kTooLong / kBadVersion / kBadMagic
};

// Validate a header. `expected_seq` is the sequence number this direction must carry next;
// `max_length` bounds the payload for this link and frame type.
DecodeResult decode_frame_header(const uint8_t* bytes, size_t n, uint32_t expected_seq,
                                 uint32_t max_length);

uint32_t crc32c(const void* data, size_t n, uint32_t seed = 0);

}  // namespace appliance
