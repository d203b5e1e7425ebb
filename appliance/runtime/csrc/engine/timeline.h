// Timeline: a Chrome-trace record (chrome://tracing, ui.perfetto.dev) of what the engine does
// with each tensor, laid out as Horovod's timeline (HOROVOD_TIMELINE, hvd.start_timeline).
//
// What it owns: the recorder state (which phase each tensor name is in, its pid), a bounded
// record queue and a writer thread that owns the file. The engine's background thread never
// formats or writes: each hook (called only when on(), one relaxed load) appends small records
// to the queue under a mutex the writer takes only to swap the queue out every 20 ms.
// Only rank 0 records (it is where negotiation is seen); on other ranks start() and stop() do
// nothing and on() stays false. A tensor's negotiation and operation share one track (tid 0);
// a negotiation that starts while the same name's previous operation still runs on a device
// goes on tid 1, and that second operation is not recorded.
//
// File layout (one JSON array; each tensor name is a "process" named by metadata events):
//   NEGOTIATE_<KIND> B .. E   from the first rank's readiness to the plan that runs it, with
//                              one zero-length "X" event per rank named by its rank number;
//   <KIND> B .. E              the operation (ALLREDUCE, ALLGATHER, BROADCAST, ALLTOALL,
//                              REDUCESCATTER; not BARRIER/JOIN), its E carrying dtype and shape,
//                              and inside it, one after another: QUEUE (plan issued until the
//                              entry starts), MEMCPY_IN_FUSION_BUFFER, the collective
//                              (CPU_<KIND>, NCCL_<KIND>...), MEMCPY_OUT_FUSION_BUFFER (fused
//                              batches only); MEMCPY_IN/OUT_HOST_BUFFER for CUDA staging;
//   CYCLE_START "i" events      (mark_cycles) one per wake of rank 0's background thread.
// Timestamps are microseconds since start(); pid 0's metadata carries the wall-clock start.
// The array is closed by stop(): the file is valid JSON after stop() or a clean shutdown
// (a killed process leaves an unterminated array, which chrome://tracing still reads). The
// writer keeps every B/E pair balanced per tensor, closing what is open at stop().
//
// Failure modes: start() throws std::invalid_argument naming the path when it cannot be
// opened for writing. A full queue (kQueueLimit records: the writer cannot keep up) drops
// records instead of blocking the engine; the number dropped is written in pid 0's metadata.
// A write error stops recording (one log line); the engine is never affected.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "backends/backend.h"
#include "coordinator/request.h"

namespace appliance {

class Timeline final : public ActivitySink {
 public:
  static constexpr size_t kQueueLimit = 1u << 18;  // records (~30 MB); the writer drains every 20 ms

  explicit Timeline(int rank) : rank_(rank) {}
  ~Timeline() override { stop(); }
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // Caller threads. Starts recording into `path` (truncated), stopping a running timeline
  // first (the same path: it goes on, as Horovod). No-op on ranks other than 0. Throws
  // std::invalid_argument when path cannot be opened.
  void start(const std::string& path, bool mark_cycles);
  // Closes every open phase, writes what is queued and closes the file. Idempotent.
  void stop();
  // The path being written ("" when off).
  std::string path() const;

  // Background-thread hooks; call them only when on() (one relaxed load when off).
  void negotiate(const std::string& name, OpKind kind, int rank);  // `rank` is ready for `name`
  // The plan runs these entries: negotiation ends for every name; operations this rank runs
  // (`runs(name)`) open their <KIND> phase and QUEUE.
  void planned(const std::vector<PlanEntry>& entries, const std::function<bool(const std::string&)>& runs);
  // Each operation of `e` in its phase ends its step (QUEUE...) and starts `what` (null: none;
  // else a string that outlives the timeline, such as a literal).
  void activity(const PlanEntry& e, const char* what) override;
  // `e` is launched on `b`: QUEUE ends; b's own notes follow, or one step <B>_<KIND> covers it.
  void launched(const PlanEntry& e, const Backend& b);
  // `name`'s operation finished (its activity and phase end; E carries dtype and shape).
  void done(const std::string& name, const Signature& sig);
  void cycle();  // a CYCLE_START marker when mark_cycles

 private:
  enum class Phase : uint8_t { kNone, kOp, kActivity };
  struct Track {  // recorder state of one tensor name (kept for the file's life: its pid)
    int pid = 0;
    bool negotiating = false;
    int neg_tid = 0;  // 1 when a negotiation starts while the previous operation still runs
    Phase op = Phase::kNone;
  };
  // What the writer needs, without allocation in the common case: names are pids and
  // interned or literal strings; only a new tensor's name and an E's dtype/shape are copied.
  struct Rec {
    char ph;                     // B, E, X, i; M: a new tensor, named by `args`
    uint8_t tid;
    int32_t pid;
    int32_t mark;                // X: the rank that became ready
    const char* what;            // B, i: phase or marker name (static or interned)
    int64_t ts;
    std::string args;            // E: JSON members (no braces); M: the tensor name
  };

  int64_t now_us() const;
  void stop_locked();  // ctl_ held
  // mu_ held:
  void push(char ph, int tid, int pid, const char* what, int64_t ts, int mark = -1, std::string args = {});
  Track& track(const std::string& name);
  const char* intern(std::string s);
  void end_activity(Track& t, int64_t ts);
  void writer_loop(std::FILE* f, int64_t epoch_us);

  const int rank_;
  std::mutex ctl_;             // serialises start/stop
  mutable std::mutex mu_;      // everything below
  std::condition_variable cv_;
  std::unordered_map<std::string, Track> tracks_;
  std::unordered_set<std::string> interned_;  // node-based: c_str() stays valid
  std::vector<Rec> queue_;  // swapped with the writer's: both keep their capacity
  uint64_t dropped_ = 0;
  bool closing_ = false;
  bool mark_cycles_ = false;
  std::string path_;
  std::chrono::steady_clock::time_point t0_;
  std::thread writer_;
};

}  // namespace appliance
