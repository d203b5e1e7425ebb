// OpState: one enqueued operation, from enqueue() to wait() (or to its completion callback).
// HandleTable: the map from handle ints to operations, which Python threads wait on and the
// background thread completes. Names in flight are unique per process (a duplicate is a
// ValueError at submit). An operation with a completion callback (OpState::on_done, the C
// door's way: capi/) is never waited for: the table forgets it when it completes and then
// calls the callback, outside its lock, on the completing thread.
// It also knows when this rank's callers are stuck: the waits that block are registered while
// they last, so the engine can tell a rank blocked on operations still in negotiation (which
// the deadlock check counts) from one that computes (engine/negotiator.h's waiting()).
#pragma once

#include <time.h>

#include <atomic>
#include <chrono>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "coordinator/request.h"
#include "ops/output_pool.h"

namespace appliance {

// Steady-clock microseconds: the engine's timestamps for bursts, polling and waits.
inline int64_t steady_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
// This thread's CPU time in nanoseconds (a syscall: for measurements, not the hot path).
inline uint64_t thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

struct TensorDesc {
  uint64_t ptr = 0;
  DataType dtype = DataType::kUInt8;
  std::vector<int64_t> shape;
  int32_t device = -1;
  uint64_t stream = 0;
  void* data() const { return reinterpret_cast<void*>(static_cast<uintptr_t>(ptr)); }
};

struct OpState {
  int handle = 0;
  Request req;
  TensorDesc in, out;
  uint32_t sent_as_id = 0;  // cache id this rank announced it with (0 = sent in full)

  // Filled by the background thread before completion.
  Status status;
  std::unique_ptr<OutputPool::Block> output;  // core-allocated output (allgather, alltoall, reducescatter)
  size_t output_bytes = 0;
  std::shared_ptr<OutputPool> pool;  // where large outputs come from (null: plain allocation)
  std::vector<int64_t> out_shape;
  std::vector<int64_t> recv_splits;
  std::shared_ptr<void> device_output;  // CUDA output from the adapter's allocator (NCCL path)
  // Device work (NCCL path): an event recorded on the op's stream after it, set at launch.
  // A caller may make its own stream wait on it instead of waiting for `done` on the host.
  std::shared_ptr<void> ready_event;
  int64_t value = -1;
  int64_t planned_us = 0;  // steady_us when its plan entry launched here (metrics: the caller's wait)
  // Set (under the table's mutex) by the background thread; atomic so that a spinning
  // waiter reads them without taking that mutex, which it would otherwise keep from the
  // thread that completes the op. Release/acquire: what was written before is visible.
  std::atomic<bool> launched{false};
  std::atomic<bool> done{false};
  // Called once, after `done` is set, outside the table's lock (then dropped): see the top.
  std::function<void(const std::shared_ptr<OpState>&)> on_done;

  // Allocate the output without zeroing it (the collective overwrites every byte).
  uint8_t* allocate_output(size_t bytes, std::vector<int64_t> shape);
};

using OpPtr = std::shared_ptr<OpState>;

class HandleTable {
 public:
  // Registers op under a new handle; throws std::invalid_argument when its name is in flight.
  // *outstanding (optional) receives how many ops were added and not yet waited for before it.
  int add(const OpPtr& op, size_t* outstanding = nullptr);
  void complete(const OpPtr& op, Status s);
  // complete() of every non-null op with the same status, under one lock and one notify (a
  // fused entry's tensors: waiters are woken once, not once per tensor).
  void complete_all(const std::vector<OpPtr>& ops, const Status& s);
  bool poll(int handle);
  // The op behind a handle that is not yet waited for; throws std::invalid_argument if none.
  OpPtr find(int handle);
  // Device work of op is on its stream (op->ready_event is set).
  void mark_launched(const OpPtr& op);
  // Blocks until done (or, with until_launched, until launched with a ready event), then
  // forgets the handle and frees its name for reuse. *finished tells which. Throws
  // std::invalid_argument on unknown handles. `now_us` (optional): in, a steady_us() reading
  // the caller took just before (0: none); out, the reading as it returns (the in value when
  // the op was done already: one clock read fewer per small op).
  OpPtr wait(int handle, bool until_launched = false, bool* finished = nullptr, int64_t* now_us = nullptr);
  // Completes every op not yet done with s (job failure, shutdown).
  void fail_all(const Status& s);
  // wait() polls (yielding the CPU) this long before it blocks on the condition variable.
  void set_spin_us(int us) { spin_us_ = us; }
  // Whether a caller is in wait() now or left it less than `us` microseconds ago: the
  // background thread polls instead of sleeping only then, so it never competes for the CPU
  // with a caller that is computing (a backward pass) rather than waiting.
  bool waited_within(int64_t us) const;
  // Whether a caller is in wait() now (a caller that waits has stopped issuing a burst).
  bool waiting() const { return waiters_.load(std::memory_order_relaxed) > 0; }

  // Stuck callers. A wait that blocks (its op not done once the spin is over) and lasts
  // `after_us` calls `poke` once, from the waiting thread, without the table's lock (the engine
  // then looks: stuck_since_us). Set before any wait; after_us <= 0: never.
  void watch_waits(int64_t after_us, std::function<void()> poke) {
    watch_after_us_ = after_us;
    poke_ = std::move(poke);
  }
  // Whether a blocked wait has lasted the watch's time (one atomic load: the engine's every turn).
  bool long_waits() const { return long_waits_.load(std::memory_order_relaxed) > 0; }
  // The steady_us since which a caller waits on an op not yet planned here (planned_us 0, not
  // done) and no op was added or completed here; -1 when no caller waits so. On the engine's
  // side only (planned_us is written there).
  int64_t stuck_since_us();

 private:
  void run_callbacks(std::vector<OpPtr>& ops);  // outside mu_

  std::mutex mu_;
  std::condition_variable cv_;
  int next_ = 1;
  int spin_us_ = 0;
  std::atomic<int> waiters_{0};
  std::atomic<int64_t> last_wait_us_{0};  // steady clock, when a wait() last returned
  std::unordered_map<int, OpPtr> ops_;
  std::unordered_map<std::string, int> names_;
  // Stuck callers (watch_waits): handle -> when its blocking wait began; the latest add or
  // completion; waits past the watch's time.
  std::unordered_map<int, int64_t> blocked_;
  int64_t last_change_us_ = 0;
  std::atomic<int> long_waits_{0};
  int64_t watch_after_us_ = 0;
  std::function<void()> poke_;
};

}  // namespace appliance
