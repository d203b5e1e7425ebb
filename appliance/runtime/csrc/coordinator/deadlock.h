// Deadlock check, pure logic (no I/O, no threads; time is passed in): the ranks whose callers are
// all blocked on operations that can never complete, told apart from ranks that are only slow.
//
// What a rank says: a rank tells rank 0's coordinator (engine/negotiator.h: Negotiator::waiting)
// once one of its callers has been blocked for half the deadlock time in a wait on an operation
// still in negotiation, with nothing submitted or completed on that rank since; and again when
// that changes. A rank that computes (a checkpoint, a long step) is not in a wait, and one whose
// awaited operation is running (a long collective) waits on no negotiation: neither ever counts.
//
// The decision (find_deadlock): start from the ranks that have waited, nothing moving there, for
// the deadlock time (APPLIANCE_DEADLOCK_SECONDS); drop every rank that waits on an operation that
// could still complete (each member of its process set is ready for it, or is not in the group and
// may still submit it), until nothing changes. Joined ranks count as ready for the global set's
// operations, as the coordinator counts them, and wait on the join, which completes once every
// rank joined; a group's members complete together. The ranks left wait on each other forever.
// Partial stalls (some rank is not waiting: it skipped a collective and went on computing) are
// the stall check's (coordinator.h), on its own, longer, clock.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "coordinator/request.h"

namespace appliance {

// An operation some ranks are ready for that no plan has run yet.
struct PendingOp {
  std::string name;
  OpKind kind = OpKind::kAllreduce;
  int32_t set = 0;
  int32_t root = 0;
  uint32_t group_id = 0;       // a group's members complete together (0: not grouped)
  std::vector<uint8_t> ready;  // per job rank: ready for it
  static PendingOp of(const Request& req, int size);  // nobody ready yet
};

// The ranks of `candidates` that wait, each, only on operations that can never complete (see
// above); empty when none. members(set): the set's job ranks, nullptr for an unknown set (its
// operations fail at once: they complete). joined, left: per job rank.
std::vector<int> find_deadlock(const std::vector<PendingOp>& ops, const std::vector<int>& candidates,
                               const std::function<const std::vector<int>*(int32_t)>& members,
                               const std::vector<uint8_t>& joined, const std::vector<uint8_t>& left);

// What each of `ranks` waits on, one line each: "rank 1 waits on: allreduce 'a', broadcast 'b' (root 0)".
std::vector<std::string> describe_waits(const std::vector<PendingOp>& ops, const std::vector<int>& ranks);

// What rank 0's coordinator knows of the ranks that wait, and when the check has something to
// look at.
class WaitingRanks {
 public:
  using Time = std::chrono::steady_clock::time_point;
  WaitingRanks(int size, double deadlock_s);

  // Rank `rank` waits since `since`; `also`: requests it is ready for that the coordinator may
  // not have seen (announced by cache id in the tree).
  void waiting(int rank, Time since, std::vector<Request> also);
  void not_waiting(int rank);
  // Operations of these ranks completed at `now`: their clocks start again.
  void progress(const std::vector<int>& ranks, Time now);

  bool any() const { return count_ > 0; }
  bool is_waiting(int rank) const { return ranks_[rank].waiting; }
  const std::vector<Request>& also(int rank) const { return ranks_[rank].also; }
  // The ranks that have waited, nothing moving, for the deadlock time by `now` (with `now` =
  // Time::max(): every rank that waits).
  std::vector<int> settled(Time now) const;
  // When the check has something new to look at (Time{}: now; Time::max(): nothing), and that it did.
  Time next_check() const;
  void checked(Time now);

 private:
  struct Rank {
    bool waiting = false;
    Time quiet{};  // waiting, with nothing moving, since
    std::vector<Request> also;
  };
  Time settles(const Rank& r) const;
  Time::duration settle_;
  std::vector<Rank> ranks_;
  int count_ = 0;
  bool dirty_ = false;  // changed since the last check
  Time checked_{};
};

}  // namespace appliance
