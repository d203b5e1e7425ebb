// Allreduce, ring algorithm: reduce-scatter, then allgather, in place.
//
// Cost model, P ranks, N bytes:
//   steps: 2(P-1) (P-1 reduce-scatter steps, P-1 allgather steps), each moving one block of
//   about N/P bytes to the right neighbour while receiving one from the left.
//   bytes on the wire per rank: 2N(P-1)/P sent and as many received (bandwidth-optimal);
//   time ~ 2(P-1)(alpha + N/(P beta)) + one reduction pass over N(P-1)/P bytes, overlapped
//   with the transfer: incoming blocks are reduced frame by frame (chunk_bytes) as they
//   arrive, while the kernel keeps moving the outgoing block.
//   Latency grows as 2(P-1) alpha; with count < P some blocks are empty and travel as empty
//   frames (small tensors are expected to be fused by the caller).
// Memory: one chunk of the Comm workspace stages incoming frames, reduced while cache-hot;
// the allgather half receives straight into the user's buffer. Nothing of size N.
//
// Blocks: element i of the P-way split gets floor(count/P) elements, plus one for the first
// count mod P blocks. Rank r owns the reduction of block r after the first half.
#include "collectives/ring.h"

namespace appliance {

void allreduce(Comm& c, void* buf, size_t count, DataType dt, ReduceOp op, const CollectiveOptions& o) {
  ring::check_op(op, "allreduce");
  const int P = c.size();
  if (P == 1 || count == 0) return;
  const size_t esz = dtype_size(dt);
  std::vector<size_t> off(P), len(P);
  const size_t base = count / P, extra = count % P;
  size_t at = 0;
  for (int i = 0; i < P; ++i) {
    off[i] = at;
    len[i] = (base + (static_cast<size_t>(i) < extra ? 1 : 0)) * esz;
    at += len[i];
  }
  uint8_t* b = static_cast<uint8_t*>(buf);
  ring::reduce_scatter(c, b, off, len, dt, op, o, nullptr);
  ring::allgather(c, b, off, len);
}

}  // namespace appliance
