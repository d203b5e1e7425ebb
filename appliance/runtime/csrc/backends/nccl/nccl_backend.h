// NcclBackend: runs plan entries on CUDA tensors through one NCCL communicator (the global
// process set on this rank's device), every operation on the tensor's stream, in plan order.
//
// Owns the communicator (created in the constructor from a unique id the Runtime exchanged
// through the authenticated store), a device fusion buffer for batches of small allreduces,
// and the events that say when an entry finished (Completion::done polls the event and
// ncclCommGetAsyncError). Reductions map to NCCL's Sum/Prod/Min/Max/Avg; scale factors on
// Sum/Average become one ncclRedOpCreatePreMulSum factor applied on the device. Allgather
// with differing first dimensions is a group of broadcasts; uneven reducescatter a group of
// reduces; alltoall a group of send/recv. Outputs whose size negotiation decides come from the
// adapter's DeviceAllocator.
//
// Failure modes: any NCCL/CUDA error throws Error(kInternal) naming the call; an async NCCL
// error surfaces from Completion::done(); abort() calls ncclCommAbort so no kernel waits forever
// on a dead peer. One GPU per rank: a tensor on another device than the communicator's is an
// error that ends the job (every rank learns why).
#pragma once

#include "backends/backend.h"
#include "backends/cuda/cuda_api.h"
#include "backends/nccl/nccl_api.h"

namespace appliance {

class NcclBackend final : public Backend {
 public:
  // Blocks until every rank has joined the communicator (ncclCommInitRank).
  NcclBackend(const NcclApi& nccl, const CudaApi& cuda, int rank, int size, int device, const ncclUniqueId& id,
              DeviceAllocator alloc);
  ~NcclBackend() override;
  const char* name() const override { return "nccl"; }
  std::unique_ptr<Completion> launch(const PlanEntry& e, const std::vector<OpState*>& ops) override;
  void abort() override;
  int device() const { return device_; }

 private:
  void allreduce(const PlanEntry& e, const std::vector<OpState*>& ops, cudaStream_t st);
  void allgather(const PlanEntry& e, OpState& o, cudaStream_t st);
  void broadcast(const PlanEntry& e, OpState& o, cudaStream_t st);
  void alltoall(const PlanEntry& e, OpState& o, cudaStream_t st);
  void reducescatter(const PlanEntry& e, OpState& o, cudaStream_t st);
  // NCCL reduction for s (creates a PreMulSum op when scaled; *created tells to destroy it).
  ncclRedOp_t red_op(const Signature& s, bool* created);
  uint8_t* device_output(OpState& o, size_t bytes, std::vector<int64_t> shape);
  uint8_t* fusion_buffer(size_t bytes, cudaStream_t st);

  const NcclApi& nccl_;
  const CudaApi& cuda_;
  int rank_, size_, device_;
  ncclComm_t comm_ = nullptr;
  DeviceAllocator alloc_;
  void* fusion_ = nullptr;
  size_t fusion_cap_ = 0;
  cudaEvent_t fusion_free_ = nullptr;  // recorded after the last use of the fusion buffer
  cudaStream_t stream_ = nullptr;      // of the entry being launched
};

}  // namespace appliance
