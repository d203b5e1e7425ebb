// Runtime: the per-process collective engine. Owns the rendezvous store (server on rank 0),
// the mesh (data Comm, control channels), the coordinator (rank 0), the response cache, the
// backends, the handle table and the background thread. No process-wide state: Python holds
// one Runtime per init() and destroys it at shutdown().
//
// Threads: callers enqueue/poll/wait from any thread; everything else (control plane,
// negotiation, collectives) is the engine's work, done under engine_mu_ by one thread at a
// time: the background thread, which sleeps in poll() until work, a control frame or a
// deadline (fusion cycle, heartbeat, stall check) wakes it, or a caller waiting for a host
// operation, which drives the engine itself for a while (engine/drive.cc) so that a small
// operation costs no hand-off between threads.
//
// Failure: see csrc/README.md. A failed job fails every pending handle with a Status naming
// the origin rank; later enqueues complete at once with the same status. The first failure
// is also written once to cfg.fault_file (engine/fault_report.h), for the launcher.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <map>
#include <set>

#include "backends/backend.h"
#include "backends/registry.h"
#include "bootstrap/mesh.h"
#include "collectives/collectives.h"
#include "coordinator/coordinator.h"
#include "coordinator/response_cache.h"
#include "engine/messages.h"
#include "engine/options.h"
#include "engine/timeline.h"
#include "ops/ops.h"
#include "store/store.h"

namespace appliance {

// The job's layout and bootstrap, set explicitly by the caller, and the engine's options
// (engine/options.h: each knob that feeds the core is one of those).
struct RuntimeConfig : EngineOptions {
  int rank = 0, size = 1;
  std::string host;  // this rank's host name (HOROVOD_HOSTNAME or gethostname)
  std::string store_host;
  int store_port = 0;
  std::string secret, job_id, data_addr;
  // CUDA tensors (engine/devices.cc): where the CUDA runtime and NCCL may be found, in order
  // (appliance/runtime/devices.py builds these lists); nccl_library is the explicit knob.
  std::vector<std::string> nccl_candidates, cudart_candidates;
};

class Runtime {
 public:
  explicit Runtime(RuntimeConfig cfg);  // rendezvous + mesh; throws Error on failure
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  int rank() const { return cfg_.rank; }
  int size() const { return cfg_.size; }
  const Topology& topology() const { return topo_; }
  std::string host_of(int rank) const;
  // Transport of the data link to `rank` ("shm", "tcp"; "self" for this rank).
  std::string link_kind(int rank) const { return rank >= 0 && rank < static_cast<int>(links_.size()) ? links_[rank] : ""; }

  // Validates locally (std::invalid_argument -> Python ValueError) and queues the operation.
  int enqueue(Request req, TensorDesc in, TensorDesc out);
  // The id of a new group of operations on `process_set` (the members' Signature carries it
  // with their number): 1, 2, 3... per set, so ranks that make the same calls agree on it; a
  // set added again counts afresh.
  uint32_t new_group(int32_t process_set);
  bool poll(int handle);  // engine/drive.cc

  // Counters for tests and diagnostics (read from any thread).
  struct Stats {
    std::atomic<uint64_t> plans{0}, entries{0}, tensors{0}, fused_entries{0}, ready_full{0}, ready_ids{0};
    std::atomic<uint64_t> driven_plans{0};  // plans run by a driving caller (engine/drive.cc)
  };
  const Stats& stats() const { return stats_; }
  const OutputPool& output_pool() const { return *outputs_; }
  // Blocks until the op is done. A host op's caller first drives the engine (engine/drive.cc).
  OpPtr wait(int handle);
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
  // --- background thread (engine/loop.cc) ---
  void loop();
  // The engine's work, under engine_mu_, from the background thread or a driving caller:
  // settle a burst (background thread only), step(), and turn a failure or the coordinator's
  // end into the job's end. False once the engine has ended (ended_).
  bool turn(bool settle);
  void step();
  void fail_engine(Status s);  // a failure caught by guard(): abort the job, end the engine
  // Runs f (engine work, under engine_mu_); a failure it throws ends the engine. False once
  // the engine has ended.
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
  // The background thread stays off while a caller drives, or did within a cycle.
  void park();
  // Ends the background thread's parking at once (a caller needs it: drive.cc).
  void unpark();
  // --- callers driving (engine/drive.cc) ---
  // Drives the engine until op is done, the engine ends, or spin_us passes without op done.
  void drive(const OpState& op);
  // A caller issuing operations back to back without waiting (a backward pass's gradients, a
  // burst of async calls) gets them announced together: while such enqueues come less than
  // kBurstGapUs apart, wait (at most the cycle time) for a pause or for a caller to wait, so
  // they negotiate and fuse as one plan. A lone operation, or a synchronous loop's, goes at once.
  static constexpr int64_t kBurstGapUs = 50;
  void settle_burst();
  void intake(Clock::time_point now);
  void on_ready(int from, const std::vector<uint8_t>& payload);
  void on_resend(const std::vector<uint8_t>& payload);
  void read_control(bool in_collective);
  void dispatch_inbox();
  void issue_plans(Clock::time_point now);
  void run_plan(Plan& plan);
  void run_entry(const PlanEntry& e);
  // A joined rank skips the ops the others run; it counts their automatic names as used so
  // that its later unnamed ops keep matching theirs.
  void note_skipped_name(const std::string& name);
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
  // Completes the handles of launched entries whose backend has finished, in plan order.
  void poll_running();
  void heartbeats(Clock::time_point now);
  void stall_check(Clock::time_point now);
  void send_control(int peer, FrameType type, const std::vector<uint8_t>& payload);
  Status await_better_cause(const Status& s);
  void abort_job(const Status& s, int skip_peer);
  void finish(const Status& terminal);
  void record_fault(const Status& s);
  int poll_timeout_ms() const;
  bool is_ctrl_peer(int peer) const;
  // Before sleeping on epoll_fd_: arms the control links that wake only when armed (shm);
  // true when one of them has bytes already (do not sleep).
  bool arm_control();

  struct CtrlPeer {
    std::unique_ptr<Channel> ch;
    Clock::time_point last_recv, last_send;
    bool gone = false;  // said BYE (or is closed after one)
  };
  struct Inbound {
    int from;
    std::vector<uint8_t> payload;
  };

  RuntimeConfig cfg_;
  Timeline timeline_;  // before the backends, which report to it
  Topology topo_;
  std::vector<std::string> hosts_;
  std::vector<std::string> links_;  // kind of the data link to each rank: "tcp", "shm", "self"
  std::unique_ptr<TcpStoreServer> store_server_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Comm> comm_;
  std::vector<CtrlPeer> ctrl_;  // indexed by rank (rank 0: every peer; others: only [0])
  std::vector<int> ctrl_ranks_;  // the ranks ctrl_ has a channel for, ascending (what loops visit)
  std::unique_ptr<Coordinator> coord_;
  ResponseCache cache_;
  // One backend per device kind, and which one runs an entry (backends/registry.h).
  std::unique_ptr<BackendRegistry> backends_;
  std::atomic<int> join_device_{-1};  // device a joined rank contributes zeros on
  struct Running {                    // launched entries whose backend has not finished
    std::unique_ptr<Completion> completion;
    std::vector<OpPtr> ops;
  };
  std::deque<Running> running_;
  HandleTable handles_;
  Stats stats_;
  std::shared_ptr<OutputPool> outputs_ = std::make_shared<OutputPool>();  // large core-allocated outputs

  // Held by whichever thread does the engine's work: guards every "background-thread state"
  // member below (and the backends, comm_, ctrl_, coord_, cache_, timeline_ recording).
  std::mutex engine_mu_;
  bool ended_ = false;  // the job failed or the coordinator left: no more turns (engine_mu_)
  std::atomic<int> drivers_{0};             // callers driving (or about to)
  std::atomic<int64_t> last_drive_us_{0};   // when a driving caller last left with its op done
  std::atomic<bool> device_ops_{false};     // a CUDA op was enqueued: callers no longer drive
  std::mutex park_mu_;
  std::condition_variable park_cv_;  // the background thread parks on it while callers drive
  int wake_fd_ = -1;
  int epoll_fd_ = -1;  // control fds, the Watch of collectives
  std::thread thread_;

  std::mutex qmu_;
  std::atomic<bool> sleeping_{false};
  int64_t last_busy_us_ = 0;  // background thread: when it last took requests or ran a plan  // the background thread is (about to be) in ppoll
  std::atomic<int64_t> last_enqueue_us_{0};  // steady clock, set by enqueue()
  std::atomic<bool> burst_{false};  // the last enqueue came within kBurstGapUs of an unwaited one
  std::deque<OpPtr> queue_;  // enqueued, not yet announced
  // Counts what callers posted to the background thread (ops, set changes, the stop), each
  // under qmu_; the thread compares it with taken_ (its own count at its last intake), so its
  // idle loop takes no lock that an enqueuing caller would have to wait for.
  std::atomic<uint64_t> posted_{0};
  uint64_t taken_ = 0;  // background thread only (written under qmu_)
  std::deque<SetChange> set_changes_;                 // not yet applied by the background thread
  std::map<int32_t, std::vector<int>> known_sets_;    // as callers see them (enqueue checks)
  std::map<int32_t, uint64_t> auto_names_;           // process set -> automatic names given
  std::map<int32_t, uint32_t> groups_;                // process set -> groups given (new_group)
  std::atomic<bool> stopping_{false};  // set under qmu_ (enqueue checks it there)
  Status terminal_;          // set once the runtime can run nothing more
  bool fault_written_ = false;  // the fault report is written once (guarded by qmu_)

  // background-thread state
  std::unordered_map<std::string, OpPtr> inflight_;  // announced, waiting for a plan
  std::map<int32_t, SetComm> sets_;                  // process sets this rank is in
  std::map<int32_t, int> set_sizes_;                 // every registered process set -> its number of ranks
  CollectiveOptions copts_;
  std::deque<Inbound> inbox_;
  uint64_t plans_applied_ = 0;
  uint64_t plan_seq_ = 0;
  Clock::time_point next_stall_check_;
  int64_t hb_interval_ms_ = 1000;
  int abort_from_ = -1;       // peer an ABORT frame came from (not sent back to it)
  bool coordinator_gone_ = false;
  bool silence_seen_ = false;  // the failure is a heartbeat timeout this rank saw itself
};

}  // namespace appliance
