// MeshOptions: how this rank joins the job's links (bootstrap/links.h) and what its pairs may
// use (bootstrap/transports.h).
#pragma once

#include <cstdint>
#include <string>

#include "common/options.h"
#include "transport/auth.h"

namespace appliance {

struct MeshOptions {
  int rank = 0, size = 1;
  std::string host;          // see PeerInfo::host
  std::string bind_addr;     // address to listen on and publish ("" = pick one that routes;
                             // "0.0.0.0" = listen on all, publish the one that routes)
  std::string store_host;    // with bind_addr "": listen on the interface that routes here
  bool allow_shm = false;    // shared memory between ranks of one host
  uint64_t shm_ring_bytes = 1 << 20;  // per direction and pair
  int64_t timeout_ms = LinkOptions{}.start_timeout_ms();
  int peer_timeout_ms = LinkOptions{}.heartbeat_timeout_ms();  // TCP_USER_TIMEOUT / keepalive budget
  AuthParams auth;
};

}  // namespace appliance
