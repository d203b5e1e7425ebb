// Frame headers: encoding, validation and their CRC-32C (see frame.h).
#include "wire/frame.h"

#include <array>
#include <cstring>
#include <sstream>

namespace appliance {

namespace {
constexpr uint8_t kMagic[4] = {'A', 'P', 'L', 'F'};

void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}

std::array<uint32_t, 256> make_crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // Castagnoli
    t[i] = c;
  }
  return t;
}

uint32_t crc32c_table(const uint8_t* p, size_t n, uint32_t c) {
  static const std::array<uint32_t, 256> table = make_crc_table();
  for (size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// SSE4.2's crc32 instruction computes CRC-32C: every frame header is checked on both ends,
// several per collective, so the byte table's cost showed in small ops' profiles.
__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(const uint8_t* p, size_t n, uint32_t c) {
  uint64_t c64 = c;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c64 = __builtin_ia32_crc32di(c64, v);
  }
  c = static_cast<uint32_t>(c64);
  for (; n > 0; --n, ++p) c = __builtin_ia32_crc32qi(c, *p);
  return c;
}

bool have_sse42() {
  static const bool ok = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2") != 0;
  }();
  return ok;
}
#endif
}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t seed) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (have_sse42()) return ~crc32c_sse42(p, n, ~seed);
#endif
  return ~crc32c_table(p, n, ~seed);
}

bool frame_type_valid(uint8_t raw) { return raw >= 1 && raw <= static_cast<uint8_t>(FrameType::kBye); }

const char* frame_type_name(FrameType t) {
  switch (t) {
    case FrameType::kData: return "data";
    case FrameType::kHello: return "hello";
    case FrameType::kChallenge: return "challenge";
    case FrameType::kProof: return "proof";
    case FrameType::kControl: return "control";
    case FrameType::kHeartbeat: return "heartbeat";
    case FrameType::kAbort: return "abort";
    case FrameType::kStoreRequest: return "store request";
    case FrameType::kStoreReply: return "store reply";
    case FrameType::kBye: return "bye";
  }
  return "unknown";
}

void encode_frame_header(const FrameHeader& h, uint8_t out[kFrameHeaderSize]) {
  std::memcpy(out, kMagic, 4);
  out[4] = kWireVersion;
  out[5] = static_cast<uint8_t>(h.type);
  out[6] = 0;
  out[7] = 0;
  put_u32(out + 8, h.length);
  put_u32(out + 12, h.seq);
  put_u32(out + 16, crc32c(out, 16));
}

DecodeResult decode_frame_header(const uint8_t* b, size_t n, uint32_t expected_seq,
                                 uint32_t max_length) {
  DecodeResult r;
  if (n < kFrameHeaderSize) {  // callers pass whole headers; treat a short one as torn
    r.error = DecodeError::kBadMagic;
    return r;
  }
  if (std::memcmp(b, kMagic, 4) != 0) {
    r.error = DecodeError::kBadMagic;
    r.got = get_u32(b);
    return r;
  }
  if (get_u32(b + 16) != crc32c(b, 16)) {
    r.error = DecodeError::kBadCrc;
    return r;
  }
  if (b[4] != kWireVersion) {
    r.error = DecodeError::kBadVersion;
    r.got = b[4];
    r.want = kWireVersion;
    return r;
  }
  if (!frame_type_valid(b[5])) {
    r.error = DecodeError::kBadType;
    r.got = b[5];
    return r;
  }
  if (b[6] != 0 || b[7] != 0) {
    r.error = DecodeError::kReserved;
    return r;
  }
  r.header.type = static_cast<FrameType>(b[5]);
  r.header.length = get_u32(b + 8);
  r.header.seq = get_u32(b + 12);
  if (r.header.length > max_length) {
    r.error = DecodeError::kTooLong;
    r.got = r.header.length;
    r.want = max_length;
    return r;
  }
  if (r.header.seq != expected_seq) {
    r.error = DecodeError::kBadSeq;
    r.got = r.header.seq;
    r.want = expected_seq;
    return r;
  }
  return r;
}

std::string DecodeResult::describe() const {
  std::ostringstream os;
  switch (error) {
    case DecodeError::kNone: return "ok";
    case DecodeError::kBadMagic: os << "bad frame magic 0x" << std::hex << got << " (stream torn or not our protocol)"; break;
    case DecodeError::kBadVersion: os << "wire version " << got << ", expected " << want; break;
    case DecodeError::kBadCrc: os << "frame header checksum mismatch (corrupt frame)"; break;
    case DecodeError::kBadType: os << "unknown frame type " << got; break;
    case DecodeError::kReserved: os << "reserved frame bits set"; break;
    case DecodeError::kTooLong: os << "frame of " << got << " bytes exceeds the limit of " << want; break;
    case DecodeError::kBadSeq: os << "frame sequence " << got << ", expected " << want << " (lost or duplicated frame)"; break;
  }
  return os.str();
}

}  // namespace appliance
