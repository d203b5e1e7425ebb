// Alltoall with per-pair sizes, pairwise exchange.
//
// Cost model, P ranks, S = bytes this rank sends to others, R = bytes it receives:
//   steps: P-1; at step s rank r sends its block for (r+s) mod P and receives the block
//   from (r-s) mod P, both at once. Bytes on the wire per rank: S out, R in (each byte
//   crosses the network once, the minimum); time ~ (P-1) alpha + sum over steps of
//   max(out_s, in_s)/beta. Each step pairs every rank with exactly one sender and one
//   receiver, so no link or NIC is oversubscribed. The own block is a local memcpy.
// Memory: none; blocks go straight from `in` and into `out`, which must not overlap.
#include <cstring>

#include "collectives/ring.h"

namespace appliance {

void alltoallv(Comm& c, const void* in, const std::vector<size_t>& send_bytes, void* out,
               const std::vector<size_t>& recv_bytes, const CollectiveOptions& o) {
  const int P = c.size(), r = c.rank();
  if (static_cast<int>(send_bytes.size()) != P || static_cast<int>(recv_bytes.size()) != P)
    throw Error(Code::kInvalid, "alltoallv: " + std::to_string(send_bytes.size()) + " send and " +
                                    std::to_string(recv_bytes.size()) + " receive sizes for " + std::to_string(P) +
                                    " ranks");
  std::vector<size_t> soff(P), roff(P);
  size_t sa = 0, ra = 0;
  for (int i = 0; i < P; ++i) {
    soff[i] = sa;
    sa += send_bytes[i];
    roff[i] = ra;
    ra += recv_bytes[i];
  }
  const uint8_t* src = static_cast<const uint8_t*>(in);
  uint8_t* dst = static_cast<uint8_t*>(out);
  if (send_bytes[r] != recv_bytes[r])
    throw Error(Code::kInvalid, "alltoallv: rank " + std::to_string(r) + " sends itself " +
                                    std::to_string(send_bytes[r]) + " bytes but expects " +
                                    std::to_string(recv_bytes[r]));
  if (send_bytes[r]) std::memcpy(dst + roff[r], src + soff[r], send_bytes[r]);
  std::vector<SendOp> sends(1);
  std::vector<RecvOp> recvs(1);
  for (int s = 1; s < P; ++s) {
    const int to = ring::mod(r + s, P), from = ring::mod(r - s, P);
    sends[0] = SendOp{to, src + soff[to], send_bytes[to]};
    recvs[0].peer = from;
    recvs[0].data = dst + roff[from];
    recvs[0].len = recv_bytes[from];
    c.exchange(sends, recvs);
  }
}

}  // namespace appliance
