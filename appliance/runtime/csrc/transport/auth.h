// The handshake every connection (store, control, data) makes before anything else:
// mutual proof of the per-job secret by HMAC-SHA256 over both sides' nonces, plus who is
// who (ranks, channel id). A peer without the secret is refused and nothing else is read
// from it. The secret itself never crosses the wire.
//
//   connector -> HELLO     {version, job_id, rank, expected acceptor rank, channel, nonce_c}
//   acceptor  -> CHALLENGE {rank, nonce_s, HMAC(secret, "acceptor" | T)}
//   connector -> PROOF     {HMAC(secret, "connector" | T)}
//   acceptor  -> verdict:  PROOF {1} = accepted, or ABORT {Status(kAuth, why)} = refused
//   with T = version | job_id | connector rank | acceptor rank | channel | nonce_c | nonce_s
//
// Binding job id, both ranks and the channel into T makes a recorded exchange useless for
// another job, pair or channel; the fresh nonces make it useless on the same one. The
// connector checks the acceptor's proof before it sends its own, so a stranger posing as an
// acceptor learns nothing it could replay. A HELLO that is well formed but for another job,
// rank or channel, or of another version, is answered with ABORT naming the difference;
// garbage is dropped without an answer. The verdict lets the connector tell "they refused
// our proof" from a network failure.
//
// Sequence numbers: the handshake numbers its own frames from 0 in each direction (HELLO 0,
// PROOF 1; CHALLENGE 0, verdict 1). Whatever follows on the fd (a Channel, the store
// protocol) starts again at 0 in both directions, as Channel does. Both sides read exactly
// the handshake's bytes, so nothing after it is consumed early.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "transport/channel.h"
#include "transport/frame_io.h"

namespace appliance {

constexpr uint32_t kAuthVersion = 1;
// Channel ids carried in HELLO.
constexpr int kDataChannel = 0;
constexpr int kControlChannel = 1;
constexpr int kStoreChannel = 2;
constexpr uint32_t kAllChannels = 0xFFFFFFFFu;
// The "rank" a store server claims and store clients expect: the store is not a rank.
constexpr int kStoreServerRank = -1;
// Bound on every handshake frame payload (a stranger makes us allocate at most this).
constexpr uint32_t kHandshakeMaxPayload = 4096;

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
// connection; a refused stranger must not take the job down). Serves every channel.
PeerHello auth_accept(int fd, const AuthParams& me, Deadline d);

// The acceptor as a state machine without I/O, for poll() loops that serve many connections
// at once (store server, mesh) so a slow or silent stranger never stalls the others.
// Drive it: recv() up to want() bytes into dst() and report them with received(); send
// output() (erasing what went out) whenever it is not empty. Never throws: a failure moves
// it to kRefused with failure() set (output() may still hold an ABORT worth flushing).
class AcceptorHandshake {
 public:
  enum class State { kRunning, kAccepted, kRefused };
  // `peer_addr` names the connection in failures; `channels` is a bit mask of channel ids
  // served here (others are refused with a reason).
  AcceptorHandshake(const AuthParams& me, std::string peer_addr, uint32_t channels = kAllChannels);

  uint8_t* dst() { return in_.dst(); }
  size_t want() const { return state_ == State::kRunning ? in_.want() : 0; }
  void received(size_t n);
  std::vector<uint8_t>& output() { return out_; }

  State state() const { return state_; }
  const PeerHello& peer() const { return peer_; }  // rank/channel known once HELLO arrived
  const Status& failure() const { return failure_; }
  const std::string& peer_addr() const { return addr_; }
  // Moves to kRefused (e.g. the connection broke or the deadline passed).
  void fail(const std::string& why);
  // The peer closed the connection: kRefused with a reason fitting the stage it was in.
  void closed();

 private:
  void on_hello(const Frame& f);
  void on_proof(const Frame& f);
  void refuse(const std::string& why, bool tell_peer, Code code = Code::kAuth);

  AuthParams me_;
  std::string addr_;
  uint32_t channels_;
  FrameAssembler in_{kHandshakeMaxPayload};
  std::vector<uint8_t> out_;
  State state_ = State::kRunning;
  PeerHello peer_;
  bool hello_seen_ = false;
  std::vector<uint8_t> nonce_c_, nonce_s_;
  Status failure_;
};

}  // namespace appliance
