// The wire: frame headers (wire/frame.h) and payload Reader/Writer (wire/codec.h). Every way
// a header can be wrong is named by the decoder, and no length is trusted before it is checked.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <limits>

#include "wire/codec.h"
#include "wire/frame.h"

namespace appliance {
namespace {

std::array<uint8_t, kFrameHeaderSize> header(FrameType t, uint32_t len, uint32_t seq) {
  std::array<uint8_t, kFrameHeaderSize> b{};
  encode_frame_header(FrameHeader{t, len, seq}, b.data());
  return b;
}

// Rewrites the checksum after a deliberate change, so the decoder gets past the CRC check.
void reseal(std::array<uint8_t, kFrameHeaderSize>& b) {
  const uint32_t c = crc32c(b.data(), 16);
  for (int i = 0; i < 4; ++i) b[16 + i] = static_cast<uint8_t>(c >> (8 * i));
}

TEST(FrameHeader, decodes_what_it_encoded) {
  auto b = header(FrameType::kControl, 1234, 7);
  DecodeResult r = decode_frame_header(b.data(), b.size(), 7, 4096);
  ASSERT_EQ(r.error, DecodeError::kNone) << r.describe();
  EXPECT_EQ(r.header.type, FrameType::kControl);
  EXPECT_EQ(r.header.length, 1234u);
  EXPECT_EQ(r.header.seq, 7u);
  EXPECT_EQ(r.describe(), "ok");
}

TEST(FrameHeader, is_twenty_bytes_little_endian_with_magic_first) {
  auto b = header(FrameType::kData, 0x01020304, 0x0a0b0c0d);
  EXPECT_EQ(std::memcmp(b.data(), "APLF", 4), 0);
  EXPECT_EQ(b[4], kWireVersion);
  EXPECT_EQ(b[5], static_cast<uint8_t>(FrameType::kData));
  EXPECT_EQ(b[8], 0x04);
  EXPECT_EQ(b[11], 0x01);
  EXPECT_EQ(b[12], 0x0d);
}

TEST(FrameHeader, any_flipped_bit_is_refused) {
  const auto good = header(FrameType::kHeartbeat, 0, 3);
  for (size_t byte = 0; byte < kFrameHeaderSize; ++byte)
    for (int bit = 0; bit < 8; ++bit) {
      auto b = good;
      b[byte] ^= static_cast<uint8_t>(1u << bit);
      DecodeResult r = decode_frame_header(b.data(), b.size(), 3, 4096);
      EXPECT_NE(r.error, DecodeError::kNone) << "byte " << byte << " bit " << bit;
    }
}

TEST(FrameHeader, a_corrupt_header_is_a_checksum_error) {
  auto b = header(FrameType::kData, 100, 0);
  b[9] ^= 0x40;  // length
  DecodeResult r = decode_frame_header(b.data(), b.size(), 0, 4096);
  EXPECT_EQ(r.error, DecodeError::kBadCrc);
  EXPECT_NE(r.describe().find("checksum"), std::string::npos);
}

TEST(FrameHeader, a_torn_stream_is_bad_magic) {
  auto b = header(FrameType::kData, 100, 0);
  b[0] = 'X';
  DecodeResult r = decode_frame_header(b.data(), b.size(), 0, 4096);
  EXPECT_EQ(r.error, DecodeError::kBadMagic);
  EXPECT_NE(r.describe().find("magic"), std::string::npos);
}

TEST(FrameHeader, a_truncated_header_is_refused) {
  auto b = header(FrameType::kData, 100, 0);
  for (size_t n = 0; n < kFrameHeaderSize; ++n)
    EXPECT_EQ(decode_frame_header(b.data(), n, 0, 4096).error, DecodeError::kBadMagic) << n << " bytes";
}

TEST(FrameHeader, a_length_over_the_bound_is_refused_before_anything_is_read) {
  auto b = header(FrameType::kData, std::numeric_limits<uint32_t>::max(), 0);
  DecodeResult r = decode_frame_header(b.data(), b.size(), 0, 4u << 20);
  EXPECT_EQ(r.error, DecodeError::kTooLong);
  EXPECT_EQ(r.got, std::numeric_limits<uint32_t>::max());
  EXPECT_EQ(r.want, 4u << 20);
  EXPECT_NE(r.describe().find("exceeds the limit of 4194304"), std::string::npos) << r.describe();
  EXPECT_EQ(decode_frame_header(header(FrameType::kData, 4u << 20, 0).data(), kFrameHeaderSize, 0, 4u << 20).error,
            DecodeError::kNone);
}

TEST(FrameHeader, a_lost_or_repeated_frame_is_a_sequence_error) {
  auto b = header(FrameType::kData, 0, 5);
  DecodeResult r = decode_frame_header(b.data(), b.size(), 4, 4096);
  EXPECT_EQ(r.error, DecodeError::kBadSeq);
  EXPECT_EQ(r.got, 5u);
  EXPECT_EQ(r.want, 4u);
}

TEST(FrameHeader, another_version_unknown_type_or_reserved_bits_are_named) {
  auto v = header(FrameType::kData, 0, 0);
  v[4] = kWireVersion + 1;
  reseal(v);
  EXPECT_EQ(decode_frame_header(v.data(), v.size(), 0, 4096).error, DecodeError::kBadVersion);
  auto t = header(FrameType::kData, 0, 0);
  t[5] = 0;
  reseal(t);
  EXPECT_EQ(decode_frame_header(t.data(), t.size(), 0, 4096).error, DecodeError::kBadType);
  t[5] = static_cast<uint8_t>(FrameType::kBye) + 1;
  reseal(t);
  EXPECT_EQ(decode_frame_header(t.data(), t.size(), 0, 4096).error, DecodeError::kBadType);
  auto z = header(FrameType::kData, 0, 0);
  z[7] = 1;
  reseal(z);
  EXPECT_EQ(decode_frame_header(z.data(), z.size(), 0, 4096).error, DecodeError::kReserved);
}

TEST(Crc32c, matches_the_castagnoli_check_value_and_chains) {
  const char* s = "123456789";
  EXPECT_EQ(crc32c(s, 9), 0xE3069283u);  // the standard check value of CRC-32C
  EXPECT_EQ(crc32c(s + 4, 5, crc32c(s, 4)), 0xE3069283u);
  EXPECT_EQ(crc32c(nullptr, 0), 0u);
}

TEST(Codec, reads_back_every_field_it_wrote) {
  Writer w;
  w.u8(200);
  w.u32(0xdeadbeef);
  w.u64(0x0102030405060708ull);
  w.i32(-5);
  w.i64(-6);
  w.f64(0.25);
  w.str("name");
  w.bytes("\0\1", 2);
  w.i64s({1, -2, 3});
  w.status(Status{Code::kPeerLost, 3, "hostB", "reset"});
  std::vector<uint8_t> b = w.take();
  Reader r(b.data(), b.size(), "test message");
  EXPECT_EQ(r.u8(), 200);
  EXPECT_EQ(r.u32(), 0xdeadbeefu);
  EXPECT_EQ(r.u64(), 0x0102030405060708ull);
  EXPECT_EQ(r.i32(), -5);
  EXPECT_EQ(r.i64(), -6);
  EXPECT_EQ(r.f64(), 0.25);
  EXPECT_EQ(r.str(), "name");
  EXPECT_EQ(r.bytes(), (std::vector<uint8_t>{0, 1}));
  EXPECT_EQ(r.i64s(), (std::vector<int64_t>{1, -2, 3}));
  Status s = r.status();
  EXPECT_EQ(s.code, Code::kPeerLost);
  EXPECT_EQ(s.origin_rank, 3);
  EXPECT_EQ(s.host, "hostB");
  EXPECT_EQ(s.message, "reset");
  EXPECT_TRUE(r.done());
  r.expect_done();
}

// Throws Error(kProtocol) whose text contains `part`.
template <class F>
void expect_protocol_error(F&& f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning '" << part << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.status().code, Code::kProtocol);
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(Codec, a_truncated_payload_is_a_protocol_error_naming_the_message) {
  Writer w;
  w.u64(1);
  std::vector<uint8_t> b = w.take();
  for (size_t n = 0; n < b.size(); ++n) {
    Reader r(b.data(), n, "READY message from rank 2");
    expect_protocol_error([&] { r.u64(); }, "malformed READY message from rank 2: truncated");
  }
}

TEST(Codec, a_declared_length_over_the_bound_is_refused_without_allocating) {
  Writer w;
  w.u32(0xffffffffu);  // a string or field "of 4 GiB", with nothing behind it
  std::vector<uint8_t> b = w.take();
  expect_protocol_error([&] { Reader(b.data(), b.size(), "m").str(); }, "exceeds");
  expect_protocol_error([&] { Reader(b.data(), b.size(), "m").bytes(); }, "exceeds");
  expect_protocol_error([&] { Reader(b.data(), b.size(), "m").i64s(); }, "exceeds");
  Writer v;
  v.str("0123456789");
  std::vector<uint8_t> c = v.take();
  expect_protocol_error([&] { Reader(c.data(), c.size(), "m").str(9); }, "string of 10 bytes exceeds 9");
  EXPECT_EQ(Reader(c.data(), c.size(), "m").str(10), "0123456789");
}

TEST(Codec, a_length_within_the_bound_but_past_the_end_is_truncation) {
  Writer w;
  w.u32(100);
  w.u8(1);
  std::vector<uint8_t> b = w.take();
  expect_protocol_error([&] { Reader(b.data(), b.size(), "m").bytes(); }, "truncated");
  Writer l;
  l.u32(3);
  l.i64(1);
  std::vector<uint8_t> c = l.take();
  expect_protocol_error([&] { Reader(c.data(), c.size(), "m").i64s(); }, "truncated");
}

TEST(Codec, trailing_bytes_and_unknown_status_codes_are_refused) {
  Writer w;
  w.u8(1);
  w.u8(2);
  std::vector<uint8_t> b = w.take();
  Reader r(b.data(), b.size(), "m");
  r.u8();
  expect_protocol_error([&] { r.expect_done(); }, "1 trailing bytes");
  Writer s;
  s.u8(static_cast<uint8_t>(Code::kStalled) + 1);
  s.i32(0);
  s.str("");
  s.str("");
  std::vector<uint8_t> c = s.take();
  expect_protocol_error([&] { Reader(c.data(), c.size(), "m").status(); }, "unknown status code");
}

}  // namespace
}  // namespace appliance
