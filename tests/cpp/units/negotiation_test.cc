// What makes steady-state negotiation cheap: the response cache (coordinator/response_cache.h)
// and the control messages that carry its ids (engine/messages.h).
#include <gtest/gtest.h>

#include "coordinator/response_cache.h"
#include "engine/messages.h"

namespace appliance {
namespace {

Signature sig(std::vector<int64_t> shape, OpKind kind = OpKind::kAllreduce) {
  Signature s;
  s.kind = kind;
  s.shape = std::move(shape);
  return s;
}

TEST(ResponseCache, gives_a_repeated_name_and_signature_the_same_id) {
  ResponseCache c(8);
  const uint32_t id = c.put("w", sig({4}));
  ASSERT_NE(id, 0u);
  EXPECT_EQ(c.put("w", sig({4})), id);
  EXPECT_EQ(c.lookup("w", sig({4})), id);
  ASSERT_NE(c.get(id), nullptr);
  EXPECT_EQ(c.get(id)->name, "w");
}

TEST(ResponseCache, a_new_signature_for_a_known_name_gets_a_new_id_and_the_old_one_is_unknown) {
  ResponseCache c(8);
  const uint32_t old_id = c.put("w", sig({4}));
  const uint32_t new_id = c.put("w", sig({5}));
  EXPECT_NE(new_id, old_id);
  EXPECT_EQ(c.get(old_id), nullptr);
  EXPECT_EQ(c.lookup("w", sig({4})), 0u);
  EXPECT_EQ(c.size(), 1u);
}

TEST(ResponseCache, evicts_the_least_recently_used_and_never_reuses_an_id) {
  ResponseCache c(2);
  const uint32_t a = c.put("a", sig({1})), b = c.put("b", sig({1}));
  c.put("a", sig({1}));  // a is now the most recent
  const uint32_t d = c.put("d", sig({1}));
  EXPECT_EQ(c.get(b), nullptr);
  EXPECT_NE(c.get(a), nullptr);
  EXPECT_GT(d, b);
  EXPECT_EQ(c.size(), 2u);
}

TEST(ResponseCache, caches_only_rank_invariant_kinds_and_nothing_when_disabled) {
  ResponseCache c(8);
  EXPECT_EQ(c.put("g", sig({4}, OpKind::kAllgather)), 0u);  // sizes differ per rank
  Signature ps = sig({4});
  ps.process_set = 1;
  EXPECT_EQ(c.put("ps1/w", ps), 0u);
  ResponseCache off(0);
  EXPECT_FALSE(off.enabled());
  EXPECT_EQ(off.put("w", sig({4})), 0u);
}

TEST(ControlMessages, a_ready_message_round_trips_requests_and_ids) {
  ReadyMsg m;
  m.epoch = 42;
  Request q;
  q.name = "w";
  q.sig = sig({2, 3});
  q.splits = {1, 1};
  m.full.push_back(q);
  m.ids = {7, 9};
  std::vector<uint8_t> b = encode_ready(m);
  EXPECT_EQ(peek_ctrl_type(b, "rank 1"), CtrlType::kReady);
  ReadyMsg back = decode_ready(b, "rank 1");
  EXPECT_EQ(back.epoch, 42u);
  ASSERT_EQ(back.full.size(), 1u);
  EXPECT_EQ(back.full[0].name, "w");
  EXPECT_EQ(back.full[0].sig, q.sig);
  EXPECT_EQ(back.full[0].splits, q.splits);
  EXPECT_EQ(back.ids, m.ids);
}

TEST(ControlMessages, a_plan_of_cached_names_travels_as_ids_and_resolves_against_the_cache) {
  ResponseCache sender(8), receiver(8);
  sender.put("w", sig({4}));
  receiver.put("w", sig({4}));
  Plan p;
  p.seq = 3;
  PlanEntry e;
  e.names = {"w"};
  e.sigs = {sig({4})};
  p.entries.push_back(e);
  std::vector<uint8_t> cached = encode_plan(p, sender);
  Plan back = decode_plan(cached, receiver, 2, "rank 0");
  EXPECT_EQ(back.seq, 3u);
  ASSERT_EQ(back.entries.size(), 1u);
  EXPECT_EQ(back.entries[0].names, e.names);
  EXPECT_EQ(back.entries[0].sigs[0], e.sigs[0]);
  std::vector<uint8_t> full = encode_plan(p, ResponseCache(0));
  EXPECT_GT(full.size(), cached.size());
  EXPECT_EQ(decode_plan(full, ResponseCache(0), 2, "rank 0").entries[0].names, e.names);
}

TEST(ControlMessages, a_plan_carries_its_lateness_rows_and_refuses_unknown_ranks) {
  Plan p;
  p.seq = 1;
  p.late = {Late{1, 40000}, Late{0, 7}};
  Plan back = decode_plan(encode_plan(p, ResponseCache(0)), ResponseCache(0), 2, "rank 0");
  ASSERT_EQ(back.late.size(), 2u);
  EXPECT_EQ(back.late[0].rank, 1);
  EXPECT_EQ(back.late[0].us, 40000u);
  EXPECT_EQ(back.late[1].rank, 0);
  p.late = {Late{2, 1}};
  EXPECT_THROW(decode_plan(encode_plan(p, ResponseCache(0)), ResponseCache(0), 2, "rank 0"), Error);
  UpMsg u;
  u.ids = {3, 4};
  u.late = {Late{1, 5}};  // a row per id: the missing one says nobody waited
  UpMsg ub = decode_up(encode_up(u), 2, "rank 1");
  ASSERT_EQ(ub.late.size(), 2u);
  EXPECT_EQ(ub.late[0].us, 5u);
  EXPECT_EQ(ub.late[1].us, UINT32_MAX);
}

TEST(ControlMessages, truncated_or_unknown_messages_are_protocol_errors) {
  ReadyMsg m;
  m.ids = {1, 2, 3};
  std::vector<uint8_t> b = encode_ready(m);
  b.pop_back();
  EXPECT_THROW(decode_ready(b, "rank 1"), Error);
  EXPECT_THROW(peek_ctrl_type({99}, "rank 1"), Error);
  EXPECT_THROW(peek_ctrl_type({}, "rank 1"), Error);
  EXPECT_EQ(decode_notice(encode_notice({"a", "b"}), "rank 0"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(decode_resend(encode_resend({4, 5}), "rank 0"), (std::vector<uint32_t>{4, 5}));
}

}  // namespace
}  // namespace appliance
