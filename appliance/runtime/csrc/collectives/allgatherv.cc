// Allgather with per-rank sizes, ring algorithm (also the second half of allreduce).
//
// Cost model, P ranks, N = total bytes gathered, B = largest contribution:
//   steps: P-1, each sending one block right and receiving one from the left.
//   bytes on the wire per rank: N - N_own sent and received (about N(P-1)/P);
//   time ~ (P-1) * (alpha + B/beta). Bandwidth-optimal; latency grows linearly in P.
// Memory: none; blocks are received straight into their final place in `out` and sent
// from there (no staging copies). Zero-size contributions travel as empty frames.
//
// Schedule: at step s (0..P-2) rank r forwards block (r-s) mod P to the right and receives
// block (r-s-1) mod P from the left; block r starts on rank r and has gone round after P-1.
#include <cstring>

#include "collectives/ring.h"

namespace appliance {

namespace ring {

void allgather(Comm& c, uint8_t* buf, const std::vector<size_t>& off, const std::vector<size_t>& len) {
  const int P = c.size(), r = c.rank();
  std::vector<SendOp> sends(1);
  std::vector<RecvOp> recvs(1);
  for (int s = 0; s < P - 1; ++s) {
    const int sb = mod(r - s, P), rb = mod(r - s - 1, P);
    sends[0] = SendOp{right(c), buf + off[sb], len[sb]};
    recvs[0].peer = left(c);
    recvs[0].data = buf + off[rb];
    recvs[0].len = len[rb];
    c.exchange(sends, recvs);
  }
}

}  // namespace ring

void allgatherv(Comm& c, const void* in, void* out, const std::vector<size_t>& bytes, const CollectiveOptions& o) {
  const int P = c.size();
  if (static_cast<int>(bytes.size()) != P)
    throw Error(Code::kInvalid,
                "allgatherv: " + std::to_string(bytes.size()) + " sizes for " + std::to_string(P) + " ranks");
  std::vector<size_t> off(P);
  size_t at = 0;
  for (int i = 0; i < P; ++i) {
    off[i] = at;
    at += bytes[i];
  }
  uint8_t* dst = static_cast<uint8_t*>(out);
  const size_t mine = bytes[c.rank()];
  if (mine && in != dst + off[c.rank()]) std::memmove(dst + off[c.rank()], in, mine);
  ring::allgather(c, dst, off, bytes);
}

}  // namespace appliance
