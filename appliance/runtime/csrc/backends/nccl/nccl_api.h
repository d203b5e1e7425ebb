// NCCL, loaded at run time with dlopen(): no NCCL headers or library are needed to build the
// core, and one build runs on CPU-only and GPU hosts.
//
// Declarations: written here from NCCL's public API reference (nccl.h of NCCL 2.12+, BSD):
// ncclComm_t is an opaque pointer, ncclUniqueId 128 opaque bytes, results/types/ops ints with
// the documented values below. Version codes: NCCL >= 2.9 reports major*10000 + minor*100 +
// patch (2.29.7 -> 22907); older releases reported major*1000 + minor*100 + patch.
//
// Search order (decided by the caller, appliance/runtime/devices.py): the explicit knob
// APPLIANCE_NCCL_LIBRARY, the nvidia-nccl wheel next to torch, the system loader path.
// An explicit knob that fails does not fall through: its reason is reported.
// Failure modes: never throws while loading; `why` says what is missing, or which version is
// too old (kMinNcclVersion).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "backends/cuda/cuda_api.h"

namespace appliance {

using ncclComm_t = void*;
struct ncclUniqueId {
  char internal[128];
};
using ncclRedOp_t = int;

enum NcclResult : int { kNcclSuccess = 0, kNcclInProgress = 7 };
enum NcclType : int {
  kNcclInt8 = 0, kNcclUint8 = 1, kNcclInt32 = 2, kNcclUint32 = 3, kNcclInt64 = 4, kNcclUint64 = 5,
  kNcclFloat16 = 6, kNcclFloat32 = 7, kNcclFloat64 = 8, kNcclBfloat16 = 9,
};
enum NcclOp : int { kNcclSum = 0, kNcclProd = 1, kNcclMax = 2, kNcclMin = 3, kNcclAvg = 4 };
constexpr int kNcclScalarHostImmediate = 1;

// Oldest release used: ncclAvg and bfloat16 (2.10), ncclRedOpCreatePreMulSum (2.11).
constexpr int kMinNcclVersion = 21200;

struct NcclApi {
  int (*GetVersion)(int*) = nullptr;
  int (*GetUniqueId)(ncclUniqueId*) = nullptr;
  int (*CommInitRank)(ncclComm_t*, int, ncclUniqueId, int) = nullptr;
  int (*CommDestroy)(ncclComm_t) = nullptr;
  int (*CommAbort)(ncclComm_t) = nullptr;
  int (*CommGetAsyncError)(ncclComm_t, int*) = nullptr;
  int (*AllReduce)(const void*, void*, size_t, int, ncclRedOp_t, ncclComm_t, cudaStream_t) = nullptr;
  int (*Broadcast)(const void*, void*, size_t, int, int, ncclComm_t, cudaStream_t) = nullptr;
  int (*Reduce)(const void*, void*, size_t, int, ncclRedOp_t, int, ncclComm_t, cudaStream_t) = nullptr;
  int (*AllGather)(const void*, void*, size_t, int, ncclComm_t, cudaStream_t) = nullptr;
  int (*ReduceScatter)(const void*, void*, size_t, int, ncclRedOp_t, ncclComm_t, cudaStream_t) = nullptr;
  int (*Send)(const void*, size_t, int, int, ncclComm_t, cudaStream_t) = nullptr;
  int (*Recv)(void*, size_t, int, int, ncclComm_t, cudaStream_t) = nullptr;
  int (*GroupStart)() = nullptr;
  int (*GroupEnd)() = nullptr;
  int (*RedOpCreatePreMulSum)(ncclRedOp_t*, void*, int, int, ncclComm_t) = nullptr;
  int (*RedOpDestroy)(ncclRedOp_t, ncclComm_t) = nullptr;
  const char* (*GetErrorString)(int) = nullptr;

  std::string library;  // what loaded ("" when nothing did)
  int version = 0;      // ncclGetVersion of that library (0 when none loaded)
  std::string why;      // why NCCL cannot be used ("" when it can)

  bool usable() const { return why.empty(); }
  void check(int rc, const char* what) const;  // throws Error(kInternal) unless success
};

// "2.29.7" for 22907 (and the pre-2.9 encoding).
std::string nccl_version_string(int code);
int nccl_version_major_minor(int code);  // 2.29.7 -> 229

// `explicit_path` (the knob, may be empty) is tried alone when set; otherwise `candidates`
// in order. The first library that loads decides: its version and missing symbols are
// reported, later candidates are not tried for an old one (an old NCCL on the loader path
// is what the process would use anyway).
NcclApi load_nccl_api(const std::string& explicit_path, const std::vector<std::string>& candidates);

}  // namespace appliance
