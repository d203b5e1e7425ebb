// Bounds-checked encoding of message payloads (control messages, store requests, statuses).
// Little endian, no alignment. Reader throws Error(kProtocol) on any truncation or on a
// length above the bound it was given; it never allocates more than the bytes it holds.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace appliance {

class Writer {
 public:
  // Room for a small control message up front: one allocation, not one per doubling.
  Writer() { buf_.reserve(kInitialBytes); }
  void u8(uint8_t v) { buf_.push_back(v); }
  void u32(uint32_t v);
  void u64(uint64_t v);
  void i32(int32_t v) { u32(static_cast<uint32_t>(v)); }
  void i64(int64_t v) { u64(static_cast<uint64_t>(v)); }
  void f64(double v);
  void bytes(const void* p, size_t n);  // u32 length + raw bytes
  void str(const std::string& s) { bytes(s.data(), s.size()); }
  void i64s(const std::vector<int64_t>& v);
  void status(const Status& s);
  std::vector<uint8_t>& buffer() { return buf_; }
  size_t size() const { return buf_.size(); }
  // Rewrites the u32 written at byte `at` (a length known only after what follows it).
  void patch_u32(size_t at, uint32_t v) {
    for (int i = 0; i < 4; ++i) buf_[at + i] = static_cast<uint8_t>(v >> (8 * i));
  }
  std::vector<uint8_t> take() { return std::move(buf_); }

 private:
  static constexpr size_t kInitialBytes = 256;
  std::vector<uint8_t> buf_;
};

class Reader {
 public:
  // `what` names the message in errors: "control message from rank 3".
  Reader(const uint8_t* p, size_t n, std::string what);
  uint8_t u8();
  uint32_t u32();
  uint64_t u64();
  int32_t i32() { return static_cast<int32_t>(u32()); }
  int64_t i64() { return static_cast<int64_t>(u64()); }
  double f64();
  std::string str(size_t max_len = 1 << 20);
  std::vector<uint8_t> bytes(size_t max_len = 1 << 26);
  // A bytes() field without the copy: where it starts in the payload, its length in *len.
  const uint8_t* bytes_view(size_t max_len, size_t* len);
  std::vector<int64_t> i64s(size_t max_count = 1 << 20);
  Status status();
  size_t remaining() const { return n_ - off_; }
  bool done() const { return off_ == n_; }
  void expect_done() const;  // throws if trailing bytes remain
  [[noreturn]] void fail(const std::string& why) const;

 private:
  void need(size_t k);
  const uint8_t* p_;
  size_t n_;
  size_t off_ = 0;
  std::string what_;
};

}  // namespace appliance
