// Runtime: the per-process collective engine, and the owner of its parts. No process-wide
// state: Python holds one Runtime per init() and destroys it at shutdown().
//
// What it owns: the rendezvous store (server on rank 0), the links to the other ranks (data
// Comm, ControlPlane), the Negotiator (engine/negotiator.h: which protocol agrees on what runs
// next), the backends, the handle table, the queue of enqueued operations and the process sets;
// and the Scheduler (engine/scheduler.h), which decides which thread does the engine's work and
// when. The Runtime itself is that work, one turn at a time (engine/turn.cc): take what callers
// enqueued, hand it to the negotiator with the control messages that came, send what it says,
// run the plans it produces (engine/plans.cc), keep the control links alive.
//
// Threads: callers enqueue/poll/wait from any thread; every turn runs under the scheduler's
// engine lock, on the background thread or on a caller that drives.
//
// Failure: see csrc/README.md. A failed job fails every pending handle with a Status naming
// the origin rank; later enqueues complete at once with the same status. The first failure
// is also written once to cfg.fault_file (engine/fault_report.h), for the launcher.
#pragma once

#include <algorithm>
#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "backends/backend.h"
#include "backends/registry.h"
#include "bootstrap/links.h"
#include "collectives/collectives.h"
#include "engine/control.h"
#include "engine/negotiator.h"
#include "engine/options.h"
#include "engine/profile.h"
#include "engine/scheduler.h"
#include "engine/timeline.h"
#include "ops/ops.h"
#include "store/store.h"

namespace appliance {

class Runtime final : private SchedulerHost, private NegotiationObserver {
 public:
  explicit Runtime(RuntimeConfig cfg);  // rendezvous + links; throws Error on failure
  ~Runtime() override;
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  int rank() const { return cfg_.rank; }
  int size() const { return cfg_.size; }
  const Topology& topology() const { return layout_.topo; }
  std::string host_of(int rank) const;
  // Transport of the data link to `rank` ("shm", "tcp"; "self" for this rank): the one it has,
  // or, before it is opened, the one it will take.
  std::string link_kind(int rank) const { return rank >= 0 && rank < cfg_.size ? layout_.link_kinds[rank].load() : ""; }

  // Validates locally (std::invalid_argument -> Python ValueError) and queues the operation.
  // With on_done, nobody waits for it: on_done is called once it completes (ops/ops.h).
  int enqueue(Request req, TensorDesc in, TensorDesc out, std::function<void(const OpPtr&)> on_done = nullptr);
  // The id of a new group of operations on `process_set` (the members' Signature carries it
  // with their number): 1, 2, 3... per set, so ranks that make the same calls agree on it; a
  // set added again counts afresh.
  uint32_t new_group(int32_t process_set);
  bool poll(int handle) {
    const bool done = handles_.poll(handle);
    if (!done) sched_.polled();
    return done;
  }

  // Counters for tests and diagnostics (read from any thread).
  struct Stats {
    std::atomic<uint64_t> plans{0}, entries{0}, tensors{0}, fused_entries{0};
    std::atomic<uint64_t> driven_plans{0};  // plans run by a driving caller (engine/scheduler.h)
    std::atomic<uint64_t> ctrl_in{0}, ctrl_out{0};  // control frames this rank received / sent
    std::atomic<uint64_t> ready_full{0}, ready_ids{0};  // the negotiator's: requests announced in full, as cache ids
    std::atomic<uint64_t> carried{0};  // allreduces completed from a result carried with their plan (negotiator.h's Carry)

    // Written under the engine's lock only, so one writer at a time: a plain add, no locked instruction.
    static void add(std::atomic<uint64_t>& c, uint64_t n = 1) {
      c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
    }
  };
  const Stats& stats() const { return stats_; }
  // DATA frames this rank has sent on its data links.
  uint64_t data_frames() const { return comm_ ? comm_->frames_sent() : 0; }
  // What a rank publishes as metrics (appliance/runtime/metrics.py), cumulative since this
  // Runtime started; read from any thread. Per operation kind (allreduce..reducescatter): the
  // operations run here, their bytes (as nccl-tests sizes them) and the time from their plan's
  // launch to their completion. busy: callers blocked in wait(); wait: the part of that before
  // the awaited operations were negotiated (the others were not ready); late: the time the
  // others waited for this rank, as the coordinator saw it (Plan::late). Engine-side counters
  // are written under the engine's lock only (Stats::add); busy and wait by callers (relaxed adds).
  struct Metrics {
    static constexpr int kKinds = 5;  // OpKind::kAllreduce .. kReducescatter
    struct PerKind {
      std::atomic<uint64_t> n{0}, bytes{0}, ns{0};
    } kinds[kKinds];
    std::atomic<uint64_t> busy_ns{0}, wait_ns{0}, late_ns{0};
  };
  const Metrics& metrics() const { return metrics_; }
  // A caller was blocked in wait() from t0 to t1 (steady_us); the last of the operations it
  // waited for was planned at `planned` (0: none was).
  void note_wait(int64_t t0, int64_t t1, int64_t planned) {
    if (t1 <= t0) return;
    metrics_.busy_ns.fetch_add(static_cast<uint64_t>(t1 - t0) * 1000, std::memory_order_relaxed);
    const int64_t w = std::min(planned, t1) - t0;
    if (w > 0) metrics_.wait_ns.fetch_add(static_cast<uint64_t>(w) * 1000, std::memory_order_relaxed);
  }
  // With profiling on (set_profiling): thread CPU time of the engine's turns that moved control
  // frames or announced work, less the plans they ran (the negotiation's own work), and those turns.
  const NegotiationProfile& profile() const { return profile_; }
  const OutputPool& output_pool() const { return *outputs_; }
  // Requests this rank sent to the store, and (rank 0) those its store server handled.
  uint64_t store_requests() const;
  uint64_t store_served() const;
  // Measure the negotiation's CPU time (profile()); costs two clock reads per turn.
  void set_profiling(bool on) { profile_.set(on); }

  // Blocks until the op is done. A host op's caller first drives the engine (scheduler.h).
  // `now_us`: a steady_us() reading taken just before (0: none); on return, one taken as it
  // returns (HandleTable::wait).
  OpPtr wait(int handle, int64_t* now_us) {
    sched_.wait_for(*handles_.find(handle), now_us);
    return handles_.wait(handle, false, nullptr, now_us);
  }
  // For a caller on a CUDA stream: returns once the op is done, or once its device work is on
  // its stream and `stream` has been made to wait for it (*finished false); an error after
  // that reaches the job as an abort. Host work is always waited for.
  OpPtr wait_on_stream(int handle, uint64_t stream, bool* finished) {
    OpPtr op = handles_.wait(handle, true, finished);
    if (!*finished) backends_->stream_wait(*op, stream);
    return op;
  }
  void shutdown();
  // Process sets (engine/process_sets.cc). Every rank adds and removes the same sets in the
  // same order (the adapter makes that collective); `members` are job ranks. add throws
  // std::invalid_argument for a bad id or rank list; ops on a set are ordered after its add.
  void add_process_set(int32_t id, std::vector<int> members);
  void remove_process_set(int32_t id);
  // The members of process set `id` as callers see it (0: every rank); false when unknown.
  bool process_set_members(int32_t id, std::vector<int>* members);
  // Where CUDA outputs of allgather/alltoall/reducescatter come from (set by the adapter before
  // its first CUDA operation; called on the background thread).
  void set_device_allocator(DeviceAllocator a) { backends_->set_device_allocator(std::move(a)); }
  // "nccl", "staging" or "" (no CUDA operation has run yet), and why staging.
  std::string cuda_path(std::string* why) const { return backends_->cuda_path(why); }
  // Horovod's timeline (engine/timeline.h): rank 0 records, the other ranks do nothing.
  // start throws std::invalid_argument naming a path it cannot write; stop is idempotent, and
  // shutdown() stops it too (the file is then complete JSON).
  void start_timeline(const std::string& path, bool mark_cycles) { timeline_.start(path, mark_cycles); }
  void stop_timeline() { timeline_.stop(); }

 private:
  // --- SchedulerHost (engine/turn.cc): the engine's work, under the scheduler's lock ---
  bool turn(bool settle) override;
  bool before_sleep(bool* ok) override;
  int64_t sleep_timeout_us() override;
  int sleep_fd() const override { return cfg_.size > 1 ? control_->epoll_fd() : -1; }
  bool ended() const override { return ended_; }
  void stop() override;
  // --- NegotiationObserver: rank 0's timeline sees the negotiation ---
  bool on() const override { return timeline_.on(); }
  void ready(const std::string& name, OpKind kind, int rank) override { timeline_.negotiate(name, kind, rank); }
  void planned(const std::vector<PlanEntry>& entries) override;

  // The data channel to `peer`, opened on first use by the job's Comm (engine/runtime.cc).
  std::unique_ptr<Channel> open_data(int peer);
  // While waiting for a peer's link: the control links stay serviced (an abort ends the wait).
  void wait_for_link(int fd);
  // Rendezvous through the store, the links, the control links (a job of more than one rank).
  void join();
  void step();
  // Runs f (engine work); a failure it throws ends the engine. False once the engine has ended.
  template <class F>
  bool guard(F&& f) {
    try {
      f();
      return !ended_;
    } catch (const Error& e) {
      fail_engine(e.status());
    } catch (const std::exception& e) {
      fail_engine(Status{Code::kInternal, cfg_.rank, cfg_.host, e.what()});
    }
    return false;
  }
  void fail_engine(Status s);  // a failure caught by guard(): abort the job, end the engine
  // Before an ABORT from a peer ends the engine: the lines the control messages that came before
  // it carry (a stall or deadlock report) are printed; nothing else of them is carried out.
  void print_before_abort();
  void intake(Clock::time_point now);
  // Reads the control links (in a collective too: its Watch), keeping what came for the turn.
  void read_control(bool in_collective);
  // Hands what arrived to the negotiator and carries out what it says, until nothing is left.
  void negotiate(Clock::time_point now);
  // Tells the negotiator whether this rank's callers are stuck (negotiator.h's waiting()).
  void note_waiting(Clock::time_point now);
  void carry_out(Negotiated& out);
  // Publishes the negotiator's counters (Stats::ready_full, ready_ids).
  void count_ready();
  // --- plans (engine/plans.cc) ---
  // What the negotiator needs to carry small allreduces (negotiator.h's Carry): this rank's
  // prescaled input of an announced op, and the elementwise combine.
  Carry carry();
  // A carried allreduce: its result into the output, the postscale (Average's divide) applied
  // as the collective would have.
  void finish_carried(const PlanEntry& e, OpState& op);
  void run_plan(const Plan& plan);
  void run_entry(const PlanEntry& e);
  void count_entry(const PlanEntry& e, const std::vector<OpPtr>& ops, int kind);  // metrics_ per kind
  // Completes the handles of launched entries whose backend has finished, in plan order.
  void poll_running();
  // A joined rank skips the ops the others run; it counts their automatic names as used so
  // that its later unnamed ops keep matching theirs.
  void note_skipped_name(const std::string& name);
  void abort_job(const Status& s, int skip_peer);
  void finish(const Status& terminal);
  void record_fault(const Status& s);
  // --- process sets (engine/process_sets.cc) ---
  struct SetChange {
    bool add;
    int32_t id;
    std::vector<int> members;
  };
  struct SetComm {  // this rank's side of a process set it belongs to
    std::vector<int> members;
    std::unique_ptr<Comm> comm;  // its backends are in backends_
  };
  void apply_set_changes(std::deque<SetChange>& changes);
  SetComm* set_comm(int32_t id);  // nullptr: not a member (or unknown)

  RuntimeConfig cfg_;
  Timeline timeline_;  // before the backends, which report to it
  struct Layout {      // the job as this rank sees it
    Topology topo;
    std::vector<std::string> hosts;
    std::unique_ptr<std::atomic<const char*>[]> link_kinds;  // of the data link to each rank: "tcp", "shm", "self"
  } layout_;
  struct Rendezvous {      // the job's store: its server on rank 0, this rank's client
    mutable std::mutex mu;  // against stats readers at shutdown
    std::unique_ptr<TcpStoreServer> server;
    std::unique_ptr<TcpStoreClient> client;
    uint64_t requests = 0, served = 0;  // counts kept when the store goes (shutdown)
  } store_;
  std::unique_ptr<Links> links_;  // the peers, the acceptor thread, links opened on first use
  std::unique_ptr<Comm> comm_;
  std::unique_ptr<ControlPlane> control_;
  std::unique_ptr<Negotiator> negotiator_;
  // One backend per device kind, and which one runs an entry (backends/registry.h).
  std::unique_ptr<BackendRegistry> backends_;
  std::atomic<int> join_device_{-1};  // device a joined rank contributes zeros on
  struct Running {                    // launched entries whose backend has not finished
    std::unique_ptr<Completion> completion;
    std::vector<OpPtr> ops;
    int kind = -1;        // Metrics::kinds index (-1: not counted)
    int64_t started = 0;  // steady_us at launch
  };
  std::deque<Running> running_;
  HandleTable handles_;
  Stats stats_;
  Metrics metrics_;
  NegotiationProfile profile_{stats_.ctrl_in, stats_.ctrl_out};
  std::shared_ptr<OutputPool> outputs_ = std::make_shared<OutputPool>();  // large core-allocated outputs

  struct Callers {  // the callers' side, under mu
    std::mutex mu;
    std::deque<OpPtr> queue;                      // enqueued, not yet announced
    std::deque<SetChange> set_changes;            // not yet applied by the engine
    std::map<int32_t, std::vector<int>> known_sets;  // as callers see them (enqueue checks)
    std::map<int32_t, uint64_t> auto_names;       // process set -> automatic names given
    std::map<int32_t, uint32_t> groups;           // process set -> groups given (new_group)
    Status terminal;             // set once the runtime can run nothing more
    bool fault_written = false;  // the fault report is written once
  } callers_;

  // The engine's side, under the scheduler's lock.
  bool ended_ = false;  // the job failed or rank 0 left: no more turns
  std::unordered_map<std::string, OpPtr> inflight_;  // announced, waiting for a plan
  std::map<int32_t, SetComm> sets_;                  // process sets this rank is in
  struct Arrived {  // read from the control links, not yet handed to the negotiator
    std::deque<ControlPlane::Inbound> frames;
    std::vector<int> left;  // peers whose BYE came
  } arrived_;
  struct Intake {  // what intake() took from callers_ this turn; empty between turns
    std::deque<OpPtr> ops;
    std::deque<SetChange> changes;
  } intake_;
  int64_t clock_us_ = 0;  // the turn's latest steady_us() reading: its start, or the end of its last plan entry
  int gone_rank_ = -1;  // negotiation ended: who left in order (rank 0, or the rank this one negotiated through)

  Scheduler sched_{SchedulePolicy{}, handles_};  // last: its thread stops before the rest goes
};

}  // namespace appliance
