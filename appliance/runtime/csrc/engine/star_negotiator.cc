// The star protocol: READY to rank 0, PLAN from it (see star_negotiator.h).
#include "engine/star_negotiator.h"

#include <algorithm>

#include "engine/messages.h"

namespace appliance {

StarNegotiator::StarNegotiator(NegotiatorOptions o, NegotiationObserver* observer)
    : Negotiator(o),
      o_(o), observer_(observer), cache_(o.cache_capacity) {
  if (o_.rank == 0) coord_ = make_coordinator(o_);
}

std::vector<int> StarNegotiator::control_peers() const {
  std::vector<int> peers;
  if (o_.rank != 0) return {0};
  for (int r = 1; r < o_.size; ++r) peers.push_back(r);
  return peers;
}

void StarNegotiator::submit(const Request& req, Time now) {
  if (coord_) {
    if (observer_ && observer_->on()) observer_->ready(req.name, req.sig.kind, o_.rank);
    coord_->on_request(o_.rank, req, now);
    return;
  }
  fresh_.push_back(req);
}

void StarNegotiator::flush(Time now, Negotiated& out) {
  if (fresh_.empty()) return;
  ReadyMsg m;
  m.epoch = plans_;
  for (Request& q : fresh_) {
    const uint32_t id = q.sig.cacheable() ? cache_.lookup(q.name, q.sig) : 0;
    if (id) m.ids.push_back(id);
    else m.full.push_back(q);
    pending_[q.name] = Pending{std::move(q), id};
  }
  fresh_.clear();
  ready_full_ += m.full.size();
  ready_ids_ += m.ids.size();
  out.send.push_back(Outgoing{0, encode_ready(m)});
}

void StarNegotiator::receive(int from, const std::vector<uint8_t>& payload, Time now, Negotiated& out) {
  const std::string who = "rank " + std::to_string(from);
  try {
    const CtrlType type = peek_ctrl_type(payload, who);
    if (type == CtrlType::kReady && coord_) return on_ready(from, payload, now, out);
    if (type == CtrlType::kPlan && !coord_ && from == 0) {
      return emit(decode_plan(payload, cache_, o_.size, who, [this](int32_t id) { return sets_.size_of(id); }),
                  out);
    }
    if (type == CtrlType::kResend && !coord_ && from == 0) return on_resend(payload, out);
    if (type == CtrlType::kNotice && !coord_ && from == 0) {
      for (std::string& line : decode_notice(payload, who)) out.log.push_back(std::move(line));
      return;
    }
  } catch (const Error& e) {
    throw Error(Code::kProtocol, e.status().message, from, "");
  }
  throw Error(Code::kProtocol, "unexpected control message", from, "");
}

void StarNegotiator::on_ready(int from, const std::vector<uint8_t>& payload, Time now, Negotiated& out) {
  ReadyMsg m = decode_ready(payload, "rank " + std::to_string(from));
  const bool seen = observer_ && observer_->on();
  for (Request& q : m.full) {
    if (seen) observer_->ready(q.name, q.sig.kind, from);
    coord_->on_request(from, std::move(q), now);
  }
  std::vector<uint32_t> unknown;
  for (uint32_t id : m.ids) {
    const ResponseCache::Entry* c = cache_.get(id);
    if (!c) {
      unknown.push_back(id);
      continue;
    }
    if (seen) observer_->ready(c->name, c->sig.kind, from);
    coord_->on_request(from, Request{c->name, c->sig, {}}, now);
  }
  if (!unknown.empty()) out.send.push_back(Outgoing{from, encode_resend(unknown)});
  if (m.waiting_ms >= 0) coord_->on_waiting(from, now - std::chrono::milliseconds(m.waiting_ms), {});
  else if (m.waiting_ms == ReadyMsg::kNotWaiting) coord_->on_not_waiting(from);
}

void StarNegotiator::waiting(Time since, Time now, Negotiated& out) {
  Time report;
  if (!wait_.update(since, now, &report)) return;
  if (coord_) {  // rank 0 tells its own coordinator
    if (report == Time::max()) coord_->on_not_waiting(0);
    else coord_->on_waiting(0, report, {});
    return;
  }
  ReadyMsg m;  // every request is at rank 0's coordinator already: the state alone
  m.epoch = plans_;
  m.waiting_ms = report == Time::max()
                     ? ReadyMsg::kNotWaiting
                     : std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(now - report).count());
  out.send.push_back(Outgoing{0, encode_ready(m)});
}

void StarNegotiator::on_resend(const std::vector<uint8_t>& payload, Negotiated& out) {
  std::vector<uint32_t> ids = decode_resend(payload, "rank 0");
  ReadyMsg m;
  m.epoch = plans_;
  for (auto& kv : pending_)
    if (kv.second.sent_as_id && std::find(ids.begin(), ids.end(), kv.second.sent_as_id) != ids.end()) {
      kv.second.sent_as_id = 0;
      m.full.push_back(kv.second.req);
    }
  out.send.push_back(Outgoing{0, encode_ready(m)});
}

void StarNegotiator::issue_plans(Time now, Negotiated& out) {
  for (;;) {
    std::vector<PlanEntry> entries = coord_->take_plan(now);
    if (entries.empty()) return;
    Plan plan;
    plan.seq = plans_ + 1;
    plan.entries = std::move(entries);
    plan.late = coord_->take_late();
    if (observer_ && observer_->on()) observer_->planned(plan.entries);
    if (o_.size > 1) {
      std::vector<uint8_t> bytes = encode_plan(plan, cache_);
      for (int r = 1; r < o_.size; ++r) out.send.push_back(Outgoing{r, bytes});
    }
    emit(std::move(plan), out);
  }
}

void StarNegotiator::emit(Plan plan, Negotiated& out) {
  for (const PlanEntry& e : plan.entries) {
    for (size_t i = 0; i < e.names.size(); ++i) {
      pending_.erase(e.names[i]);
      if (e.ok) cache_.put(e.names[i], e.sigs[i]);
    }
  }
  ++plans_;
  out.plans.push_back(std::move(plan));
}

void StarNegotiator::peer_left(int rank, Time now, Negotiated& out) {
  if (coord_) {
    coord_->on_rank_left(rank);  // plans it completes go out at the next tick()
  } else if (rank == 0) {
    out.coordinator_gone = true;
  }
}

void StarNegotiator::tick(Time now, Negotiated& out) {
  if (!coord_) return;
  issue_plans(now, out);
  stall_check(now, out);
  deadlock_check(now, out);
}

void StarNegotiator::deadlock_check(Time now, Negotiated& out) {
  Status abort;
  std::vector<std::string> lines = coord_->deadlock(now, &abort);
  if (!lines.empty()) notice(std::move(lines), out);
  if (!abort.ok() && out.abort.ok()) out.abort = abort;
}

void StarNegotiator::notice(std::vector<std::string> lines, Negotiated& out) {
  std::vector<uint8_t> bytes = encode_notice(lines);
  for (int r = 1; r < o_.size; ++r) out.send.push_back(Outgoing{r, bytes});
  for (std::string& line : lines) out.log.push_back(std::move(line));
}

void StarNegotiator::stall_check(Time now, Negotiated& out) {
  if (now < next_stall_check_) return;
  Status abort;
  std::vector<std::string> report = coord_->stall_warnings(now, &abort);
  // Next check at the next warning or shutdown time: at most a second away, at least 1 ms.
  next_stall_check_ = std::max(now + std::chrono::milliseconds(1),
                               std::min(now + std::chrono::seconds(1), coord_->next_stall_event()));
  if (!report.empty()) notice(std::move(report), out);  // every rank prints it: who waits, for whom
  if (!abort.ok()) out.abort = abort;
}

Negotiator::Time StarNegotiator::next_deadline() const {
  if (!coord_) return wait_.next();
  Time t = std::min(coord_->next_deadline(), wait_.next());
  if (!coord_->idle()) t = std::min(t, next_stall_check_);
  return std::min(t, coord_->next_deadlock_check());
}

void StarNegotiator::add_process_set(int32_t id, const std::vector<int>& members) {
  sets_.add(coord_.get(), id, members);
}

void StarNegotiator::remove_process_set(int32_t id) { sets_.remove(coord_.get(), id); }

}  // namespace appliance
