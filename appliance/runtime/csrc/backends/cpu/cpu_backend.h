// CpuBackend: runs plan entries on host memory with the algorithms in collectives/.
// Completes every entry within launch(). Owns the fusion/scratch buffer. With a HostLayout (a
// job of several hosts with several ranks each, hosts holding consecutive ranks), allreduce and
// allgather go hierarchical where the options force it or the cost model says it wins
// (collectives/hierarchical.cc). Average = Sum with postscale / size; integer scaling
// truncates (collectives/reduce.h). Adasum runs collectives/adasum.cc, per tensor of a fused
// entry; prescale and postscale apply around it as for Sum.
#pragma once

#include "backends/backend.h"
#include "collectives/collectives.h"
#include "fusion/fusion.h"

namespace appliance {

// The job's hosts as the hierarchical collectives see them: this host's ranks, the ranks with
// this local rank on every host, and (local rank 0 only) the leaders, which are that same view.
struct HostLayout {
  Comm* local = nullptr;
  Comm* cross = nullptr;
  int host = 0;  // index of this host
  int L = 1, H = 1;
};

class CpuBackend final : public Backend {
 public:
  CpuBackend(Comm& comm, CollectiveOptions opts, HostLayout hosts = {}) : comm_(comm), opts_(opts), hosts_(hosts) {}
  const char* name() const override { return "cpu"; }
  bool notes_activities() const override { return true; }  // fusion copies and the collective
  std::unique_ptr<Completion> launch(const PlanEntry& e, const std::vector<OpState*>& ops) override;
  // Runs the entry to the end on this thread (what launch() does; also used by staging).
  void execute(const PlanEntry& e, const std::vector<OpState*>& ops);

 private:
  void do_allreduce(const PlanEntry& e, const std::vector<OpState*>& ops);
  // In place over tensors of counts[i] elements back to back: ring allreduce, or Adasum.
  void reduce(const void* src, void* buf, const std::vector<size_t>& counts, DataType dt, ReduceOp op);
  void do_allgather(const PlanEntry& e, OpState& op);
  void do_broadcast(const PlanEntry& e, OpState& op);
  void do_alltoall(const PlanEntry& e, OpState& op);
  void do_reducescatter(const PlanEntry& e, OpState& op);

  bool hierarchical(CollectiveOptions::Hierarchy h, bool wins) const {
    return hosts_.local && hosts_.H > 1 && hosts_.L > 1 &&
           (h == CollectiveOptions::Hierarchy::kOn || (h == CollectiveOptions::Hierarchy::kAuto && wins));
  }

  Comm& comm_;
  CollectiveOptions opts_;
  HostLayout hosts_;
  ScratchBuffer scratch_;
};

}  // namespace appliance
