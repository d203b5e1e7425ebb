// The negotiation protocols (engine/negotiator.h) as pure logic: a VirtualJob (tests/cpp/virtual)
// wires N negotiators of one protocol by in-memory links, and every protocol must meet the same
// specification: the same plans in the same order on every rank whatever order ranks submit in,
// cache ids in steady state, mismatches and stalls named on every rank, joins, process sets, and
// ranks that leave.
#include <gtest/gtest.h>

#include <map>

#include "engine/star_negotiator.h"
#include "engine/tree_negotiator.h"
#include "virtual/virtual_job.h"

namespace appliance {
namespace {

using Time = Negotiator::Time;
const Time t0 = Time{} + std::chrono::hours(1);
Time at_s(double s) { return t0 + std::chrono::microseconds(static_cast<int64_t>(s * 1e6)); }

Request req(const std::string& name, std::vector<int64_t> shape = {4}, OpKind kind = OpKind::kAllreduce) {
  Request q;
  q.name = name;
  q.sig.kind = kind;
  q.sig.shape = std::move(shape);
  if (kind == OpKind::kJoin || kind == OpKind::kBarrier) q.sig.shape.clear();
  return q;
}

struct Protocol {
  const char* name;
  VirtualJob::Factory make;
};

std::vector<Protocol> protocols() {
  return {
      {"star", [](const NegotiatorOptions& o) { return std::make_unique<StarNegotiator>(o, nullptr); }},
      {"tree", [](const NegotiatorOptions& o) { return std::make_unique<TreeNegotiator>(o, nullptr); }},
  };
}

NegotiatorOptions options(size_t fusion = 0) {
  NegotiatorOptions o;
  o.fusion_threshold = fusion;
  o.cycle_time_ms = 1.0;
  o.stall_check_s = 10;
  o.stall_shutdown_s = 30;
  return o;
}

class Negotiation : public ::testing::TestWithParam<Protocol> {
 protected:
  std::unique_ptr<VirtualJob> job(int size, NegotiatorOptions o = options()) {
    return std::make_unique<VirtualJob>(size, o, GetParam().make);
  }
};

TEST_P(Negotiation, every_rank_runs_the_same_plans_in_the_same_order_whatever_order_it_submitted_in) {
  for (int size : {2, 3, 5, 8}) {
    auto j = job(size);
    for (int r = 0; r < size; ++r) {
      std::vector<Request> mine{req("a"), req("b"), req("c")};
      std::rotate(mine.begin(), mine.begin() + r % 3, mine.end());
      j->submit(r, mine, t0);
    }
    j->settle(t0);
    ASSERT_EQ(j->order(0).size(), 3u) << size;
    for (int r = 1; r < size; ++r) EXPECT_EQ(j->order(r), j->order(0)) << "rank " << r << " of " << size;
  }
}

TEST_P(Negotiation, a_repeated_name_and_signature_travels_as_a_cache_id) {
  auto j = job(4);
  for (int step = 0; step < 3; ++step) {
    for (int r = 0; r < 4; ++r) j->submit(r, {req("w"), req("b", {2})}, at_s(step));
    j->settle(at_s(step));
  }
  for (int r = 0; r < 4; ++r) EXPECT_EQ(j->order(r).size(), 6u);
  // Rank 1's second and third steps were announced as ids.
  EXPECT_EQ(j->negotiator(1).ready_ids(), 4u);
}

TEST_P(Negotiation, a_mismatch_fails_the_name_on_every_rank_naming_both_sides) {
  auto j = job(3);
  for (int step = 0; step < 2; ++step) {  // the second step: cached on ranks 0 and 1
    for (int r = 0; r < 3; ++r) j->submit(r, {req("w", {step == 1 && r == 2 ? 5 : 4})}, at_s(step));
    j->settle(at_s(step));
  }
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(j->order(r), (std::vector<std::string>{"w", "!w"})) << r;
    const PlanEntry& e = j->plans(r).back().entries.back();
    EXPECT_EQ(e.error_code, Code::kMismatch);
    EXPECT_NE(e.error.find("rank 2"), std::string::npos) << e.error;
  }
}

TEST_P(Negotiation, a_stall_is_reported_on_every_rank_naming_the_missing_one_then_aborts) {
  auto j = job(4);
  for (int step = 0; step < 2; ++step) {  // cached from the second step on
    for (int r = 0; r < 4; ++r)
      if (step == 0 || r != 3) j->submit(r, {req("w")}, at_s(step));
    j->settle(at_s(step));
  }
  for (double s = 2; s <= 13; s += 0.5) {
    j->tick(at_s(s));
    j->settle(at_s(s));
  }
  for (int r = 0; r < 4; ++r) {
    ASSERT_FALSE(j->log(r).empty()) << "rank " << r << " printed no stall report";
    EXPECT_NE(j->log(r)[0].find("rank(s) [3]"), std::string::npos) << j->log(r)[0];
  }
  EXPECT_TRUE(j->abort(0).ok());
  for (double s = 13; s <= 33; s += 0.5) {
    j->tick(at_s(s));
    j->settle(at_s(s));
  }
  ASSERT_FALSE(j->abort(0).ok());
  EXPECT_EQ(j->abort(0).code, Code::kStalled);
  EXPECT_EQ(j->abort(0).origin_rank, 3);
}

TEST_P(Negotiation, joined_ranks_contribute_zeros_to_allreduces_and_the_join_names_the_last) {
  auto j = job(3);
  for (int step = 0; step < 2; ++step) {
    for (int r = 0; r < 3; ++r) j->submit(r, {req("w")}, at_s(step));
    j->settle(at_s(step));
  }
  j->submit(1, {req("__join__", {}, OpKind::kJoin)}, at_s(2));
  j->settle(at_s(2));
  for (int r : {0, 2}) j->submit(r, {req("w")}, at_s(2));
  j->settle(at_s(2));
  const PlanEntry& e = j->plans(0).back().entries.back();
  ASSERT_TRUE(e.ok);
  EXPECT_EQ(e.joined, (std::vector<uint8_t>{0, 1, 0}));
  EXPECT_EQ(j->order(1), j->order(0));
  for (int r : {0, 2}) j->submit(r, {req("__join__", {}, OpKind::kJoin)}, at_s(3));
  j->settle(at_s(3));
  for (int r = 0; r < 3; ++r) {
    const PlanEntry& last = j->plans(r).back().entries.back();
    EXPECT_EQ(last.kind, OpKind::kJoin) << r;
    EXPECT_EQ(last.joined_last, 2) << r;
  }
}

TEST_P(Negotiation, process_set_ops_complete_when_their_members_are_ready) {
  auto j = job(4);
  j->add_process_set(1, {1, 3});
  Request q = req("ps1/x");
  q.sig.process_set = 1;
  for (int r : {1, 3}) j->submit(r, {q}, t0);
  j->settle(t0);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(j->order(r), std::vector<std::string>{"ps1/x"}) << r;
}

TEST_P(Negotiation, a_rank_that_left_fails_what_it_never_submitted) {
  auto j = job(3);
  for (int r = 0; r < 3; ++r) j->submit(r, {req("w")}, t0);
  j->settle(t0);
  j->leave(2, at_s(1));
  for (int r : {0, 1}) j->submit(r, {req("w")}, at_s(1));
  j->settle(at_s(1));
  for (int r : {0, 1}) {
    const PlanEntry& e = j->plans(r).back().entries.back();
    EXPECT_FALSE(e.ok) << r;
    EXPECT_EQ(e.error_code, Code::kAborted);
    EXPECT_NE(e.error.find("rank(s) [2] shut down"), std::string::npos) << e.error;
  }
}

TEST_P(Negotiation, rank_0_leaving_ends_negotiation_everywhere) {
  auto j = job(4);
  j->leave(0, t0);
  j->settle(t0);
  for (int r = 1; r < 4; ++r) EXPECT_TRUE(j->coordinator_gone(r)) << r;
}

TEST_P(Negotiation, ops_ready_together_fuse_into_one_entry) {
  auto j = job(2, options(1 << 20));
  for (int step = 0; step < 2; ++step) {
    for (int r = 0; r < 2; ++r) j->submit(r, {req("a"), req("b"), req("c")}, at_s(step));
    j->settle(at_s(step));
    j->tick(at_s(step + 0.5));
    j->settle(at_s(step + 0.5));
  }
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(j->plans(r).size(), 2u) << r;
    EXPECT_EQ(j->plans(r)[1].entries.size(), 1u);
    EXPECT_EQ(j->plans(r)[1].entries[0].names.size(), 3u);
  }
}

TEST_P(Negotiation, a_cache_smaller_than_a_step_still_runs_each_name_once_in_one_order) {
  NegotiatorOptions o = options();
  o.cache_capacity = 3;
  auto j = job(6, o);
  for (int step = 0; step < 4; ++step) {
    for (int r = 0; r < 6; ++r) {
      std::vector<Request> mine;
      for (int k = 0; k < 5; ++k) mine.push_back(req("t" + std::to_string((k + r) % 5)));
      j->submit(r, mine, at_s(step));
    }
    j->settle(at_s(step));
    j->tick(at_s(step + 0.5));
    j->settle(at_s(step + 0.5));
  }
  for (int r = 0; r < 6; ++r) {
    EXPECT_EQ(j->order(r), j->order(0)) << r;
    EXPECT_EQ(j->order(r).size(), 20u) << r;
  }
}

TEST_P(Negotiation, ranks_ready_at_very_different_times_agree_once_the_last_is_ready) {
  auto j = job(7);
  for (int step = 0; step < 3; ++step) {
    for (int r = 6; r >= 0; --r) {  // one rank at a time, each step; the tree sees partial subtrees
      j->submit(r, {req("w"), req("v", {3})}, at_s(step + 0.01 * r));
      j->settle(at_s(step + 0.01 * r));
    }
    j->tick(at_s(step + 0.5));
    j->settle(at_s(step + 0.5));
  }
  for (int r = 0; r < 7; ++r) EXPECT_EQ(j->order(r).size(), 6u) << r;
  for (int r = 1; r < 7; ++r) EXPECT_EQ(j->order(r), j->order(0)) << r;
}

// Lateness (Plan::late): the rank the others waited for, and for how long, on every rank's
// plans; overlapping names count once; the first (full) and the cached (tree: up the subtrees)
// occurrences alike.
TEST_P(Negotiation, plans_name_the_late_rank_and_how_long_the_others_waited_for_it) {
  const int size = 7, slow = 5;
  auto j = job(size);
  for (int step = 0; step < 3; ++step) {
    for (int r = 0; r < size; ++r)
      if (r != slow) j->submit(r, {req("w"), req("v", {3})}, at_s(step));
    j->settle(at_s(step));
    j->submit(slow, {req("w"), req("v", {3})}, at_s(step + 0.040));
    j->settle(at_s(step + 0.040));
    j->tick(at_s(step + 0.5));
    j->settle(at_s(step + 0.5));
  }
  for (int r = 0; r < size; ++r) {
    ASSERT_EQ(j->order(r).size(), 6u) << r;
    std::map<int, uint64_t> late;
    for (const Plan& p : j->plans(r))
      for (const Late& l : p.late) late[l.rank] += l.us;
    EXPECT_EQ(late.size(), 1u) << r;
    EXPECT_EQ(late[slow], 3u * 40000u) << "rank " << r << " sees 40 ms per step, once for both names";
  }
}

INSTANTIATE_TEST_SUITE_P(Protocols, Negotiation, ::testing::ValuesIn(protocols()),
                         [](const ::testing::TestParamInfo<Protocol>& p) { return std::string(p.param.name); });

}  // namespace
}  // namespace appliance

namespace appliance {
namespace {

// Per cached op, once the cache is warm: rank 0's messages and the hops to the plan.
struct Cost {
  double rank0_msgs, hops;
};
Cost cached_op_cost(const Protocol& p, int size) {
  const int ops = 4;
  VirtualJob warm(size, options(), p.make);
  for (int r = 0; r < size; ++r) warm.submit(r, {req("w")}, t0);
  warm.settle(t0);
  const uint64_t m0 = warm.sent(0) + warm.received(0);
  int hops = 0;
  for (int step = 1; step <= ops; ++step) {
    warm.reset_hops();
    for (int r = 0; r < size; ++r) warm.submit(r, {req("w")}, at_s(step));
    warm.settle(at_s(step));
    hops = std::max(hops, warm.max_plan_hops());
  }
  return Cost{double(warm.sent(0) + warm.received(0) - m0) / ops, double(hops)};
}

TEST(TreeNegotiation, rank_0_handles_the_same_few_messages_per_cached_op_at_any_size) {
  const Protocol tree = protocols()[1], star = protocols()[0];
  for (int size : {8, 64, 1024}) {
    const Cost t = cached_op_cost(tree, size), s = cached_op_cost(star, size);
    EXPECT_LE(t.rank0_msgs, 4.0) << size;               // two children: one UP each, one DOWN each
    EXPECT_EQ(s.rank0_msgs, 2.0 * (size - 1)) << size;  // the star: a READY in and a PLAN out per rank
  }
}

TEST(TreeNegotiation, hops_to_agree_grow_with_log2_of_the_size) {
  const Protocol tree = protocols()[1];
  for (int size : {2, 8, 64, 1024}) {
    int depth = 0;
    for (int r = size - 1; r > 0; r = tree_parent(r)) ++depth;
    EXPECT_LE(cached_op_cost(tree, size).hops, 2.0 * depth) << size;
  }
}

TEST(TreeNegotiation, the_tree_is_the_binary_heap) {
  EXPECT_EQ(tree_children(0, 5), (std::vector<int>{1, 2}));
  EXPECT_EQ(tree_children(1, 5), (std::vector<int>{3, 4}));
  EXPECT_EQ(tree_children(2, 5), std::vector<int>{});
  EXPECT_EQ(tree_parent(4), 1);
  EXPECT_EQ(tree_subtree(1, 10), (std::vector<int>{1, 3, 4, 7, 8, 9}));
}

}  // namespace
}  // namespace appliance
