// Scheduler: who does the engine's work, and when. It owns the engine lock, the background
// thread and its wake-ups, and lets a caller that waits for a host operation do the work on its
// own thread. One policy, behind one knob (APPLIANCE_SPIN_US, SchedulePolicy below):
//
//  * spin_us > 0: a caller waiting for a host op drives the engine itself (its turns: announce,
//    negotiate, run plans) until its op is done or spin_us passes without it, so a small
//    synchronous op costs no hand-off between threads; meanwhile, and for a cycle
//    (HOROVOD_CYCLE_TIME) after, the background thread parks. After work, while a caller waits,
//    the background thread polls for spin_us instead of sleeping, and a waiting caller polls as
//    long before it blocks.
//  * spin_us = 0: nothing spins and no caller drives; the background thread sleeps in ppoll()
//    until an enqueue (eventfd), a control frame or a deadline wakes it.
//
// Not driven even then: a wait for an op that came in a burst (enqueues less than kBurstGapUs
// apart, none waited for: the background thread gathers the burst to fuse it, after a pause of
// kBurstGapUs or at once when a caller waits), and every wait once a CUDA op was enqueued (the
// CUDA device is per thread). A driver that gives up (its peers are not ready), a caller that
// waits without driving or polls hand back at once (unpark). Callers wake the background
// thread only while it sleeps (Dekker on posted_/sleeping_), so a burst of enqueues costs one
// wake-up, not a syscall each.
//
// The engine's work itself is the host's (SchedulerHost: the Runtime): the scheduler only
// calls turn() under the lock. A failure inside a turn ends the engine there (the host's
// turn() says so by returning false).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

#include "common/options.h"
#include "ops/ops.h"

namespace appliance {

// The policy, pure: time in microseconds passed in.
struct SchedulePolicy {
  int64_t spin_us = ScheduleOptions{}.spin_us;
  int64_t cycle_us = NegotiationOptions{}.cycle_us();

  static constexpr int64_t kBurstGapUs = 50;
  static constexpr int64_t kMaxSettleUs = 5000;

  // Whether waiting callers of host ops drive the engine.
  bool callers_drive() const { return spin_us > 0; }
  // After work, poll again rather than sleep: only just after work, and only while a caller
  // waits (or just did), so a caller that computes is never competed with.
  bool spin_after_work(int64_t now, int64_t last_busy, bool caller_waited_within_spin) const {
    return spin_us > 0 && now - last_busy < spin_us && caller_waited_within_spin;
  }
  // How long the work stays the callers' after a drive: a cycle, the longest Horovod ever let an
  // op wait for its background thread (waking every spin_us would take a core from a
  // synchronous loop of small ops on every wake-up).
  int64_t park_us() const { return spin_us > cycle_us ? spin_us : cycle_us; }
  // How long the background thread should still stay parked (0: not at all).
  int64_t park_left(int64_t now, int64_t last_drive, bool driving) const {
    if (spin_us <= 0) return 0;
    if (driving) return park_us();
    const int64_t quiet = now - last_drive;
    return quiet >= park_us() ? 0 : park_us() - quiet;
  }
  // An enqueue is part of a burst when it comes soon after the previous one and earlier ops
  // are still unwaited (a synchronous loop waits for each op, so its ops never count).
  static bool is_burst(int64_t now, int64_t last_enqueue, size_t outstanding) {
    return outstanding > 0 && now - last_enqueue < kBurstGapUs;
  }
  // How long a burst is gathered at most before it is announced anyway.
  int64_t settle_limit_us() const { return cycle_us < kMaxSettleUs ? cycle_us : kMaxSettleUs; }
};

// What the scheduler drives: the Runtime. Every call but wake-related ones runs under the lock.
class SchedulerHost {
 public:
  virtual ~SchedulerHost() = default;
  // One turn of the engine's work; `settle`: the background thread's (gathers bursts first).
  // False once the engine has ended.
  virtual bool turn(bool settle) = 0;
  // Before sleeping: arms what wakes only when armed; true when something is ready already.
  // False return of `ok`: the engine ended while arming.
  virtual bool before_sleep(bool* ok) = 0;
  // Microseconds the background thread may sleep (-1: until woken); 20 us while device work runs.
  virtual int64_t sleep_timeout_us() = 0;
  // The fd the background thread also sleeps on (control links), or -1.
  virtual int sleep_fd() const = 0;
  virtual bool ended() const = 0;
  // Stopping, once, on the background thread: finish what must be finished, say goodbye.
  virtual void stop() = 0;
};

class Scheduler {
 public:
  Scheduler(SchedulePolicy p, HandleTable& handles);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  const SchedulePolicy& policy() const { return p_; }
  void start(SchedulerHost* host);  // the background thread
  // Stops the background thread (after host->stop()); call with `stopping()` already set.
  void join();

  // --- callers ---
  // Marks a post to the background thread (an op, a set change, the stop): call under the
  // host's queue lock; then wake() after releasing it.
  void post() { posted_.fetch_add(1); }
  void wake();        // only if the background thread sleeps (always, for set changes: force)
  void wake_always();
  void set_stopping();  // under the host's queue lock
  bool stopping() const { return stopping_.load(); }
  // An op was enqueued: is the caller issuing a burst? (`outstanding`: its unwaited ops before it)
  void enqueued(size_t outstanding, bool device);
  // A caller waits for `op`: it drives the engine while the policy lets it. `now_us`: a
  // steady_us() reading taken just before (0: none); on return, a reading taken as the op
  // was seen done, or 0.
  void wait_for(const OpState& op, int64_t* now_us);
  // A caller polled an op that is not done: the background thread must not stay parked.
  void polled();

  // --- the engine's side (under the lock) ---
  bool has_new() const { return posted_.load() != taken_; }
  void take() { taken_ = posted_.load(); }  // under the host's queue lock
  void busy(int64_t now_us) { last_busy_us_ = now_us; }
  // Gathers a burst before announcing it (background thread only).
  void settle_burst();
  uint64_t driven_turns() const { return driven_turns_.load(std::memory_order_relaxed); }

 private:
  void loop();
  void park();
  void unpark();
  void drive(const OpState& op, int64_t* now_us);

  SchedulePolicy p_;
  HandleTable& handles_;
  SchedulerHost* host_ = nullptr;
  std::mutex engine_mu_;  // held by whichever thread does the engine's work
  std::thread thread_;
  int wake_fd_ = -1;
  std::atomic<bool> sleeping_{false};  // the background thread is (about to be) in ppoll
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> posted_{0};
  uint64_t taken_ = 0;        // posted_ at the last intake (under the host's queue lock)
  int64_t last_busy_us_ = 0;  // when the engine last took requests or ran a plan
  std::atomic<int64_t> last_enqueue_us_{0};
  std::atomic<bool> burst_{false};       // the last enqueue came within kBurstGapUs of an unwaited one
  std::atomic<bool> device_ops_{false};  // a CUDA op was enqueued: callers no longer drive
  std::atomic<int> drivers_{0};          // callers driving (or about to)
  std::atomic<int64_t> last_drive_us_{0};  // when a driving caller last left with its op done
  std::atomic<uint64_t> driven_turns_{0};
  std::mutex park_mu_;
  std::condition_variable park_cv_;
};

}  // namespace appliance
