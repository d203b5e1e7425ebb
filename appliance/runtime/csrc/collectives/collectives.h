// The collective algorithms, one file each (collectives/<name>.cc), each opening with its
// cost model in terms of ranks P and bytes N. Transport-agnostic: they only use Comm.
// All calls are collective: every rank calls the same function with agreeing sizes.
// Reductions accept Sum, Min, Max and Product (Error(kInvalid) otherwise); Adasum has its own
// entry point. Errors from the Comm (peer lost, protocol, watch) propagate unchanged; the
// Comm is then unusable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "collectives/comm.h"
#include "common/options.h"
#include "common/types.h"

namespace appliance {

enum class BroadcastAlgo : uint8_t {
  kAuto = 0,   // pick by the cost model in broadcast.cc (size, P, chunk_bytes)
  kTree = 1,   // binomial tree: ceil(log2 P) hops of the whole buffer (latency-bound sizes)
  kChain = 2,  // pipelined chain of chunk_bytes pieces (bandwidth-bound sizes)
};

enum class AllreduceAlgo : uint8_t {
  kAuto = 0,               // pick by the cost model in allreduce.cc (P, bytes)
  kRing = 1,               // reduce-scatter + allgather rings (bandwidth-bound sizes)
  kRecursiveDoubling = 2,  // log2 P whole-buffer exchanges (latency-bound sizes)
};

// The engine's collective options (common/options.h: CollectiveKnobs) as the algorithms take
// them, and what tests force.
struct CollectiveOptions {
  CollectiveOptions() : CollectiveOptions(CollectiveKnobs{}) {}
  // Throws std::invalid_argument naming the knob of a hierarchy other than auto, on or off.
  explicit CollectiveOptions(const CollectiveKnobs& k);

  // Pipelining grain: ring steps move segments in pieces of this many bytes so receive,
  // reduce and send overlap (reduce-scatter frames are cut here, at whole elements, staged
  // in a chunk-sized workspace and reduced on arrival; the chain broadcast forwards pieces
  // of this size). Must agree on all ranks. Small values let tests reach multi-piece paths.
  size_t chunk_bytes;
  // Tests and benchmarks force one broadcast algorithm; the engine leaves kAuto.
  BroadcastAlgo broadcast_algo = BroadcastAlgo::kAuto;
  // Tests force one allreduce algorithm; the engine leaves kAuto.
  AllreduceAlgo allreduce_algo = AllreduceAlgo::kAuto;
  // Hierarchical allreduce / allgather where the job has several hosts with several ranks each
  // (HOROVOD_HIERARCHICAL_ALLREDUCE / _ALLGATHER): kAuto = where the cost model says it wins.
  enum class Hierarchy : uint8_t { kAuto = 0, kOn = 1, kOff = 2 };
  Hierarchy hierarchical_allreduce, hierarchical_allgather;
};

// `count` elements from `in` reduced over all ranks into `out`; in == out is in place, else
// `in` is only read and the two must not overlap. op is Sum, Min, Max or Product (Average
// is Sum plus a postscale applied by the caller). Ring (reduce-scatter then allgather) or,
// for small buffers, recursive doubling: allreduce.cc's cost model decides.
void allreduce(Comm& c, const void* in, void* out, size_t count, DataType dt, ReduceOp op,
               const CollectiveOptions& o);

// Rank r contributes bytes[r] bytes from `in`; `out` receives all contributions in rank
// order (sum(bytes) bytes). `in` may alias out + offset(rank).
void allgatherv(Comm& c, const void* in, void* out, const std::vector<size_t>& bytes,
                const CollectiveOptions& o);

// `bytes` bytes from root's buf to every rank's buf.
void broadcast(Comm& c, void* buf, size_t bytes, int root, const CollectiveOptions& o);

// Rank r sends send_bytes[p] bytes (consecutive in `in`, in peer order) to each peer p and
// receives recv_bytes[p] bytes from each peer p into `out` (in peer order).
void alltoallv(Comm& c, const void* in, const std::vector<size_t>& send_bytes, void* out,
               const std::vector<size_t>& recv_bytes, const CollectiveOptions& o);

// `buf` holds sum(counts) elements on every rank and is used as scratch; `out` receives this
// rank's reduced block: counts[rank] elements, the block at offset sum(counts[0..rank)).
void reducescatter(Comm& c, void* buf, void* out, const std::vector<size_t>& counts, DataType dt,
                   ReduceOp op, const CollectiveOptions& o);

// Adasum allreduce (collectives/adasum.cc), in place: `buf` holds counts.size() tensors back
// to back (counts[i] elements each, the same on every rank), and each is combined with its own
// dot products. float16, bfloat16, float32, float64 (Error(kInvalid) otherwise). Any P (ranks
// beyond the largest power of 2 are folded in first, see adasum.cc).
void adasum_allreduce(Comm& c, void* buf, const std::vector<size_t>& counts, DataType dt, const CollectiveOptions& o);

// Returns when every rank has entered.
void barrier(Comm& c);

// Hierarchical allreduce and allgather (collectives/hierarchical.cc), over `local` (this host's
// ranks) and `cross` (the ranks with this local rank, one per host, in host order), for jobs of
// H hosts with L ranks each. The allreduce is allreduce()'s, in three phases; the allgather is
// allgatherv()'s for hosts holding consecutive ranks (host h: ranks h*L .. h*L+L-1; `host` = h),
// with `leaders` (local rank 0 of each host, in host order) non-null on local rank 0 only.
// hierarchical_wins / hierarchical_allgather_wins: the cost model's choice for N bytes.
bool hierarchical_wins(int L, int H, size_t nbytes);
bool hierarchical_allgather_wins(int L, int H, size_t nbytes);
void allreduce_hierarchical(Comm& local, Comm& cross, const void* in, void* out, size_t count, DataType dt,
                            ReduceOp op, const CollectiveOptions& o);
void allgatherv_hierarchical(Comm& local, Comm* leaders, int host, const void* in, void* out,
                             const std::vector<size_t>& bytes, const CollectiveOptions& o);

}  // namespace appliance
