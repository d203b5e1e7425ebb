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
//                                  GET_MANY: u32 n, n x str key, i64 timeout_ms (waits for all)
//   reply:   u64 id, u8 code (Code), then   ok GET: bytes value;  ok ADD: i64 value
//                                           ok GET_MANY: u32 n, n x bytes value (in key order)
//                                           not ok: str message, u32 n, n x str missing key
//
// Cost: a request costs the server O(its keys); a SET wakes exactly the requests parked on that
// key (each counts its missing keys), so N ranks that publish and bulk-read N keys cost O(N)
// requests and O(N^2) bytes, not O(N^2) requests.
//
// ADD keeps the integer as decimal ASCII, so GET of a counter returns b"3".
#pragma once

#include <cstdint>

namespace appliance {
namespace store_proto {

enum Op : uint8_t { kSet = 1, kGet = 2, kWait = 3, kAdd = 4, kGetMany = 5 };

constexpr uint32_t kMaxKey = 4096;
constexpr uint32_t kMaxValue = 64u << 20;
constexpr uint32_t kMaxWaitKeys = 1u << 16;
constexpr uint32_t kMaxFrame = kMaxValue + (1u << 20);
// How long a connection may take to authenticate before the server drops it.
constexpr int64_t kHandshakeTimeoutMs = 10000;

}  // namespace store_proto
}  // namespace appliance
