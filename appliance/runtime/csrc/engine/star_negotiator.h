// StarNegotiator: every rank tells rank 0 what it is ready for, rank 0's coordinator answers
// with plans (the protocol of engine/messages.h). Pure logic behind engine/negotiator.h.
//
//   rank r != 0: submit() -> one READY per flush (cache ids for (name, signature) pairs seen
//                before, full requests otherwise); PLAN -> the plan, resolved against the
//                response cache; RESEND -> the named ids again in full; NOTICE -> lines to print.
//   rank 0:      its own requests and every READY feed the Coordinator (coordinator/); plans it
//                takes are encoded once and sent to every rank, then run here; the stall check
//                prints its report here and sends it to every rank in a NOTICE; so does the
//                deadlock check (coordinator/deadlock.h), which every READY's waiting field feeds.
//
// Rank 0 issues plans in tick() only, after the engine handed it every message that arrived, so
// readiness that comes in together is planned (and fused) together.
// Cost per negotiated batch: two one-way hops (READY in, PLAN out); rank 0 receives N-1 READYs
// and sends N-1 PLANs, so its work per cached operation grows with N. A rank's BYE (peer_left)
// reaches the coordinator (names the rank never submitted fail); rank 0's ends negotiation.
#pragma once

#include <map>
#include <memory>
#include <unordered_map>

#include "coordinator/coordinator.h"
#include "coordinator/response_cache.h"
#include "engine/coordination.h"
#include "engine/negotiator.h"

namespace appliance {

class StarNegotiator final : public Negotiator {
 public:
  StarNegotiator(NegotiatorOptions o, NegotiationObserver* observer);

  const char* name() const override { return "star"; }
  std::vector<int> control_peers() const override;
  void submit(const Request& req, Time now) override;
  void flush(Time now, Negotiated& out) override;
  void receive(int from, const std::vector<uint8_t>& payload, Time now, Negotiated& out) override;
  void peer_left(int rank, Time now, Negotiated& out) override;
  void tick(Time now, Negotiated& out) override;
  Time next_deadline() const override;
  void add_process_set(int32_t id, const std::vector<int>& members) override;
  void remove_process_set(int32_t id) override;
  void waiting(Time since, Time now, Negotiated& out) override;

 private:
  struct Pending {  // a request of this rank announced to rank 0 and not planned yet
    Request req;
    uint32_t sent_as_id = 0;
  };
  void on_ready(int from, const std::vector<uint8_t>& payload, Time now, Negotiated& out);
  void on_resend(const std::vector<uint8_t>& payload, Negotiated& out);
  void issue_plans(Time now, Negotiated& out);
  void stall_check(Time now, Negotiated& out);
  void deadlock_check(Time now, Negotiated& out);
  // Lines every rank prints: sent in a NOTICE, printed here.
  void notice(std::vector<std::string> lines, Negotiated& out);
  // A plan comes out: its names are no longer pending, its successful entries enter the cache.
  void emit(Plan plan, Negotiated& out);

  NegotiatorOptions o_;
  NegotiationObserver* observer_;
  ResponseCache cache_;
  std::unique_ptr<Coordinator> coord_;  // rank 0 only
  std::unordered_map<std::string, Pending> pending_;
  std::vector<Request> fresh_;           // submitted since the last flush
  ProcessSetSizes sets_;
  uint64_t plans_ = 0;                   // plans emitted so far (READY's epoch)
  Time next_stall_check_{};  // the first tick checks
};

}  // namespace appliance
