// CpuBackend: plan entries on host memory through the algorithms in collectives/ (see
// cpu_backend.h).
#include "backends/cpu/cpu_backend.h"

#include <cstring>
#include <numeric>

#include "collectives/reduce.h"

namespace appliance {

namespace {
// The collective's step in the timeline (engine/timeline.h).
const char* collective_step(OpKind k) {
  switch (k) {
    case OpKind::kAllreduce: return "CPU_ALLREDUCE";
    case OpKind::kAllgather: return "CPU_ALLGATHER";
    case OpKind::kBroadcast: return "CPU_BROADCAST";
    case OpKind::kAlltoall: return "CPU_ALLTOALL";
    case OpKind::kReducescatter: return "CPU_REDUCESCATTER";
    default: return nullptr;
  }
}
}  // namespace

std::unique_ptr<Completion> CpuBackend::launch(const PlanEntry& e, const std::vector<OpState*>& ops) {
  execute(e, ops);
  return nullptr;
}

void CpuBackend::execute(const PlanEntry& e, const std::vector<OpState*>& ops) {
  if (e.kind != OpKind::kAllreduce || e.names.size() == 1) note(e, collective_step(e.kind));
  switch (e.kind) {
    case OpKind::kAllreduce: return do_allreduce(e, ops);
    case OpKind::kAllgather: return do_allgather(e, *ops.at(0));
    case OpKind::kBroadcast: return do_broadcast(e, *ops.at(0));
    case OpKind::kAlltoall: return do_alltoall(e, *ops.at(0));
    case OpKind::kReducescatter: return do_reducescatter(e, *ops.at(0));
    case OpKind::kBarrier: return barrier(comm_);
    case OpKind::kJoin:
      for (OpState* op : ops)
        if (op) op->value = e.joined_last;
      return;
  }
  APPLIANCE_ASSERT(false, "unknown op kind");
}

void CpuBackend::do_allreduce(const PlanEntry& e, const std::vector<OpState*>& ops) {
  const Signature& s = e.sigs[0];
  const ReduceOp op = reduction_op(s.op);
  const double post = final_scale(s.op, s.postscale, comm_.size());
  if (e.names.size() == 1 && ops[0]) {
    // Alone: reduce straight from the user's input into their output buffer (a prescale
    // first needs the input copied there, where it may be scaled).
    OpState& o = *ops[0];
    size_t n = static_cast<size_t>(s.numel());
    void* buf = o.out.data();
    const void* src = o.in.data();
    if (src != buf && s.prescale != 1.0) {
      if (n) std::memcpy(buf, src, s.nbytes());
      src = buf;
    }
    scale(buf, n, s.dtype, s.prescale);  // a no-op at 1.0, so never on the user's input
    reduce(src, buf, {n}, s.dtype, op);
    scale(buf, n, s.dtype, post);
    return;
  }
  std::vector<FusedPiece> pieces;
  std::vector<size_t> counts;
  size_t total = 0;
  for (size_t i = 0; i < e.names.size(); ++i) {
    size_t bytes = e.sigs[i].nbytes();
    counts.push_back(static_cast<size_t>(e.sigs[i].numel()));
    pieces.push_back(FusedPiece{ops[i] ? ops[i]->in.data() : nullptr, ops[i] ? ops[i]->out.data() : nullptr, bytes});
    total += bytes;
  }
  note(e, "MEMCPY_IN_FUSION_BUFFER");
  uint8_t* buf = scratch_.reserve(total);
  fusion_pack(buf, pieces);
  note(e, collective_step(e.kind));
  size_t n = total / dtype_size(s.dtype);
  scale(buf, n, s.dtype, s.prescale);
  reduce(buf, buf, counts, s.dtype, op);
  scale(buf, n, s.dtype, post);
  note(e, "MEMCPY_OUT_FUSION_BUFFER");
  fusion_unpack(buf, pieces);
}

void CpuBackend::reduce(const void* src, void* buf, const std::vector<size_t>& counts, DataType dt, ReduceOp op) {
  // Adasum combines each tensor of a fused buffer with its own dot products; the element-wise
  // ops do not care where one tensor ends.
  const size_t n = std::accumulate(counts.begin(), counts.end(), size_t{0});
  if (op == ReduceOp::kAdasum) {
    if (src != buf && n) std::memcpy(buf, src, n * dtype_size(dt));
    return adasum_allreduce(comm_, buf, counts, dt, opts_);
  }
  if (n && hierarchical(opts_.hierarchical_allreduce, hierarchical_wins(hosts_.L, hosts_.H, n * dtype_size(dt))))
    return allreduce_hierarchical(*hosts_.local, *hosts_.cross, src, buf, n, dt, op, opts_);
  allreduce(comm_, src, buf, n, dt, op, opts_);
}

void CpuBackend::do_allgather(const PlanEntry& e, OpState& o) {
  const Signature& s = e.sigs[0];
  const size_t row_bytes = static_cast<size_t>(s.row_elems()) * dtype_size(s.dtype);
  std::vector<size_t> bytes(comm_.size());
  int64_t rows = 0;
  size_t total = 0;
  for (int r = 0; r < comm_.size(); ++r) {
    bytes[r] = static_cast<size_t>(e.sizes[r]) * row_bytes;
    rows += e.sizes[r];
    total += bytes[r];
  }
  std::vector<int64_t> shape = o.in.shape;
  shape[0] = rows;
  uint8_t* out = o.allocate_output(total, shape);
  if (hierarchical(opts_.hierarchical_allgather, hierarchical_allgather_wins(hosts_.L, hosts_.H, total)))
    return allgatherv_hierarchical(*hosts_.local, hosts_.local->rank() == 0 ? hosts_.cross : nullptr, hosts_.host,
                                   o.in.data(), out, bytes, opts_);
  allgatherv(comm_, o.in.data(), out, bytes, opts_);
}

void CpuBackend::do_broadcast(const PlanEntry& e, OpState& o) {
  const Signature& s = e.sigs[0];
  if (comm_.rank() == s.root && o.in.ptr != o.out.ptr && s.nbytes()) std::memcpy(o.out.data(), o.in.data(), s.nbytes());
  broadcast(comm_, o.out.data(), s.nbytes(), s.root, opts_);
}

void CpuBackend::do_alltoall(const PlanEntry& e, OpState& o) {
  AlltoallLayout l = alltoall_layout(e, o.in.shape, comm_.size(), comm_.rank());
  o.recv_splits = std::move(l.recv_splits);
  uint8_t* out = o.allocate_output(l.recv_total, std::move(l.out_shape));
  alltoallv(comm_, o.in.data(), l.send, out, l.recv, opts_);
}

void CpuBackend::do_reducescatter(const PlanEntry& e, OpState& o) {
  const Signature& s = e.sigs[0];
  const int P = comm_.size();
  const int64_t dim0 = s.shape.empty() ? 1 : s.shape[0];
  const size_t row = static_cast<size_t>(s.row_elems());
  std::vector<size_t> counts(P);
  for (int r = 0; r < P; ++r) counts[r] = static_cast<size_t>(reducescatter_rows(dim0, P, r)) * row;
  std::vector<int64_t> shape = s.shape;
  if (!shape.empty()) shape[0] = reducescatter_rows(dim0, P, comm_.rank());
  size_t mine = counts[comm_.rank()];
  uint8_t* out = o.allocate_output(mine * dtype_size(s.dtype), shape);
  uint8_t* buf = scratch_.reserve(s.nbytes());
  if (s.nbytes()) std::memcpy(buf, o.in.data(), s.nbytes());
  scale(buf, static_cast<size_t>(s.numel()), s.dtype, s.prescale);
  reducescatter(comm_, buf, out, counts, s.dtype, reduction_op(s.op), opts_);
  scale(out, mine, s.dtype, final_scale(s.op, s.postscale, P));
}

}  // namespace appliance
