// Coordinator: rank 0's negotiation, as pure logic (no I/O, no threads; time is passed in).
//
// It learns which names each rank is ready for, and when a name is ready on every rank that
// has not joined, validates that all ranks agree and moves it to the ready list. take_plan()
// turns the ready list into plan entries: allreduces that agree in (dtype, op, scales, device)
// are fused up to the fusion threshold; grouped ops wait for all their members. The plan is
// issued at once unless another name is ready on only some ranks (more is coming), in which
// case it waits up to the cycle time so that it can fuse.
//
// Process sets: a request names its set (0 = every rank); a name is complete when every member
// of its set is ready, and validation, sizes and plans speak of the set's ranks in member order.
// Sets are added and removed (add_process_set/remove_process_set) in the same order on every rank.
// Joined ranks (hvd.join) count as ready for allreduces and contribute zeros; other kinds
// fail while a rank is joined (on the ranks that submitted them: the joined rank is not told). A rank that left (shutdown) fails every name it never submitted.
// Stall check: names waiting on some ranks for too long are reported, at most one report per
// warning period listing every stalled name (oldest first) with its missing ranks; past the shutdown time
// the job aborts with Code::kStalled, blaming the lowest missing rank of the oldest name.
// Deadlock check (coordinator/deadlock.h): ranks say when their callers wait on operations still
// in negotiation; when every rank of a group has waited so for the deadlock time and nothing it
// waits on can complete, the job aborts with Code::kStalled at once, naming what each rank waits on.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/options.h"
#include "common/status.h"
#include "coordinator/deadlock.h"
#include "coordinator/request.h"

namespace appliance {

// Fusion, pure: the entries of `ready` in order into `out`, allreduces that agree in (dtype,
// op, scales, device, joined ranks, process set) fused up to `threshold` bytes (0: none); a host
// allreduce over `member_bytes` (0: no limit) runs alone, in place (two memory passes through the
// buffer cost it more than an operation of its own; a device copy costs less than a launch).
void fuse_entries(std::vector<PlanEntry>& out, std::vector<PlanEntry>& ready, size_t threshold, size_t member_bytes);

// The negotiation's options (common/options.h: fusion, cycle, stall checks) and the job's size.
struct CoordinatorOptions : NegotiationOptions {
  int size = 1;
};

class Coordinator {
 public:
  using Time = std::chrono::steady_clock::time_point;

  explicit Coordinator(CoordinatorOptions o);

  // A rank is ready for a request (kind kJoin = the rank joined).
  void on_request(int rank, Request req, Time now);
  // A rank shut down in order; it will submit nothing more.
  void on_rank_left(int rank);

  // Process sets by id (> 0); members are sorted job ranks. Returns "" or why not.
  std::string add_process_set(int32_t id, std::vector<int> members);
  void remove_process_set(int32_t id);

  // Plan entries to issue now; empty when nothing is due (see next_deadline()).
  std::vector<PlanEntry> take_plan(Time now);
  // When take_plan() should be called again at the latest (Time::max() when idle).
  Time next_deadline() const;

  // Stall check: the report lines due now (empty when none is due). Sets *abort (when ok) to
  // a kStalled status naming the ranks and names when a stall passed the shutdown time.
  std::vector<std::string> stall_warnings(Time now, Status* abort);
  // When stall_warnings() has something new to say at the earliest (Time::max() when nothing
  // waits), so the check can run on time rather than on a coarse tick.
  Time next_stall_event() const;

  bool idle() const { return readiness_.empty() && ready_.empty(); }

  // Deadlock check (coordinator/deadlock.h). Rank `rank`'s callers wait since `since`, nothing
  // moving there, on operations still in negotiation; `also`: requests it is ready for that this
  // coordinator may not have seen (announced by cache id in the tree).
  void on_waiting(int rank, Time since, std::vector<Request> also);
  void on_not_waiting(int rank);
  // Operations of process set `set` completed at `now` outside this coordinator (the tree's
  // cached ones; its own count as they complete).
  void on_progress(int32_t set, Time now);
  // The lines every rank prints when a group of ranks is deadlocked (empty: none is), with *abort
  // (when ok) set to a kStalled status naming what each of them waits on.
  std::vector<std::string> deadlock(Time now, Status* abort);
  // When deadlock() has something new to look at (Time::max(): nothing).
  Time next_deadlock_check() const { return o_.deadlock_s > 0 ? waiting_.next_check() : Time::max(); }

  // Lateness since the last call (see Plan::late): for each name completed by one rank's
  // readiness after every other member was ready, the time since the previous member became
  // ready, counted once per rank where such intervals overlap. Joins and departures are not lateness.
  std::vector<Late> take_late();
  // Lateness seen elsewhere (a tree subtree's): added as take_late() will report it.
  void add_late(int rank, Time from, Time to);

 private:
  // The readiness table's row of a name not yet ready on every rank of its set: which ranks
  // asked for it, with what.
  struct Readiness {
    std::string name;
    int32_t set = 0;
    OpKind kind = OpKind::kAllreduce;
    std::vector<std::optional<Request>> reqs;  // per rank
    int count = 0;
    Time first_seen{};
    Time last_arrival{};  // when the latest member so far became ready
  };

  const std::vector<int>* members(int32_t set) const;  // nullptr: unknown set
  bool complete(const Readiness& p) const;
  bool promote_if_complete(const std::string& name, Time now);  // true: it was complete
  PlanEntry validate(Readiness& p);

  CoordinatorOptions o_;
  std::unordered_map<std::string, Readiness> readiness_;  // the readiness table, by name
  std::vector<PlanEntry> ready_;                 // validated, in readiness order
  std::map<std::pair<int32_t, uint32_t>, std::vector<PlanEntry>> groups_;  // (set, group id) -> members validated so far
  Time first_ready_{};
  std::vector<int> all_;                          // 0..size-1: the global set
  std::map<int32_t, std::vector<int>> sets_;      // the other sets
  std::vector<uint8_t> joined_, left_;
  int joined_count_ = 0;
  int last_joined_ = -1;
  std::vector<Time> late_until_;    // per rank: the end of the lateness counted so far
  std::vector<uint64_t> late_us_;   // per rank: lateness not yet taken (take_late)
  bool any_late_ = false;
  bool reported_ = false;  // a stall report was made, at last_report_
  Time last_report_{};
  WaitingRanks waiting_;   // the deadlock check's view of the ranks
};

}  // namespace appliance
