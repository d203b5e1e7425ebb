// N negotiators wired by in-memory links (see virtual_job.h).
#include "engine/virtual_job.h"

#include <chrono>

namespace appliance {

VirtualJob::VirtualJob(int size, NegotiatorOptions base, const Factory& make) : ranks_(size) {
  for (int r = 0; r < size; ++r) {
    NegotiatorOptions o = base;
    o.rank = r;
    o.size = size;
    ranks_[r].n = make(o);
  }
}

template <class F>
void VirtualJob::timed(int rank, F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  ranks_[rank].busy_ns += static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
}

void VirtualJob::take(int rank, Negotiated& out) {
  Rank& me = ranks_[rank];
  for (Outgoing& m : out.send) {
    Rank& to = ranks_.at(m.peer);
    ++me.sent;
    if (to.left) continue;
    to.inbox.push_back(Message{rank, me.clock + 1, std::move(m.bytes)});
  }
  for (Plan& p : out.plans) {
    if (me.clock > max_plan_hops_) max_plan_hops_ = me.clock;
    me.plans.push_back(std::move(p));
  }
  for (std::string& line : out.log) me.log.push_back(std::move(line));
  if (!out.abort.ok() && me.abort.ok()) me.abort = out.abort;
  if (out.coordinator_gone) me.gone = true;
}

void VirtualJob::submit(int rank, const std::vector<Request>& reqs, Time now) {
  Negotiated out;
  timed(rank, [&] {
    for (const Request& q : reqs) ranks_[rank].n->submit(q, now);
    ranks_[rank].n->flush(now, out);
  });
  take(rank, out);
}

void VirtualJob::add_process_set(int32_t id, const std::vector<int>& members) {
  for (Rank& r : ranks_) r.n->add_process_set(id, members);
}

void VirtualJob::leave(int rank, Time now) {
  Rank& me = ranks_[rank];
  for (int peer : me.n->control_peers()) {
    Rank& to = ranks_[peer];
    if (to.left) continue;
    Negotiated out;
    timed(peer, [&] { to.n->peer_left(rank, now, out); });
    take(peer, out);
  }
  me.left = true;
  me.inbox.clear();
}

void VirtualJob::tick(Time now) {
  for (int r = 0; r < size(); ++r) {
    if (ranks_[r].left) continue;
    Negotiated out;
    timed(r, [&] { ranks_[r].n->tick(now, out); });
    take(r, out);
  }
}

void VirtualJob::settle(Time now, int max_rounds) {
  for (int round = 0; round < max_rounds; ++round) {
    bool moved = false;
    for (int r = 0; r < size(); ++r) {
      Rank& me = ranks_[r];
      if (me.left) continue;
      std::deque<Message> inbox;
      inbox.swap(me.inbox);
      for (Message& m : inbox) {
        moved = true;
        ++me.received;
        if (m.hops > me.clock) me.clock = m.hops;
        Negotiated out;
        timed(r, [&] { me.n->receive(m.from, m.bytes, now, out); });
        take(r, out);
      }
      Negotiated out;
      timed(r, [&] { me.n->tick(now, out); });
      moved = moved || !out.send.empty() || !out.plans.empty();
      take(r, out);
    }
    if (!moved) return;
  }
}

void VirtualJob::reset_hops() {
  for (Rank& r : ranks_) r.clock = 0;
  max_plan_hops_ = 0;
}

std::vector<std::string> VirtualJob::order(int rank) const {
  std::vector<std::string> names;
  for (const Plan& p : ranks_[rank].plans)
    for (const PlanEntry& e : p.entries)
      for (const std::string& n : e.names) names.push_back(e.ok ? n : "!" + n);
  return names;
}

}  // namespace appliance
