// Ring building blocks shared by the collectives (internal to collectives/).
//
// A buffer is cut into P blocks (byte offset and length per rank, lengths may be 0). Ranks
// form the ring r -> r+1; every step sends one block to the right neighbour and receives one
// from the left, both at once (Comm::exchange), so each link carries one block per step in
// each direction. Zero-length blocks still travel as empty frames, keeping ranks in step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "collectives/collectives.h"
#include "common/status.h"

namespace appliance {
namespace ring {

inline int right(const Comm& c) { return (c.rank() + 1) % c.size(); }
inline int left(const Comm& c) { return (c.rank() + c.size() - 1) % c.size(); }
inline int mod(int a, int p) { return ((a % p) + p) % p; }

// Piece size for on_piece reductions: chunk_bytes rounded down to whole elements.
inline size_t grain(size_t chunk_bytes, size_t elem) {
  size_t g = chunk_bytes - chunk_bytes % elem;
  return g ? g : elem;
}

inline void check_op(ReduceOp op, const char* what) {
  if (op != ReduceOp::kSum && op != ReduceOp::kMin && op != ReduceOp::kMax && op != ReduceOp::kProduct)
    throw Error(Code::kInvalid, std::string(what) + ": op " + reduce_op_name(op) +
                                    " is not Sum, Min, Max or Product (Average = Sum plus a postscale)");
}

// Ring reduce-scatter over P-1 steps. This rank's contribution is read from `src`; partial
// results are written to `buf` (src == buf: in place; otherwise src is only read, and no
// block of it is copied on its own: each is read once, when it is folded into what arrives).
// At the end block `rank` holds the reduction of every rank's block `rank`: in `buf`, or in
// `final_out` when given (then buf's block `rank` is not written). Offsets/lengths in bytes,
// multiples of the element size. Blocks travel in frames of whole elements of at most
// chunk_bytes; each incoming frame is staged in the Comm workspace (one chunk) and reduced
// on arrival. Error(kInvalid) when max_frame is smaller than one element. Lives in
// reducescatter.cc.
void reduce_scatter(Comm& c, const uint8_t* src, uint8_t* buf, const std::vector<size_t>& off,
                    const std::vector<size_t>& len, DataType dt, ReduceOp op, const CollectiveOptions& o,
                    uint8_t* final_out);

// Ring allgather over P-1 steps, in place: block r of `buf` starts on rank r and ends on all.
// Lives in allgatherv.cc.
void allgather(Comm& c, uint8_t* buf, const std::vector<size_t>& off, const std::vector<size_t>& len);

}  // namespace ring
}  // namespace appliance
