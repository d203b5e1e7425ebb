// Test harness for the data plane: runs one collective on N ranks as N threads of this
// process, over socketpair links (transport/tcp/tcp_link.h) or shared-memory links
// (transport/shm/shm_link.h, CollectiveSpec::transport), and reports per-rank outputs,
// errors and timings. Test-only; no pybind11 here (dataplane.cc binds it).
//
// It also stands in for what the engine does around a collective: each rank gets a Watch
// on a pipe; a rank that fails posts its status to a shared abort board (first one wins)
// and wakes every other rank's Watch, whose service() then throws that status. So one
// failure ends the collective on every rank within a poll, and `job_error` reports the
// origin, as the real runtime's ABORT does.
//
// Faults: a FaultLink wrapped around one rank's link to one peer either crashes that rank
// after `close_after` bytes sent on that link (the rank then closes all its links without
// reporting, like a dead process), or flips the byte at stream offset `corrupt_at`.
// A run that does not finish within timeout_ms is aborted through the board with kTimeout.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "collectives/collectives.h"
#include "common/status.h"

namespace appliance {
namespace testing {

struct FaultSpec {
  int rank = -1;             // the rank whose link misbehaves
  int peer = -1;             // ... on its link to this peer
  int64_t close_after = -1;  // crash after this many bytes were sent on that link
  int64_t corrupt_at = -1;   // flip the byte at this offset of the outgoing stream
};

struct CollectiveSpec {
  std::string kind;  // allreduce adasum allgatherv broadcast alltoallv reducescatter barrier
  int nranks = 2;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  std::vector<size_t> counts;                   // reducescatter: elements per rank; adasum: per tensor
  std::vector<std::vector<size_t>> send_bytes;  // alltoallv: [rank][peer]
  bool alias = false;     // allreduce: in place (else into a separate output); allgatherv: in = out + offset;
                          // reducescatter: out = buf block
  CollectiveOptions opts;
  size_t max_frame = 1 << 20;
  int iterations = 1;
  bool sync = false;      // barrier (untimed) before each timed iteration, for benchmarks
  int delay_rank = -1;    // this rank sleeps delay_ms before entering
  int delay_ms = 0;
  int sockbuf = 0;        // SO_SNDBUF/SO_RCVBUF for the socketpairs, 0 = system default
  std::string transport = "tcp";  // "tcp": socketpairs; "shm": shared-memory links (memfd rings)
  size_t shm_ring_bytes = 1 << 20;
  bool watch_fd = true;   // false: the Watch has no fd and relies on periodic servicing
  FaultSpec fault;
  int64_t timeout_ms = 20000;
  // > 0: allreduce and allgatherv run hierarchically (collectives/hierarchical.cc), as on hosts of
  // this many consecutive ranks each (nranks a multiple of it).
  int local_size = 0;
};

struct RankResult {
  std::vector<uint8_t> output;
  std::optional<Status> error;
  double seconds = 0;  // sum over iterations of time inside the collective
  double enter_s = 0;  // last iteration: entry and exit, relative to the common start
  double exit_s = 0;
};

struct HarnessResult {
  std::vector<RankResult> ranks;
  std::optional<Status> job_error;  // first failure posted to the abort board
  double wall_s = 0;
};

HarnessResult run_collective(const CollectiveSpec& spec, const std::vector<std::vector<uint8_t>>& inputs);

}  // namespace testing
}  // namespace appliance
