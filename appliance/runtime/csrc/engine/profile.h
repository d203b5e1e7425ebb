// NegotiationProfile: with profiling on (Runtime::set_profiling), the thread CPU time the engine
// spends negotiating: that of its turns that moved control frames or announced work, less the
// plans those turns ran and the clock reads taken to measure them. The engine's hot functions only
// mark where a turn and a plan begin and end (nothing but one relaxed load when profiling is off);
// the arithmetic is here, at the turn's end. Read from any thread.
#pragma once

#include <atomic>
#include <cstdint>

#include "ops/ops.h"

namespace appliance {

class NegotiationProfile {
 public:
  // `ctrl_in`, `ctrl_out`: the control frames received and sent, whose change marks a turn that negotiated.
  NegotiationProfile(const std::atomic<uint64_t>& ctrl_in, const std::atomic<uint64_t>& ctrl_out)
      : in_(ctrl_in), out_(ctrl_out) {}

  struct Mark {
    bool on = false;
    uint64_t cpu = 0, plans = 0, reads = 0, moved = 0;
  };
  Mark turn_begins() const {
    if (!on_.load(std::memory_order_relaxed)) return Mark{};
    return Mark{true, thread_cpu_ns(), plan_ns_, plan_reads_, moved()};
  }
  // `announced`: the turn handed new work to the negotiator.
  void turn_ends(const Mark& m, bool announced) {
    if (m.on) count(m, announced);
  }
  uint64_t plan_begins() const { return on_.load(std::memory_order_relaxed) ? thread_cpu_ns() : 0; }
  void plan_ends(uint64_t cpu) {
    if (!cpu) return;
    plan_ns_ += thread_cpu_ns() - cpu;
    plan_reads_ += 2;
  }

  // Turning it on first measures what one CPU clock read costs.
  void set(bool on);
  uint64_t ns() const { return ns_.load(std::memory_order_relaxed); }  // the negotiation's CPU time so far
  uint64_t turns() const { return turns_.load(std::memory_order_relaxed); }

 private:
  void count(const Mark& m, bool announced);
  uint64_t moved() const { return in_.load(std::memory_order_relaxed) + out_.load(std::memory_order_relaxed); }

  const std::atomic<uint64_t>& in_;
  const std::atomic<uint64_t>& out_;
  std::atomic<bool> on_{false};
  uint64_t plan_ns_ = 0, plan_reads_ = 0;  // the engine's side: plans timed so far
  std::atomic<uint64_t> ns_{0}, turns_{0};
  std::atomic<uint64_t> clock_read_ns_{0};
};

}  // namespace appliance
