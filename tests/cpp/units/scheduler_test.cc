// The engine's pure policies: the scheduler's (engine/scheduler.h: who works when, one knob)
// and the control plane's heartbeat verdict (engine/control.h), with time passed in.
#include <gtest/gtest.h>

#include "engine/control.h"
#include "engine/scheduler.h"

namespace appliance {
namespace {

TEST(SchedulePolicy, one_knob_spin_us_decides_driving_spinning_and_parking) {
  SchedulePolicy on{100, 1000}, off{0, 1000};
  EXPECT_TRUE(on.callers_drive());
  EXPECT_FALSE(off.callers_drive());
  EXPECT_TRUE(on.spin_after_work(1050, 1000, true));
  EXPECT_FALSE(on.spin_after_work(1050, 1000, false));  // nobody waits: a computing caller keeps its core
  EXPECT_FALSE(on.spin_after_work(1200, 1000, true));   // spin_us passed since work
  EXPECT_FALSE(off.spin_after_work(1000, 1000, true));
  EXPECT_EQ(off.park_left(5000, 4999, true), 0);
}

TEST(SchedulePolicy, the_background_thread_parks_a_cycle_after_a_drive_and_while_one_lasts) {
  SchedulePolicy p{100, 1000};
  EXPECT_EQ(p.park_us(), 1000);
  EXPECT_EQ(p.park_left(10000, 0, true), 1000);        // a caller drives now
  EXPECT_EQ(p.park_left(10000, 9700, false), 700);     // left 300 us ago with its op done
  EXPECT_EQ(p.park_left(10000, 8000, false), 0);       // a cycle ago
  EXPECT_EQ((SchedulePolicy{5000, 1000}).park_us(), 5000);  // never shorter than the spin
}

TEST(SchedulePolicy, a_burst_is_unwaited_enqueues_close_together) {
  EXPECT_TRUE(SchedulePolicy::is_burst(1020, 1000, 1));
  EXPECT_FALSE(SchedulePolicy::is_burst(1020, 1000, 0));  // a synchronous loop waited for the last
  EXPECT_FALSE(SchedulePolicy::is_burst(1000 + SchedulePolicy::kBurstGapUs, 1000, 3));
  EXPECT_EQ((SchedulePolicy{100, 1000}).settle_limit_us(), 1000);
  EXPECT_EQ((SchedulePolicy{100, 50000}).settle_limit_us(), SchedulePolicy::kMaxSettleUs);
}

TEST(Heartbeats, the_peer_silent_the_longest_past_the_timeout_is_blamed) {
  using namespace std::chrono;
  const Clock::time_point t0 = Clock::time_point{} + hours(1);
  std::vector<Clock::time_point> last{t0, t0 - seconds(12), t0 - seconds(20), t0 - seconds(3)};
  EXPECT_EQ(heartbeat_verdict(last, {1, 2, 3}, t0, seconds(10)), 2);
  EXPECT_EQ(heartbeat_verdict(last, {1, 3}, t0, seconds(10)), 1);
  EXPECT_EQ(heartbeat_verdict(last, {3}, t0, seconds(10)), -1);
  EXPECT_EQ(heartbeat_verdict(last, {}, t0, seconds(10)), -1);
}

TEST(Heartbeats, a_quiet_link_beats_four_times_per_timeout_between_50_ms_and_1_s) {
  EXPECT_EQ(heartbeat_interval_ms(10), 1000);
  EXPECT_EQ(heartbeat_interval_ms(2), 500);
  EXPECT_EQ(heartbeat_interval_ms(0.1), 50);
}

}  // namespace
}  // namespace appliance
