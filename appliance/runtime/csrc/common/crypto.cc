// SHA-256 (FIPS 180-4), HMAC-SHA256 (RFC 2104), constant-time compare and random bytes.
// Written here so the core has no OpenSSL dependency; checked against hashlib/hmac by
// tests/runtime/test_bootstrap_crypto.py. Speed is irrelevant (handshakes hash ~100 bytes).
#include "common/crypto.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <cstring>

#include "common/status.h"

namespace appliance {

namespace {

constexpr uint32_t kRound[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

inline uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

// Incremental hasher: feed any number of pieces, then finish once.
class Sha256 {
 public:
  void update(const void* data, size_t n) {
    const uint8_t* p = static_cast<const uint8_t*>(data);
    total_ += n;
    if (fill_ > 0) {
      size_t take = std::min(n, sizeof(block_) - fill_);
      std::memcpy(block_ + fill_, p, take);
      fill_ += take;
      p += take;
      n -= take;
      if (fill_ < sizeof(block_)) return;
      compress(block_);
      fill_ = 0;
    }
    for (; n >= 64; p += 64, n -= 64) compress(p);
    std::memcpy(block_, p, n);
    fill_ = n;
  }

  Digest finish() {
    const uint64_t bits = total_ * 8;
    const uint8_t pad = 0x80;
    update(&pad, 1);
    const uint8_t zero = 0;
    while (fill_ != 56) update(&zero, 1);
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(bits >> (56 - 8 * i));
    update(len, 8);
    Digest d;
    for (int i = 0; i < 8; ++i)
      for (int k = 0; k < 4; ++k) d[4 * i + k] = static_cast<uint8_t>(h_[i] >> (24 - 8 * k));
    return d;
  }

 private:
  void compress(const uint8_t* b) {
    uint32_t w[64];
    for (int i = 0; i < 16; ++i)
      w[i] = (uint32_t(b[4 * i]) << 24) | (uint32_t(b[4 * i + 1]) << 16) | (uint32_t(b[4 * i + 2]) << 8) |
             uint32_t(b[4 * i + 3]);
    for (int i = 16; i < 64; ++i) {
      uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h_[0], b2 = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
    for (int i = 0; i < 64; ++i) {
      uint32_t S1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
      uint32_t ch = (e & f) ^ (~e & g);
      uint32_t t1 = h + S1 + ch + kRound[i] + w[i];
      uint32_t S0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
      uint32_t maj = (a & b2) ^ (a & c) ^ (b2 & c);
      uint32_t t2 = S0 + maj;
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b2;
      b2 = a;
      a = t1 + t2;
    }
    h_[0] += a;
    h_[1] += b2;
    h_[2] += c;
    h_[3] += d;
    h_[4] += e;
    h_[5] += f;
    h_[6] += g;
    h_[7] += h;
  }

  uint32_t h_[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                    0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  uint8_t block_[64];
  size_t fill_ = 0;
  uint64_t total_ = 0;
};

}  // namespace

Digest sha256(const void* data, size_t n) {
  Sha256 s;
  s.update(data, n);
  return s.finish();
}

Digest hmac_sha256(const void* key, size_t key_len, const void* msg, size_t msg_len) {
  uint8_t k[64] = {0};
  if (key_len > sizeof(k)) {
    Digest kd = sha256(key, key_len);
    std::memcpy(k, kd.data(), kd.size());
  } else if (key_len > 0) {
    std::memcpy(k, key, key_len);
  }
  uint8_t pad[64];
  for (int i = 0; i < 64; ++i) pad[i] = k[i] ^ 0x36;
  Sha256 inner;
  inner.update(pad, 64);
  inner.update(msg, msg_len);
  Digest ih = inner.finish();
  for (int i = 0; i < 64; ++i) pad[i] = k[i] ^ 0x5c;
  Sha256 outer;
  outer.update(pad, 64);
  outer.update(ih.data(), ih.size());
  return outer.finish();
}

bool digest_equal(const Digest& a, const Digest& b) {
  volatile uint8_t diff = 0;  // volatile: keep the loop from being cut short
  for (size_t i = 0; i < a.size(); ++i) diff = diff | (a[i] ^ b[i]);
  return diff == 0;
}

std::vector<uint8_t> random_bytes(size_t n) {
  std::vector<uint8_t> out(n);
  size_t got = 0;
  while (got < n) {
    ssize_t r = getrandom(out.data() + got, n - got, 0);
    if (r > 0) {
      got += static_cast<size_t>(r);
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    break;  // ENOSYS (old kernel, seccomp): fall back to the device
  }
  if (got == n) return out;
  int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(Code::kInternal, std::string("no randomness: /dev/urandom: ") + std::strerror(errno));
  while (got < n) {
    ssize_t r = ::read(fd, out.data() + got, n - got);
    if (r > 0) {
      got += static_cast<size_t>(r);
    } else if (r < 0 && errno == EINTR) {
      continue;
    } else {
      int err = errno;
      ::close(fd);
      throw Error(Code::kInternal, std::string("reading /dev/urandom: ") + (r == 0 ? "EOF" : std::strerror(err)));
    }
  }
  ::close(fd);
  return out;
}

}  // namespace appliance
