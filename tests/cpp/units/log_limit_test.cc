// LogLimiter (common/log_limit.h): a few lines per source, a cap over all sources, and one
// summary per interval of what was left out. Time is passed in.
#include <gtest/gtest.h>

#include "common/log_limit.h"

namespace appliance {
namespace {

using Time = LogLimiter::Time;
const Time t0 = Time{} + std::chrono::hours(1);
Time at_s(int s) { return t0 + std::chrono::seconds(s); }

TEST(LogLimiter, lets_each_source_say_a_few_lines_then_counts_the_rest) {
  LogLimiter l(2, 20, std::chrono::seconds(60));
  EXPECT_EQ(l.admit("10.0.0.1", "one", t0), std::vector<std::string>{"one"});
  EXPECT_EQ(l.admit("10.0.0.1", "two", t0), std::vector<std::string>{"two"});
  EXPECT_TRUE(l.admit("10.0.0.1", "three", t0).empty());
  EXPECT_EQ(l.admit("10.0.0.2", "other", t0), std::vector<std::string>{"other"});
  EXPECT_EQ(l.next_flush(), at_s(60));
}

TEST(LogLimiter, caps_all_sources_together) {
  LogLimiter l(3, 4, std::chrono::seconds(60));
  int printed = 0;
  for (int i = 0; i < 10; ++i) printed += static_cast<int>(l.admit("10.0.0." + std::to_string(i), "x", t0).size());
  EXPECT_EQ(printed, 4);
}

TEST(LogLimiter, says_once_per_interval_how_many_lines_it_left_out_and_from_where) {
  LogLimiter l(1, 20, std::chrono::seconds(60));
  l.admit("10.0.0.1", "a", t0);
  l.admit("10.0.0.1", "b", t0);
  l.admit("10.0.0.1", "c", t0);
  EXPECT_TRUE(l.flush(at_s(59)).empty());
  std::vector<std::string> out = l.flush(at_s(60));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_NE(out[0].find("left out 2 more such line(s) in the last 60 s, from 1 source(s): 10.0.0.1 (2)"),
            std::string::npos) << out[0];
  EXPECT_EQ(l.next_flush(), Time::max());
  // A new interval: the source may speak again; a summary precedes it when one is due.
  EXPECT_EQ(l.admit("10.0.0.1", "d", at_s(61)), std::vector<std::string>{"d"});
}

TEST(LogLimiter, drain_says_what_was_left_out_before_the_interval_ends) {
  LogLimiter l(1, 20, std::chrono::seconds(60));
  l.admit("10.0.0.1", "a", t0);
  l.admit("10.0.0.1", "b", t0);
  std::vector<std::string> out = l.drain(at_s(5));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_NE(out[0].find("left out 1 more"), std::string::npos) << out[0];
  EXPECT_TRUE(l.drain(at_s(6)).empty());
}

TEST(LogLimiter, a_source_is_an_address_without_its_port) {
  EXPECT_EQ(LogLimiter::source_of("10.1.2.3:5555"), "10.1.2.3");
  EXPECT_EQ(LogLimiter::source_of("10.1.2.3"), "10.1.2.3");
}

}  // namespace
}  // namespace appliance
