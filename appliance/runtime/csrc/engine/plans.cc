// Plans on a Runtime: every entry of a plan launched on its backend in plan order, and the
// handles of launched entries completed in that order when their backend finishes. An entry
// carrying its result (a carried allreduce, negotiator.h's Carry) completes without a collective.

#include <cstring>

#include "collectives/reduce.h"
#include "engine/runtime.h"

namespace appliance {

Carry Runtime::carry() {
  Carry c;
  // One UP or DOWN holds at most a quarter of a control link's shared-memory ring
  // (bootstrap/options.h's shm_ring_bytes) in carried bytes, so that the messages of both
  // directions stay small beside the rings whatever the knob says; one op at most as much.
  constexpr size_t kMessageBytes = size_t{256} << 10;
  c.op_bytes = std::min(cfg_.carry_bytes, kMessageBytes);
  c.message_bytes = kMessageBytes;
  // Called by the negotiator as intake() submits: the op is in flight, its input the caller's.
  c.take = [this](const Request& req, std::vector<uint8_t>& out) {
    auto it = inflight_.find(req.name);
    if (it == inflight_.end()) return false;
    const OpState& op = *it->second;
    const Signature& s = op.req.sig;
    if (op.in.device >= 0 || !op.in.data() || s != req.sig) return false;
    const uint8_t* in = static_cast<const uint8_t*>(op.in.data());
    out.assign(in, in + s.nbytes());
    scale(out.data(), static_cast<size_t>(s.numel()), s.dtype, s.prescale);
    return true;
  };
  c.combine = [](const Signature& s, uint8_t* dst, const uint8_t* src) {
    reduce_into(dst, src, static_cast<size_t>(s.numel()), s.dtype, reduction_op(s.op));
  };
  return c;
}

void Runtime::finish_carried(const PlanEntry& e, OpState& op) {
  const Signature& s = e.sigs[0];
  std::memcpy(op.out.data(), e.result.data(), e.result.size());
  scale(op.out.data(), static_cast<size_t>(s.numel()), s.dtype, final_scale(s.op, s.postscale, cfg_.size));
  Stats::add(stats_.carried);
}

void Runtime::planned(const std::vector<PlanEntry>& entries) {
  timeline_.planned(entries, [this](const std::string& n) { return inflight_.count(n) > 0; });
}

void Runtime::run_plan(const Plan& plan) {
  const uint64_t mark = profile_.plan_begins();
  for (const Late& l : plan.late)
    if (l.rank == cfg_.rank) Stats::add(metrics_.late_ns, static_cast<uint64_t>(l.us) * 1000);
  for (const PlanEntry& e : plan.entries) run_entry(e);
  profile_.plan_ends(mark);
  Stats::add(stats_.plans);
  sched_.busy(clock_us_);
}

void Runtime::run_entry(const PlanEntry& e) {
  const int32_t set = e.sigs.empty() ? 0 : e.sigs[0].process_set;
  if (set != 0 && e.ok && !set_comm(set)) {
    // Not a member: nothing of this entry runs here. (A member whose set is gone cannot have
    // an ok entry: the coordinator fails names of unknown sets.)
    for (const std::string& n : e.names)
      if (inflight_.count(n))
        throw Error(Code::kProtocol, "the plan runs '" + n + "' in process set " + std::to_string(set) +
                                         ", which this rank is not in", 0, host_of(0));
    return;
  }
  std::vector<OpPtr> ops(e.names.size());
  std::vector<OpState*> raw(e.names.size(), nullptr);
  const bool joined_here = !e.joined.empty() && e.joined[cfg_.rank];
  for (size_t i = 0; i < e.names.size(); ++i) {
    auto it = inflight_.find(e.names[i]);
    if (it != inflight_.end()) {
      ops[i] = it->second;
      raw[i] = ops[i].get();
      inflight_.erase(it);
      continue;
    }
    if (set == 0) note_skipped_name(e.names[i]);
    // A failed entry, or an allreduce this rank joined out of, may name ops it never submitted.
    if (e.ok && !(joined_here && e.kind == OpKind::kAllreduce)) {
      throw Error(Code::kProtocol, "the plan names " + std::string(op_kind_name(e.kind)) + " '" + e.names[i] +
                                       "', which this rank never submitted", 0, host_of(0));
    }
  }
  if (!e.ok) {
    handles_.complete_all(ops, Status{e.error_code, -1, "", e.error});
    return;
  }
  Backend& backend = backends_->for_entry(e, raw, join_device_.load());
  if (timeline_.on()) timeline_.launched(e, backend);
  const int kind = static_cast<int>(e.kind) < Metrics::kKinds && !joined_here ? static_cast<int>(e.kind) : -1;
  // Launched at the turn's latest reading (its start, or the previous entry's end): the
  // negotiation between them is microseconds; an entry's own run is read once, at its end.
  const int64_t started = clock_us_;
  if (kind >= 0) count_entry(e, ops, kind);
  for (auto& op : ops)
    if (op) op->planned_us = started;
  std::unique_ptr<Completion> completion;
  if (!e.result.empty() && raw.size() == 1 && raw[0] && !joined_here) finish_carried(e, *raw[0]);
  else completion = backend.launch(e, raw);
  Stats::add(stats_.entries);
  Stats::add(stats_.tensors, e.names.size());
  if (e.names.size() > 1) Stats::add(stats_.fused_entries);
  if (completion) {
    std::shared_ptr<void> ev = completion->ready_event();
    for (auto& op : ops)
      if (op && ev) {
        op->ready_event = ev;
        handles_.mark_launched(op);
      }
    running_.push_back(Running{std::move(completion), std::move(ops), kind, started});
    return;
  }
  clock_us_ = steady_us();
  if (kind >= 0) Stats::add(metrics_.kinds[kind].ns, static_cast<uint64_t>(clock_us_ - started) * 1000);
  if (timeline_.on())
    for (size_t i = 0; i < ops.size(); ++i)
      if (ops[i]) timeline_.done(e.names[i], e.sigs[i]);
  handles_.complete_all(ops, Status::Ok());
}

void Runtime::count_entry(const PlanEntry& e, const std::vector<OpPtr>& ops, int kind) {
  uint64_t n = 0, bytes = 0;
  for (const OpPtr& op : ops) {
    if (!op) continue;
    ++n;
    const Signature& s = op->req.sig;
    if (e.kind == OpKind::kAllgather && !e.sizes.empty()) {  // the gathered output, as nccl-tests sizes it
      int64_t rows = 0;
      for (int64_t d : e.sizes) rows += d;
      bytes += static_cast<uint64_t>(rows * s.row_elems()) * dtype_size(s.dtype);
    } else {
      bytes += s.nbytes();
    }
  }
  Metrics::PerKind& k = metrics_.kinds[kind];
  Stats::add(k.n, n);
  Stats::add(k.bytes, bytes);
}

void Runtime::poll_running() {
  while (!running_.empty()) {
    Running& r = running_.front();
    if (!r.completion->done()) return;  // in plan order: later entries wait for earlier ones
    if (r.kind >= 0) Stats::add(metrics_.kinds[r.kind].ns, static_cast<uint64_t>(steady_us() - r.started) * 1000);
    for (auto& op : r.ops)
      if (op) {
        if (timeline_.on()) timeline_.done(op->req.name, op->req.sig);
        handles_.complete(op, Status::Ok());
      }
    running_.pop_front();
  }
}

void Runtime::note_skipped_name(const std::string& name) {
  static const std::string kMark = ".noname.";
  const size_t at = name.rfind(kMark);
  if (at == std::string::npos || at + kMark.size() >= name.size()) return;
  uint64_t n = 0;
  for (size_t i = at + kMark.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || n > (UINT64_MAX - 9) / 10) return;
    n = n * 10 + static_cast<uint64_t>(name[i] - '0');
  }
  std::lock_guard<std::mutex> g(callers_.mu);
  uint64_t& next = callers_.auto_names[0];
  next = std::max(next, n + 1);
}

}  // namespace appliance
