// The tree protocol: cached ids ANDed up a binary tree, decisions sent down (see tree_negotiator.h).
#include "engine/tree_negotiator.h"

#include <algorithm>

namespace appliance {

namespace {
int64_t ms_between(Negotiator::Time a, Negotiator::Time b) {
  return b <= a ? 0 : std::chrono::duration_cast<std::chrono::milliseconds>(b - a).count();
}
}  // namespace

bool carry_eligible(const Signature& s, size_t op_bytes) {
  const bool op = s.op == ReduceOp::kSum || s.op == ReduceOp::kAverage || s.op == ReduceOp::kMin ||
                  s.op == ReduceOp::kMax || s.op == ReduceOp::kProduct;
  const size_t n = s.nbytes();
  return op && s.kind == OpKind::kAllreduce && s.process_set == 0 && s.device < 0 && s.group_size <= 1 && n > 0 &&
         n <= op_bytes;
}

std::vector<int> tree_children(int rank, int size) {
  std::vector<int> c;
  for (int k = 1; k <= 2; ++k)
    if (2 * rank + k < size) c.push_back(2 * rank + k);
  return c;
}

std::vector<int> tree_subtree(int rank, int size) {
  std::vector<int> out{rank};
  for (size_t i = 0; i < out.size(); ++i)
    for (int c : tree_children(out[i], size)) out.push_back(c);
  return out;
}

TreeNegotiator::TreeNegotiator(NegotiatorOptions o, NegotiationObserver* observer)
    : Negotiator(o), o_(o), observer_(observer), cache_(o.cache_capacity), parent_(tree_parent(o.rank)), children_(tree_children(o.rank, o.size)) {
  if (root()) coord_ = make_coordinator(o_);
}

std::vector<int> TreeNegotiator::control_peers() const {
  std::vector<int> peers;
  if (parent_ >= 0) peers.push_back(parent_);
  peers.insert(peers.end(), children_.begin(), children_.end());
  return peers;
}

// --- announcing -----------------------------------------------------------------------------

Negotiator::Time TreeNegotiator::stale_after(const Mine& m) const {
  const double t = o_.stall_warning_s() > 0 ? o_.stall_warning_s() : o_.stall_shutdown_s;
  if (t <= 0) return Time::max();
  return m.since + std::chrono::duration_cast<Time::duration>(std::chrono::duration<double>(t / 2));
}

void TreeNegotiator::submit(const Request& req, Time now) {
  if (ended_) return;
  Mine& m = mine_[req.name];
  m.req = req;
  m.since = now;
  announce(m, now);
}

void TreeNegotiator::announce(Mine& m, Time now) {
  const uint32_t id = !slow_ && m.req.sig.cacheable() ? cache_.lookup(m.req.name, m.req.sig) : 0;
  if (!id) return announce_full(m, now);
  m.id = id;
  ++ready_ids_;
  next_stale_ = std::min(next_stale_, stale_after(m));
  std::vector<uint8_t> carried;
  if (carry_.take && carry_eligible(m.req.sig, carry_.op_bytes) && o_.size > 1)
    if (!carry_.take(m.req, carried) || carried.size() != m.req.sig.nbytes()) carried.clear();
  mark(id, 0, now, Late{o_.rank, kNoLag}, std::move(carried));
}

void TreeNegotiator::announce_full(Mine& m, Time now) {
  m.id = 0;
  ++ready_full_;
  const int64_t waited = ms_between(m.since, now);
  if (root()) full(0, m.req, waited, now);
  else up_.full.push_back(UpMsg::Full{o_.rank, m.req, waited});
}

void TreeNegotiator::mark(uint32_t id, int source, Time now, Late last, std::vector<uint8_t> carried) {
  if (done_.count(id)) return;
  Arrivals& a = table_[id];
  if (!carried.empty()) {
    a.with |= 1u << source;
    a.carried[source] = std::move(carried);
  }
  if (a.bits && now > a.last) {
    const auto waited = std::chrono::duration_cast<std::chrono::microseconds>(now - a.last).count();
    last.us = std::min<uint64_t>(last.us, static_cast<uint64_t>(waited));
  } else if (a.bits) {
    last.us = 0;
  }
  if (!a.bits || now >= a.last) {
    a.last = now;
    a.latest = last;
  }
  a.bits |= 1u << source;
  const uint32_t all = (1u << (children_.size() + 1)) - 1;
  if (a.bits != all) return;
  const Late latest = a.latest;
  std::vector<uint8_t> combined;
  if (a.with == all) {  // in source order, whatever order the sources came in
    const ResponseCache::Entry* c = cache_.get(id);
    APPLIANCE_ASSERT(c != nullptr, "a complete id the cache does not hold");
    combined = std::move(a.carried[0]);
    for (size_t i = 1; i <= children_.size(); ++i) carry_.combine(c->sig, combined.data(), a.carried[i].data());
  }
  table_.erase(id);
  complete(id, now, latest, std::move(combined));
}

void TreeNegotiator::complete(uint32_t id, Time now, Late last, std::vector<uint8_t> carried) {
  done_.insert(id);
  if (!root()) {
    up_.ids.push_back(id);
    up_.late.push_back(last);
    if (!carried.empty() && up_carried_ + carried.size() > carry_.message_bytes) carried.clear();  // goes up without
    up_carried_ += carried.size();
    up_.carried.push_back(std::move(carried));
    return;
  }
  if (last.us != kNoLag && last.us > 0) coord_->add_late(last.rank, now - std::chrono::microseconds(last.us), now);
  const ResponseCache::Entry* c = cache_.get(id);
  APPLIANCE_ASSERT(c != nullptr, "a complete id the cache does not hold");
  PlanEntry e;
  e.kind = c->sig.kind;
  e.names.push_back(c->name);  // not {c->name}: an initializer list copies twice
  e.sigs.push_back(c->sig);
  e.result = std::move(carried);
  if (ready_.empty()) first_ready_ = now;
  ready_.push_back(std::move(e));
  coord_->on_progress(c->sig.process_set, now);  // the deadlock check: these ranks moved
}

void TreeNegotiator::full(int rank, Request req, int64_t waited_ms, Time now) {
  if (req.sig.kind == OpKind::kJoin) ++joined_;
  // Some ranks may have announced this name by its cached id: forget that id everywhere, so
  // they announce it in full too and the coordinator sees every rank's request.
  // (In the slow mode nobody announces by id.)
  if (!slow_)
    if (const uint32_t id = cache_.id_of(req.name)) evict_.insert(id);
  if (observer_ && observer_->on()) observer_->ready(req.name, req.sig.kind, rank);
  coord_->on_request(rank, std::move(req), now - std::chrono::milliseconds(waited_ms));
}

void TreeNegotiator::left(int rank, Time now) {
  if (!root()) return up_.left.push_back(rank);
  coord_->on_rank_left(rank);
  departed_ = true;
}

void TreeNegotiator::stale(uint32_t id) {
  if (!cache_.get(id)) return;  // evicted already
  for (const PlanEntry& e : ready_)
    if (cache_.lookup(e.names[0], e.sigs[0]) == id) return;  // about to run
  evict_.insert(id);
}

void TreeNegotiator::waiting(Time since, Time now, Negotiated& out) {
  if (ended_) return;
  report_waiting(since, now);
  if (!root()) send_up(out);
}

void TreeNegotiator::report_waiting(Time since, Time now) {
  Time report;
  if (!wait_.update(since, now, &report)) return;
  UpMsg::Waiting w;
  w.rank = o_.rank;
  w.ms = report == Time::max() ? ReadyMsg::kNotWaiting : ms_between(report, now);
  if (report != Time::max())
    for (const auto& kv : mine_)
      if (kv.second.id) w.also.push_back(kv.second.req);
  if (root()) on_waiting(std::move(w), now);
  else up_.waiting.push_back(std::move(w));
}

void TreeNegotiator::on_waiting(UpMsg::Waiting w, Time now) {
  if (w.ms < 0) return coord_->on_not_waiting(w.rank);
  coord_->on_waiting(w.rank, now - std::chrono::milliseconds(w.ms), std::move(w.also));
}

void TreeNegotiator::flush(Time now, Negotiated& out) {
  if (ended_) return;
  if (root()) issue(now, out);
  else send_up(out);
}

void TreeNegotiator::send_up(Negotiated& out) {
  if (up_.ids.empty() && up_.full.empty() && up_.left.empty() && up_.stale.empty() && up_.waiting.empty()) return;
  up_.seq = seq_;
  out.send.push_back(Outgoing{parent_, encode_up(up_)});
  up_ = UpMsg{};
  up_carried_ = 0;
}

// --- messages -------------------------------------------------------------------------------

void TreeNegotiator::receive(int from, const std::vector<uint8_t>& payload, Time now, Negotiated& out) {
  if (ended_) return;
  const std::string who = "rank " + std::to_string(from);
  try {
    const CtrlType type = peek_ctrl_type(payload, who);
    if (type == CtrlType::kUp && std::find(children_.begin(), children_.end(), from) != children_.end())
      return on_up(from, payload, now);
    if (type == CtrlType::kDown && from == parent_) return on_down(payload, now, out);
    if (type == CtrlType::kGone && from == parent_) return end(decode_gone(payload, o_.size, who), out);
  } catch (const Error& e) {
    throw Error(Code::kProtocol, e.status().message, from, "");
  }
  throw Error(Code::kProtocol, "unexpected control message", from, "");
}

void TreeNegotiator::on_up(int from, const std::vector<uint8_t>& payload, Time now) {
  const int source = 1 + static_cast<int>(std::find(children_.begin(), children_.end(), from) - children_.begin());
  UpMsg m = decode_up(payload, o_.size, "rank " + std::to_string(from));
  for (int32_t r : m.left) left(r, now);  // before the ids: a departure stops the AND
  // Ids reported before the last mode change are void (the child re-announces in full), and so
  // are ids this rank's cache no longer holds (evicted since: ids are never given again).
  if (!slow_ && m.seq >= slow_seq_)
    for (size_t i = 0; i < m.ids.size(); ++i) {
      const ResponseCache::Entry* c = cache_.get(m.ids[i]);
      if (!c) continue;
      std::vector<uint8_t>& carried = m.carried[i];
      if (!carried.empty() && carried.size() != c->sig.nbytes())
        throw Error(Code::kProtocol, "carried " + std::to_string(carried.size()) + " bytes for '" + c->name + "' of " +
                                         std::to_string(c->sig.nbytes()));
      if (!carry_.combine) carried.clear();
      mark(m.ids[i], source, now, m.late[i], std::move(carried));
    }
  for (UpMsg::Full& f : m.full) {
    if (root()) full(f.rank, std::move(f.req), f.waited_ms, now);
    else up_.full.push_back(std::move(f));
  }
  for (uint32_t id : m.stale) {
    if (root()) stale(id);
    else up_.stale.push_back(id);
  }
  for (UpMsg::Waiting& w : m.waiting) {  // after the requests that came with it
    if (root()) on_waiting(std::move(w), now);
    else up_.waiting.push_back(std::move(w));
  }
}

void TreeNegotiator::on_down(const std::vector<uint8_t>& payload, Time now, Negotiated& out) {
  DownMsg m = decode_down(payload, "rank " + std::to_string(parent_));
  if (m.seq != seq_ + 1)
    throw Error(Code::kProtocol, "DOWN message " + std::to_string(m.seq) + " after " + std::to_string(seq_));
  for (int c : children_) out.send.push_back(Outgoing{c, payload});  // on at once, unchanged
  apply(m, Plan{}, now, out);
}

void TreeNegotiator::apply(const DownMsg& m, Plan plan, Time now, Negotiated& out) {
  seq_ = m.seq;
  for (uint32_t id : m.evict) cache_.erase(id);
  if (!root() && m.plan_bytes)
    plan = decode_plan(m.plan, m.plan_bytes, cache_, o_.size, "rank " + std::to_string(parent_), [this](int32_t id) { return sets_.size_of(id); });
  for (const PlanEntry& e : plan.entries)
    for (size_t i = 0; i < e.names.size(); ++i) {
      if (const uint32_t id = cache_.id_of(e.names[i])) {  // its next readiness is a new report
        done_.erase(id);
        table_.erase(id);
      }
      mine_.erase(e.names[i]);
      if (e.ok) cache_.put(e.names[i], e.sigs[i]);
    }
  if (!plan.entries.empty()) {
    plan.seq = m.seq;
    out.plans.push_back(std::move(plan));
  }
  if (m.slow != slow_) {
    slow_ = m.slow;
    slow_seq_ = m.seq;
    table_.clear();
    done_.clear();
    up_.ids.clear();
    up_.late.clear();
    up_.carried.clear();
    up_carried_ = 0;
    for (auto& kv : mine_)
      if (kv.second.id) announce_full(kv.second, now);
  }
  // Ids the cache no longer holds (evicted above or by its capacity): re-announce in full (the
  // root drops them from what it has not issued yet: they come back through the coordinator).
  for (auto& kv : mine_)
    if (kv.second.id && !cache_.get(kv.second.id)) announce_full(kv.second, now);
  ready_.erase(std::remove_if(ready_.begin(), ready_.end(),
                              [this](const PlanEntry& e) { return cache_.lookup(e.names[0], e.sigs[0]) == 0; }),
               ready_.end());
  for (auto it = table_.begin(); it != table_.end();) it = cache_.get(it->first) ? std::next(it) : table_.erase(it);
  for (auto it = done_.begin(); it != done_.end();) it = cache_.get(*it) ? std::next(it) : done_.erase(it);
  for (const std::string& line : m.lines) out.log.push_back(line);
}

// --- the root's decisions -------------------------------------------------------------------

void TreeNegotiator::issue(Time now, Negotiated& out) {
  std::vector<PlanEntry> entries = coord_->take_plan(now);
  for (const PlanEntry& e : entries)
    if (e.kind == OpKind::kJoin && e.ok) joined_ = 0;  // every rank joined: the join is over
  const bool slow = joined_ > 0 || departed_ || (observer_ && observer_->on());
  const bool mode_change = slow != slow_;
  // Entries that carry their result have nothing left to move: out at once, unfused, up to
  // message_bytes of results per DOWN; past that they run as the others (the result dropped).
  std::vector<PlanEntry> carried;
  size_t carried_bytes = 0;
  for (auto it = ready_.begin(); it != ready_.end();) {
    if (it->result.empty()) {
      ++it;
    } else if (carried_bytes + it->result.size() > carry_.message_bytes) {
      it->result.clear();
      ++it;
    } else {
      carried_bytes += it->result.size();
      carried.push_back(std::move(*it));
      it = ready_.erase(it);
    }
  }
  if (!ready_.empty()) {
    size_t bytes = 0;
    for (const PlanEntry& e : ready_) bytes += e.sigs[0].nbytes();
    const bool more_coming = !table_.empty() || !coord_->idle();
    const bool due = mode_change || o_.fusion_threshold == 0 || !more_coming || bytes >= o_.fusion_threshold ||
                     now >= first_ready_ + std::chrono::microseconds(static_cast<int64_t>(o_.cycle_time_ms * 1000));
    if (due) {
      std::vector<PlanEntry> fused;
      fuse_entries(fused, ready_, o_.fusion_threshold, o_.fusion_member_bytes);
      ready_.clear();
      if (entries.empty()) entries.swap(fused);
      else entries.insert(entries.begin(), std::make_move_iterator(fused.begin()), std::make_move_iterator(fused.end()));
    }
  }
  if (!carried.empty())
    entries.insert(entries.begin(), std::make_move_iterator(carried.begin()), std::make_move_iterator(carried.end()));
  if (entries.empty() && evict_.empty() && lines_.empty() && !mode_change) return;
  DownMsg m;
  m.seq = seq_ + 1;
  m.slow = slow;
  m.evict.assign(evict_.begin(), evict_.end());
  m.lines = std::move(lines_);
  lines_.clear();
  evict_.clear();
  // The plan is encoded against the cache as every rank holds it after the evictions.
  for (uint32_t id : m.evict) cache_.erase(id);
  Plan plan;
  plan.entries = std::move(entries);
  if (!plan.entries.empty()) plan.late = coord_->take_late();
  if (observer_ && observer_->on() && !plan.entries.empty()) observer_->planned(plan.entries);
  if (!children_.empty()) {  // a root without children (one rank) has nobody to tell
    std::vector<uint8_t> bytes = encode_down(m, &plan, &cache_);
    for (size_t i = 0; i + 1 < children_.size(); ++i) out.send.push_back(Outgoing{children_[i], bytes});
    out.send.push_back(Outgoing{children_.back(), std::move(bytes)});
  }
  apply(m, std::move(plan), now, out);
}

void TreeNegotiator::tick(Time now, Negotiated& out) {
  if (ended_) return;
  // Cached requests pending for long: the root evicts them, so that every rank re-announces
  // them in full and the coordinator can say who is missing.
  if (now >= next_stale_) {
    next_stale_ = Time::max();
    for (auto& kv : mine_) {
      Mine& m = kv.second;
      if (!m.id || m.stale) continue;
      if (now < stale_after(m)) {
        next_stale_ = std::min(next_stale_, stale_after(m));
        continue;
      }
      m.stale = true;
      if (root()) stale(m.id);
      else up_.stale.push_back(m.id);
    }
  }
  if (!root()) return send_up(out);
  if (now >= next_stall_check_) {
    Status abort;
    std::vector<std::string> report = coord_->stall_warnings(now, &abort);
    next_stall_check_ = std::max(now + std::chrono::milliseconds(1),
                                 std::min(now + std::chrono::seconds(1), coord_->next_stall_event()));
    lines_.insert(lines_.end(), report.begin(), report.end());  // printed everywhere with the next DOWN
    if (!abort.ok()) out.abort = abort;
  }
  Status deadlock;
  std::vector<std::string> lines = coord_->deadlock(now, &deadlock);
  lines_.insert(lines_.end(), lines.begin(), lines.end());
  if (!deadlock.ok() && out.abort.ok()) out.abort = deadlock;
  issue(now, out);
}

void TreeNegotiator::peer_left(int rank, Time now, Negotiated& out) {
  if (ended_) return;
  if (rank == parent_) return end(rank, out);
  if (std::find(children_.begin(), children_.end(), rank) == children_.end()) return;
  // Its subtree can no longer reach the root (it ends its negotiation): all of it left. Its
  // bit never comes again, so nothing completes here until the slow mode takes over.
  for (int r : tree_subtree(rank, o_.size)) left(r, now);
  if (root()) issue(now, out);
  else send_up(out);
}

void TreeNegotiator::end(int rank, Negotiated& out) {
  ended_ = true;
  out.coordinator_gone = true;
  out.gone_rank = rank;
  const std::vector<uint8_t> gone = encode_gone(rank);
  for (int c : children_) out.send.push_back(Outgoing{c, gone});
}

Negotiator::Time TreeNegotiator::next_deadline() const {
  Time t = Time::max();
  if (ended_) return t;
  t = std::min(t, std::min(next_stale_, wait_.next()));
  if (!root()) return t;
  t = std::min(t, coord_->next_deadlock_check());
  if (!ready_.empty()) t = std::min(t, first_ready_ + std::chrono::microseconds(static_cast<int64_t>(o_.cycle_time_ms * 1000)));
  t = std::min(t, coord_->next_deadline());
  if (!coord_->idle()) t = std::min(t, next_stall_check_);
  const bool slow = joined_ > 0 || departed_ || (observer_ && observer_->on());
  if (slow != slow_) t = Time{};  // a mode change to announce
  return t;
}

void TreeNegotiator::add_process_set(int32_t id, const std::vector<int>& members) {
  sets_.add(coord_.get(), id, members);
}

void TreeNegotiator::remove_process_set(int32_t id) { sets_.remove(coord_.get(), id); }

}  // namespace appliance
