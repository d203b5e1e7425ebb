// Writer, and the bounds-checked Reader of message payloads (see codec.h).
#include "wire/codec.h"

#include <cstring>

namespace appliance {

void Writer::u32(uint32_t v) {
  for (int i = 0; i < 4; ++i) buf_.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void Writer::u64(uint64_t v) {
  for (int i = 0; i < 8; ++i) buf_.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void Writer::f64(double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, 8);
  u64(bits);
}
void Writer::bytes(const void* p, size_t n) {
  u32(static_cast<uint32_t>(n));
  const uint8_t* b = static_cast<const uint8_t*>(p);
  buf_.insert(buf_.end(), b, b + n);
}
void Writer::i64s(const std::vector<int64_t>& v) {
  u32(static_cast<uint32_t>(v.size()));
  for (int64_t x : v) i64(x);
}
void Writer::status(const Status& s) {
  u8(static_cast<uint8_t>(s.code));
  i32(s.origin_rank);
  str(s.host);
  str(s.message);
}

Reader::Reader(const uint8_t* p, size_t n, std::string what) : p_(p), n_(n), what_(std::move(what)) {}

void Reader::fail(const std::string& why) const {
  throw Error(Code::kProtocol, "malformed " + what_ + ": " + why);
}

void Reader::need(size_t k) {
  if (k > n_ - off_) fail("truncated at byte " + std::to_string(off_) + " (needs " + std::to_string(k) + " more)");
}

uint8_t Reader::u8() {
  need(1);
  return p_[off_++];
}
uint32_t Reader::u32() {
  need(4);
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p_[off_ + i]) << (8 * i);
  off_ += 4;
  return v;
}
uint64_t Reader::u64() {
  need(8);
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p_[off_ + i]) << (8 * i);
  off_ += 8;
  return v;
}
double Reader::f64() {
  uint64_t bits = u64();
  double v;
  std::memcpy(&v, &bits, 8);
  return v;
}
std::string Reader::str(size_t max_len) {
  uint32_t n = u32();
  if (n > max_len) fail("string of " + std::to_string(n) + " bytes exceeds " + std::to_string(max_len));
  need(n);
  std::string s(reinterpret_cast<const char*>(p_ + off_), n);
  off_ += n;
  return s;
}
std::vector<uint8_t> Reader::bytes(size_t max_len) {
  size_t n = 0;
  const uint8_t* at = bytes_view(max_len, &n);
  return std::vector<uint8_t>(at, at + n);
}
const uint8_t* Reader::bytes_view(size_t max_len, size_t* len) {
  uint32_t n = u32();
  if (n > max_len) fail("field of " + std::to_string(n) + " bytes exceeds " + std::to_string(max_len));
  need(n);
  const uint8_t* at = p_ + off_;
  off_ += n;
  *len = n;
  return at;
}
std::vector<int64_t> Reader::i64s(size_t max_count) {
  uint32_t n = u32();
  if (n > max_count) fail("list of " + std::to_string(n) + " items exceeds " + std::to_string(max_count));
  need(static_cast<size_t>(n) * 8);
  std::vector<int64_t> v;
  v.reserve(n);
  for (uint32_t i = 0; i < n; ++i) v.push_back(i64());
  return v;
}
Status Reader::status() {
  Status s;
  uint8_t c = u8();
  if (c > static_cast<uint8_t>(Code::kStalled)) fail("unknown status code " + std::to_string(c));
  s.code = static_cast<Code>(c);
  s.origin_rank = i32();
  s.host = str(4096);
  s.message = str(1 << 16);
  return s;
}
void Reader::expect_done() const {
  if (!done()) fail(std::to_string(remaining()) + " trailing bytes");
}

}  // namespace appliance
