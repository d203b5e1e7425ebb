// Backend: executes one successful plan entry for this rank's operations.
//
// `ops[i]` is this rank's operation for entry.names[i], or nullptr when this rank has joined
// and contributes zeros (allreduce only). A backend fills outputs (user buffers or
// core-allocated ones) and result fields; it does not complete handles. Any exception it
// throws aborts the job (other ranks may already be inside the collective).
//
// CPU backend: the collective algorithms over a Comm. NCCL backend: CUDA buffers, loaded
// with dlopen() on first use (backends/nccl); `nccl_available()` says whether it can load.
#pragma once

#include <string>
#include <vector>

#include "coordinator/request.h"
#include "engine/ops.h"

namespace appliance {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual void execute(const PlanEntry& e, const std::vector<OpState*>& ops) = 0;
};

// Rows of dim0 rank r receives in a reducescatter of `dim0` rows over `size` ranks
// (Horovod's split: the first dim0 % size ranks get one more).
int64_t reducescatter_rows(int64_t dim0, int size, int rank);

}  // namespace appliance
