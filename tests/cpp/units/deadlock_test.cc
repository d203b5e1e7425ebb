// The deadlock check (coordinator/deadlock.h): rank 0's coordinator's decision with time passed
// in (ranks that all wait on operations that can never complete, told apart from slow ranks,
// process sets, joins, progress), and both negotiation protocols carrying each rank's report to
// it (engine/negotiator.h's WaitReport) and its lines to every rank.
#include <gtest/gtest.h>

#include <cmath>

#include "coordinator/coordinator.h"
#include "engine/messages.h"
#include "engine/star_negotiator.h"
#include "engine/tree_negotiator.h"
#include "virtual/virtual_job.h"

namespace appliance {
namespace {

using Time = Coordinator::Time;
const Time t0 = Time{} + std::chrono::hours(1);
Time at_s(double s) { return t0 + std::chrono::microseconds(std::llround(s * 1e6)); }

Request req(const std::string& name, OpKind kind = OpKind::kAllreduce, int32_t set = 0) {
  Request q;
  q.name = name;
  q.sig.kind = kind;
  q.sig.process_set = set;
  if (kind != OpKind::kJoin && kind != OpKind::kBarrier) q.sig.shape = {4};
  return q;
}

CoordinatorOptions opts(int size, double deadlock_s = 5) {
  CoordinatorOptions o;
  o.size = size;
  o.deadlock_s = deadlock_s;
  return o;
}

bool has(const std::vector<std::string>& lines, const std::string& text) {
  for (const std::string& l : lines)
    if (l.find(text) != std::string::npos) return true;
  return false;
}

TEST(Deadlock, ranks_that_all_wait_on_different_names_are_named_after_the_deadlock_time) {
  Coordinator c(opts(2));
  c.on_request(0, req("a"), t0);
  c.on_request(1, req("b", OpKind::kBroadcast), t0);
  c.on_waiting(0, at_s(0.1), {});
  c.on_waiting(1, at_s(0.2), {});
  Status abort;
  EXPECT_TRUE(c.deadlock(at_s(5.1), &abort).empty());  // rank 1 has waited 4.9 s
  EXPECT_EQ(c.next_deadlock_check(), at_s(5.2));
  std::vector<std::string> lines = c.deadlock(at_s(5.2), &abort);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_NE(lines[0].find("rank(s) [0, 1]"), std::string::npos) << lines[0];
  EXPECT_NE(lines[1].find("rank 0 waits on: allreduce 'a'"), std::string::npos) << lines[1];
  EXPECT_NE(lines[2].find("rank 1 waits on: broadcast 'b' (root 0)"), std::string::npos) << lines[2];
  EXPECT_EQ(abort.code, Code::kStalled);
  EXPECT_EQ(abort.origin_rank, 0);
  EXPECT_NE(abort.message.find("rank 1 waits on: broadcast 'b'"), std::string::npos) << abort.message;
}

TEST(Deadlock, every_waiting_rank_stuck_with_the_group_is_named_even_before_its_own_time) {
  Coordinator c(opts(3));
  c.on_request(0, req("a"), t0);
  c.on_request(1, req("b"), t0);
  c.on_request(2, req("b"), t0);
  c.on_waiting(0, t0, {});
  c.on_waiting(1, t0, {});
  c.on_waiting(2, at_s(3), {});  // came later: 0 and 1 are deadlocked whatever it does
  Status abort;
  std::vector<std::string> lines = c.deadlock(at_s(5), &abort);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_TRUE(has(lines, "rank 2 waits on: allreduce 'b'"));
}

TEST(Deadlock, a_rank_that_is_not_waiting_is_slow_not_deadlocked) {
  Coordinator c(opts(3));
  c.on_request(0, req("a"), t0);
  c.on_request(1, req("a"), t0);
  c.on_waiting(0, t0, {});
  c.on_waiting(1, t0, {});  // rank 2 computes (a checkpoint): it may still submit 'a'
  Status abort;
  EXPECT_TRUE(c.deadlock(at_s(60), &abort).empty());
  EXPECT_TRUE(abort.ok());
}

TEST(Deadlock, different_orders_deadlock_even_when_one_of_them_waits_on_both) {
  Coordinator c(opts(2));
  c.on_request(0, req("a"), t0);  // rank 0: a, then b asynchronously, waits on a
  c.on_request(0, req("b"), t0);
  c.on_request(1, req("b2"), t0);
  c.on_waiting(0, t0, {});
  c.on_waiting(1, t0, {});
  Status abort;
  std::vector<std::string> lines = c.deadlock(at_s(5), &abort);
  EXPECT_TRUE(has(lines, "rank 0 waits on: allreduce 'a', allreduce 'b'")) << lines.size();
  EXPECT_EQ(abort.code, Code::kStalled);
}

TEST(Deadlock, progress_of_a_rank_starts_its_clock_again) {
  Coordinator c(opts(2));
  c.on_request(0, req("a"), t0);
  c.on_request(1, req("b"), t0);
  c.on_waiting(0, t0, {});
  c.on_waiting(1, t0, {});
  c.on_progress(0, at_s(3));  // a cached entry of the global set completed
  Status abort;
  EXPECT_TRUE(c.deadlock(at_s(5), &abort).empty());
  EXPECT_FALSE(c.deadlock(at_s(8), &abort).empty());
}

TEST(Deadlock, a_rank_waiting_on_nothing_known_here_is_not_counted) {
  Coordinator c(opts(2));
  c.on_request(0, req("a"), t0);
  c.on_waiting(0, t0, {});
  c.on_waiting(1, t0, {});  // its request is on its way
  Status abort;
  EXPECT_TRUE(c.deadlock(at_s(10), &abort).empty());
}

TEST(Deadlock, what_a_rank_announced_by_cache_id_comes_with_its_report) {
  Coordinator c(opts(2));
  c.on_waiting(0, t0, {req("a")});
  c.on_waiting(1, t0, {req("b")});
  Status abort;
  std::vector<std::string> lines = c.deadlock(at_s(5), &abort);
  EXPECT_TRUE(has(lines, "rank 1 waits on: allreduce 'b'"));
  c.on_waiting(1, t0, {req("a")});  // both on 'a': it completes (the tree plans it)
  abort = Status{};
  EXPECT_TRUE(c.deadlock(at_s(6), &abort).empty());
}

TEST(Deadlock, a_mismatch_within_a_process_set_is_named_while_the_rest_go_on) {
  Coordinator c(opts(4));
  ASSERT_EQ(c.add_process_set(1, {0, 1}), "");
  ASSERT_EQ(c.add_process_set(2, {2, 3}), "");
  c.on_request(0, req("ps1/a", OpKind::kAllreduce, 1), t0);
  c.on_request(1, req("ps1/b", OpKind::kAllreduce, 1), t0);
  c.on_waiting(0, t0, {});
  c.on_waiting(1, t0, {});
  for (int s = 1; s < 6; ++s) {  // set 2 keeps going
    c.on_request(2, req("ps2/x" + std::to_string(s), OpKind::kAllreduce, 2), at_s(s));
    c.on_request(3, req("ps2/x" + std::to_string(s), OpKind::kAllreduce, 2), at_s(s));
    c.take_plan(at_s(s));
  }
  Status abort;
  std::vector<std::string> lines = c.deadlock(at_s(5.5), &abort);
  EXPECT_TRUE(has(lines, "rank 1 waits on: allreduce 'ps1/b' in process set 1"));
  EXPECT_EQ(lines.size(), 3u);  // ranks 0 and 1 only
  EXPECT_EQ(abort.code, Code::kStalled);
}

TEST(Deadlock, an_operation_of_a_set_with_a_rank_that_is_not_waiting_may_still_complete) {
  Coordinator c(opts(3));
  ASSERT_EQ(c.add_process_set(1, {1, 2}), "");
  c.on_request(0, req("a"), t0);
  c.on_request(1, req("ps1/x", OpKind::kAllreduce, 1), t0);  // rank 2 will submit it, then 'a'
  c.on_waiting(0, t0, {});
  c.on_waiting(1, t0, {});
  Status abort;
  EXPECT_TRUE(c.deadlock(at_s(30), &abort).empty());
}

TEST(Deadlock, a_joined_rank_waits_on_the_join_and_counts_as_ready_for_allreduces) {
  Coordinator c(opts(3));
  c.on_request(0, req("__join__", OpKind::kJoin), t0);
  c.on_request(1, req("a"), t0);
  c.on_request(2, req("b"), t0);
  for (int r = 0; r < 3; ++r) c.on_waiting(r, t0, {});
  Status abort;
  std::vector<std::string> lines = c.deadlock(at_s(5), &abort);
  EXPECT_TRUE(has(lines, "rank 0 waits on: join"));
  EXPECT_TRUE(has(lines, "rank 2 waits on: allreduce 'b'"));

  Coordinator d(opts(3));  // rank 2 joined too: 'a' completes without it
  d.on_request(0, req("__join__", OpKind::kJoin), t0);
  d.on_request(2, req("__join__", OpKind::kJoin), t0);
  d.on_request(1, req("a"), t0);
  EXPECT_FALSE(d.take_plan(t0).empty());
}

TEST(Deadlock, no_check_when_the_deadlock_time_is_zero) {
  Coordinator c(opts(2, 0));
  c.on_request(0, req("a"), t0);
  c.on_request(1, req("b"), t0);
  c.on_waiting(0, t0, {});
  c.on_waiting(1, t0, {});
  Status abort;
  EXPECT_EQ(c.next_deadlock_check(), Time::max());
  EXPECT_TRUE(c.deadlock(at_s(600), &abort).empty());
}

TEST(Deadlock, a_rank_that_stops_waiting_leaves_the_group) {
  Coordinator c(opts(2));
  c.on_request(0, req("a"), t0);
  c.on_request(1, req("b"), t0);
  c.on_waiting(0, t0, {});
  c.on_waiting(1, t0, {});
  c.on_not_waiting(1);
  Status abort;
  EXPECT_TRUE(c.deadlock(at_s(10), &abort).empty());
}

TEST(WaitReport, reports_after_its_time_once_and_again_when_it_changes) {
  WaitReport w(2.5);
  Time told;
  EXPECT_FALSE(w.update(t0, at_s(1), &told));
  EXPECT_EQ(w.next(), at_s(2.5));
  EXPECT_TRUE(w.update(t0, at_s(2.5), &told));
  EXPECT_EQ(told, t0);
  EXPECT_FALSE(w.update(t0, at_s(4), &told));  // once
  EXPECT_TRUE(w.update(at_s(4), at_s(4), &told));  // something moved: no longer (not yet again)
  EXPECT_EQ(told, Time::max());
  EXPECT_TRUE(w.update(at_s(4), at_s(7), &told));
  EXPECT_EQ(told, at_s(4));
  EXPECT_TRUE(w.update(Time::max(), at_s(8), &told));
  EXPECT_EQ(told, Time::max());
  EXPECT_FALSE(w.active());
  WaitReport off(0);
  EXPECT_FALSE(off.update(t0, at_s(100), &told));
}

TEST(WaitReport, travels_in_ready_and_up_messages_and_a_bad_rank_is_a_protocol_error) {
  ReadyMsg m;
  EXPECT_EQ(decode_ready(encode_ready(m), "rank 1").waiting_ms, ReadyMsg::kNoNews);
  m.waiting_ms = 2600;
  EXPECT_EQ(decode_ready(encode_ready(m), "rank 1").waiting_ms, 2600);
  UpMsg u;
  u.waiting.push_back(UpMsg::Waiting{2, 2500, {req("a"), req("b", OpKind::kBroadcast)}});
  u.waiting.push_back(UpMsg::Waiting{1, ReadyMsg::kNotWaiting, {}});
  UpMsg back = decode_up(encode_up(u), 3, "rank 1");
  ASSERT_EQ(back.waiting.size(), 2u);
  EXPECT_EQ(back.waiting[0].rank, 2);
  EXPECT_EQ(back.waiting[0].ms, 2500);
  ASSERT_EQ(back.waiting[0].also.size(), 2u);
  EXPECT_EQ(back.waiting[0].also[1].sig.kind, OpKind::kBroadcast);
  EXPECT_EQ(back.waiting[1].ms, ReadyMsg::kNotWaiting);
  EXPECT_THROW(decode_up(encode_up(u), 2, "rank 1"), Error);  // rank 2 of a job of 2
}

// --- both protocols --------------------------------------------------------------------------

struct Protocol {
  const char* name;
  VirtualJob::Factory make;
};

class DeadlockNegotiation : public ::testing::TestWithParam<Protocol> {
 protected:
  std::unique_ptr<VirtualJob> job(int size) {
    NegotiatorOptions o;
    o.fusion_threshold = 0;
    o.stall_check_s = 10;
    o.stall_shutdown_s = 30;
    o.deadlock_s = 5;
    return std::make_unique<VirtualJob>(size, o, GetParam().make);
  }
};

TEST_P(DeadlockNegotiation, cached_operations_in_different_orders_fail_the_job_with_every_ranks_line) {
  for (int size : {2, 3}) {
    auto j = job(size);
    for (int r = 0; r < size; ++r) j->submit(r, {req("a")}, t0);  // 'a' and 'b' cached
    j->settle(t0);
    for (int r = 0; r < size; ++r) j->submit(r, {req("b")}, t0);
    j->settle(t0);
    // rank 0: a then b; the others: b then a; each waits on its first
    for (int r = 0; r < size; ++r) j->submit(r, {req(r == 0 ? "a" : "b")}, at_s(1));
    j->settle(at_s(1));
    for (double s = 1; s <= 7; s += 0.5) {
      for (int r = 0; r < size; ++r) j->waiting(r, at_s(1), at_s(s));
      j->tick(at_s(s));
      j->settle(at_s(s));
      if (!j->abort(0).ok()) {
        EXPECT_GE(s, 6.0) << "named before the deadlock time";
        break;
      }
    }
    ASSERT_EQ(j->abort(0).code, Code::kStalled) << size;
    for (int r = 0; r < size; ++r) {
      EXPECT_TRUE(has(j->log(r), "rank 0 waits on: allreduce 'a'")) << "rank " << r << " of " << size;
      EXPECT_TRUE(has(j->log(r), "rank " + std::to_string(size - 1) + " waits on: allreduce 'b'")) << r;
    }
  }
}

TEST_P(DeadlockNegotiation, a_slow_rank_is_not_a_deadlock) {
  auto j = job(3);
  for (int r = 0; r < 3; ++r) j->submit(r, {req("a")}, t0);
  j->settle(t0);
  for (int r = 0; r < 2; ++r) j->submit(r, {req("a")}, at_s(1));  // rank 2 checkpoints for 15 s
  j->settle(at_s(1));
  for (double s = 1; s <= 16; s += 0.5) {
    for (int r = 0; r < 2; ++r) j->waiting(r, at_s(1), at_s(s));
    j->tick(at_s(s));
    j->settle(at_s(s));
  }
  EXPECT_TRUE(j->abort(0).ok()) << j->abort(0).to_string();
  j->submit(2, {req("a")}, at_s(16));
  j->settle(at_s(16));
  for (int r = 0; r < 3; ++r) EXPECT_EQ(j->order(r).size(), 2u) << r;
  for (int r = 0; r < 2; ++r) j->waiting(r, Time::max(), at_s(16));
  j->settle(at_s(16));
  for (double s = 16; s <= 29; s += 1) {
    j->tick(at_s(s));
    j->settle(at_s(s));
  }
  EXPECT_TRUE(j->abort(0).ok()) << j->abort(0).to_string();
}

INSTANTIATE_TEST_SUITE_P(
    Protocols, DeadlockNegotiation,
    ::testing::Values(Protocol{"star", [](const NegotiatorOptions& o) { return std::make_unique<StarNegotiator>(o, nullptr); }},
                      Protocol{"tree", [](const NegotiatorOptions& o) { return std::make_unique<TreeNegotiator>(o, nullptr); }}),
    [](const ::testing::TestParamInfo<Protocol>& p) { return std::string(p.param.name); });

}  // namespace
}  // namespace appliance
