// Allreduce, in place or from an input to an output: the ring (bandwidth-optimal) or
// recursive doubling (latency-optimal), chosen per call by the cost model below; every rank
// chooses alike (same P, N, options).
//
// Cost model, P ranks, N bytes, alpha = one message's fixed cost (latency plus the wake-ups
// around it), beta = transfer rate, gamma = reduction rate (the constants below are this
// machine class's orders of magnitude over shared memory: 5 us, 5 GB/s, 5 GB/s):
//   ring: 2(P-1) steps (P-1 reduce-scatter, P-1 allgather), each moving one block of about
//     N/P bytes to the right neighbour while receiving one from the left;
//     time ~ 2(P-1) alpha + 2N(P-1)/(P beta) + N(P-1)/(P gamma). Bandwidth-optimal: incoming
//     blocks are reduced frame by frame (chunk_bytes) as they arrive, overlapped with the
//     transfer. One chunk of workspace; nothing of size N. Out of place it reads the input
//     where the in-place ring reads the buffer (a block on its first send and when it is
//     folded into what arrives): no copy of the input beforehand, which at large N is worth
//     N/(memory bandwidth).
//   recursive doubling: ceil(log2 P') steps for P' = the largest power of two <= P, each
//     exchanging the whole buffer with the partner rank XOR 2^k and reducing it;
//     time ~ log2(P') (alpha + N/beta + N/gamma), plus 2 alpha + 2N/beta + N/gamma when P is
//     not a power of two (the first 2(P-P') ranks fold in pairs before, and the odd one of
//     each pair hands the result back after). N bytes of workspace, so only below
//     kMaxDoublingBytes; out of place it copies the input to the output first (cheap there). Both partners reduce the same two operands (x op y on one, y op x on
//     the other: the ops are commutative elementwise, NaN included), so every rank ends with
//     the same bits, as with the ring.
//   With these constants doubling wins up to ~50 KB at P = 2 (one message instead of two),
//   ~57 KB at P = 4, ~81 KB at P = 8; with P not a power of two the fold costs more (~8 KB at
//   P = 3, ~22 KB at P = 5). Tests force either algorithm (CollectiveOptions::allreduce_algo).
//
// Ring blocks: element i of the P-way split gets floor(count/P) elements, plus one for the
// first count mod P blocks. Rank r owns the reduction of block r after the first half.
#include <cstring>

#include "collectives/reduce.h"
#include "collectives/ring.h"

namespace appliance {

namespace {

constexpr double kAlphaUs = 5.0;
constexpr double kBetaBytesPerUs = 5000.0;
constexpr double kGammaBytesPerUs = 5000.0;
constexpr size_t kMaxDoublingBytes = 1 << 20;

int floor_pow2(int p) {
  int q = 1;
  while (q * 2 <= p) q *= 2;
  return q;
}

int log2_of(int q) {
  int k = 0;
  while ((1 << k) < q) ++k;
  return k;
}

bool use_doubling(int P, size_t nbytes, const CollectiveOptions& o) {
  if (o.allreduce_algo == AllreduceAlgo::kRing) return false;
  if (o.allreduce_algo == AllreduceAlgo::kRecursiveDoubling) return true;
  if (nbytes > kMaxDoublingBytes) return false;
  const double n = static_cast<double>(nbytes), p = P;
  const double ring = 2 * (p - 1) * kAlphaUs + 2 * n * (p - 1) / (p * kBetaBytesPerUs) + n * (p - 1) / (p * kGammaBytesPerUs);
  const int q = floor_pow2(P);
  double doubling = log2_of(q) * (kAlphaUs + n / kBetaBytesPerUs + n / kGammaBytesPerUs);
  if (q != P) doubling += 2 * kAlphaUs + 2 * n / kBetaBytesPerUs + n / kGammaBytesPerUs;
  return doubling < ring;
}

void ring_allreduce(Comm& c, const uint8_t* src, uint8_t* b, size_t count, size_t esz, DataType dt, ReduceOp op,
                    const CollectiveOptions& o) {
  const int P = c.size();
  std::vector<size_t> off(P), len(P);
  const size_t base = count / P, extra = count % P;
  size_t at = 0;
  for (int i = 0; i < P; ++i) {
    off[i] = at;
    len[i] = (base + (static_cast<size_t>(i) < extra ? 1 : 0)) * esz;
    at += len[i];
  }
  ring::reduce_scatter(c, src, b, off, len, dt, op, o, nullptr);
  ring::allgather(c, b, off, len);
}

// Ranks 0..2*rem-1 pair up (even r folds into r+1); the odd ones and ranks >= 2*rem take
// part in the doubling as "virtual" ranks 0..q-1.
void doubling_allreduce(Comm& c, uint8_t* b, size_t count, size_t esz, DataType dt, ReduceOp op) {
  const int P = c.size(), r = c.rank(), q = floor_pow2(P), rem = P - q;
  const size_t n = count * esz;
  uint8_t* in = static_cast<uint8_t*>(c.workspace(n));
  auto real = [rem](int v) { return v < rem ? 2 * v + 1 : v + rem; };
  int v = -1;  // this rank's virtual rank, -1 while folded away
  if (r < 2 * rem) {
    if (r % 2 == 0) {
      c.send(r + 1, b, n);
      c.recv(r + 1, b, n);  // the result, once the doubling is over
      return;
    }
    c.recv(r - 1, in, n);
    reduce_into(b, in, count, dt, op);
    v = r / 2;
  } else {
    v = r - rem;
  }
  for (int mask = 1; mask < q; mask <<= 1) {
    const int partner = real(v ^ mask);
    // The whole buffer is sent while the partner's arrives in the workspace; b changes only
    // after both are done, so what is sent is never half reduced.
    c.sendrecv(partner, b, n, partner, in, n);
    reduce_into(b, in, count, dt, op);
  }
  if (r < 2 * rem) c.send(r - 1, b, n);
}

}  // namespace

void allreduce(Comm& c, const void* in, void* out, size_t count, DataType dt, ReduceOp op,
               const CollectiveOptions& o) {
  ring::check_op(op, "allreduce");
  const int P = c.size();
  const size_t esz = dtype_size(dt);
  const uint8_t* src = static_cast<const uint8_t*>(in);
  uint8_t* b = static_cast<uint8_t*>(out);
  const bool ring = P > 1 && count > 0 && !use_doubling(P, count * esz, o);
  if (ring) return ring_allreduce(c, src, b, count, esz, dt, op, o);
  if (src != b && count) std::memcpy(b, src, count * esz);
  if (P > 1 && count > 0) doubling_allreduce(c, b, count, esz, dt, op);
}

}  // namespace appliance
