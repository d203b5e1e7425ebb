// BackendRegistry: the backends of one Runtime, and the choice of the one that runs a plan
// entry. The engine holds one and includes only this header and backend.h; the concrete
// backends are known here and in no floor above.
//
// One backend per device kind: host memory (a CpuBackend over the job's data Comm, with views of
// this host's ranks and of the ranks with this local rank for hierarchical collectives when the
// job has several hosts with the same number of consecutive ranks each, and one over each process
// set's Comm view this rank is in) and CUDA memory, through NCCL or through
// host staging when NCCL cannot run an entry (backends/cuda/device_plan.h decides, per job and
// per entry). CUDA tensors of a process set other than the global one always go through host
// staging (NCCL communicators exist for the global set only; making one is job-wide). The CUDA
// side is made at the job's first CUDA entry: the CUDA runtime and NCCL are dlopen()ed, every
// rank's DeviceReport is exchanged through the authenticated store, the job-wide choice is
// made from them, and the NCCL communicator is created (its unique id travels the same way).
//
// Threads: for_entry, add_set, remove_set and abort are the engine's work (one thread at a
// time); set_device_allocator, cuda_path and stream_wait may be called by any caller.
// Failure modes: a rank with CUDA tensors whose CUDA runtime is unusable, or a malformed
// exchange, throws Error: the engine aborts the job with it.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/cuda/device_plan.h"
#include "collectives/collectives.h"
#include "common/options.h"
#include "store/store.h"

namespace appliance {

class CpuBackend;
class StagingBackend;
class NcclBackend;
struct CudaApi;
struct NcclApi;

// The device options (common/options.h: nccl_library) and what else the backends need.
struct BackendOptions : DeviceOptions {
  int rank = 0, size = 1;
  std::string host;                // this rank's host name, for its errors
  std::vector<std::string> hosts;  // every rank's host name, for errors that name a peer
  int64_t exchange_timeout_ms = LinkOptions{}.start_timeout_ms();  // for each exchange through the store
  CollectiveOptions collectives;
  bool verbose = ReportOptions{}.verbose;
  // Where the CUDA runtime and NCCL may be found, in order; nccl_library is the explicit knob.
  std::vector<std::string> nccl_candidates, cudart_candidates;
};

class BackendRegistry {
 public:
  // `comm`: the job's data Comm; `store`: the job's store (null in a job of one rank); `sink`:
  // where backends report their steps. All outlive the registry.
  BackendRegistry(BackendOptions o, Comm& comm, Store* store, ActivitySink* sink);
  ~BackendRegistry();
  BackendRegistry(const BackendRegistry&) = delete;
  BackendRegistry& operator=(const BackendRegistry&) = delete;

  // The backend that runs `e` (a successful entry this rank takes part in). At the job's first
  // CUDA entry it sets the CUDA side up on the device of the first of `ops`, or on
  // `fallback_device` (a joined rank's) when this rank has none, or device 0.
  Backend& for_entry(const PlanEntry& e, const std::vector<OpState*>& ops, int fallback_device);
  // A process set this rank is in, over its Comm view (which outlives the set's backends).
  void add_set(int32_t id, Comm& comm);
  void remove_set(int32_t id);
  // Makes sure nothing of a device backend can wait on a peer (NCCL: ncclCommAbort).
  void abort();

  // Where CUDA outputs of allgather/alltoall/reducescatter come from (set by the adapter).
  void set_device_allocator(DeviceAllocator a);
  // "nccl", "staging" or "" (no CUDA entry has run yet), and why staging.
  std::string cuda_path(std::string* why) const;
  // Makes `stream` wait for the op's device work (its ready event).
  void stream_wait(const OpState& op, uint64_t stream);

 private:
  struct SetBackends {
    std::unique_ptr<CpuBackend> cpu;
    std::unique_ptr<StagingBackend> staging;  // made at the set's first CUDA entry
  };
  void load_cuda();  // the CUDA runtime, or Error naming why it cannot be used
  void setup_cuda(int device);
  DeviceAllocator locked_allocator();

  BackendOptions o_;
  std::unique_ptr<Comm> local_, cross_;  // the job's hosts, when it has several with several ranks each
  Store* store_;
  ActivitySink* sink_;
  std::unique_ptr<CudaApi> cuda_;
  std::unique_ptr<NcclApi> nccl_api_;
  std::unique_ptr<CpuBackend> cpu_;
  std::unique_ptr<StagingBackend> staging_;
  std::unique_ptr<NcclBackend> nccl_;
  std::map<int32_t, SetBackends> sets_;
  bool cuda_ready_ = false;
  std::set<std::string> warned_;
  mutable std::mutex cuda_mu_;  // guards alloc_ and the CUDA decision, which callers read
  DeviceAllocator alloc_;
  CudaDecision decision_;
};

}  // namespace appliance
