// SHA-256 and HMAC-SHA256 (FIPS 180-4, RFC 2104), for proving the job secret in handshakes,
// and a source of random nonces (getrandom / /dev/urandom).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace appliance {

using Digest = std::array<uint8_t, 32>;

Digest sha256(const void* data, size_t n);
Digest hmac_sha256(const void* key, size_t key_len, const void* msg, size_t msg_len);
bool digest_equal(const Digest& a, const Digest& b);  // constant time
std::vector<uint8_t> random_bytes(size_t n);

}  // namespace appliance
