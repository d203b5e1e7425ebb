// Which backend runs a CUDA plan entry: pure decisions, the same on every rank from the same
// inputs, so ranks never disagree on how a collective moves (no I/O; unit-tested in
// tests/cpp/units and, through appliance.runtime._core_testing, tests/runtime/test_decisions.py).
//
// 1. decide_cuda_path (once per job, at its first CUDA entry, from every rank's DeviceReport
//    exchanged through the store): NCCL when every rank can run it, the versions agree in
//    major.minor, and no two ranks sit on one physical GPU (same machine, same PCI bus id;
//    NCCL refuses that). Otherwise every CUDA entry of the job goes through host staging:
//    a collective includes every rank, so one rank without NCCL moves them all to host
//    memory. The reason names the ranks concerned.
// 2. select_cuda_backend (per entry): NCCL runs every kind, but a reduction NCCL lacks
//    (Adasum; int16 or bool elements; scale factors on Min/Max/Product or on integers;
//    integer Average) goes through host staging with its reason; so does a scaled sum on a
//    job of one rank (NCCL 2.28.9 leaves the last element of a one-rank PreMulSum unscaled for
//    some sizes, e.g. 4913 float32 elements; torch.distributed shows the same).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "coordinator/request.h"

namespace appliance {

struct DeviceReport {
  std::string host;      // host name, for messages
  std::string machine;   // identity of the physical machine (boot id)
  std::string gpu;       // identity of the GPU on that machine (PCI bus id)
  int nccl_version = 0;  // 0: NCCL not usable on that rank
  std::string why;       // why not, when nccl_version == 0

  std::vector<uint8_t> encode() const;
  static DeviceReport decode(const std::vector<uint8_t>& bytes, const std::string& from);
};

enum class CudaPath : uint8_t { kNccl = 0, kStaging = 1 };

struct CudaDecision {
  CudaPath path = CudaPath::kStaging;
  std::string reason;  // why staging ("" for NCCL)
};

CudaDecision decide_cuda_path(const std::vector<DeviceReport>& ranks);

// For an entry on CUDA tensors under `path` in a job of `size` ranks: kNccl, or kStaging with *why set.
CudaPath select_cuda_backend(const PlanEntry& e, CudaPath path, int size, std::string* why);

// The single factor a sum-like NCCL reduction applies to each input (prescale, postscale and
// Average's 1/size folded together), or 1.0.
double nccl_premul_factor(const Signature& s, int size);

// IEEE half and bfloat16 bits of x (round to nearest even), for NCCL's scalar arguments.
uint16_t float_to_half_bits(float x);
uint16_t float_to_bf16_bits(float x);

}  // namespace appliance
