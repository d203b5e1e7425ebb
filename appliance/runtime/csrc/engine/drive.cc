// A caller waiting for a host operation drives the engine itself: it takes engine_mu_ and
// runs the background thread's turns (announce, negotiate, run plans) on its own thread,
// for up to APPLIANCE_SPIN_US without its op completing. A small collective then costs no
// hand-off to the background thread and back, which on a busy core is two context switches
// per rank and most of a 4 KiB allreduce's time.
//
// The background thread parks (Runtime::park) while a caller drives, and for a cycle
// (HOROVOD_CYCLE_TIME) after a driver left with its op done: the next op of a synchronous
// loop is driven too. A driver that gives up (its peers are not ready), and a caller that
// waits without driving or polls, hand back at once: they unpark the background thread,
// which then carries on as if no caller had driven. An async op enqueued within that cycle
// and not waited for starts when the cycle ends (Horovod's background thread woke once a
// cycle). A driver that finds the background thread asleep (in poll) wakes it as it leaves,
// so that it re-arms the control links the driver's reads disarmed.
//
// Not driven: a wait while the last enqueue was part of a burst (the background thread is
// gathering the burst to fuse it, and does that faster than a driver; benchmarks/fusion.py);
// CUDA operations (once any was enqueued, device state such as the current device belongs to
// the background thread); everything when APPLIANCE_CALLER_DRIVES=0 or APPLIANCE_SPIN_US=0.
// A failure met while driving ends the engine exactly as on the background thread
// (Runtime::guard): the job is aborted and every pending handle fails.
#include <sched.h>
#include <unistd.h>

#include "engine/runtime.h"

namespace appliance {

OpPtr Runtime::wait(int handle) {
  if (cfg_.caller_drives && cfg_.spin_us > 0 && !device_ops_.load(std::memory_order_relaxed) && !burst_.load()) {
    OpPtr op = handles_.find(handle);
    if (!op->done.load(std::memory_order_acquire)) drive(*op);
  } else {
    unpark();  // this wait leaves the work to the background thread: it must not sit out a cycle
  }
  return handles_.wait(handle);
}

bool Runtime::poll(int handle) {
  const bool done = handles_.poll(handle);
  if (!done && drivers_.load() == 0) unpark();  // a caller polling in a loop does not drive
  return done;
}

void Runtime::unpark() {
  {  // under park_mu_: park() reads it there before it waits, so no wake-up is lost
    std::lock_guard<std::mutex> g(park_mu_);
    last_drive_us_.store(0);
  }
  park_cv_.notify_one();
}

void Runtime::drive(const OpState& op) {
  drivers_.fetch_add(1);
  const int64_t until = steady_us() + cfg_.spin_us;
  for (unsigned turns = 1;; ++turns) {
    if (op.done.load(std::memory_order_acquire)) break;
    std::unique_lock<std::mutex> lk(engine_mu_, std::try_to_lock);
    if (lk.owns_lock()) {
      if (ended_ || stopping_.load()) break;
      const uint64_t plans = stats_.plans.load(std::memory_order_relaxed);
      const bool on = turn(false);
      stats_.driven_plans += stats_.plans.load(std::memory_order_relaxed) - plans;
      if (!on) break;
      lk.unlock();
      // Ranks may outnumber cores: a peer we wait for may need this one. Turns that find
      // nothing yield now and then, as a waiting caller's poll does.
      if (turns % 4 == 0 && !op.done.load(std::memory_order_acquire)) sched_yield();
    } else {
      sched_yield();  // the background thread is mid-turn: it parks after it
    }
    if (op.done.load(std::memory_order_acquire) || steady_us() >= until) break;  // done: no clock read
  }
  const bool done = op.done.load(std::memory_order_acquire);
  if (done) {
    last_drive_us_.store(steady_us());
    drivers_.fetch_sub(1);
  } else {
    drivers_.fetch_sub(1);
    unpark();
  }
  // A background thread asleep since before we drove armed its control links, and our reads
  // disarmed them: wake it to re-arm (and to take over what we leave, if our op is not done).
  if (sleeping_.exchange(false)) {
    uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
  }
}

}  // namespace appliance
