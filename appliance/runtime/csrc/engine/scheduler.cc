// The background thread, its wake-ups and parking, and callers driving (see scheduler.h).
#include "engine/scheduler.h"

#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>

#include "common/status.h"

namespace appliance {

Scheduler::Scheduler(SchedulePolicy p, HandleTable& handles) : p_(p), handles_(handles) {
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) throw Error(Code::kInternal, "cannot create an eventfd");
}

Scheduler::~Scheduler() {
  join();
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void Scheduler::start(SchedulerHost* host) {
  host_ = host;
  thread_ = std::thread([this] { loop(); });
}

void Scheduler::set_stopping() {
  stopping_ = true;
  ++posted_;
}

void Scheduler::join() {
  wake_always();
  {
    std::lock_guard<std::mutex> g(park_mu_);  // park() checks stopping_ under it: no lost wake-up
  }
  park_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Scheduler::wake_always() {
  uint64_t one = 1;
  if (wake_fd_ >= 0) (void)!::write(wake_fd_, &one, sizeof(one));
}

void Scheduler::wake() {
  if (sleeping_.exchange(false)) wake_always();
}

void Scheduler::enqueued(size_t outstanding, bool device) {
  if (device) device_ops_.store(true);  // callers stop driving
  const int64_t now = steady_us();
  burst_.store(SchedulePolicy::is_burst(now, last_enqueue_us_.exchange(now), outstanding));
  wake();
}

// --- the background thread ------------------------------------------------------------------

void Scheduler::loop() {
  prctl(PR_SET_TIMERSLACK, 1000UL);  // 1 us: short waits here (bursts, device polls) stay short
  std::unique_lock<std::mutex> lk(engine_mu_, std::defer_lock);
  const int sleep_fd = host_->sleep_fd();
  for (;;) {
    park();
    lk.lock();
    if (host_->ended()) return;
    if (stopping_.load()) break;
    const int64_t timeout_us = host_->sleep_timeout_us();
    // Just after work, while a caller waits (or just did), poll instead of sleeping: the next
    // small op, or a peer's control message, then costs no wake-up. Spinning needs no syscall
    // beyond the yield: a turn reads the queue and the control links anyway, and callers,
    // seeing sleeping_ false, do not write wake_fd_.
    if (p_.spin_after_work(steady_us(), last_busy_us_, handles_.waited_within(p_.spin_us))) {
      lk.unlock();
      sched_yield();
    } else {
      // Dekker on posted_: either we see their post, or they see sleeping_ and wake us. A
      // driving caller that finds us asleep as it leaves wakes us the same way.
      sleeping_.store(true);
      bool ok = true;
      const bool ready = host_->before_sleep(&ok);
      if (!ok) return;
      const bool sleep = posted_.load() == taken_ && !ready;
      lk.unlock();
      pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {sleep_fd, POLLIN, 0}};
      if (sleep) {
        timespec ts{};
        if (timeout_us >= 0) {
          const int64_t t = std::min<int64_t>(timeout_us, 60000000);
          ts.tv_sec = t / 1000000;
          ts.tv_nsec = (t % 1000000) * 1000;
        }
        ::ppoll(fds, sleep_fd >= 0 ? 2 : 1, timeout_us >= 0 ? &ts : nullptr, nullptr);
      }
      sleeping_.store(false);
      if (fds[0].revents & POLLIN) {
        uint64_t v;
        (void)!::read(wake_fd_, &v, sizeof(v));
      }
    }
    lk.lock();
    if (host_->ended()) return;
    if (stopping_.load()) break;
    const bool go_on = host_->turn(true);
    lk.unlock();
    if (!go_on) return;
  }
  host_->stop();  // lk held
}

void Scheduler::park() {
  if (!p_.callers_drive()) return;
  std::unique_lock<std::mutex> l(park_mu_);
  for (;;) {
    if (stopping_.load()) return;
    const int64_t left = p_.park_left(steady_us(), last_drive_us_.load(), drivers_.load() > 0);
    if (left <= 0) return;
    // A driver that leaves with its op done does not notify (that would cost its caller a
    // syscall per op): re-check when the parking would end. Whoever needs this thread sooner
    // (a driver that gives up, a caller waiting without driving, shutdown) notifies.
    park_cv_.wait_for(l, std::chrono::microseconds(left));
  }
}

void Scheduler::unpark() {
  {  // under park_mu_: park() reads it there before it waits, so no wake-up is lost
    std::lock_guard<std::mutex> g(park_mu_);
    last_drive_us_.store(0);
  }
  park_cv_.notify_one();
}

void Scheduler::settle_burst() {
  if (!burst_.load() || posted_.load() == taken_) return;
  const int64_t until = steady_us() + p_.settle_limit_us();
  // Until the callers pause for kBurstGapUs, or one of them waits: a caller that waits (a
  // burst's synchronize) issues nothing more, so its ops are announced at once.
  for (int64_t t = steady_us(); t < until && !handles_.waiting() && drivers_.load() == 0; t = steady_us()) {
    const int64_t quiet = t - last_enqueue_us_.load();
    if (quiet >= SchedulePolicy::kBurstGapUs) return;
    if (quiet < SchedulePolicy::kBurstGapUs / 2) {
      timespec ts{0, static_cast<long>((SchedulePolicy::kBurstGapUs / 2 - quiet) * 1000)};
      nanosleep(&ts, nullptr);
    } else {
      sched_yield();  // the last stretch polls, so a wait that begins now is seen within a few us
    }
  }
}

// --- callers --------------------------------------------------------------------------------

void Scheduler::wait_for(const OpState& op, int64_t* now_us) {
  if (p_.callers_drive() && !device_ops_.load(std::memory_order_relaxed) && !burst_.load()) {
    if (!op.done.load(std::memory_order_acquire)) drive(op, now_us);
  } else {
    *now_us = 0;
    unpark();  // this wait leaves the work to the background thread: it must not sit out a cycle
  }
}

void Scheduler::polled() {
  if (drivers_.load() == 0) unpark();  // a caller polling in a loop does not drive
}

void Scheduler::drive(const OpState& op, int64_t* now_us) {
  drivers_.fetch_add(1);
  const int64_t until = (*now_us ? *now_us : steady_us()) + p_.spin_us;
  *now_us = 0;
  for (unsigned turns = 1;; ++turns) {
    if (op.done.load(std::memory_order_acquire)) break;
    std::unique_lock<std::mutex> lk(engine_mu_, std::try_to_lock);
    if (lk.owns_lock()) {
      if (host_->ended() || stopping_.load()) break;
      if (!host_->turn(false)) break;
      lk.unlock();
      // Ranks may outnumber cores: a peer we wait for may need this one. Turns that find
      // nothing yield now and then, as a waiting caller's poll does.
      if (turns % 4 == 0 && !op.done.load(std::memory_order_acquire)) sched_yield();
    } else {
      sched_yield();  // the background thread is mid-turn: it parks after it
    }
    if (op.done.load(std::memory_order_acquire) || steady_us() >= until) break;  // done: no clock read
  }
  if (op.done.load(std::memory_order_acquire)) {
    *now_us = steady_us();
    last_drive_us_.store(*now_us);
    drivers_.fetch_sub(1);
  } else {
    drivers_.fetch_sub(1);
    unpark();
  }
  // A background thread asleep since before we drove armed its control links, and our reads
  // disarmed them: wake it to re-arm (and to take over what we leave, if our op is not done).
  wake();
}

}  // namespace appliance
