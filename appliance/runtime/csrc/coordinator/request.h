// Requests and plans: what ranks tell the coordinator and what it answers.
//
// A Request is one rank's readiness for one tensor name, with everything that must agree
// across ranks (its Signature) and the per-rank parts that may differ (allgather's first
// dimension, alltoall's splits). A Plan is the coordinator's answer: entries every rank runs in
// order. Entries either succeed (possibly several fused names) or carry an error text (a
// mismatch) that fails those names' handles on every rank.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/types.h"
#include "wire/codec.h"

namespace appliance {

struct Signature {
  OpKind kind = OpKind::kAllreduce;
  DataType dtype = DataType::kFloat32;
  std::vector<int64_t> shape;
  ReduceOp op = ReduceOp::kSum;
  double prescale = 1.0, postscale = 1.0;
  int32_t root = 0;
  int32_t device = -1;  // -1 host, >= 0 CUDA device (only host vs CUDA must agree)
  uint32_t group_id = 0, group_size = 0;
  int32_t process_set = 0;  // 0 = every rank; otherwise an id registered on every rank (root, splits: set ranks)

  bool operator==(const Signature& o) const;
  bool operator!=(const Signature& o) const { return !(*this == o); }
  int64_t numel() const;
  int64_t row_elems() const;  // elements per first-dimension row (1 for a 1-D tensor)
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  bool cacheable() const;     // rank-invariant kinds whose readiness can travel as a cache id
  void encode(Writer& w) const;
  static Signature decode(Reader& r);
};

struct Request {
  std::string name;
  Signature sig;
  std::vector<int64_t> splits;  // alltoall: rows this rank sends to each rank (empty = even)

  void encode(Writer& w) const;
  static Request decode(Reader& r);
};

// Text for a cross-rank disagreement: "allreduce 'w.grad': shape differs: rank 0 [4, 3] vs
// rank 2 [4, 2]". Returns "" when a and b agree for their kind.
std::string describe_mismatch(const std::string& name, int rank_a, const Request& a, int rank_b,
                              const Request& b);

std::string shape_str(const std::vector<int64_t>& shape);

struct PlanEntry {
  bool ok = true;
  Code error_code = Code::kMismatch;  // when !ok: how the names below fail on every rank
  std::string error;                  // when !ok: why
  OpKind kind = OpKind::kAllreduce;
  std::vector<std::string> names;  // > 1 when fused (allreduce only)
  std::vector<Signature> sigs;     // one per name
  std::vector<int64_t> sizes;      // allgather: dim0 per rank; alltoall: P*P splits (row-major, sender-major)
  int32_t joined_last = -1;        // join: last rank that joined
  std::vector<uint8_t> joined;     // allreduce while some ranks joined: 1 for ranks that contribute zeros
  // A carried allreduce (engine/negotiator.h's Carry; one name): its reduced bytes, before the
  // postscale. Empty: the collective runs.
  std::vector<uint8_t> result;
};

// Lateness the coordinator saw since its previous plan: `rank` was the last one ready for
// entries the others had all been ready for, and they waited `us` microseconds for it (the
// union of those intervals per rank, so overlapping entries count once).
struct Late {
  int32_t rank = 0;
  uint32_t us = 0;
};

struct Plan {
  uint64_t seq = 0;
  std::vector<PlanEntry> entries;
  std::vector<Late> late;  // carried with the plan; each rank adds the rows naming it to its metrics
};

}  // namespace appliance
