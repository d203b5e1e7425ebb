// The handshake every connection (store, control, data) makes before anything else:
// mutual proof of the per-job secret by HMAC-SHA256 over both sides' nonces, plus who is
// who (ranks, channel id). A peer without the secret is refused and nothing else is read
// from it. The secret itself never crosses the wire.
//
//   connector -> HELLO     {version, job_id, rank, channel, nonce_c}
//   acceptor  -> CHALLENGE {rank, nonce_s, HMAC(secret, "acceptor" | job | ranks | channel | nonce_c | nonce_s)}
//   connector -> PROOF     {HMAC(secret, "connector" | job | ranks | channel | nonce_c | nonce_s)}
//
// IMPLEMENTATION OWNER: see csrc/README.md (bootstrap work package).
#pragma once

#include <string>

#include "transport/channel.h"

namespace appliance {

struct AuthParams {
  std::string secret;  // raw bytes
  std::string job_id;  // public; separates jobs that share a secret by mistake
  int rank = -1;       // our rank, or -1 for a process that is not a rank (store clients)
};

struct PeerHello {
  int rank = -1;
  int channel = 0;
};

// Connector side; throws Error(kAuth) naming `expect_rank` when the acceptor fails to prove
// the secret, Error(kProtocol) on garbage.
void auth_connect(int fd, const AuthParams& me, int expect_rank, int channel, Deadline d);

// Acceptor side; returns who connected. Throws Error(kAuth) (the caller logs and drops the
// connection; a refused stranger must not take the job down).
PeerHello auth_accept(int fd, const AuthParams& me, Deadline d);

}  // namespace appliance
