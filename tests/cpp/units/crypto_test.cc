// SHA-256 and HMAC-SHA256 (common/crypto.h) against the published test vectors (FIPS 180-4
// examples, RFC 4231), and the constant-time comparison and nonce source around them.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "common/crypto.h"

namespace appliance {
namespace {

std::string hex(const Digest& d) {
  std::string s;
  char b[3];
  for (uint8_t x : d) {
    std::snprintf(b, sizeof(b), "%02x", x);
    s += b;
  }
  return s;
}

std::string sha(const std::string& m) { return hex(sha256(m.data(), m.size())); }
std::string hmac(const std::string& k, const std::string& m) { return hex(hmac_sha256(k.data(), k.size(), m.data(), m.size())); }

TEST(Sha256, matches_the_fips_180_examples) {
  EXPECT_EQ(sha(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha(std::string(1000000, 'a')), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, pads_correctly_around_the_block_boundary) {
  // 55, 56 and 64 bytes: the length field fits, just does not fit, and a full block.
  EXPECT_EQ(sha(std::string(55, 'a')), "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318");
  EXPECT_EQ(sha(std::string(56, 'a')), "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a");
  EXPECT_EQ(sha(std::string(64, 'a')), "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");
}

TEST(HmacSha256, matches_rfc_4231) {
  EXPECT_EQ(hmac(std::string(20, '\x0b'), "Hi There"),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(hmac("Jefe", "what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(hmac(std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First"),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  EXPECT_EQ(hmac(std::string(131, '\xaa'),
                 "This is a test using a larger than block-size key and a larger than block-size data. The key "
                 "needs to be hashed before being used by the HMAC algorithm."),
            "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
}

TEST(DigestEqual, tells_equal_from_different_digests) {
  Digest a = sha256("x", 1), b = a;
  EXPECT_TRUE(digest_equal(a, b));
  b[31] ^= 1;
  EXPECT_FALSE(digest_equal(a, b));
  b = a;
  b[0] ^= 0x80;
  EXPECT_FALSE(digest_equal(a, b));
}

TEST(RandomBytes, gives_the_length_asked_and_differs_between_calls) {
  EXPECT_TRUE(random_bytes(0).empty());
  std::vector<uint8_t> a = random_bytes(32), b = random_bytes(32);
  EXPECT_EQ(a.size(), 32u);
  EXPECT_NE(a, b);
}

}  // namespace
}  // namespace appliance
