// Hierarchical allreduce and allgather, for jobs of H hosts with L ranks each (Horovod's
// HOROVOD_HIERARCHICAL_ALLREDUCE / _ALLGATHER), over two views of the job's Comm: `local` (the
// ranks of this host) and `cross` (the ranks with this local rank, one per host).
//
// Allreduce, all local ranks on disjoint slices: the buffer is cut into L blocks; (1) a ring
// reduce-scatter within the host leaves block l reduced over the host on local rank l; (2) each
// local rank allreduces its block with the same local rank of every other host (allreduce():
// ring or recursive doubling by its own cost model); (3) a ring allgather within the host.
// Allgather, one leader per host: (1) a ring allgatherv within the host gathers the host's
// contributions (contiguous in the output: hosts hold consecutive ranks); (2) the leaders (local
// rank 0) allgatherv the host blocks across hosts; (3) the leader broadcasts the whole output
// within the host.
//
// Cost model, P = H x L ranks, N bytes; local links (shared memory) alpha_l, beta_l; cross-host
// links (TCP) alpha_c, beta_c; gamma the reduction rate (constants below: this machine class's
// orders of magnitude, 5 us / 5 GB/s over shared memory, 25 us / 1.5 GB/s over TCP, 5 GB/s):
//   flat ring allreduce: 2(P-1) steps, each as slow as its cross-host edge:
//     2(P-1)(alpha_c + N/(P beta_c)) + N/gamma
//   flat recursive doubling (N small): log2 L steps with a partner on this host, log2 H across:
//     log2 L (alpha_l + N/beta_l + N/gamma) + log2 H (alpha_c + N/beta_c + N/gamma)
//   hierarchical: 2(L-1)(alpha_l + N/(L beta_l)) + N/gamma + allreduce of N/L bytes over H ranks
//     (the cheaper of ring and doubling, cross-host constants).
//   The L cross-host connections of a host are modelled as parallel (separate sockets, as
//   Horovod's hierarchical allreduce assumes): where they share one slower NIC, the flat ring is
//   closer than the model says (HOROVOD_HIERARCHICAL_ALLREDUCE=0 turns it off).
//   With these constants it wins from 32 KiB at H = 2, L = 4 (16 KiB at 2 x 2 and 16 x 8); never with one
//   host or one rank per host (it would be the flat algorithm itself).
//   allgather: flat ring (P-1)(alpha_c + N/(P beta_c)); hierarchical (L-1)(alpha_l + N/(P beta_l))
//     + (H-1)(alpha_c + N/(H beta_c)) + broadcast of N within the host (a pipelined chain:
//     (L-1 + N/chunk) (alpha_l + chunk/beta_l)).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "collectives/reduce.h"
#include "collectives/ring.h"

namespace appliance {

namespace {

constexpr double kAlphaLocalUs = 5.0, kBetaLocal = 5000.0;  // bytes per us
constexpr double kAlphaCrossUs = 25.0, kBetaCross = 1500.0;
constexpr double kGamma = 5000.0;

double log2d(int p) { return p > 1 ? std::log2(static_cast<double>(p)) : 0.0; }

double ring_us(int p, double n, double alpha, double beta) {
  return p > 1 ? 2 * (p - 1) * (alpha + n / (p * beta)) + n / kGamma : 0.0;
}

double doubling_us(int p, double n, double alpha, double beta) {
  return p > 1 ? std::ceil(log2d(p)) * (alpha + n / beta + n / kGamma) : 0.0;
}

}  // namespace

bool hierarchical_wins(int L, int H, size_t nbytes) {
  if (L < 2 || H < 2) return false;
  const double n = static_cast<double>(nbytes);
  const double flat = std::min(ring_us(L * H, n, kAlphaCrossUs, kBetaCross),
                               std::ceil(log2d(L)) * (kAlphaLocalUs + n / kBetaLocal + n / kGamma) +
                                   doubling_us(H, n, kAlphaCrossUs, kBetaCross));
  const double cross = std::min(ring_us(H, n / L, kAlphaCrossUs, kBetaCross), doubling_us(H, n / L, kAlphaCrossUs, kBetaCross));
  const double hier = 2 * (L - 1) * (kAlphaLocalUs + n / (L * kBetaLocal)) + n / kGamma + cross;
  return hier < flat;
}

bool hierarchical_allgather_wins(int L, int H, size_t nbytes) {
  if (L < 2 || H < 2) return false;
  const double n = static_cast<double>(nbytes), P = L * H;
  const double flat = (P - 1) * (kAlphaCrossUs + n / (P * kBetaCross));
  const double chunk = 1 << 20;
  const double bcast = (L - 1 + std::ceil(n / chunk)) * (kAlphaLocalUs + std::min(n, chunk) / kBetaLocal);
  const double hier = (L - 1) * (kAlphaLocalUs + n / (P * kBetaLocal)) + (H - 1) * (kAlphaCrossUs + n / (H * kBetaCross)) + bcast;
  return hier < flat;
}

void allreduce_hierarchical(Comm& local, Comm& cross, const void* in, void* out, size_t count, DataType dt,
                            ReduceOp op, const CollectiveOptions& o) {
  ring::check_op(op, "allreduce");
  const int L = local.size(), l = local.rank();
  const size_t esz = dtype_size(dt);
  const uint8_t* src = static_cast<const uint8_t*>(in);
  uint8_t* b = static_cast<uint8_t*>(out);
  std::vector<size_t> off(L), len(L);
  const size_t base = count / L, extra = count % L;
  size_t at = 0;
  for (int i = 0; i < L; ++i) {
    off[i] = at;
    len[i] = (base + (static_cast<size_t>(i) < extra ? 1 : 0)) * esz;
    at += len[i];
  }
  // 1. this host's sum of block l, on local rank l
  if (L > 1) ring::reduce_scatter(local, src, b, off, len, dt, op, o, nullptr);
  else if (src != b && count) std::memcpy(b, src, count * esz);
  // 2. block l summed over the hosts
  if (cross.size() > 1) allreduce(cross, b + off[l], b + off[l], len[l] / esz, dt, op, o);
  // 3. every block on every local rank
  if (L > 1) ring::allgather(local, b, off, len);
}

void allgatherv_hierarchical(Comm& local, Comm* leaders, int host, const void* in, void* out,
                             const std::vector<size_t>& bytes, const CollectiveOptions& o) {
  const int L = local.size(), P = static_cast<int>(bytes.size());
  APPLIANCE_ASSERT(L >= 1 && P % L == 0 && host >= 0 && host < P / L,
                   "hierarchical allgather needs the same number of consecutive ranks on every host");
  const int H = P / L;
  std::vector<size_t> offs(P + 1, 0);
  for (int r = 0; r < P; ++r) offs[r + 1] = offs[r] + bytes[r];
  uint8_t* o8 = static_cast<uint8_t*>(out);
  // 1. this host's block (its ranks' contributions, consecutive in the output) on every local rank
  const std::vector<size_t> mine(bytes.begin() + host * L, bytes.begin() + (host + 1) * L);
  allgatherv(local, in, o8 + offs[host * L], mine, o);
  // 2. the leaders exchange the host blocks
  if (leaders && H > 1) {
    APPLIANCE_ASSERT(leaders->size() == H && leaders->rank() == host, "leaders: one per host, in host order");
    std::vector<size_t> blocks(H);
    for (int g = 0; g < H; ++g) blocks[g] = offs[(g + 1) * L] - offs[g * L];
    allgatherv(*leaders, o8 + offs[host * L], o8, blocks, o);
  }
  // 3. the whole output from the leader to the host
  if (L > 1 && H > 1) broadcast(local, o8, offs[P], 0, o);
}

}  // namespace appliance
