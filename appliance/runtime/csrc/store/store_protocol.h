// The store's wire protocol (internal to store/): after the auth handshake (channel
// kStoreChannel, acceptor rank kStoreServerRank) the client sends STORE_REQUEST frames and
// the server answers with STORE_REPLY frames, sequence numbers from 0 in each direction.
// Replies carry the request id and may come out of order (a GET waiting for its key does not
// hold back a SET behind it), so one connection serves several client threads.
//
//   request: u64 id, u8 op, then   SET: str key, bytes value
//                                  GET: str key, i64 timeout_ms
//                                  WAIT: u32 n, n x str key, i64 timeout_ms
//                                  ADD: str key, i64 delta
//   reply:   u64 id, u8 code (Code), then   ok GET: bytes value;  ok ADD: i64 value
//                                           not ok: str message, u32 n, n x str missing key
//
// ADD keeps the integer as decimal ASCII, so GET of a counter returns b"3".
#pragma once

#include <cstdint>

namespace appliance {
namespace store_proto {

enum Op : uint8_t { kSet = 1, kGet = 2, kWait = 3, kAdd = 4 };

constexpr uint32_t kMaxKey = 4096;
constexpr uint32_t kMaxValue = 64u << 20;
constexpr uint32_t kMaxWaitKeys = 1u << 16;
constexpr uint32_t kMaxFrame = kMaxValue + (1u << 20);
// How long a connection may take to authenticate before the server drops it.
constexpr int64_t kHandshakeTimeoutMs = 10000;

}  // namespace store_proto
}  // namespace appliance
