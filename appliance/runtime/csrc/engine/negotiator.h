// Negotiator: how the ranks agree on what runs next, and in which order. One interface, two
// protocols: the star (star_negotiator.h: every rank tells rank 0's coordinator what it is
// ready for, rank 0 answers with plans) and the tree (tree_negotiator.h: cached operations agreed
// up and down a tree without the coordinator, which handles only the rest).
//
// A negotiator is pure logic: no sockets, no threads, time passed in. The engine hands it this
// rank's requests (submit, then flush once per batch) and the control messages that arrive
// (receive), and after every call takes what it produced (Negotiated): control messages to send
// (to peers the control plane links it with: control_peers()), plans to run here in order, lines
// to print, and an abort. Plans come out in the same order on every rank; the response cache
// (coordinator/response_cache.h) lives inside, updated as plans come out.
//
// The engine also says, while it may matter, whether this rank's callers are stuck (waiting()):
// a rank reports it to rank 0's coordinator after half the deadlock time, and again when it
// changes (WaitReport), for the deadlock check (coordinator/deadlock.h).
//
// Failure modes: receive() throws Error(kProtocol) naming the sender for malformed or unexpected
// bytes; an abort (stall past HOROVOD_STALL_SHUTDOWN_TIME_SECONDS, a deadlock) comes out in
// Negotiated::abort.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "coordinator/coordinator.h"
#include "coordinator/request.h"

namespace appliance {

// The negotiation's options (common/options.h), the job's size (rank 0's coordinator's) and this rank.
struct NegotiatorOptions : CoordinatorOptions {
  int rank = 0;
};

// A control message for one peer.
struct Outgoing {
  int peer;
  std::vector<uint8_t> bytes;
};

// What a negotiator call produced, for the engine to carry out in this order: send, run, print.
struct Negotiated {
  std::vector<Outgoing> send;
  std::vector<Plan> plans;
  std::vector<std::string> log;  // lines to print on this rank (a stall report)
  Status abort;                   // not ok: the job fails with it (origin: the blamed rank)
  bool coordinator_gone = false;  // negotiation ended: rank `gone_rank` (0, or the tree parent) left in order
  int gone_rank = 0;

  bool empty() const { return send.empty() && plans.empty() && log.empty() && abort.ok() && !coordinator_gone; }
};

// Carried allreduces (the tree negotiator; the star ignores them): small cached allreduces whose
// data travels with the agreement, reduced up the tree and broadcast down with the plan, so that
// no collective runs for them. What the engine lends the negotiator, which touches no tensors:
// the limits, this rank's input (prescaled) and the elementwise combine. Carried bytes are only
// ever an optimisation: every rank keeps its input until its op completes, so whatever drops
// them (a first occurrence, an eviction, the slow mode, a rank without bytes, a limit) leaves
// the op to run its collective as before.
struct Carry {
  size_t op_bytes = 0;       // an eligible allreduce of at most this many bytes carries its data (0: none)
  size_t message_bytes = 0;  // carried bytes one UP or DOWN holds at most (the rest run normally)
  // This rank's input of `req`, with its prescale applied, into `out`; false: none to give.
  std::function<bool(const Request& req, std::vector<uint8_t>& out)> take;
  // dst = dst (op) src, elementwise, with sig's dtype and reduce op (Average: Sum).
  std::function<void(const Signature& sig, uint8_t* dst, const uint8_t* src)> combine;
};
// Whether a request with this signature may carry its data (the same test on every rank):
// an allreduce (Sum, Average, Min, Max, Product) of 1..op_bytes bytes of a host tensor in the
// global process set, not grouped.
bool carry_eligible(const Signature& s, size_t op_bytes);

// Where rank 0's negotiation is seen (the timeline): when a rank became ready for a name, and
// the entries of a plan as it is issued.
class NegotiationObserver {
 public:
  virtual ~NegotiationObserver() = default;
  virtual bool on() const = 0;  // cheap: whether to report at all
  virtual void ready(const std::string& name, OpKind kind, int rank) = 0;
  virtual void planned(const std::vector<PlanEntry>& entries) = 0;
};

// What this rank tells rank 0's coordinator of its own callers: that they wait (since when), once
// they have waited `report_s` (NegotiationOptions::wait_report_s; 0: never), and that they no
// longer do, when rank 0 was told they did. Pure: time passed in.
class WaitReport {
 public:
  using Time = std::chrono::steady_clock::time_point;
  explicit WaitReport(double report_s);
  // The state now: callers wait since `since` (Time::max(): none does). True when a report is
  // due; *report: the since to report (Time::max(): they no longer wait).
  bool update(Time since, Time now, Time* report);
  Time next() const;  // when a report falls due (Time::max(): none)
  bool active() const { return since_ != Time::max() || told_ != Time::max(); }

 private:
  bool on_;
  Time::duration after_;
  Time since_ = Time::max();
  Time told_ = Time::max();  // the since rank 0 was told (Time::max(): not waiting)
};

class Negotiator {
 public:
  using Time = std::chrono::steady_clock::time_point;
  explicit Negotiator(const NegotiationOptions& o) : wait_(o.wait_report_s()) {}
  virtual ~Negotiator() = default;

  virtual const char* name() const = 0;
  // The ranks this one exchanges control messages with (the control plane links them at init).
  virtual std::vector<int> control_peers() const = 0;

  // This rank is ready for `req`; flush() after the batch announces what was submitted.
  virtual void submit(const Request& req, Time now) = 0;
  virtual void flush(Time now, Negotiated& out) = 0;
  // A control message (a CONTROL frame's payload) from peer `from`.
  virtual void receive(int from, const std::vector<uint8_t>& payload, Time now, Negotiated& out) = 0;
  // Peer `rank` shut down in order (its BYE).
  virtual void peer_left(int rank, Time now, Negotiated& out) = 0;
  // Deadlines: plans held back to fuse, stall checks. Call at next_deadline() at the latest.
  virtual void tick(Time now, Negotiated& out) = 0;
  virtual Time next_deadline() const = 0;

  // Process sets, in the same order on every rank, before the requests queued after them.
  virtual void add_process_set(int32_t id, const std::vector<int>& members) = 0;
  virtual void remove_process_set(int32_t id) = 0;
  // Carried allreduces (see Carry): the tree carries them, the star does not.
  virtual void set_carry(Carry) {}
  // This rank's callers wait since `since` on an operation still in negotiation, nothing
  // submitted or completed here since (Time::max(): none does). The engine says so at the end of
  // every turn while a caller has waited long (ops.h's long_waits) or waiting_matters(); the
  // negotiator tells rank 0 when a report is due (WaitReport); next_deadline() includes when it
  // falls due, so that a turn comes then.
  virtual void waiting(Time since, Time now, Negotiated& out) = 0;
  bool waiting_matters() const { return wait_.active(); }

  // Counters (requests announced in full, and as cache ids).
  uint64_t ready_full() const { return ready_full_; }
  uint64_t ready_ids() const { return ready_ids_; }

 protected:
  uint64_t ready_full_ = 0, ready_ids_ = 0;
  WaitReport wait_;
};

}  // namespace appliance
