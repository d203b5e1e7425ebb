// The background thread of a Runtime: announce work, negotiate (rank 0 coordinates), run
// plans, keep control links alive, and turn any failure into one job-wide abort.
#include <poll.h>
#include <sched.h>
#include <sys/prctl.h>
#include <time.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>

#include "common/log.h"
#include "engine/fault_report.h"
#include "engine/runtime.h"

namespace appliance {

namespace {
uint64_t thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

int64_t ms_until(Clock::time_point t, Clock::time_point now) {
  if (t == Clock::time_point::max()) return INT64_MAX;
  if (t <= now) return 0;
  return std::chrono::duration_cast<std::chrono::microseconds>(t - now).count() / 1000 + 1;
}
}  // namespace

void Runtime::loop() {
  prctl(PR_SET_TIMERSLACK, 1000UL);  // 1 us: short waits here (bursts, device polls) stay short
  std::unique_lock<std::mutex> lk(engine_mu_, std::defer_lock);
  for (;;) {
    park();
    lk.lock();
    if (ended_) return;
    if (stopping_.load()) break;
    pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {epoll_fd_, POLLIN, 0}};
    int64_t t = poll_timeout_ms();
    timespec ts{};
    if (!running_.empty()) {
      ts.tv_nsec = 20000;  // device work in flight: look at its events every 20 us
    } else if (t >= 0) {
      t = std::min<int64_t>(t, 60000);
      ts.tv_sec = t / 1000;
      ts.tv_nsec = (t % 1000) * 1000000;
    }
    // Just after work, while a caller waits (or just did), poll instead of sleeping
    // (APPLIANCE_SPIN_US): the next small op, or a peer's control message, then costs no
    // wake-up. A caller that is computing is never competed with. Spinning needs no
    // syscall beyond the yield: step() reads the queue and the control links anyway, and
    // callers, seeing sleeping_ false, do not write wake_fd_.
    const bool spin = cfg_.spin_us > 0 && steady_us() - last_busy_us_ < cfg_.spin_us &&
                      handles_.waited_within(cfg_.spin_us);
    if (spin) {
      lk.unlock();
      sched_yield();
    } else {
      // Callers write wake_fd_ only while this thread sleeps (enqueue() reads sleeping_), so
      // a burst of enqueues costs one wake-up, not a syscall each. Dekker on posted_: either
      // we see their post, or they see sleeping_ and wake us. A driving caller that finds us
      // asleep as it leaves wakes us the same way (drive.cc).
      sleeping_.store(true);
      bool sleep = false;
      if (!guard([&] { sleep = posted_.load() == taken_ && !arm_control(); })) return;
      lk.unlock();
      if (sleep) ::ppoll(fds, cfg_.size > 1 ? 2 : 1, (t >= 0 || !running_.empty()) ? &ts : nullptr, nullptr);
      sleeping_.store(false);
      if (fds[0].revents & POLLIN) {
        uint64_t v;
        (void)!read(wake_fd_, &v, sizeof(v));
      }
    }
    lk.lock();
    if (ended_) return;
    if (stopping_.load()) break;
    bool go_on = turn(true);
    lk.unlock();
    if (!go_on) return;
  }
  // Stopping (lk held). Device work already launched (its callers may only have ordered
  // their streams after it) finishes before the communicator is torn down; bounded, in case
  // a peer is gone.
  guard([&] {
    const auto drain_until = Clock::now() + std::chrono::milliseconds(
                                                std::max<int64_t>(5000, static_cast<int64_t>(cfg_.heartbeat_timeout_s * 1000)));
    while (!running_.empty() && Clock::now() < drain_until) {
      poll_running();
      if (!running_.empty()) usleep(50);
    }
    for (int r : ctrl_ranks_) {
      if (!is_ctrl_peer(r)) continue;
      try {
        auto bye = encode_bye();
        ctrl_[r].ch->send_frame(FrameType::kControl, bye.data(), bye.size(), deadline_after_ms(1000));
      } catch (const Error&) {
      }
    }
    finish(Status{Code::kShutdown, cfg_.rank, cfg_.host, "the collective runtime was shut down on this rank"});
  });
  ended_ = true;
}

bool Runtime::turn(bool settle) {
  return guard([&] {
    if (settle) {  // the background thread's turn: one wake-up (HOROVOD_TIMELINE_MARK_CYCLES)
      if (coord_ && timeline_.on()) timeline_.cycle();
      settle_burst();
    }
    step();
    if (coordinator_gone_) {
      Status gone{Code::kAborted, 0, host_of(0), "rank 0 (the coordinator) has shut down; no further collectives can run"};
      bool had_work = !inflight_.empty() || !running_.empty();
      {
        std::lock_guard<std::mutex> g(qmu_);
        had_work = had_work || !queue_.empty();
      }
      if (had_work) record_fault(gone);  // an orderly end of rank 0 is a fault only for work it leaves behind
      finish(gone);
      ended_ = true;
    }
  });
}

void Runtime::set_profiling(bool on) {
  if (on && clock_read_ns_.load() == 0) {
    constexpr int kReads = 200;
    const uint64_t t0 = thread_cpu_ns();
    for (int i = 0; i < kReads; ++i) (void)thread_cpu_ns();
    clock_read_ns_.store(std::max<uint64_t>(1, (thread_cpu_ns() - t0) / kReads));
  }
  profiling_.store(on);
}

void Runtime::fail_engine(Status s) {
  if (s.origin_rank < 0) {
    s.origin_rank = cfg_.rank;
    s.host = cfg_.host;
  }
  // A lost peer we noticed ourselves may only have given up because of someone else; a
  // status that came in an ABORT already names the origin.
  if (s.code == Code::kPeerLost && abort_from_ < 0 && !silence_seen_) s = await_better_cause(s);
  abort_job(s, abort_from_);
  ended_ = true;
}

void Runtime::park() {
  if (!cfg_.caller_drives) return;
  // How long after a drive the work stays the callers': a cycle (HOROVOD_CYCLE_TIME), the
  // longest Horovod ever let an op wait for its background thread. Waking every spin_us
  // instead would take a core from a synchronous loop of small ops on every wake-up.
  const int64_t park_us = std::max<int64_t>(cfg_.spin_us, static_cast<int64_t>(cfg_.cycle_time_ms * 1000));
  std::unique_lock<std::mutex> l(park_mu_);
  for (;;) {
    if (stopping_.load()) return;
    const int64_t quiet = steady_us() - last_drive_us_.load();
    const bool driving = drivers_.load() > 0;
    if (!driving && quiet >= park_us) return;
    // A driver that leaves with its op done does not notify (that would cost its caller a
    // syscall per op): re-check a cycle later. Whoever needs this thread sooner (a driver
    // that gives up, a caller waiting without driving, shutdown) notifies. (A driver on
    // another thread that leaves with its op done just after may renew the parking: the
    // one waiting then waits at most a cycle.)
    park_cv_.wait_for(l, std::chrono::microseconds(driving ? park_us : park_us - quiet));
  }
}

void Runtime::step() {
  // One clock read serves the whole turn (a turn takes microseconds; the deadlines it serves
  // are a cycle or longer): a driver turns once per small op, so each read shows.
  const Clock::time_point now = Clock::now();
  const bool profile = profiling_.load(std::memory_order_relaxed);
  const uint64_t cpu0 = profile ? thread_cpu_ns() : 0, plan0 = plan_cpu_ns_, reads0 = plan_clock_reads_;
  const uint64_t moved0 = stats_.ctrl_in.load(std::memory_order_relaxed) + stats_.ctrl_out.load(std::memory_order_relaxed);
  const uint64_t taken0 = taken_;
  poll_running();
  intake(now);
  read_control(false);
  do {
    dispatch_inbox();
    if (coord_) issue_plans(now);
  } while (!inbox_.empty());
  heartbeats(now);
  if (coord_) stall_check(now);
  if (profile && (taken_ != taken0 || stats_.ctrl_in.load(std::memory_order_relaxed) +
                                              stats_.ctrl_out.load(std::memory_order_relaxed) != moved0)) {
    // Less the clock reads themselves: the turn's own and those around its plans.
    const int64_t own = static_cast<int64_t>(thread_cpu_ns() - cpu0 - (plan_cpu_ns_ - plan0)) -
                        static_cast<int64_t>((1 + plan_clock_reads_ - reads0) * clock_read_ns_.load(std::memory_order_relaxed));
    stats_.negotiation_ns += static_cast<uint64_t>(std::max<int64_t>(0, own));
    ++stats_.negotiation_turns;
  }
}

void Runtime::settle_burst() {
  if (!burst_.load() || posted_.load() == taken_) return;
  const int64_t until = steady_us() + std::min<int64_t>(static_cast<int64_t>(cfg_.cycle_time_ms * 1000), 5000);
  // Until the callers pause for kBurstGapUs, or one of them waits: a caller that waits (a
  // burst's synchronize) issues nothing more, so its ops are announced at once.
  for (int64_t t = steady_us(); t < until && !handles_.waiting() && drivers_.load() == 0; t = steady_us()) {
    const int64_t quiet = t - last_enqueue_us_.load();
    if (quiet >= kBurstGapUs) return;
    if (quiet < kBurstGapUs / 2) {
      timespec ts{0, static_cast<long>((kBurstGapUs / 2 - quiet) * 1000)};
      nanosleep(&ts, nullptr);
    } else {
      sched_yield();  // the last stretch polls, so a wait that begins now is seen within a few us
    }
  }
}

bool Runtime::is_ctrl_peer(int peer) const { return ctrl_[peer].ch && !ctrl_[peer].gone; }

bool Runtime::arm_control() {
  bool ready = false;
  for (int r : ctrl_ranks_)
    if (is_ctrl_peer(r) && ctrl_[r].ch->link().spins() && ctrl_[r].ch->link().arm_wait(true, false) == 0) ready = true;
  return ready;
}

int Runtime::poll_timeout_ms() const {
  auto now = Clock::now();
  int64_t t = INT64_MAX;
  if (coord_) {
    t = std::min(t, ms_until(coord_->next_deadline(), now));
    if (!coord_->idle()) t = std::min(t, ms_until(next_stall_check_, now));
  }
  if (cfg_.size > 1 && cfg_.heartbeat_timeout_s > 0) t = std::min(t, hb_interval_ms_);
  if (!inbox_.empty()) t = 0;
  return t == INT64_MAX ? -1 : t;
}

void Runtime::intake(Clock::time_point now) {
  if (posted_.load() == taken_) return;  // nothing new: no lock taken (callers may be enqueuing)
  std::deque<OpPtr> fresh;
  std::deque<SetChange> changes;
  {
    std::lock_guard<std::mutex> g(qmu_);
    taken_ = posted_.load();
    fresh.swap(queue_);
    changes.swap(set_changes_);
  }
  apply_set_changes(changes);  // before the requests queued after them
  if (fresh.empty()) return;
  last_busy_us_ = std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count();
  ReadyMsg m;
  m.epoch = plans_applied_;
  for (OpPtr& op : fresh) {
    inflight_[op->req.name] = op;
    if (coord_) {
      if (timeline_.on()) timeline_.negotiate(op->req.name, op->req.sig.kind, cfg_.rank);
      coord_->on_request(cfg_.rank, op->req, now);
      continue;
    }
    uint32_t id = op->req.sig.cacheable() ? cache_.lookup(op->req.name, op->req.sig) : 0;
    op->sent_as_id = id;
    if (id) m.ids.push_back(id);
    else m.full.push_back(op->req);
  }
  stats_.ready_full += m.full.size();
  stats_.ready_ids += m.ids.size();
  if (!coord_) send_control(0, FrameType::kControl, encode_ready(m));
}

void Runtime::send_control(int peer, FrameType type, const std::vector<uint8_t>& payload) {
  CtrlPeer& c = ctrl_[peer];
  int64_t budget = std::max<int64_t>(5000, static_cast<int64_t>(cfg_.heartbeat_timeout_s * 1000));
  c.ch->send_frame(type, payload.data(), payload.size(), deadline_after_ms(budget));
  c.last_send = Clock::now();
  ++stats_.ctrl_out;
}

void Runtime::read_control(bool in_collective) {
  for (int r : ctrl_ranks_) {
    if (!is_ctrl_peer(r)) continue;
    CtrlPeer& c = ctrl_[r];
    Frame f;
    while (c.ch->try_recv_frame(f)) {
      c.last_recv = Clock::now();
      ++stats_.ctrl_in;
      if (f.type == FrameType::kHeartbeat) continue;
      if (f.type == FrameType::kAbort) {
        Reader rd(f.payload.data(), f.payload.size(), "ABORT from rank " + std::to_string(r));
        Status s = rd.status();
        abort_from_ = r;
        throw Error(s);
      }
      if (f.type != FrameType::kControl)
        throw Error(Code::kProtocol, std::string("unexpected ") + frame_type_name(f.type) + " frame on the control link", r, host_of(r));
      if (peek_ctrl_type(f.payload, "rank " + std::to_string(r)) == CtrlType::kBye) {
        c.gone = true;
        epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c.ch->link().wait_handle(), nullptr);
        if (coord_) coord_->on_rank_left(r);
        else coordinator_gone_ = true;
        break;
      }
      inbox_.push_back(Inbound{r, std::move(f.payload)});
    }
  }
  if (in_collective) heartbeats(Clock::now());
}

void Runtime::dispatch_inbox() {
  while (!inbox_.empty()) {
    Inbound m = std::move(inbox_.front());
    inbox_.pop_front();
    const std::string from = "rank " + std::to_string(m.from) + " (" + host_of(m.from) + ")";
    CtrlType type;
    Plan plan;
    try {
      type = peek_ctrl_type(m.payload, from);
      if (type == CtrlType::kPlan && !coord_)
        plan = decode_plan(m.payload, cache_, cfg_.size, from, [this](int32_t id) {
          auto it = set_sizes_.find(id);
          return it == set_sizes_.end() ? 0 : it->second;
        });
    } catch (const Error& e) {
      throw Error(Code::kProtocol, e.status().message, m.from, host_of(m.from));
    }
    if (type == CtrlType::kReady && coord_) on_ready(m.from, m.payload);
    else if (type == CtrlType::kPlan && !coord_) run_plan(plan);
    else if (type == CtrlType::kResend && !coord_) on_resend(m.payload);
    else if (type == CtrlType::kNotice && !coord_) {
      for (const std::string& line : decode_notice(m.payload, from)) log_line(cfg_.rank, line);
    }
    else throw Error(Code::kProtocol, "unexpected control message", m.from, host_of(m.from));
  }
}

void Runtime::on_ready(int from, const std::vector<uint8_t>& payload) {
  ReadyMsg m;
  try {
    m = decode_ready(payload, "rank " + std::to_string(from));
  } catch (const Error& e) {
    throw Error(Code::kProtocol, e.status().message, from, host_of(from));
  }
  auto now = Clock::now();
  for (Request& q : m.full) {
    if (timeline_.on()) timeline_.negotiate(q.name, q.sig.kind, from);
    coord_->on_request(from, std::move(q), now);
  }
  std::vector<uint32_t> unknown;
  for (uint32_t id : m.ids) {
    const ResponseCache::Entry* c = cache_.get(id);
    if (!c) unknown.push_back(id);
    else {
      if (timeline_.on()) timeline_.negotiate(c->name, c->sig.kind, from);
      coord_->on_request(from, Request{c->name, c->sig, {}}, now);
    }
  }
  if (!unknown.empty()) send_control(from, FrameType::kControl, encode_resend(unknown));
}

void Runtime::on_resend(const std::vector<uint8_t>& payload) {
  std::vector<uint32_t> ids = decode_resend(payload, "rank 0");
  ReadyMsg m;
  m.epoch = plans_applied_;
  for (auto& kv : inflight_)
    if (kv.second->sent_as_id && std::find(ids.begin(), ids.end(), kv.second->sent_as_id) != ids.end()) {
      kv.second->sent_as_id = 0;
      m.full.push_back(kv.second->req);
    }
  send_control(0, FrameType::kControl, encode_ready(m));
}

void Runtime::issue_plans(Clock::time_point now) {
  for (;;) {
    std::vector<PlanEntry> entries = coord_->take_plan(now);
    if (entries.empty()) return;
    Plan plan;
    plan.seq = ++plan_seq_;
    plan.entries = std::move(entries);
    if (timeline_.on()) timeline_.planned(plan.entries, [this](const std::string& n) { return inflight_.count(n) > 0; });
    if (cfg_.size > 1) {
      std::vector<uint8_t> bytes = encode_plan(plan, cache_);
      for (int r = 1; r < cfg_.size; ++r)
        if (is_ctrl_peer(r)) send_control(r, FrameType::kControl, bytes);
    }
    run_plan(plan);
  }
}

void Runtime::run_plan(Plan& plan) {
  const uint64_t cpu0 = profiling_.load(std::memory_order_relaxed) ? thread_cpu_ns() : 0;
  for (const PlanEntry& e : plan.entries) run_entry(e);
  if (cpu0) {
    plan_cpu_ns_ += thread_cpu_ns() - cpu0;
    plan_clock_reads_ += 2;
  }
  ++plans_applied_;
  ++stats_.plans;
  last_busy_us_ = steady_us();
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
  std::unique_ptr<Completion> completion = backend.launch(e, raw);
  ++stats_.entries;
  stats_.tensors += e.names.size();
  if (e.names.size() > 1) ++stats_.fused_entries;
  for (size_t i = 0; i < e.names.size(); ++i) cache_.put(e.names[i], e.sigs[i]);
  if (completion) {
    std::shared_ptr<void> ev = completion->ready_event();
    for (auto& op : ops)
      if (op && ev) {
        op->ready_event = ev;
        handles_.mark_launched(op);
      }
    running_.push_back(Running{std::move(completion), std::move(ops)});
    return;
  }
  if (timeline_.on())
    for (size_t i = 0; i < ops.size(); ++i)
      if (ops[i]) timeline_.done(e.names[i], e.sigs[i]);
  handles_.complete_all(ops, Status::Ok());
}

void Runtime::poll_running() {
  while (!running_.empty()) {
    Running& r = running_.front();
    if (!r.completion->done()) return;  // in plan order: later entries wait for earlier ones
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
  std::lock_guard<std::mutex> g(qmu_);
  uint64_t& next = auto_names_[0];
  next = std::max(next, n + 1);
}

void Runtime::heartbeats(Clock::time_point now) {
  if (cfg_.size < 2 || cfg_.heartbeat_timeout_s <= 0) return;
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg_.heartbeat_timeout_s * 1000));
  int silent = -1;  // of the peers silent for too long, the one silent the longest
  for (int r : ctrl_ranks_) {
    if (!is_ctrl_peer(r)) continue;
    CtrlPeer& c = ctrl_[r];
    if (now - c.last_recv > timeout && (silent < 0 || c.last_recv < ctrl_[silent].last_recv)) silent = r;
  }
  if (silent >= 0) {
    // Silence is seen first-hand (unlike a closed link, which may be a peer giving up because of
    // someone else): the loop reports it at once, without waiting for a better cause.
    silence_seen_ = true;
    throw Error(Code::kPeerLost,
                "no sign of life for " + std::to_string(static_cast<int>(cfg_.heartbeat_timeout_s)) +
                    " s (host down, network cut or process stopped; APPLIANCE_HEARTBEAT_TIMEOUT)",
                silent, host_of(silent));
  }
  for (int r : ctrl_ranks_) {
    if (!is_ctrl_peer(r)) continue;
    if (now - ctrl_[r].last_send >= std::chrono::milliseconds(hb_interval_ms_)) send_control(r, FrameType::kHeartbeat, {});
  }
}

void Runtime::stall_check(Clock::time_point now) {
  if (now < next_stall_check_) return;
  Status abort;
  std::vector<std::string> report = coord_->stall_warnings(now, &abort);
  // Next check at the next warning or shutdown time: at most a second away, at least 1 ms.
  next_stall_check_ = std::max(now + std::chrono::milliseconds(1),
                               std::min(now + std::chrono::seconds(1), coord_->next_stall_event()));
  if (!report.empty()) {
    // Every rank prints the report: the ranks that wait and the ones they wait for.
    for (const std::string& line : report) log_line(cfg_.rank, line);
    std::vector<uint8_t> notice = encode_notice(report);
    for (int r = 1; r < cfg_.size; ++r)
      if (is_ctrl_peer(r)) send_control(r, FrameType::kControl, notice);
  }
  if (!abort.ok()) {
    abort.host = host_of(abort.origin_rank);
    throw Error(abort);
  }
}

Status Runtime::await_better_cause(const Status& s) {
  // A closed data link may only mean the peer gave up because of someone else; give the
  // coordinator's ABORT (which names the origin) a moment to arrive.
  auto until = Clock::now() + std::chrono::milliseconds(1000);
  while (Clock::now() < until && cfg_.size > 1) {
    pollfd fd{epoll_fd_, POLLIN, 0};
    ::poll(&fd, 1, 50);
    try {
      read_control(false);
    } catch (const Error& e) {
      return e.status();
    }
  }
  return s;
}

void Runtime::abort_job(const Status& s, int skip_peer) {
  log_line(cfg_.rank, "collective job failed: " + s.to_string());
  Writer w;
  w.status(s);
  for (int r : ctrl_ranks_) {
    if (r == skip_peer || !is_ctrl_peer(r)) continue;
    try {
      ctrl_[r].ch->send_frame(FrameType::kAbort, w.buffer().data(), w.buffer().size(), deadline_after_ms(1000));
    } catch (const Error&) {
    }
  }
  record_fault(s);
  finish(s);
}

void Runtime::record_fault(const Status& s) {
  if (cfg_.fault_file.empty()) return;
  {
    std::lock_guard<std::mutex> g(qmu_);
    if (fault_written_) return;
    fault_written_ = true;
  }
  FaultReport f;
  f.rank = cfg_.rank;
  f.host = cfg_.host;
  f.origin_rank = s.origin_rank;
  f.origin_host = s.host;
  if (f.origin_host.empty() && (comm_ || s.origin_rank == cfg_.rank)) f.origin_host = host_of(s.origin_rank);  // hosts known once the mesh is up
  f.kind = fault_kind(s.code);
  f.message = s.to_string();
  f.time = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  write_fault_file(cfg_.fault_file, f);
}

void Runtime::finish(const Status& terminal) {
  {
    std::lock_guard<std::mutex> g(qmu_);
    if (terminal_.ok()) terminal_ = terminal;
    queue_.clear();
  }
  backends_->abort();  // nothing of a device backend may wait on a peer after this
  running_.clear();
  inflight_.clear();
  handles_.fail_all(terminal);
}

}  // namespace appliance
