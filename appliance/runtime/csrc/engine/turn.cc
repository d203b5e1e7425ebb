// One turn of the engine's work (Runtime as the scheduler's host): take what callers enqueued,
// negotiate, carry out what the negotiator says, keep the control links alive, and turn any
// failure into one job-wide abort.
#include <poll.h>
#include <unistd.h>

#include <algorithm>

#include "common/log.h"
#include "engine/fault_report.h"
#include "engine/runtime.h"

namespace appliance {

bool Runtime::turn(bool settle) {
  const uint64_t plans = stats_.plans.load(std::memory_order_relaxed);
  const bool on = guard([&] {
    if (settle) {  // the background thread's turn: one wake-up (HOROVOD_TIMELINE_MARK_CYCLES)
      if (cfg_.rank == 0 && timeline_.on()) timeline_.cycle();
      sched_.settle_burst();
    }
    step();
    if (gone_rank_ >= 0) {
      const int r = gone_rank_;
      Status gone{Code::kAborted, r, host_of(r),
                  r == 0 ? "rank 0 (the coordinator) has shut down; no further collectives can run"
                         : "rank " + std::to_string(r) + ", this rank's way to rank 0's coordinator, has shut down; no further collectives can run here"};
      bool had_work = !inflight_.empty() || !running_.empty();
      {
        std::lock_guard<std::mutex> g(callers_.mu);
        had_work = had_work || !callers_.queue.empty();
      }
      if (had_work) record_fault(gone);  // an orderly end of rank 0 is a fault only for work it leaves behind
      finish(gone);
      ended_ = true;
    }
  });
  if (!settle) Stats::add(stats_.driven_plans, stats_.plans.load(std::memory_order_relaxed) - plans);
  return on;
}

void Runtime::step() {
  // One clock read serves the whole turn (a turn takes microseconds; the deadlines it serves
  // are a cycle or longer): a driver turns once per small op, so each read shows.
  const Clock::time_point now = Clock::now();
  clock_us_ = std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count();
  const NegotiationProfile::Mark mark = profile_.turn_begins();
  bool took = false;
  poll_running();
  if (sched_.has_new()) {
    intake(now);
    took = true;
  }
  read_control(false);
  negotiate(now);
  if (handles_.long_waits() || negotiator_->waiting_matters()) note_waiting(now);
  if (cfg_.size > 1) control_->heartbeats(now);
  profile_.turn_ends(mark, took);
}

void Runtime::intake(Clock::time_point now) {
  // The callers' queues are swapped with the engine's empty ones, which keep their memory from
  // turn to turn (a deque allocates as it is made: two per turn otherwise).
  std::deque<OpPtr>& fresh = intake_.ops;
  std::deque<SetChange>& changes = intake_.changes;
  fresh.clear();
  changes.clear();
  {
    std::lock_guard<std::mutex> g(callers_.mu);
    sched_.take();
    fresh.swap(callers_.queue);
    changes.swap(callers_.set_changes);
  }
  apply_set_changes(changes);  // before the requests queued after them
  changes.clear();
  if (fresh.empty()) return;
  sched_.busy(std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count());
  for (OpPtr& op : fresh) {
    inflight_[op->req.name] = op;
    negotiator_->submit(op->req, now);
  }
  fresh.clear();
  Negotiated out;
  negotiator_->flush(now, out);
  carry_out(out);
}

void Runtime::read_control(bool in_collective) {
  if (cfg_.size < 2) return;
  const size_t before = arrived_.frames.size() + arrived_.left.size();
  control_->read(arrived_.frames, arrived_.left);
  Stats::add(stats_.ctrl_in, arrived_.frames.size() + arrived_.left.size() - before);
  if (in_collective) control_->heartbeats(Clock::now());
}

void Runtime::negotiate(Clock::time_point now) {
  do {
    while (!arrived_.frames.empty()) {
      ControlPlane::Inbound m = std::move(arrived_.frames.front());
      arrived_.frames.pop_front();
      Negotiated out;
      try {
        negotiator_->receive(m.from, m.payload, now, out);
      } catch (const Error& e) {
        Status s = e.status();
        if (s.host.empty()) s.host = host_of(s.origin_rank);
        throw Error(s);
      }
      carry_out(out);
    }
    while (!arrived_.left.empty()) {
      const int r = arrived_.left.front();
      arrived_.left.erase(arrived_.left.begin());
      Negotiated out;
      negotiator_->peer_left(r, now, out);
      carry_out(out);
    }
    Negotiated out;
    negotiator_->tick(now, out);
    carry_out(out);
  } while (!arrived_.frames.empty() || !arrived_.left.empty());  // plans run may have read more
  count_ready();
}

void Runtime::note_waiting(Clock::time_point now) {
  const int64_t us = handles_.stuck_since_us();
  const Clock::time_point since = us < 0 ? Clock::time_point::max() : Clock::time_point(std::chrono::microseconds(us));
  Negotiated out;
  negotiator_->waiting(since, now, out);
  carry_out(out);
}

void Runtime::count_ready() {
  stats_.ready_full.store(negotiator_->ready_full(), std::memory_order_relaxed);
  stats_.ready_ids.store(negotiator_->ready_ids(), std::memory_order_relaxed);
}

void Runtime::carry_out(Negotiated& out) {
  for (Outgoing& m : out.send) {
    if (!control_->live(m.peer)) continue;
    control_->send(m.peer, m.bytes);
    Stats::add(stats_.ctrl_out);
  }
  if (!out.plans.empty()) count_ready();  // before plans complete handles: a caller sees its op counted
  for (const Plan& p : out.plans) run_plan(p);
  for (const std::string& line : out.log) log_line(cfg_.rank, line);
  if (out.coordinator_gone) gone_rank_ = out.gone_rank;
  if (!out.abort.ok()) {
    Status s = out.abort;
    s.host = host_of(s.origin_rank);
    throw Error(s);
  }
}

bool Runtime::before_sleep(bool* ok) {
  bool ready = false;
  *ok = guard([&] { ready = cfg_.size > 1 && control_->arm(); });
  return ready;
}

int64_t Runtime::sleep_timeout_us() {
  if (!running_.empty()) return 20;  // device work in flight: look at its events every 20 us
  if (!arrived_.frames.empty() || !arrived_.left.empty()) return 0;
  const Clock::time_point now = Clock::now();
  int64_t t = INT64_MAX;
  const Clock::time_point d = negotiator_->next_deadline();
  if (d != Clock::time_point::max()) t = d <= now ? 0 : std::chrono::duration_cast<std::chrono::microseconds>(d - now).count() + 1;
  if (cfg_.size > 1) {
    const int64_t hb = control_->next_heartbeat_ms();
    if (hb >= 0) t = std::min(t, hb * 1000);
  }
  return t == INT64_MAX ? -1 : t;
}

void Runtime::stop() {
  // Device work already launched (its callers may only have ordered their streams after it)
  // finishes before the communicator is torn down; bounded, in case a peer is gone.
  guard([&] {
    const auto drain_until = Clock::now() + std::chrono::milliseconds(
                                                std::max<int64_t>(5000, static_cast<int64_t>(cfg_.heartbeat_timeout_s * 1000)));
    while (!running_.empty() && Clock::now() < drain_until) {
      poll_running();
      if (!running_.empty()) usleep(50);
    }
    if (cfg_.size > 1) control_->bye();
    finish(Status{Code::kShutdown, cfg_.rank, cfg_.host, "the collective runtime was shut down on this rank"});
  });
  ended_ = true;
}

void Runtime::fail_engine(Status s) {
  if (s.origin_rank < 0) {
    s.origin_rank = cfg_.rank;
    s.host = cfg_.host;
  }
  // A lost peer we noticed ourselves may only have given up because of someone else; a
  // status that came in an ABORT already names the origin.
  if (s.code == Code::kPeerLost && control_->abort_from() < 0 && !control_->silence_seen() && cfg_.size > 1)
    s = control_->await_better_cause(s, arrived_.frames, arrived_.left);
  print_before_abort();
  abort_job(s, control_->abort_from());
  ended_ = true;
}

void Runtime::print_before_abort() {
  if (cfg_.size < 2 || control_->abort_from() < 0) return;
  for (ControlPlane::Inbound& m : arrived_.frames) {
    Negotiated out;
    try {
      negotiator_->receive(m.from, m.payload, Clock::now(), out);
    } catch (const std::exception&) {
      continue;  // the job ends anyway
    }
    for (const std::string& line : out.log) log_line(cfg_.rank, line);
  }
  arrived_.frames.clear();
}

void Runtime::abort_job(const Status& s, int skip_peer) {
  log_line(cfg_.rank, "collective job failed: " + s.to_string());
  if (cfg_.size > 1) control_->abort(s, skip_peer);
  record_fault(s);
  finish(s);
}

void Runtime::record_fault(const Status& s) {
  if (cfg_.fault_file.empty()) return;
  {
    std::lock_guard<std::mutex> g(callers_.mu);
    if (callers_.fault_written) return;
    callers_.fault_written = true;
  }
  FaultReport f;
  f.rank = cfg_.rank;
  f.host = cfg_.host;
  f.origin_rank = s.origin_rank;
  f.origin_host = s.host;
  if (f.origin_host.empty() && (comm_ || s.origin_rank == cfg_.rank)) f.origin_host = host_of(s.origin_rank);  // hosts known once the links are up
  f.kind = fault_kind(s.code);
  f.message = s.to_string();
  f.time = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  write_fault_file(cfg_.fault_file, f);
}

void Runtime::finish(const Status& terminal) {
  {
    std::lock_guard<std::mutex> g(callers_.mu);
    if (callers_.terminal.ok()) callers_.terminal = terminal;
    callers_.queue.clear();
  }
  backends_->abort();  // nothing of a device backend may wait on a peer after this
  running_.clear();
  inflight_.clear();
  handles_.fail_all(terminal);
}

}  // namespace appliance
