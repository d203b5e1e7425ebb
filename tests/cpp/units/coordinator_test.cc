// Rank 0's negotiation as pure logic (coordinator/coordinator.h), with time passed in:
// readiness, cross-rank validation, plans and their fusion, groups, joins, ranks that left,
// process sets and the stall check.
#include <gtest/gtest.h>

#include "coordinator/coordinator.h"

namespace appliance {
namespace {

using Time = Coordinator::Time;
const Time t0 = Time{} + std::chrono::hours(1);
Time at_ms(double ms) { return t0 + std::chrono::microseconds(static_cast<int64_t>(ms * 1000)); }

Request req(const std::string& name, std::vector<int64_t> shape = {4}, DataType dt = DataType::kFloat32,
            OpKind kind = OpKind::kAllreduce) {
  Request q;
  q.name = name;
  q.sig.kind = kind;
  q.sig.dtype = dt;
  q.sig.shape = std::move(shape);
  return q;
}

CoordinatorOptions opts(int size, size_t threshold = 1 << 20) {
  CoordinatorOptions o;
  o.size = size;
  o.fusion_threshold = threshold;
  o.cycle_time_ms = 1.0;
  return o;
}

void all_ready(Coordinator& c, const Request& q, int size, Time now = t0) {
  for (int r = 0; r < size; ++r) c.on_request(r, q, now);
}

TEST(Coordinator, plans_nothing_until_every_rank_is_ready) {
  Coordinator c(opts(3));
  c.on_request(0, req("w"), t0);
  c.on_request(2, req("w"), t0);
  EXPECT_TRUE(c.take_plan(at_ms(100)).empty());
  EXPECT_EQ(c.next_deadline(), Time::max());
  c.on_request(1, req("w"), t0);
  std::vector<PlanEntry> plan = c.take_plan(t0);
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_TRUE(plan[0].ok);
  EXPECT_EQ(plan[0].names, std::vector<std::string>{"w"});
  EXPECT_TRUE(c.idle());
}

TEST(Coordinator, lateness_names_the_last_rank_once_per_overlapping_interval) {
  Coordinator c(opts(3));
  EXPECT_TRUE(c.take_late().empty());
  for (const char* n : {"a", "b"}) {  // ranks 0 and 1 ready for both at 0 and 1 ms
    c.on_request(0, req(n), t0);
    c.on_request(1, req(n), at_ms(1));
  }
  c.on_request(2, req("a"), at_ms(30));  // rank 2 last: 29 ms for "a", then 10 more for "b"
  c.on_request(2, req("b"), at_ms(40));
  c.on_request(2, req("c"), at_ms(41));
  c.on_request(0, req("c"), at_ms(45));
  c.on_request(1, req("c"), at_ms(50));  // rank 1 last for "c": 5 ms after rank 0
  std::vector<Late> late = c.take_late();
  ASSERT_EQ(late.size(), 2u);
  EXPECT_EQ(late[0].rank, 1);
  EXPECT_EQ(late[0].us, 5000u);
  EXPECT_EQ(late[1].rank, 2);
  EXPECT_EQ(late[1].us, 39000u);  // 1..40 ms: the overlap of "a" and "b" counted once
  EXPECT_TRUE(c.take_late().empty());  // taken
  size_t names = 0;
  for (const PlanEntry& e : c.take_plan(at_ms(50))) names += e.names.size();
  EXPECT_EQ(names, 3u);  // lateness changes nothing of the plans
}

TEST(Coordinator, entries_follow_readiness_order_not_submission_order) {
  Coordinator c(opts(2, 0));
  c.on_request(0, req("a"), t0);
  c.on_request(0, req("b"), t0);
  c.on_request(1, req("b"), t0);
  c.on_request(1, req("a"), t0);
  std::vector<PlanEntry> plan = c.take_plan(t0);
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].names[0], "b");
  EXPECT_EQ(plan[1].names[0], "a");
}

TEST(Coordinator, a_shape_mismatch_fails_the_name_naming_both_ranks) {
  Coordinator c(opts(3));
  c.on_request(0, req("w", {4, 3}), t0);
  c.on_request(1, req("w", {4, 3}), t0);
  c.on_request(2, req("w", {4, 2}), t0);
  std::vector<PlanEntry> plan = c.take_plan(t0);
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_FALSE(plan[0].ok);
  EXPECT_EQ(plan[0].error_code, Code::kMismatch);
  EXPECT_EQ(plan[0].error, "allreduce 'w': shape differs: rank 0 has [4, 3], rank 2 has [4, 2]");
}

TEST(Coordinator, dtype_op_scales_root_and_kind_must_agree) {
  auto mismatch = [](Request a, Request b) {
    Coordinator c(opts(2));
    c.on_request(0, a, t0);
    c.on_request(1, b, t0);
    std::vector<PlanEntry> plan = c.take_plan(t0);
    return plan.size() == 1 && !plan[0].ok ? plan[0].error : std::string();
  };
  Request base = req("t");
  Request dt = base;
  dt.sig.dtype = DataType::kFloat64;
  EXPECT_NE(mismatch(base, dt).find("dtype differs"), std::string::npos);
  Request op = base;
  op.sig.op = ReduceOp::kMax;
  EXPECT_NE(mismatch(base, op).find("reduce op differs"), std::string::npos);
  Request scale = base;
  scale.sig.postscale = 0.5;
  EXPECT_NE(mismatch(base, scale).find("scale factors"), std::string::npos);
  Request kind = base;
  kind.sig.kind = OpKind::kBroadcast;
  EXPECT_NE(mismatch(base, kind).find("operation differs"), std::string::npos);
  Request b0 = req("t", {4}, DataType::kFloat32, OpKind::kBroadcast), b1 = b0;
  b1.sig.root = 1;
  EXPECT_NE(mismatch(b0, b1).find("root rank differs"), std::string::npos);
  // allgather: only the first dimension may differ
  Request g0 = req("g", {2, 3}, DataType::kFloat32, OpKind::kAllgather), g1 = req("g", {5, 3}, DataType::kFloat32, OpKind::kAllgather);
  EXPECT_EQ(mismatch(g0, g1), "");
  Request g2 = req("g", {5, 2}, DataType::kFloat32, OpKind::kAllgather);
  EXPECT_NE(mismatch(g0, g2).find("shape beyond the first dimension"), std::string::npos);
}

TEST(Coordinator, allgather_and_alltoall_plans_carry_every_ranks_sizes) {
  Coordinator c(opts(2));
  c.on_request(0, req("g", {2, 3}, DataType::kFloat32, OpKind::kAllgather), t0);
  c.on_request(1, req("g", {5, 3}, DataType::kFloat32, OpKind::kAllgather), t0);
  Request a0 = req("a", {4}, DataType::kFloat32, OpKind::kAlltoall), a1 = a0;
  a1.splits = {3, 1};
  c.on_request(0, a0, t0);
  c.on_request(1, a1, t0);
  std::vector<PlanEntry> plan = c.take_plan(t0);
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].sizes, (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(plan[1].sizes, (std::vector<int64_t>{2, 2, 3, 1}));  // sender-major; rank 0 splits evenly
}

TEST(Coordinator, small_allreduces_that_agree_fuse_up_to_the_threshold) {
  Coordinator c(opts(2, 64));  // four float32[4] fit in 64 bytes
  for (int i = 0; i < 5; ++i) all_ready(c, req("f" + std::to_string(i)), 2);
  all_ready(c, req("d", {4}, DataType::kFloat64), 2);
  std::vector<PlanEntry> plan = c.take_plan(t0);
  ASSERT_EQ(plan.size(), 3u);
  EXPECT_EQ(plan[0].names, (std::vector<std::string>{"f0", "f1", "f2", "f3"}));
  EXPECT_EQ(plan[0].sigs.size(), 4u);
  EXPECT_EQ(plan[1].names, (std::vector<std::string>{"f4"}));
  EXPECT_EQ(plan[2].names, (std::vector<std::string>{"d"}));  // another dtype: its own entry
}

TEST(Coordinator, an_allreduce_over_the_member_limit_runs_alone) {
  CoordinatorOptions o = opts(2, 1 << 20);
  o.fusion_member_bytes = 32;  // float32[8] is the largest fused
  Coordinator c(o);
  all_ready(c, req("a"), 2);
  all_ready(c, req("big", {16}), 2);
  all_ready(c, req("b", {8}), 2);
  std::vector<PlanEntry> plan = c.take_plan(t0);
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].names, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(plan[1].names, (std::vector<std::string>{"big"}));
  o.fusion_member_bytes = 0;  // no limit: everything below the threshold fuses
  Coordinator all(o);
  for (const char* n : {"a", "big", "b"}) all_ready(all, req(n, {16}), 2);
  EXPECT_EQ(all.take_plan(t0).size(), 1u);
  o.fusion_member_bytes = 32;  // CUDA tensors: no member limit (a device copy costs less than a launch)
  Coordinator gpu(o);
  for (const char* n : {"a", "big", "b"}) {
    Request q = req(n, {16});
    q.sig.device = 0;
    all_ready(gpu, q, 2);
  }
  EXPECT_EQ(gpu.take_plan(t0).size(), 1u);
}

TEST(Coordinator, a_threshold_of_zero_disables_fusion) {
  Coordinator c(opts(2, 0));
  for (int i = 0; i < 3; ++i) all_ready(c, req("f" + std::to_string(i)), 2);
  EXPECT_EQ(c.take_plan(t0).size(), 3u);
}

TEST(Coordinator, waits_up_to_a_cycle_for_more_while_another_name_is_partly_ready) {
  Coordinator c(opts(2));
  all_ready(c, req("ready"), 2, t0);
  c.on_request(0, req("coming"), t0);
  EXPECT_TRUE(c.take_plan(at_ms(0.5)).empty());
  EXPECT_EQ(c.next_deadline(), at_ms(1.0));
  std::vector<PlanEntry> plan = c.take_plan(at_ms(1.0));
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0].names[0], "ready");
}

TEST(Coordinator, a_group_is_planned_only_once_all_its_members_are_ready) {
  Coordinator c(opts(2));
  Request a = req("a"), b = req("b");
  a.sig.group_id = b.sig.group_id = 7;
  a.sig.group_size = b.sig.group_size = 2;
  all_ready(c, a, 2);
  EXPECT_TRUE(c.take_plan(at_ms(10)).empty());
  all_ready(c, b, 2);
  std::vector<PlanEntry> plan = c.take_plan(at_ms(10));
  ASSERT_EQ(plan.size(), 1u);  // fused: same dtype and op
  EXPECT_EQ(plan[0].names, (std::vector<std::string>{"a", "b"}));
}

TEST(Coordinator, a_joined_rank_counts_as_ready_for_allreduce_and_contributes_zeros) {
  Coordinator c(opts(3));
  Request join = req("__join__", {}, DataType::kUInt8, OpKind::kJoin);
  c.on_request(2, join, t0);
  c.on_request(0, req("w"), t0);
  c.on_request(1, req("w"), t0);
  std::vector<PlanEntry> plan = c.take_plan(t0);
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_TRUE(plan[0].ok);
  EXPECT_EQ(plan[0].joined, (std::vector<uint8_t>{0, 0, 1}));
}

TEST(Coordinator, other_kinds_fail_while_a_rank_has_joined) {
  Coordinator c(opts(2));
  c.on_request(1, req("__join__", {}, DataType::kUInt8, OpKind::kJoin), t0);
  c.on_request(0, req("b", {4}, DataType::kFloat32, OpKind::kBroadcast), t0);
  std::vector<PlanEntry> plan = c.take_plan(t0);
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_FALSE(plan[0].ok);
  EXPECT_NE(plan[0].error.find("cannot run while rank(s) [1] have joined"), std::string::npos) << plan[0].error;
}

TEST(Coordinator, join_completes_when_every_rank_joined_naming_the_last) {
  Coordinator c(opts(2));
  Request join = req("__join__", {}, DataType::kUInt8, OpKind::kJoin);
  c.on_request(1, join, t0);
  c.on_request(0, join, t0);
  std::vector<PlanEntry> plan = c.take_plan(t0);
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0].kind, OpKind::kJoin);
  EXPECT_EQ(plan[0].joined_last, 0);
}

TEST(Coordinator, a_rank_that_left_fails_the_names_it_never_submitted) {
  Coordinator c(opts(3));
  c.on_request(0, req("w"), t0);
  c.on_request(1, req("w"), t0);
  c.on_rank_left(2);
  std::vector<PlanEntry> plan = c.take_plan(t0);
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_FALSE(plan[0].ok);
  EXPECT_EQ(plan[0].error_code, Code::kAborted);
  EXPECT_NE(plan[0].error.find("rank(s) [2] shut down without submitting it"), std::string::npos) << plan[0].error;
}

TEST(Coordinator, a_process_set_completes_with_its_members_and_speaks_of_its_ranks) {
  Coordinator c(opts(4));
  EXPECT_EQ(c.add_process_set(1, {3, 1}), "");
  EXPECT_NE(c.add_process_set(1, {0}), "");
  EXPECT_NE(c.add_process_set(0, {0}), "");
  EXPECT_NE(c.add_process_set(2, {0, 4}), "");
  Request g0 = req("ps1/g", {2}, DataType::kFloat32, OpKind::kAllgather), g1 = req("ps1/g", {6}, DataType::kFloat32, OpKind::kAllgather);
  g0.sig.process_set = g1.sig.process_set = 1;
  c.on_request(3, g1, t0);
  EXPECT_TRUE(c.take_plan(t0).empty());
  c.on_request(1, g0, t0);
  std::vector<PlanEntry> plan = c.take_plan(t0);
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_TRUE(plan[0].ok) << plan[0].error;
  EXPECT_EQ(plan[0].sizes, (std::vector<int64_t>{2, 6}));  // member order: rank 1, rank 3
}

TEST(Coordinator, a_request_for_an_unknown_process_set_fails_as_invalid) {
  Coordinator c(opts(2));
  Request q = req("ps9/w");
  q.sig.process_set = 9;
  c.on_request(0, q, t0);
  std::vector<PlanEntry> plan = c.take_plan(t0);
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_FALSE(plan[0].ok);
  EXPECT_EQ(plan[0].error_code, Code::kInvalid);
}

TEST(Coordinator, the_stall_check_reports_missing_ranks_then_aborts_blaming_the_lowest) {
  CoordinatorOptions o = opts(3);
  o.stall_check_s = 60;
  o.stall_shutdown_s = 300;
  Coordinator c(o);
  c.on_request(0, req("w"), t0);
  Status abort;
  EXPECT_TRUE(c.stall_warnings(t0 + std::chrono::seconds(59), &abort).empty());
  EXPECT_EQ(c.next_stall_event(), t0 + std::chrono::seconds(60));
  std::vector<std::string> lines = c.stall_warnings(t0 + std::chrono::seconds(61), &abort);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[0].find("waits for rank(s) [1, 2]"), std::string::npos) << lines[0];
  EXPECT_NE(lines[1].find("allreduce 'w' waited 61 s for rank(s) [1, 2] (submitted by [0])"), std::string::npos) << lines[1];
  EXPECT_TRUE(abort.ok());
  EXPECT_TRUE(c.stall_warnings(t0 + std::chrono::seconds(100), &abort).empty());  // one report per period
  c.stall_warnings(t0 + std::chrono::seconds(300), &abort);
  EXPECT_EQ(abort.code, Code::kStalled);
  EXPECT_EQ(abort.origin_rank, 1);
}

TEST(Coordinator, with_the_stall_check_disabled_nothing_is_reported_but_the_shutdown_still_comes) {
  CoordinatorOptions o = opts(2);
  o.stall_check_disable = true;  // HOROVOD_STALL_CHECK_DISABLE: stall_check_s no longer counts
  o.stall_check_s = 60;
  o.stall_shutdown_s = 300;
  Coordinator c(o);
  c.on_request(0, req("w"), t0);
  Status abort;
  EXPECT_EQ(c.next_stall_event(), t0 + std::chrono::seconds(300));
  EXPECT_TRUE(c.stall_warnings(t0 + std::chrono::seconds(61), &abort).empty());
  EXPECT_TRUE(abort.ok());
  c.stall_warnings(t0 + std::chrono::seconds(300), &abort);
  EXPECT_EQ(abort.code, Code::kStalled);
}

}  // namespace
}  // namespace appliance
