// The negotiation's CPU time (see profile.h).
#include "engine/profile.h"

#include <algorithm>

namespace appliance {

void NegotiationProfile::set(bool on) {
  if (on && clock_read_ns_.load() == 0) {
    constexpr int kReads = 200;
    const uint64_t t0 = thread_cpu_ns();
    for (int i = 0; i < kReads; ++i) (void)thread_cpu_ns();
    clock_read_ns_.store(std::max<uint64_t>(1, (thread_cpu_ns() - t0) / kReads));
  }
  on_.store(on);
}

void NegotiationProfile::count(const Mark& m, bool announced) {
  if (!announced && moved() == m.moved) return;
  // Less the plans and the clock reads themselves: the turn's own and those around its plans.
  const int64_t own = static_cast<int64_t>(thread_cpu_ns() - m.cpu - (plan_ns_ - m.plans)) -
                      static_cast<int64_t>((1 + plan_reads_ - m.reads) * clock_read_ns_.load(std::memory_order_relaxed));
  ns_.fetch_add(static_cast<uint64_t>(std::max<int64_t>(0, own)), std::memory_order_relaxed);
  turns_.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace appliance
