// Rank 0's negotiation: the readiness table, validation, plans with fusion, groups, joins,
// process sets and the stall check (see coordinator.h).
#include "coordinator/coordinator.h"

#include <algorithm>
#include <sstream>
#include <tuple>

namespace appliance {

namespace {
std::string rank_list(const std::vector<int>& v) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}
}  // namespace

Coordinator::Coordinator(CoordinatorOptions o)
    : o_(o), joined_(o.size, 0), left_(o.size, 0), late_until_(o.size), late_us_(o.size, 0), waiting_(o.size, o.deadlock_s) {
  for (int r = 0; r < o_.size; ++r) all_.push_back(r);
}

std::string Coordinator::add_process_set(int32_t id, std::vector<int> members) {
  if (id <= 0) return "process set id " + std::to_string(id) + " is reserved";
  if (sets_.count(id)) return "process set " + std::to_string(id) + " exists already";
  if (members.empty()) return "a process set needs at least one rank";
  std::sort(members.begin(), members.end());
  for (size_t i = 0; i < members.size(); ++i)
    if (members[i] < 0 || members[i] >= o_.size || (i && members[i] == members[i - 1]))
      return "process set " + std::to_string(id) + ": rank list " + rank_list(members) + " is not a set of ranks below " +
             std::to_string(o_.size);
  sets_[id] = std::move(members);
  return "";
}

void Coordinator::remove_process_set(int32_t id) { sets_.erase(id); }

const std::vector<int>* Coordinator::members(int32_t set) const {
  if (set == 0) return &all_;
  auto it = sets_.find(set);
  return it == sets_.end() ? nullptr : &it->second;
}

bool Coordinator::complete(const Readiness& p) const {
  const std::vector<int>* m = members(p.set);
  if (!m) return true;  // validate() fails it: the set is unknown
  for (int r : *m)
    if (!p.reqs[r] && !(p.set == 0 && joined_[r]) && !left_[r]) return false;
  return true;
}

void Coordinator::on_request(int rank, Request req, Time now) {
  APPLIANCE_ASSERT(rank >= 0 && rank < o_.size, "rank out of range");
  if (req.sig.kind == OpKind::kJoin) {
    if (!joined_[rank]) {
      joined_[rank] = 1;
      ++joined_count_;
    }
    last_joined_ = rank;
    if (joined_count_ == o_.size) {
      PlanEntry e;
      e.kind = OpKind::kJoin;
      e.names = {req.name};
      e.sigs = {req.sig};
      e.joined_last = last_joined_;
      if (ready_.empty()) first_ready_ = now;
      ready_.push_back(std::move(e));
      waiting_.progress(all_, now);
      std::fill(joined_.begin(), joined_.end(), 0);
      joined_count_ = 0;
      return;
    }
    std::vector<std::string> names;
    for (auto& kv : readiness_) names.push_back(kv.first);
    for (auto& n : names) promote_if_complete(n, now);
    return;
  }
  auto it = readiness_.find(req.name);
  if (it == readiness_.end()) {
    Readiness p;
    p.name = req.name;
    p.reqs.resize(o_.size);
    p.first_seen = now;
    p.kind = req.sig.kind;
    p.set = req.sig.process_set;
    it = readiness_.emplace(req.name, std::move(p)).first;
  }
  Readiness& p = it->second;
  APPLIANCE_ASSERT(!p.reqs[rank], "rank " + std::to_string(rank) + " submitted '" + req.name + "' twice");
  p.reqs[rank] = std::move(req);
  const bool others = p.count++ > 0;
  const Time prev = p.last_arrival;
  p.last_arrival = now;
  if (promote_if_complete(it->first, now) && others) add_late(rank, prev, now);
}

void Coordinator::add_late(int rank, Time from, Time to) {
  if (rank < 0 || rank >= o_.size) return;
  from = std::max(from, late_until_[rank]);
  if (to <= from) return;
  late_us_[rank] += static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(to - from).count());
  late_until_[rank] = to;
  any_late_ = true;
}

std::vector<Late> Coordinator::take_late() {
  std::vector<Late> out;
  if (!any_late_) return out;
  for (int r = 0; r < o_.size; ++r) {
    uint64_t& us = late_us_[r];
    while (us > 0) {  // a u32 of microseconds per row: over an hour in more rows
      const uint32_t part = static_cast<uint32_t>(std::min<uint64_t>(us, UINT32_MAX));
      out.push_back(Late{r, part});
      us -= part;
    }
  }
  any_late_ = false;
  return out;
}

void Coordinator::on_rank_left(int rank) {
  if (left_[rank]) return;
  left_[rank] = 1;
  std::vector<std::string> names;
  for (auto& kv : readiness_) names.push_back(kv.first);
  for (auto& n : names) promote_if_complete(n, Time{});
}

bool Coordinator::promote_if_complete(const std::string& name, Time now) {
  auto it = readiness_.find(name);
  if (it == readiness_.end() || !complete(it->second)) return false;
  PlanEntry e = validate(it->second);
  readiness_.erase(it);
  on_progress(e.sigs[0].process_set, now);
  if (ready_.empty() && groups_.empty()) first_ready_ = now;
  const Signature& s = e.sigs[0];
  if (s.group_size > 1) {
    const auto key = std::make_pair(s.process_set, s.group_id);
    auto& members = groups_[key];
    members.push_back(std::move(e));
    if (members.size() < s.group_size) return true;
    if (ready_.empty()) first_ready_ = now;
    for (auto& m : members) ready_.push_back(std::move(m));
    groups_.erase(key);
    return true;
  }
  if (ready_.empty()) first_ready_ = now;
  ready_.push_back(std::move(e));
  return true;
}

PlanEntry Coordinator::validate(Readiness& p) {
  PlanEntry e;
  int ref = -1;
  for (int r = 0; r < o_.size && ref < 0; ++r)
    if (p.reqs[r]) ref = r;
  APPLIANCE_ASSERT(ref >= 0, "no request for " + p.name);
  const Request& rq = *p.reqs[ref];
  e.kind = rq.sig.kind;
  e.names = {p.name};
  e.sigs = {rq.sig};
  auto fail = [&](std::string why, Code code = Code::kMismatch) {
    e.ok = false;
    e.error_code = code;
    e.error = std::move(why);
    return e;
  };
  const std::vector<int>* m = members(p.set);
  if (!m)
    return fail(std::string(op_kind_name(e.kind)) + " '" + p.name + "': process set " + std::to_string(p.set) +
                " is not registered (removed, or not added on every rank)", Code::kInvalid);
  std::vector<int> gone, joined, outsiders;
  for (int r = 0; r < o_.size; ++r) {
    const bool member = p.set == 0 || std::binary_search(m->begin(), m->end(), r);
    if (p.reqs[r]) {
      if (!member) outsiders.push_back(r);
    } else if (!member) {
    } else if (left_[r]) {
      gone.push_back(r);
    } else if (p.set == 0 && joined_[r]) {
      joined.push_back(r);
    }
  }
  const std::string set_text = p.set ? " in process set " + std::to_string(p.set) : "";
  if (!outsiders.empty())
    return fail(std::string(op_kind_name(e.kind)) + " '" + p.name + "': rank(s) " + rank_list(outsiders) +
                " submitted it but are not in process set " + std::to_string(p.set) + " " + rank_list(*m));
  if (!gone.empty())
    return fail(std::string(op_kind_name(e.kind)) + " '" + p.name + "'" + set_text + ": rank(s) " + rank_list(gone) +
                " shut down without submitting it",
                Code::kAborted);
  if (!joined.empty() && e.kind != OpKind::kAllreduce)
    return fail(std::string(op_kind_name(e.kind)) + " '" + p.name + "' cannot run while rank(s) " +
                rank_list(joined) + " have joined; only allreduce can");  // a cross-rank conflict: MismatchError
  for (int r = ref + 1; r < o_.size; ++r) {
    if (!p.reqs[r]) continue;
    std::string why = describe_mismatch(p.name, ref, rq, r, *p.reqs[r]);
    if (!why.empty()) return fail(why + set_text);
  }
  const int P = static_cast<int>(m->size());
  if (e.kind == OpKind::kAllgather) {
    for (int r : *m) e.sizes.push_back(p.reqs[r]->sig.shape[0]);
  } else if (e.kind == OpKind::kAlltoall) {
    for (int r : *m) {
      const Request& q = *p.reqs[r];
      if (q.splits.empty()) {
        for (int d = 0; d < P; ++d) e.sizes.push_back(q.sig.shape[0] / P);
      } else {
        e.sizes.insert(e.sizes.end(), q.splits.begin(), q.splits.end());
      }
    }
  }
  if (!joined.empty()) e.joined = joined_;
  return e;
}

std::vector<PlanEntry> Coordinator::take_plan(Time now) {
  if (ready_.empty()) return {};
  size_t ready_bytes = 0;
  for (auto& e : ready_)
    for (auto& s : e.sigs) ready_bytes += s.nbytes();
  bool more_coming = !readiness_.empty() || !groups_.empty();
  bool due = o_.fusion_threshold == 0 || !more_coming || ready_bytes >= o_.fusion_threshold ||
             now >= first_ready_ + std::chrono::microseconds(static_cast<int64_t>(o_.cycle_time_ms * 1000));
  if (!due) return {};
  std::vector<PlanEntry> out;
  fuse_entries(out, ready_, o_.fusion_threshold, o_.fusion_member_bytes);
  ready_.clear();
  return out;
}

void fuse_entries(std::vector<PlanEntry>& out, std::vector<PlanEntry>& ready, size_t threshold, size_t member_bytes) {
  using Key = std::tuple<uint8_t, uint8_t, double, double, int32_t, std::vector<uint8_t>, int32_t>;  // device index: one buffer per device; process set
  if (ready.size() == 1) {  // one entry fuses with nothing: as it is, without the key map
    out.push_back(std::move(ready[0]));
    return;
  }
  std::map<Key, std::pair<size_t, size_t>> open;  // key -> (index in out, bytes)
  for (auto& e : ready) {
    const Signature& s = e.sigs[0];
    bool fusable = e.ok && e.kind == OpKind::kAllreduce && threshold > 0 && s.nbytes() < threshold &&
                   (member_bytes == 0 || s.device >= 0 || s.nbytes() <= member_bytes);
    if (!fusable) {
      out.push_back(std::move(e));
      continue;
    }
    Key k{static_cast<uint8_t>(s.dtype), static_cast<uint8_t>(s.op), s.prescale, s.postscale, s.device, e.joined, s.process_set};
    auto it = open.find(k);
    if (it != open.end() && it->second.second + s.nbytes() <= threshold) {
      PlanEntry& f = out[it->second.first];
      it->second.second += s.nbytes();
      f.names.push_back(std::move(e.names[0]));
      f.sigs.push_back(std::move(e.sigs[0]));  // s is moved from here on
      continue;
    }
    open[k] = {out.size(), s.nbytes()};
    out.push_back(std::move(e));
  }
}

Coordinator::Time Coordinator::next_deadline() const {
  if (ready_.empty()) return Time::max();
  return first_ready_ + std::chrono::microseconds(static_cast<int64_t>(o_.cycle_time_ms * 1000));
}

std::vector<std::string> Coordinator::stall_warnings(Time now, Status* abort) {
  // One report at most every warning period: every tensor that has waited at least the
  // warning time, oldest first, each with the ranks it waits for.
  struct Stalled {
    Readiness* p;
    double waited;
    std::vector<int> have, missing;
  };
  std::vector<Stalled> stalled, over;
  bool due = false;
  for (auto& kv : readiness_) {
    Readiness& p = kv.second;
    const double waited = std::chrono::duration<double>(now - p.first_seen).count();
    Stalled st{&p, waited, {}, {}};
    const std::vector<int>* m = members(p.set);
    for (int r : m ? *m : all_) {
      if (p.reqs[r]) st.have.push_back(r);
      else if (!(p.set == 0 && joined_[r]) && !left_[r]) st.missing.push_back(r);
    }
    if (o_.stall_shutdown_s > 0 && waited >= o_.stall_shutdown_s) over.push_back(st);
    if (o_.stall_warning_s() <= 0 || waited < o_.stall_warning_s()) continue;
    due = !reported_ || std::chrono::duration<double>(now - last_report_).count() >= o_.stall_warning_s();
    stalled.push_back(std::move(st));
  }
  auto oldest_first = [](const Stalled& a, const Stalled& b) {
    return a.p->first_seen != b.p->first_seen ? a.p->first_seen < b.p->first_seen : a.p->name < b.p->name;
  };
  auto describe = [](const Stalled& st) {
    std::ostringstream os;
    os << op_kind_name(st.p->kind) << " '" << st.p->name << "' waited " << static_cast<int>(st.waited)
       << " s for rank(s) " << rank_list(st.missing) << " (submitted by " << rank_list(st.have) << ")";
    return os.str();
  };
  constexpr size_t kMaxListed = 8;
  std::vector<std::string> lines;
  if (due && !stalled.empty()) {
    std::sort(stalled.begin(), stalled.end(), oldest_first);
    reported_ = true;
    last_report_ = now;
    std::ostringstream head;
    head << "stall: " << stalled.size() << " tensor(s) waiting for other ranks; the oldest waits for rank(s) "
         << rank_list(stalled[0].missing) << ", which skipped a collective or is slow or stuck";
    if (o_.stall_shutdown_s > 0)
      head << "; the job stops after " << o_.stall_shutdown_s << " s of waiting (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS)";
    lines.push_back(head.str());
    for (size_t i = 0; i < stalled.size() && i < kMaxListed; ++i) lines.push_back("stall:   " + describe(stalled[i]));
    if (stalled.size() > kMaxListed) lines.push_back("stall:   ... and " + std::to_string(stalled.size() - kMaxListed) + " more");
  }
  if (!over.empty() && abort && abort->ok()) {
    std::sort(over.begin(), over.end(), oldest_first);
    std::ostringstream os;
    os << "stalled for " << o_.stall_shutdown_s << " s (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS): ";
    for (size_t i = 0; i < over.size() && i < kMaxListed; ++i) os << (i ? "; " : "") << describe(over[i]);
    if (over.size() > kMaxListed) os << "; and " << over.size() - kMaxListed << " more";
    const int origin = over[0].missing.empty() ? -1 : over[0].missing[0];
    *abort = Status{Code::kStalled, origin, "", os.str()};
  }
  return lines;
}

Coordinator::Time Coordinator::next_stall_event() const {
  Time t = Time::max();
  auto after = [](Time from, double s) {
    return from + std::chrono::duration_cast<Time::duration>(std::chrono::duration<double>(s));
  };
  Time warn = Time::max();
  for (const auto& kv : readiness_) {
    const Readiness& p = kv.second;
    if (o_.stall_shutdown_s > 0) t = std::min(t, after(p.first_seen, o_.stall_shutdown_s));
    if (o_.stall_warning_s() > 0) warn = std::min(warn, after(p.first_seen, o_.stall_warning_s()));
  }
  if (warn != Time::max() && reported_) warn = std::max(warn, after(last_report_, o_.stall_warning_s()));
  return std::min(t, warn);
}

// --- the deadlock check (coordinator/deadlock.h) --------------------------------------------

void Coordinator::on_waiting(int rank, Time since, std::vector<Request> also) {
  APPLIANCE_ASSERT(rank >= 0 && rank < o_.size, "rank out of range");
  waiting_.waiting(rank, since, std::move(also));
}

void Coordinator::on_not_waiting(int rank) {
  APPLIANCE_ASSERT(rank >= 0 && rank < o_.size, "rank out of range");
  waiting_.not_waiting(rank);
}

void Coordinator::on_progress(int32_t set, Time now) {
  if (!waiting_.any()) return;
  const std::vector<int>* m = members(set);
  waiting_.progress(m ? *m : all_, now);
}

std::vector<std::string> Coordinator::deadlock(Time now, Status* abort) {
  if (o_.deadlock_s <= 0 || now < waiting_.next_check()) return {};
  waiting_.checked(now);
  const std::vector<int> candidates = waiting_.settled(now);
  if (candidates.empty()) return {};
  // Every operation a rank is ready for and no plan has run: the readiness table, the validated
  // ones not issued yet (complete), the join, and what waiting ranks announced by cache id.
  std::vector<PendingOp> ops;
  std::unordered_map<std::string, size_t> at;
  auto op_of = [&](const Request& req) -> PendingOp& {
    auto it = at.find(req.name);
    if (it != at.end()) return ops[it->second];
    at.emplace(req.name, ops.size());
    ops.push_back(PendingOp::of(req, o_.size));
    return ops.back();
  };
  for (const auto& kv : readiness_)
    for (int r = 0; r < o_.size; ++r)
      if (kv.second.reqs[r]) op_of(*kv.second.reqs[r]).ready[r] = 1;
  auto complete = [&](const PlanEntry& e) {  // every member of its set is ready for it
    for (size_t i = 0; i < e.names.size(); ++i) {
      PendingOp& p = op_of(Request{e.names[i], e.sigs[i], {}});
      const std::vector<int>* m = members(p.set);
      for (int r : m ? *m : all_) p.ready[r] = 1;
    }
  };
  for (const PlanEntry& e : ready_) complete(e);
  for (const auto& kv : groups_)
    for (const PlanEntry& e : kv.second) complete(e);
  if (joined_count_ > 0) {
    Request join;
    join.name = "__join__";
    join.sig.kind = OpKind::kJoin;
    op_of(join).ready = joined_;
  }
  const std::vector<int> waiting = waiting_.settled(Time::max());
  for (int r : waiting)
    for (const Request& q : waiting_.also(r)) op_of(q).ready[r] = 1;
  auto set_of = [this](int32_t set) { return members(set); };
  if (find_deadlock(ops, candidates, set_of, joined_, left_).empty()) return {};
  // Named: every waiting rank stuck with them, also those that have not waited as long yet.
  const std::vector<int> stuck = find_deadlock(ops, waiting, set_of, joined_, left_);
  std::sort(ops.begin(), ops.end(), [](const PendingOp& a, const PendingOp& b) { return a.name < b.name; });
  const std::vector<std::string> waits = describe_waits(ops, stuck);
  std::ostringstream head;
  head << "deadlock: rank(s) " << rank_list(stuck) << " are all blocked waiting on collectives that no other of them "
       << "will submit (different operations, names or order on different ranks); nothing moved for " << o_.deadlock_s
       << " s (APPLIANCE_DEADLOCK_SECONDS), so the job stops";
  std::vector<std::string> lines{head.str()};
  std::string text = "deadlock: ";
  for (size_t i = 0; i < waits.size(); ++i) {
    lines.push_back("deadlock:   " + waits[i]);
    text += (i ? "; " : "") + waits[i];
  }
  if (abort && abort->ok()) *abort = Status{Code::kStalled, stuck[0], "", text};
  return lines;
}

}  // namespace appliance
