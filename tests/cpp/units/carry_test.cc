// Carried allreduces in the tree negotiator alone (engine/negotiator.h's Carry): N negotiators
// wired by a VirtualJob, each lent a Carry whose inputs are the test's. A cached eligible
// allreduce yields one plan entry per rank carrying the reduction of every rank's input (the
// same bytes on every rank); a rank without an input, a mismatch, the slow mode and the DOWN's
// cap of carried bytes leave the entry to run its collective.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <map>

#include "collectives/reduce.h"
#include "engine/tree_negotiator.h"
#include "virtual/virtual_job.h"

namespace appliance {
namespace {

using Time = Negotiator::Time;
const Time t0 = Time{} + std::chrono::hours(1);
Time at_s(double s) { return t0 + std::chrono::microseconds(static_cast<int64_t>(s * 1e6)); }

constexpr int64_t kElems = 6;

Request allreduce(const std::string& name, ReduceOp op = ReduceOp::kSum, int64_t elems = kElems) {
  Request q;
  q.name = name;
  q.sig.kind = OpKind::kAllreduce;
  q.sig.dtype = DataType::kFloat32;
  q.sig.op = op;
  q.sig.shape = {elems};
  return q;
}

// Rank r's input of `name`: distinct values per rank and element, exact in float32.
std::vector<float> input(int rank, const std::string& name, int64_t elems = kElems) {
  std::vector<float> v(static_cast<size_t>(elems));
  for (int64_t i = 0; i < elems; ++i) v[i] = static_cast<float>((rank * 7 + i * 3 + name.size()) % 11) - 5.0f;
  return v;
}

struct CarrySetup {
  size_t op_bytes = 1 << 16, message_bytes = 1 << 20;
  std::function<bool(int rank, const std::string& name)> gives = [](int, const std::string&) { return true; };
};

VirtualJob::Factory carrying(const CarrySetup& setup) {
  return [setup](const NegotiatorOptions& o) {
    auto n = std::make_unique<TreeNegotiator>(o, nullptr);
    Carry c;
    c.op_bytes = setup.op_bytes;
    c.message_bytes = setup.message_bytes;
    const int rank = o.rank;
    auto gives = setup.gives;
    c.take = [rank, gives](const Request& req, std::vector<uint8_t>& out) {
      if (!gives(rank, req.name)) return false;
      const std::vector<float> v = input(rank, req.name, req.sig.numel());
      out.resize(v.size() * sizeof(float));
      std::memcpy(out.data(), v.data(), out.size());
      return true;
    };
    c.combine = [](const Signature& s, uint8_t* dst, const uint8_t* src) {
      reduce_into(dst, src, static_cast<size_t>(s.numel()), s.dtype, s.op == ReduceOp::kAverage ? ReduceOp::kSum : s.op);
    };
    n->set_carry(std::move(c));
    return n;
  };
}

NegotiatorOptions options() {
  NegotiatorOptions o;
  o.fusion_threshold = 1 << 20;
  o.cycle_time_ms = 1.0;
  o.stall_check_s = 10;
  o.stall_shutdown_s = 30;
  return o;
}

std::vector<float> expected(int size, const std::string& name, ReduceOp op, int64_t elems = kElems) {
  std::vector<float> acc = input(0, name, elems);
  for (int r = 1; r < size; ++r) {
    const std::vector<float> v = input(r, name, elems);
    for (size_t i = 0; i < acc.size(); ++i)
      acc[i] = op == ReduceOp::kMin ? std::min(acc[i], v[i]) : op == ReduceOp::kMax ? std::max(acc[i], v[i]) : acc[i] + v[i];
  }
  return acc;
}

std::vector<float> as_floats(const std::vector<uint8_t>& b) {
  std::vector<float> v(b.size() / sizeof(float));
  std::memcpy(v.data(), b.data(), v.size() * sizeof(float));
  return v;
}

// Every rank submits `reqs` at step `step`, and the job settles.
void step(VirtualJob& j, const std::vector<Request>& reqs, int step) {
  for (int r = 0; r < j.size(); ++r) j.submit(r, reqs, at_s(step));
  j.settle(at_s(step));
  j.tick(at_s(step + 0.5));  // past the cycle: whatever waits to fuse goes out
  j.settle(at_s(step + 0.5));
}

// Rank `rank`'s entries of the plans since plan `from`.
std::vector<PlanEntry> entries(const VirtualJob& j, int rank, size_t from) {
  std::vector<PlanEntry> out;
  for (size_t p = from; p < j.plans(rank).size(); ++p)
    for (const PlanEntry& e : j.plans(rank)[p].entries) out.push_back(e);
  return out;
}

TEST(CarriedAllreduce, a_cached_op_carries_the_reduction_of_every_ranks_input_to_every_rank) {
  for (int size : {2, 3, 5})
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax}) {
      VirtualJob j(size, options(), carrying(CarrySetup{}));
      step(j, {allreduce("w", op)}, 0);  // the first occurrence: through the coordinator, nothing carried
      for (int r = 0; r < size; ++r) {
        ASSERT_EQ(entries(j, r, 0).size(), 1u);
        EXPECT_TRUE(entries(j, r, 0)[0].result.empty());
      }
      std::vector<size_t> from;
      for (int r = 0; r < size; ++r) from.push_back(j.plans(r).size());
      step(j, {allreduce("w", op)}, 1);
      for (int r = 0; r < size; ++r) {
        const std::vector<PlanEntry> es = entries(j, r, from[r]);
        ASSERT_EQ(es.size(), 1u) << size << " ranks, rank " << r;
        EXPECT_EQ(es[0].names, std::vector<std::string>{"w"});
        EXPECT_EQ(as_floats(es[0].result), expected(size, "w", op)) << size << " ranks, rank " << r << ", op " << int(op);
      }
    }
}

TEST(CarriedAllreduce, a_rank_without_an_input_leaves_the_entry_to_run_its_collective) {
  for (int size : {2, 3, 5}) {
    CarrySetup s;
    s.gives = [size](int rank, const std::string&) { return rank != size - 1; };
    VirtualJob j(size, options(), carrying(s));
    step(j, {allreduce("w")}, 0);
    step(j, {allreduce("w")}, 1);
    for (int r = 0; r < size; ++r) {
      const std::vector<PlanEntry> es = entries(j, r, 0);
      ASSERT_EQ(es.size(), 2u) << size;
      EXPECT_TRUE(es[1].ok);
      EXPECT_TRUE(es[1].result.empty()) << size << " ranks, rank " << r;
    }
  }
}

TEST(CarriedAllreduce, a_mismatch_drops_the_carried_bytes_and_fails_the_name_everywhere) {
  for (int size : {2, 3, 5}) {
    VirtualJob j(size, options(), carrying(CarrySetup{}));
    step(j, {allreduce("w")}, 0);
    // Step 1: the last rank changes the shape (a mismatch); the others announce the cached id with bytes.
    for (int r = 0; r < size; ++r) j.submit(r, {allreduce("w", ReduceOp::kSum, r == size - 1 ? kElems + 1 : kElems)}, at_s(1));
    j.settle(at_s(1));
    // Step 2: every rank agrees again (a new signature for some: announced in full, no bytes).
    step(j, {allreduce("w")}, 2);
    for (int r = 0; r < size; ++r) {
      EXPECT_EQ(j.order(r), (std::vector<std::string>{"w", "!w", "w"})) << size << " ranks, rank " << r;
      for (const PlanEntry& e : entries(j, r, 0)) EXPECT_TRUE(e.result.empty()) << size << " ranks, rank " << r;
    }
    // Step 3: cached on every rank again: carried again.
    step(j, {allreduce("w")}, 3);
    for (int r = 0; r < size; ++r) EXPECT_EQ(as_floats(entries(j, r, 0).back().result), expected(size, "w", ReduceOp::kSum));
  }
}

TEST(CarriedAllreduce, ops_past_the_limit_or_not_eligible_carry_nothing) {
  CarrySetup s;
  s.op_bytes = kElems * sizeof(float) - 1;  // one byte short of "w"
  VirtualJob j(3, options(), carrying(s));
  const std::vector<Request> reqs{allreduce("w"), allreduce("a", ReduceOp::kAverage, 2), allreduce("d", ReduceOp::kAdasum, 2)};
  step(j, reqs, 0);
  step(j, reqs, 1);
  for (int r = 0; r < 3; ++r) {
    std::map<std::string, std::vector<float>> carried;
    for (const PlanEntry& e : entries(j, r, 0))
      if (!e.result.empty()) carried[e.names[0]] = as_floats(e.result);
    ASSERT_EQ(carried.size(), 1u) << "rank " << r;  // the small Average only, as its Sum (the divide comes after)
    EXPECT_EQ(carried["a"], expected(3, "a", ReduceOp::kSum, 2)) << "rank " << r;
  }
}

TEST(CarriedAllreduce, one_down_carries_at_most_its_cap_and_the_rest_run_their_collectives) {
  const size_t one = kElems * sizeof(float);
  for (int size : {2, 3, 5}) {
    CarrySetup s;
    s.message_bytes = 2 * one;  // two results per DOWN (and per UP)
    VirtualJob j(size, options(), carrying(s));
    const std::vector<Request> four{allreduce("a"), allreduce("b"), allreduce("c"), allreduce("d")};
    step(j, four, 0);
    const size_t from = j.plans(0).size();
    step(j, four, 1);
    std::vector<std::string> with, without;
    for (const PlanEntry& e : entries(j, 0, from)) {
      if (!e.result.empty()) {
        EXPECT_EQ(e.names.size(), 1u);
        EXPECT_EQ(as_floats(e.result), expected(size, e.names[0], ReduceOp::kSum));
        with.push_back(e.names[0]);
      } else {
        without.insert(without.end(), e.names.begin(), e.names.end());
      }
    }
    EXPECT_EQ(with.size(), 2u) << size;
    EXPECT_EQ(without.size(), 2u) << size;
    for (int r = 1; r < size; ++r) {
      EXPECT_EQ(j.order(r), j.order(0)) << size << " ranks, rank " << r;
      size_t carried = 0;
      for (const PlanEntry& e : entries(j, r, 0)) carried += e.result.size();
      EXPECT_EQ(carried, 2 * one) << size << " ranks, rank " << r;
    }
  }
}

}  // namespace
}  // namespace appliance
