// TreeNegotiator: cached operations agreed by the ranks among themselves, over a tree; rank 0's
// coordinator handles only the rest (first occurrences, mismatches, joins, process sets, stalls,
// ranks that left). Pure logic behind engine/negotiator.h.
//
// The tree: the binary heap over ranks (tree_parent, tree_children), rooted at rank 0. Each rank
// talks to its parent and at most two children, so rank 0's work per operation, and every
// rank's links, are O(1) in the job's size, and an agreement takes 2 log2 N hops (up, down).
//
// Up (UP messages): a rank ready for an operation whose (name, signature) is in the response
// cache contributes its id; a rank reports an id to its parent once the id is ready in its whole
// subtree (its own and each child's report): an AND over the subtree, one message per edge per
// operation. Requests that are not cached travel up in full, with the rank that made them.
// At the root: an id ready in the whole tree is ready everywhere; it becomes a plan entry from
// the cache (fused as the coordinator fuses); full requests go to the Coordinator (coordinator/).
// Down (DOWN messages): the root's decisions, in one sequence every rank applies in the same
// order and forwards to its children unchanged: ids to forget, the plan, a mode, lines to print.
// Every rank builds the same plans from them and updates its cache identically.
//
// The slow mode: while a rank has joined, after a rank left, or while rank 0 records a timeline,
// every request travels in full, so the coordinator sees each rank's readiness (zeros for joined
// ranks, names a departed rank never submitted, per-rank ticks). A mode change makes every rank
// re-announce its cached requests in full; reports sent before it are ignored (UP's seq).
// Conflicts: a full request for a name the cache holds (another signature somewhere, a mismatch)
// makes the root evict that id everywhere; ranks that announced it re-announce it in full, and
// the coordinator names the mismatch on every rank. An id evicted by the cache's capacity is
// re-announced the same way. Stalls: a rank whose cached request has been pending for half the
// stall warning time (or half the shutdown time) tells the root (UP's stale ids), which evicts
// the id unless it is about to run; every rank then re-announces it in full with how long it
// waited, so the coordinator's stall report (sent down to every rank) names the missing ranks.
// Every re-announcement follows a DOWN, so it never races a plan that runs the same request.
// Lateness: with each id a rank reports up goes its subtree's last member and how long the rest
// of the subtree waited for it (the smaller of that member's own subtree's lag and the time
// since the previous source was ready here); the root hands the whole tree's to the coordinator,
// whose next plan carries it (Plan::late).
// Carried allreduces (negotiator.h's Carry): a rank announcing an eligible cached allreduce
// (carry_eligible, not in the slow mode) takes its input from the engine; a rank reports such
// an id up with its subtree's combination (its own input, then child 1's, then child 2's: the
// same result whatever order they came in) when every source brought one, else without. The
// root turns an id complete with its combination into a plan entry carrying the result
// (PlanEntry::result: not fused, issued at once), up to message_bytes of results per DOWN;
// every rank applies it instead of running the collective. Whatever drops the bytes (a limit, a
// rank without them, an eviction, a mode change) leaves the entry to run as any other.
// Waiting callers (the deadlock check, coordinator/deadlock.h): a rank's report (negotiator.h's
// WaitReport) goes up in its next UP with the requests it announced by cache id (the root's
// coordinator never saw them), forwarded unchanged by every parent; the root's coordinator also
// hears of every cached entry it plans (progress), and its lines go down as a stall report's do.
// Departures: a rank whose parent leaves ends its negotiation (as rank 0's departure ends
// everyone's) and tells its children; a parent reports a departed child's subtree up as left.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <unordered_map>

#include "coordinator/coordinator.h"
#include "coordinator/response_cache.h"
#include "engine/coordination.h"
#include "engine/messages.h"
#include "engine/negotiator.h"

namespace appliance {

// The binary heap tree over `size` ranks, rooted at 0.
inline int tree_parent(int rank) { return rank == 0 ? -1 : (rank - 1) / 2; }
std::vector<int> tree_children(int rank, int size);
// `rank` and every rank below it in the tree.
std::vector<int> tree_subtree(int rank, int size);

class TreeNegotiator final : public Negotiator {
 public:
  TreeNegotiator(NegotiatorOptions o, NegotiationObserver* observer);

  const char* name() const override { return "tree"; }
  std::vector<int> control_peers() const override;
  void submit(const Request& req, Time now) override;
  void flush(Time now, Negotiated& out) override;
  void receive(int from, const std::vector<uint8_t>& payload, Time now, Negotiated& out) override;
  void peer_left(int rank, Time now, Negotiated& out) override;
  void tick(Time now, Negotiated& out) override;
  Time next_deadline() const override;
  void add_process_set(int32_t id, const std::vector<int>& members) override;
  void remove_process_set(int32_t id) override;
  void set_carry(Carry c) override { carry_ = std::move(c); }
  void waiting(Time since, Time now, Negotiated& out) override;

 private:
  struct Mine {  // a request of this rank, announced and not planned yet
    Request req;
    uint32_t id = 0;  // announced as this cache id (0: in full)
    Time since;
    bool stale = false;  // the root was told it waits for long
  };
  bool root() const { return o_.rank == 0; }
  Time stale_after(const Mine& m) const;
  void announce(Mine& m, Time now);            // as an id when cached (and not slow), else in full
  void announce_full(Mine& m, Time now);
  // source 0: this rank; i > 0: children_[i-1], whose subtree's last member was `last` (Late:
  // its rank, and how long the rest of that subtree had waited for it; kNoLag: nobody did).
  // `carried`: that source's input of a carried allreduce (empty: none).
  void mark(uint32_t id, int source, Time now, Late last, std::vector<uint8_t> carried);
  // Ready in the whole subtree; `carried`: the subtree's combined input (empty: none).
  void complete(uint32_t id, Time now, Late last, std::vector<uint8_t> carried);
  void full(int rank, Request req, int64_t waited_ms, Time now);
  void left(int rank, Time now);
  void stale(uint32_t id);  // root: some rank waits on it for long
  void report_waiting(Time since, Time now);    // this rank's WaitReport, when due: up (or to the root's coordinator)
  void on_waiting(UpMsg::Waiting w, Time now);  // root: a rank's report reached it
  void on_up(int from, const std::vector<uint8_t>& payload, Time now);
  void on_down(const std::vector<uint8_t>& payload, Time now, Negotiated& out);
  // Applies one DOWN here (the root: as it issues it): evictions, plan, mode, lines.
  void apply(const DownMsg& m, Plan plan, Time now, Negotiated& out);
  void send_up(Negotiated& out);
  void issue(Time now, Negotiated& out);  // root: a DOWN when there is something to say
  void end(int rank, Negotiated& out);     // negotiation over: `rank` (parent or root) left

  NegotiatorOptions o_;
  NegotiationObserver* observer_;
  ResponseCache cache_;
  std::unique_ptr<Coordinator> coord_;  // root only
  int parent_ = -1;
  std::vector<int> children_;
  ProcessSetSizes sets_;
  bool ended_ = false;

  std::unordered_map<std::string, Mine> mine_;
  Time next_stale_ = Time::max();   // the earliest stale_after() of a cached request of mine
  uint64_t seq_ = 0;                // DOWN messages applied
  bool slow_ = false;
  uint64_t slow_seq_ = 0;           // seq of the last mode change
  // The AND over the subtree: id -> which sources (bit 0 this rank, bit i child i) are ready,
  // when the latest of them came, and the subtree's last member so far with its lag (the
  // lateness the root hands the coordinator: Plan::late).
  static constexpr uint32_t kNoLag = UINT32_MAX;
  struct Arrivals {
    uint32_t bits = 0;
    Time last{};
    Late latest{0, kNoLag};
    uint32_t with = 0;                     // sources that brought a carried input
    std::vector<uint8_t> carried[3];       // per source (this rank, child 1, child 2)
  };
  std::unordered_map<uint32_t, Arrivals> table_;
  std::set<uint32_t> done_;         // complete here (reported up, or at the root: planned soon)
  UpMsg up_;                        // what goes up next (not the root)
  size_t up_carried_ = 0;           // carried bytes in up_
  Carry carry_;                     // carried allreduces (none unless the engine lends them)

  // root only
  std::vector<PlanEntry> ready_;    // cached entries ready everywhere, not issued yet
  Time first_ready_{};
  std::set<uint32_t> evict_;        // ids to forget in the next DOWN
  std::vector<std::string> lines_;  // to print everywhere with the next DOWN
  int joined_ = 0;                  // join requests seen since the last completed join
  bool departed_ = false;           // a rank left: slow from then on
  Time next_stall_check_{};
};

}  // namespace appliance
