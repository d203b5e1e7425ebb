// Reduce-scatter, ring algorithm (also the first half of allreduce).
//
// Cost model, P ranks, N = total bytes (sum of the blocks), B = largest block:
//   steps: P-1, each sending one block right and receiving one block from the left.
//   bytes on the wire per rank: N - N_own sent and as many received (about N(P-1)/P);
//   time ~ (P-1) * (alpha + B/beta) plus one reduction pass over the received bytes, which
//   overlaps the transfer (pieces of chunk_bytes are reduced as they arrive).
// Memory: one chunk of staging from the Comm workspace (frames are received there while
// still cache-hot and reduced at once); nothing allocated per call, nothing of size N.
//
// Schedule: at step s (0..P-2) rank r sends block (r-s-1) mod P and receives block
// (r-s-2) mod P, reducing it into its own copy. The block sent at step s+1 is the one just
// reduced, so after P-1 steps block r on rank r has seen every rank's contribution. The
// last step receives straight into `out` and reduces the local partial into it (the ops are
// commutative, so the result is bitwise the same), saving a copy.
#include <algorithm>
#include <cstring>
#include <string>

#include "collectives/reduce.h"
#include "collectives/ring.h"

namespace appliance {

namespace ring {

void reduce_scatter(Comm& c, const uint8_t* src, uint8_t* buf, const std::vector<size_t>& off,
                    const std::vector<size_t>& len, DataType dt, ReduceOp op, const CollectiveOptions& o,
                    uint8_t* final_out) {
  const int P = c.size(), r = c.rank();
  const size_t esz = dtype_size(dt);
  if (P == 1) {
    if (final_out && len[0]) std::memcpy(final_out, src + off[0], len[0]);
    else if (!final_out && src != buf && len[0]) std::memcpy(buf + off[0], src + off[0], len[0]);
    return;
  }
  // Frames of whole elements, at most chunk_bytes: each incoming frame is staged in a
  // cache-sized buffer and reduced at once.
  if (esz > c.max_frame())
    throw Error(Code::kInvalid, "max_frame " + std::to_string(c.max_frame()) + " is smaller than one element");
  const size_t g = grain(std::min(o.chunk_bytes, c.max_frame()), esz);
  uint8_t* stage = static_cast<uint8_t*>(c.workspace(g));
  std::vector<SendOp> sends(1);
  std::vector<RecvOp> recvs(1);
  for (int s = 0; s < P - 1; ++s) {
    const int sb = mod(r - s - 1, P), rb = mod(r - s - 2, P);
    // Step 0 sends a block of this rank's own input; every later step forwards the partial
    // result the previous step wrote to buf.
    sends[0] = SendOp{right(c), (s == 0 ? src : buf) + off[sb], len[sb], g};
    RecvOp& rv = recvs[0];
    rv.peer = left(c);
    rv.len = len[rb];
    rv.piece = g;
    const uint8_t* mine = src + off[rb];
    uint8_t* dst = buf + off[rb];
    if (s == P - 2 && final_out) {  // last step: straight into out, then fold the local part in
      rv.data = final_out;
      rv.stage = nullptr;
      rv.grain = g;
      rv.on_piece = [final_out, mine, dt, op, esz](size_t at, size_t n) {
        reduce_into(final_out + at, mine + at, n / esz, dt, op);
      };
    } else {
      rv.data = nullptr;
      rv.stage = stage;
      rv.on_piece = [stage, mine, dst, dt, op, esz](size_t at, size_t n) {
        if (dst != mine) std::memcpy(dst + at, mine + at, n);  // a chunk: still in cache for the reduce
        reduce_into(dst + at, stage, n / esz, dt, op);
      };
    }
    c.exchange(sends, recvs);
  }
}

}  // namespace ring

void reducescatter(Comm& c, void* buf, void* out, const std::vector<size_t>& counts, DataType dt, ReduceOp op,
                   const CollectiveOptions& o) {
  ring::check_op(op, "reducescatter");
  const int P = c.size();
  if (static_cast<int>(counts.size()) != P)
    throw Error(Code::kInvalid, "reducescatter: " + std::to_string(counts.size()) + " counts for " +
                                    std::to_string(P) + " ranks");
  const size_t esz = dtype_size(dt);
  std::vector<size_t> off(P), len(P);
  size_t at = 0;
  for (int i = 0; i < P; ++i) {
    off[i] = at;
    len[i] = counts[i] * esz;
    at += len[i];
  }
  uint8_t* b = static_cast<uint8_t*>(buf);
  uint8_t* dst = static_cast<uint8_t*>(out);
  const size_t mine = off[c.rank()];
  if (dst == b + mine) {
    dst = nullptr;  // out is this rank's block of buf: reduce in place
  } else if (len[c.rank()] && dst < b + at && b < dst + len[c.rank()]) {
    throw Error(Code::kInvalid, "reducescatter: out overlaps buf other than at this rank's block");
  }
  ring::reduce_scatter(c, b, b, off, len, dt, op, o, dst);
}

}  // namespace appliance
