// VirtualJob: N negotiators of one protocol in one process, wired by in-memory links, with time
// passed in. What the unit tests check both protocols against (same plans in the same order on
// every rank, mismatches, stalls, departures), and what benchmarks/scale.py's virtual mode
// measures (rank 0's CPU time and messages per operation, and hops on the critical path, at up
// to thousands of ranks) without a scheduler in the way. A simulator, not part of the product:
// built only with APPLIANCE_BUILD_TESTS=ON (tests/cpp/CMakeLists.txt), into the C++ unit tests
// and the test-only extension (_core_testing.negotiation_model, hooks/negotiation.cc).
//
// Links are FIFO per (sender, receiver) pair, like a control link. settle() delivers every
// message in flight, in rounds (every rank's inbox, rank order; a rank that handled messages
// is ticked after them, as the engine does in a turn), until nothing moves. Each message carries a hop count: one more than the largest its sender had
// received when it sent it (a Lamport clock), so a plan's hops are the length of the longest
// chain of messages that led to it since the last reset_hops().
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/negotiator.h"

namespace appliance {

// What one cached operation costs a protocol at `ranks` ranks, measured on a VirtualJob once its
// response cache is warm: `ops` steps of `tensors` synchronous allreduces each (every rank
// submits the step, then it settles). rank0_ns: time inside rank 0's negotiator per op (the
// protocol's own CPU work: decoding, deciding, encoding; no sockets), each call started with
// cold CPU caches (as after the other ranks' work), so that it does not depend on how much
// memory the other negotiators of this one process touch; rank0_msgs / max_msgs:
// messages rank 0 / the busiest rank sent and received per op; hops: the longest chain of
// messages from the step's submissions to a plan (per step). protocol: "tree" or "star".
struct NegotiationCost {
  double rank0_ns = 0, rank0_msgs = 0, max_msgs = 0, hops = 0;
};
NegotiationCost measure_cached_ops(const std::string& protocol, int ranks, int ops, int tensors);

class VirtualJob {
 public:
  using Time = Negotiator::Time;
  using Factory = std::function<std::unique_ptr<Negotiator>(const NegotiatorOptions&)>;

  VirtualJob(int size, NegotiatorOptions base, const Factory& make);

  int size() const { return static_cast<int>(ranks_.size()); }
  Negotiator& negotiator(int rank) { return *ranks_[rank].n; }
  // Rank `rank` submits `reqs` as one batch (submit each, then flush).
  void submit(int rank, const std::vector<Request>& reqs, Time now);
  void add_process_set(int32_t id, const std::vector<int>& members);
  // Rank `rank` shuts down in order: a BYE to each of its control peers; it takes no further part.
  void leave(int rank, Time now);
  // Delivers and ticks until nothing is in flight (at most `max_rounds` rounds).
  void settle(Time now, int max_rounds = 100000);
  // Ticks every rank once at `now` (deadlines: fusion cycles, stall checks).
  void tick(Time now);
  // Rank `rank`'s callers wait since `since` (Time::max(): none does), as its engine says.
  void waiting(int rank, Time since, Time now);

  // Everything rank `rank` produced so far.
  const std::vector<Plan>& plans(int rank) const { return ranks_[rank].plans; }
  const std::vector<std::string>& log(int rank) const { return ranks_[rank].log; }
  const Status& abort(int rank) const { return ranks_[rank].abort; }
  bool coordinator_gone(int rank) const { return ranks_[rank].gone; }
  // The names of rank `rank`'s plans in order, "!" before a failed entry's names.
  std::vector<std::string> order(int rank) const;

  // Measurements: messages each rank sent and received, the largest hop count of a plan since
  // reset_hops(), and the time (steady clock) spent inside each rank's negotiator calls.
  uint64_t sent(int rank) const { return ranks_[rank].sent; }
  uint64_t received(int rank) const { return ranks_[rank].received; }
  uint64_t busy_ns(int rank) const { return ranks_[rank].busy_ns; }
  int max_plan_hops() const { return max_plan_hops_; }
  void reset_hops();
  // Rank 0's inputs are recorded (what it was handed, in order). replay() hands them to a fresh
  // negotiator made by the factory and returns the time spent in its calls from input `from`
  // on; take the record and let the job go first, so that its memory is not in the way.
  struct Input {  // one call of rank 0's negotiator
    enum Kind { kSubmit, kReceive, kLeft, kTick } kind;
    Time now;
    int peer = -1;
    std::vector<uint8_t> bytes;
    std::vector<Request> reqs;
  };
  struct Rank0Record {
    Factory make;
    NegotiatorOptions opts;
    std::vector<Input> inputs;
    uint64_t replay(size_t from) const;
  };
  size_t rank0_inputs() const { return rank0_.inputs.size(); }
  Rank0Record take_rank0_record() { return std::move(rank0_); }
  // Evict the CPU caches before each call of rank 0's negotiator (not timed).
  void cold_rank0(bool on) { cold_rank0_ = on; }
  // Rank `rank`'s control peers as its negotiator named them.
  std::vector<int> peers(int rank) { return ranks_[rank].n->control_peers(); }

 private:
  struct Message {
    int from;
    int hops;
    std::vector<uint8_t> bytes;
  };
  struct Rank {
    std::unique_ptr<Negotiator> n;
    std::deque<Message> inbox;
    std::vector<Plan> plans;
    std::vector<std::string> log;
    Status abort;
    bool gone = false, left = false;
    int clock = 0;  // hops: the largest received
    uint64_t sent = 0, received = 0, busy_ns = 0;
  };
  void take(int rank, Negotiated& out);
  template <class F>
  void timed(int rank, F&& f);

  std::vector<Rank> ranks_;
  Rank0Record rank0_;
  int max_plan_hops_ = 0;
  bool cold_rank0_ = false;
  std::vector<uint8_t> scratch_;  // what evicts the caches
};

}  // namespace appliance
