// StagingBackend: runs a plan entry on CUDA tensors through host memory. Inputs are copied to
// the host on the tensor's stream (which is synchronized first, so the copy sees the caller's
// pending work), the CPU backend runs the collective, and results are copied back to the
// device on the same stream before the entry counts as done. Outputs the core allocates
// (allgather, alltoall, reducescatter) stay in host memory; the adapter moves them to the
// tensor's device. Used when NCCL cannot run the entry (device_plan.h says why). Scale factors
// of 16-bit tensors are first rounded to the tensor's type, as on the device (NCCL's scalar,
// Horovod's CUDA kernels), so staged and device results agree.
// Failure modes: a failing CUDA copy throws Error(kInternal) naming the call.
#pragma once

#include "backends/backend.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_api.h"

namespace appliance {

class StagingBackend final : public Backend {
 public:
  StagingBackend(CpuBackend& cpu, const CudaApi& cuda) : cpu_(cpu), cuda_(cuda) {}
  const char* name() const override { return "cuda-staging"; }
  bool notes_activities() const override { return true; }  // host copies, then the CPU backend's steps
  std::unique_ptr<Completion> launch(const PlanEntry& e, const std::vector<OpState*>& ops) override;

 private:
  CpuBackend& cpu_;
  const CudaApi& cuda_;
};

}  // namespace appliance
