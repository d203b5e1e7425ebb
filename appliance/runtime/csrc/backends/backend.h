// Backend: runs one successful plan entry for this rank's operations.
//
// `ops[i]` is this rank's operation for entry.names[i], or nullptr when this rank has joined
// and contributes zeros (allreduce only). launch() starts the entry and returns how to learn
// that it finished: nullptr when it already has (the CPU backend runs collectives to the end),
// or a Completion the engine polls (the NCCL backend: an event recorded on the tensor's stream).
// Outputs are filled (user buffers or core-allocated ones) by the time the entry is done; a
// backend never completes handles. Any exception from launch() or Completion::done() aborts the
// job (other ranks may already be inside the collective); abort() then makes sure nothing of
// this backend can hang (NCCL: ncclCommAbort).
//
// Backends (one per device kind, held by the Runtime's BackendRegistry, backends/registry.h):
// backends/cpu (host memory, the algorithms in collectives/), backends/nccl (CUDA memory
// through NCCL) and backends/cuda/staging (CUDA memory through host copies and the CPU backend).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "coordinator/request.h"
#include "ops/ops.h"

namespace appliance {

// How the engine learns that a launched entry finished (and, for device work, how a stream
// waits for it).
class Completion {
 public:
  virtual ~Completion() = default;
  // True once the entry's work has finished; throws Error when it failed.
  virtual bool done() = 0;
  // An event (cudaEvent_t) recorded after the entry's work on its stream, shared with the ops
  // so callers can order their own stream after it; nullptr for host work.
  virtual std::shared_ptr<void> ready_event() { return nullptr; }
};

// Where a backend reports the steps of an entry (engine/timeline.h records them). on() is one
// relaxed load; activity() is called only when it is true, on the background thread.
class ActivitySink {
 public:
  virtual ~ActivitySink() = default;
  bool on() const { return on_.load(std::memory_order_relaxed); }
  // Each operation of `e` this rank runs ends its current step and starts `what` (null: none).
  virtual void activity(const PlanEntry& e, const char* what) = 0;

 protected:
  std::atomic<bool> on_{false};
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual std::unique_ptr<Completion> launch(const PlanEntry& e, const std::vector<OpState*>& ops) = 0;
  virtual void abort() {}
  // True for backends that report their own steps (fusion copies, the collective); the engine
  // records the whole launch of the others as one step, <NAME>_<KIND>.
  virtual bool notes_activities() const { return false; }
  void set_activity_sink(ActivitySink* s) { sink_ = s; }

 protected:
  void note(const PlanEntry& e, const char* what) const {
    if (sink_ && sink_->on()) sink_->activity(e, what);
  }
  ActivitySink* sink_ = nullptr;
};

// Device memory for outputs whose size is known only after negotiation (allgather,
// alltoall, reducescatter on CUDA): supplied by the framework adapter (torch's allocator).
struct DeviceBlock {
  uint64_t ptr = 0;
  std::shared_ptr<void> owner;  // keeps the memory alive; handed back to the adapter
};
// `stream`: the stream the memory is written on (the operation's), for the allocator's
// bookkeeping (torch's caching allocator ties a block to a stream).
using DeviceAllocator = std::function<DeviceBlock(int device, size_t bytes, uint64_t stream)>;

// Bytes this rank sends to / receives from each peer in an alltoall entry, the rows it
// receives from each (recv_splits) and the output shape; from the plan's P x P splits.
struct AlltoallLayout {
  std::vector<size_t> send, recv;
  std::vector<int64_t> recv_splits, out_shape;
  size_t recv_total = 0;
};
AlltoallLayout alltoall_layout(const PlanEntry& e, const std::vector<int64_t>& in_shape, int size, int rank);

// Rows of dim0 rank r receives in a reducescatter of `dim0` rows over `size` ranks
// (Horovod's split: the first dim0 % size ranks get one more).
int64_t reducescatter_rows(int64_t dim0, int size, int rank);

}  // namespace appliance
