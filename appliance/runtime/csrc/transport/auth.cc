// The mutual HMAC handshake (see auth.h for the exchange and its sequence numbering).
#include "transport/auth.h"

#include "common/crypto.h"
#include "common/status.h"
#include "transport/tcp/socket.h"
#include "wire/codec.h"

namespace appliance {

namespace {

constexpr size_t kNonceBytes = 32;
constexpr size_t kMaxJobId = 1024;
constexpr uint32_t kHandshakeSeqHello = 0, kHandshakeSeqProof = 1;

Digest transcript_mac(const std::string& secret, const char* label, const std::string& job_id, int connector_rank,
                      int acceptor_rank, int channel, const std::vector<uint8_t>& nonce_c,
                      const std::vector<uint8_t>& nonce_s) {
  Writer w;
  w.str(label);
  w.u32(kAuthVersion);
  w.str(job_id);
  w.i32(connector_rank);
  w.i32(acceptor_rank);
  w.i32(channel);
  w.bytes(nonce_c.data(), nonce_c.size());
  w.bytes(nonce_s.data(), nonce_s.size());
  const auto& b = w.buffer();
  return hmac_sha256(secret.data(), secret.size(), b.data(), b.size());
}

Digest digest_from(const std::vector<uint8_t>& v, Reader& r) {
  if (v.size() != 32) r.fail("proof of " + std::to_string(v.size()) + " bytes, expected 32");
  Digest d;
  std::copy(v.begin(), v.end(), d.begin());
  return d;
}

std::string rank_label(int rank) {
  return rank == kStoreServerRank ? std::string("the store") : "rank " + std::to_string(rank);
}

// An error about the acceptor we connected to: a rank carries its number and address in the
// Status ("rank 2 (10.0.0.7:4100): ..."); the store, which is no rank, says so in the text.
Error about_peer(Code code, int rank, const std::string& addr, const std::string& msg) {
  if (rank == kStoreServerRank) return Error(code, "the store at " + addr + " " + msg);
  return Error(code, msg, rank, addr);
}

}  // namespace

// ---- acceptor ---------------------------------------------------------------------------------

AcceptorHandshake::AcceptorHandshake(const AuthParams& me, std::string peer_addr, uint32_t channels)
    : me_(me), addr_(std::move(peer_addr)), channels_(channels) {}

void AcceptorHandshake::refuse(const std::string& why, bool tell_peer, Code code) {
  if (state_ != State::kRunning) return;
  state_ = State::kRefused;
  std::string who = "connection from " + addr_;
  if (hello_seen_) who += " (claiming rank " + std::to_string(peer_.rank) + ", channel " + std::to_string(peer_.channel) + ")";
  failure_ = Status{Code::kAuth, -1, "", rank_label(me_.rank) + " refused a " + who + ": " + why};
  if (tell_peer) {
    Writer w;
    w.status(Status{code, me_.rank, "", why});
    const uint32_t seq = in_.next_seq() <= 1 ? 0 : 1;  // answers HELLO (0) or PROOF (1)
    auto bytes = encode_frame(FrameType::kAbort, seq, w.buffer().data(), w.buffer().size());
    out_.insert(out_.end(), bytes.begin(), bytes.end());
  }
}

void AcceptorHandshake::fail(const std::string& why) { refuse(why, false); }

void AcceptorHandshake::closed() {
  if (!hello_seen_) {
    refuse("it closed the connection before completing a HELLO", false);
  } else {
    refuse("it closed the connection after our CHALLENGE (it could not verify our proof: not the same job secret?)",
           false);
  }
}

void AcceptorHandshake::received(size_t n) {
  if (state_ != State::kRunning) return;
  try {
    if (!in_.advance(n, addr_)) return;
    Frame f = in_.take();
    if (in_.next_seq() == 1) {
      on_hello(f);
    } else {
      on_proof(f);
    }
  } catch (const Error& e) {
    refuse("sent garbage instead of a handshake: " + e.status().message, false);
  }
}

void AcceptorHandshake::on_hello(const Frame& f) {
  if (f.type != FrameType::kHello) {
    refuse(std::string("sent a ") + frame_type_name(f.type) + " frame instead of HELLO", false);
    return;
  }
  Reader r(f.payload.data(), f.payload.size(), "HELLO from " + addr_);
  const uint32_t version = r.u32();
  if (version != kAuthVersion) {
    refuse("handshake version " + std::to_string(version) + ", this side speaks " + std::to_string(kAuthVersion), true);
    return;
  }
  const std::string job_id = r.str(kMaxJobId);
  peer_.rank = r.i32();
  const int expect_rank = r.i32();
  peer_.channel = r.i32();
  nonce_c_ = r.bytes(64);
  r.expect_done();
  hello_seen_ = true;
  if (nonce_c_.size() != kNonceBytes) r.fail("nonce of " + std::to_string(nonce_c_.size()) + " bytes");
  if (job_id != me_.job_id) {
    // kMismatch, not kAuth: a rank that re-initialised may reach the previous store
    // generation before it is gone; the store client retries on this code.
    // This job's id is not told to a peer that has not proved the secret (nor in the line).
    std::string shown;
    for (char c : job_id.substr(0, 64)) shown += (c >= 0x20 && c < 0x7f) ? c : '?';
    refuse("wrong job id '" + shown + "'", true, Code::kMismatch);
    return;
  }
  if (expect_rank != me_.rank) {
    refuse("the connection was meant for " + rank_label(expect_rank) + ", this is " + rank_label(me_.rank), true);
    return;
  }
  if (peer_.channel < 0 || peer_.channel > 31 || !(channels_ & (1u << peer_.channel))) {
    refuse("channel " + std::to_string(peer_.channel) + " is not served here", true);
    return;
  }
  nonce_s_ = random_bytes(kNonceBytes);
  Digest mac = transcript_mac(me_.secret, "acceptor", me_.job_id, peer_.rank, me_.rank, peer_.channel, nonce_c_, nonce_s_);
  Writer w;
  w.i32(me_.rank);
  w.bytes(nonce_s_.data(), nonce_s_.size());
  w.bytes(mac.data(), mac.size());
  auto bytes = encode_frame(FrameType::kChallenge, kHandshakeSeqHello, w.buffer().data(), w.buffer().size());
  out_.insert(out_.end(), bytes.begin(), bytes.end());
}

void AcceptorHandshake::on_proof(const Frame& f) {
  if (f.type != FrameType::kProof) {
    refuse(std::string("sent a ") + frame_type_name(f.type) + " frame instead of PROOF", false);
    return;
  }
  Reader r(f.payload.data(), f.payload.size(), "PROOF from " + addr_);
  Digest got = digest_from(r.bytes(64), r);
  r.expect_done();
  Digest want = transcript_mac(me_.secret, "connector", me_.job_id, peer_.rank, me_.rank, peer_.channel, nonce_c_, nonce_s_);
  if (!digest_equal(got, want)) {
    refuse("wrong proof of the job secret (do all ranks share the same secret?)", true);
    return;
  }
  const uint8_t ok = 1;
  Writer w;
  w.u8(ok);
  auto bytes = encode_frame(FrameType::kProof, kHandshakeSeqProof, w.buffer().data(), w.buffer().size());
  out_.insert(out_.end(), bytes.begin(), bytes.end());
  state_ = State::kAccepted;
}

PeerHello auth_accept(int fd, const AuthParams& me, Deadline d) {
  AcceptorHandshake hs(me, peer_address(fd));
  try {
    while (hs.state() == AcceptorHandshake::State::kRunning) {
      if (!hs.output().empty()) {
        write_all(fd, hs.output().data(), hs.output().size(), d, "answering the handshake of " + hs.peer_addr());
        hs.output().clear();
      }
      size_t n = hs.want();
      read_all(fd, hs.dst(), n, d, "waiting for the handshake of " + hs.peer_addr());
      hs.received(n);
    }
  } catch (const Error& e) {
    if (e.status().code == Code::kPeerLost) {
      hs.closed();
    } else {
      hs.fail(e.status().message);
    }
  }
  if (!hs.output().empty()) {
    // The verdict (or the reason for a refusal); best effort for a refusal.
    try {
      write_all(fd, hs.output().data(), hs.output().size(),
                std::min(d, deadline_after_ms(1000)), "sending the handshake verdict to " + hs.peer_addr());
    } catch (const Error& e) {
      if (hs.state() == AcceptorHandshake::State::kAccepted) throw Error(Code::kAuth, e.status().message);
    }
  }
  if (hs.state() != AcceptorHandshake::State::kAccepted) throw Error(hs.failure());
  return hs.peer();
}

// ---- connector --------------------------------------------------------------------------------

void auth_connect(int fd, const AuthParams& me, int expect_rank, int channel, Deadline d) {
  const std::string addr = peer_address(fd);
  const std::string who = rank_label(expect_rank) + " at " + addr;
  std::vector<uint8_t> nonce_c = random_bytes(kNonceBytes);
  {
    Writer w;
    w.u32(kAuthVersion);
    w.str(me.job_id);
    w.i32(me.rank);
    w.i32(expect_rank);
    w.i32(channel);
    w.bytes(nonce_c.data(), nonce_c.size());
    send_frame_fd(fd, FrameType::kHello, kHandshakeSeqHello, w.buffer().data(), w.buffer().size(), d,
                  "sending HELLO to " + who);
  }
  // Transport failures keep their code (timeout, peer lost) and say where they happened.
  auto rethrow = [&](const Error& e, bool after_proof) {
    if (after_proof && e.status().code == Code::kPeerLost)
      throw about_peer(Code::kAuth, expect_rank, addr, "closed the connection after our proof (it refused it: not the same job secret?)");
    throw about_peer(e.status().code, expect_rank, addr, e.status().message + " (during the handshake)");
  };
  auto refusal = [&](const Frame& f, const char* what) {
    Reader r(f.payload.data(), f.payload.size(), "refusal from " + who);
    Status s = r.status();
    return about_peer(s.code == Code::kMismatch ? Code::kMismatch : Code::kAuth, expect_rank, addr,
                      std::string(what) + ": " + s.message);
  };

  Frame ch;
  try {
    ch = recv_frame_fd(fd, kHandshakeSeqHello, kHandshakeMaxPayload, d, "waiting for CHALLENGE from " + who);
  } catch (const Error& e) {
    rethrow(e, false);
  }
  if (ch.type == FrameType::kAbort) throw refusal(ch, "refused us");
  if (ch.type != FrameType::kChallenge)
    throw about_peer(Code::kProtocol, expect_rank, addr,
                     std::string("answered HELLO with a ") + frame_type_name(ch.type) + " frame");
  Reader r(ch.payload.data(), ch.payload.size(), "CHALLENGE from " + who);
  const int their_rank = r.i32();
  std::vector<uint8_t> nonce_s = r.bytes(64);
  Digest their_mac = digest_from(r.bytes(64), r);
  r.expect_done();
  if (their_rank != expect_rank)
    throw about_peer(Code::kAuth, expect_rank, addr, "answered as " + rank_label(their_rank));
  if (nonce_s.size() != kNonceBytes) r.fail("nonce of " + std::to_string(nonce_s.size()) + " bytes");
  Digest want = transcript_mac(me.secret, "acceptor", me.job_id, me.rank, expect_rank, channel, nonce_c, nonce_s);
  if (!digest_equal(their_mac, want))
    throw about_peer(Code::kAuth, expect_rank, addr,
                     "failed to prove the job secret (wrong secret, or not part of this job)");

  Digest mine = transcript_mac(me.secret, "connector", me.job_id, me.rank, expect_rank, channel, nonce_c, nonce_s);
  Writer w;
  w.bytes(mine.data(), mine.size());
  Frame verdict;
  try {
    send_frame_fd(fd, FrameType::kProof, kHandshakeSeqProof, w.buffer().data(), w.buffer().size(), d,
                  "sending PROOF to " + who);
    verdict = recv_frame_fd(fd, kHandshakeSeqProof, kHandshakeMaxPayload, d, "waiting for the verdict of " + who);
  } catch (const Error& e) {
    rethrow(e, true);
  }
  if (verdict.type == FrameType::kAbort) throw refusal(verdict, "refused our proof");
  Reader vr(verdict.payload.data(), verdict.payload.size(), "verdict from " + who);
  if (verdict.type != FrameType::kProof || vr.u8() != 1)
    throw about_peer(Code::kProtocol, expect_rank, addr, "sent a malformed handshake verdict");
  vr.expect_done();
}

}  // namespace appliance
