// Backoff: how a thread waits for a link that has no pollable handle (shared memory).
//
// A few rounds of busy spinning (cheap when the peer is on another core and answers within
// microseconds), then sched_yield (lets the peer run when cores are scarce), then sleeps that
// double from 20 us up to 1 ms. reset() after any progress. Owned by whoever waits; no state
// beyond the counter.
#pragma once

#include <sched.h>
#include <time.h>

#include <cstdint>

namespace appliance {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

class Backoff {
 public:
  static constexpr uint32_t kSpins = 64;
  static constexpr uint32_t kYields = 32;

  void reset() { round_ = 0; }

  // Sleep length (microseconds) the next step() would use, 0 while still spinning/yielding.
  int64_t next_sleep_us() const {
    if (round_ < kSpins + kYields) return 0;
    uint32_t k = round_ - kSpins - kYields;
    int64_t us = int64_t{20} << (k < 6 ? k : 6);
    return us > 1000 ? 1000 : us;
  }

  // One waiting step. Callers that also have fds to watch use next_sleep_us() as their poll
  // timeout instead and call advance().
  void step() {
    if (round_ < kSpins) {
      for (int i = 0; i < 16; ++i) cpu_relax();
    } else if (round_ < kSpins + kYields) {
      sched_yield();
    } else {
      int64_t us = next_sleep_us();
      timespec ts{0, static_cast<long>(us * 1000)};
      nanosleep(&ts, nullptr);
    }
    advance();
  }
  void advance() {
    if (round_ < 1000000) ++round_;
  }

 private:
  uint32_t round_ = 0;
};

}  // namespace appliance
