// Barrier, dissemination algorithm.
//
// Cost model, P ranks: ceil(log2 P) rounds; in round k rank r sends an empty frame to
// (r + 2^k) mod P and waits for one from (r - 2^k) mod P. Bytes on the wire: one frame
// header (20 bytes) per rank per round; time ~ ceil(log2 P) * alpha. After round k a rank
// has heard, directly or transitively, from the 2^(k+1) - 1 ranks before it, so after the
// last round from everyone: no rank leaves before all have entered.
#include "collectives/ring.h"

namespace appliance {

void barrier(Comm& c) {
  const int P = c.size(), r = c.rank();
  for (int k = 1; k < P; k <<= 1) c.sendrecv(ring::mod(r + k, P), nullptr, 0, ring::mod(r - k, P), nullptr, 0);
}

}  // namespace appliance
