// N negotiators wired by in-memory links (see virtual_job.h).
#include "virtual/virtual_job.h"

#include <algorithm>
#include <chrono>

#include "engine/star_negotiator.h"
#include "engine/tree_negotiator.h"

namespace appliance {

VirtualJob::VirtualJob(int size, NegotiatorOptions base, const Factory& make) : ranks_(size) {
  rank0_.make = make;
  for (int r = 0; r < size; ++r) {
    NegotiatorOptions o = base;
    o.rank = r;
    o.size = size;
    ranks_[r].n = make(o);
    if (r == 0) rank0_.opts = o;
  }
}

uint64_t VirtualJob::Rank0Record::replay(size_t from) const {
  std::unique_ptr<Negotiator> n = make(opts);
  uint64_t ns = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Input& in = inputs[i];
    Negotiated out;
    const auto t0 = std::chrono::steady_clock::now();
    switch (in.kind) {
      case Input::kSubmit:
        for (const Request& q : in.reqs) n->submit(q, in.now);
        n->flush(in.now, out);
        break;
      case Input::kReceive: n->receive(in.peer, in.bytes, in.now, out); break;
      case Input::kLeft: n->peer_left(in.peer, in.now, out); break;
      case Input::kTick: n->tick(in.now, out); break;
    }
    if (i >= from)
      ns += static_cast<uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
  }
  return ns;
}

template <class F>
void VirtualJob::timed(int rank, F&& f) {
  if (rank == 0 && cold_rank0_) {
    if (scratch_.empty()) scratch_.resize(32u << 20);
    for (size_t i = 0; i < scratch_.size(); i += 64) scratch_[i] = static_cast<uint8_t>(scratch_[i] + 1);
  }
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
  if (rank == 0) rank0_.inputs.push_back(Input{Input::kSubmit, now, -1, {}, reqs});
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
    if (peer == 0) rank0_.inputs.push_back(Input{Input::kLeft, now, rank, {}, {}});
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
    if (r == 0) rank0_.inputs.push_back(Input{Input::kTick, now, -1, {}, {}});
    Negotiated out;
    timed(r, [&] { ranks_[r].n->tick(now, out); });
    take(r, out);
  }
}

void VirtualJob::waiting(int rank, Time since, Time now) {
  Negotiated out;
  timed(rank, [&] { ranks_[rank].n->waiting(since, now, out); });
  take(rank, out);
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
        if (r == 0) rank0_.inputs.push_back(Input{Input::kReceive, now, m.from, m.bytes, {}});
        Negotiated out;
        timed(r, [&] { me.n->receive(m.from, m.bytes, now, out); });
        take(r, out);
      }
      if (inbox.empty()) continue;  // as the engine: a turn that handled messages ticks
      if (r == 0) rank0_.inputs.push_back(Input{Input::kTick, now, -1, {}, {}});
      Negotiated out;
      timed(r, [&] { me.n->tick(now, out); });
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

NegotiationCost measure_cached_ops(const std::string& protocol, int ranks, int ops, int tensors) {
  VirtualJob::Factory make;
  if (protocol == "tree") make = [](const NegotiatorOptions& o) { return std::make_unique<TreeNegotiator>(o, nullptr); };
  else if (protocol == "star") make = [](const NegotiatorOptions& o) { return std::make_unique<StarNegotiator>(o, nullptr); };
  else throw std::invalid_argument("protocol must be tree or star, not '" + protocol + "'");
  if (ranks < 1 || ops < 1 || tensors < 1) throw std::invalid_argument("ranks, ops and tensors must be positive");
  NegotiatorOptions o;
  o.fusion_threshold = 0;  // one entry per op: every op is negotiated, none hides in another's
  o.stall_check_s = o.stall_shutdown_s = 0;
  auto job_ptr = std::make_unique<VirtualJob>(ranks, o, make);
  VirtualJob& job = *job_ptr;
  std::vector<Request> step(static_cast<size_t>(tensors));
  for (int t = 0; t < tensors; ++t) {
    step[t].name = "t" + std::to_string(t);
    step[t].sig.shape = {1};
  }
  const VirtualJob::Time t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < ranks; ++r) job.submit(r, step, t0);  // first step: in full, fills the caches
  job.settle(t0);
  const size_t inputs0 = job.rank0_inputs();
  std::vector<uint64_t> msgs0(ranks);
  for (int r = 0; r < ranks; ++r) msgs0[r] = job.sent(r) + job.received(r);
  int hops = 0;
  for (int k = 1; k <= ops; ++k) {
    job.reset_hops();
    for (int r = 0; r < ranks; ++r) job.submit(r, step, t0);
    job.settle(t0);
    hops = std::max(hops, job.max_plan_hops());
  }
  NegotiationCost c;
  const double n = static_cast<double>(ops) * tensors;
  c.rank0_msgs = (job.sent(0) + job.received(0) - msgs0[0]) / n;
  for (int r = 0; r < ranks; ++r) c.max_msgs = std::max(c.max_msgs, (job.sent(r) + job.received(r) - msgs0[r]) / n);
  c.hops = hops;
  VirtualJob::Rank0Record record = job.take_rank0_record();
  job_ptr.reset();
  c.rank0_ns = record.replay(inputs0) / n;
  return c;
}

}  // namespace appliance
