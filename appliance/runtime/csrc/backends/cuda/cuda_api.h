// The CUDA runtime, loaded at run time with dlopen(): no CUDA toolkit is needed to build the
// core, and one build runs on CPU-only and GPU hosts.
//
// Declarations: written here from NVIDIA's public CUDA Runtime API reference
// (cuda_runtime_api.h / driver_types.h): handles are opaque pointers, error codes ints,
// cudaMemcpyDefault = 4 (direction inferred through unified addressing),
// cudaEventDisableTiming = 2, cudaSuccess = 0, cudaErrorNotReady = 600. Only functions whose
// signatures have been stable since CUDA 10 are used; no struct layouts are relied on.
//
// Owns: the loaded library handle (process-wide by nature: dlopen'd libraries are). Failure
// modes: a library that does not load, lacks a symbol, or sees no device leaves the API
// unusable with a one-line reason (CudaApi::why); calls through a usable API that fail throw
// Error(kInternal) naming the CUDA call and its error string.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace appliance {

using cudaStream_t = void*;
using cudaEvent_t = void*;

struct CudaApi {
  // Each pointer is filled by load(); none may be called unless usable().
  int (*GetDeviceCount)(int*) = nullptr;
  int (*GetDevice)(int*) = nullptr;
  int (*SetDevice)(int) = nullptr;
  int (*DeviceGetPCIBusId)(char*, int, int) = nullptr;
  int (*RuntimeGetVersion)(int*) = nullptr;
  int (*EventCreateWithFlags)(cudaEvent_t*, unsigned) = nullptr;
  int (*EventRecord)(cudaEvent_t, cudaStream_t) = nullptr;
  int (*EventQuery)(cudaEvent_t) = nullptr;
  int (*EventDestroy)(cudaEvent_t) = nullptr;
  int (*StreamWaitEvent)(cudaStream_t, cudaEvent_t, unsigned) = nullptr;
  int (*StreamSynchronize)(cudaStream_t) = nullptr;
  int (*MemcpyAsync)(void*, const void*, size_t, int, cudaStream_t) = nullptr;
  int (*MemsetAsync)(void*, int, size_t, cudaStream_t) = nullptr;
  int (*Malloc)(void**, size_t) = nullptr;
  int (*Free)(void*) = nullptr;
  int (*MallocHost)(void**, size_t) = nullptr;
  int (*FreeHost)(void*) = nullptr;
  const char* (*GetErrorString)(int) = nullptr;

  std::string library;  // path or name that loaded ("" when none did)
  int runtime_version = 0;
  int device_count = 0;
  std::string why;      // why the API is not usable ("" when it is)

  bool usable() const { return why.empty(); }
  // Throws Error(kInternal) "CUDA <what> failed: <error string>" unless rc == 0.
  void check(int rc, const char* what) const;
  // Identity of a device on this host (its PCI bus id, e.g. "0000:3B:00.0").
  std::string device_identity(int device) const;
};

constexpr int kCudaMemcpyDefault = 4;
constexpr unsigned kCudaEventDisableTiming = 2;
constexpr int kCudaErrorNotReady = 600;

// Tries `candidates` in order (paths or sonames) and returns the first that loads with every
// symbol and sees at least one device. Never throws.
CudaApi load_cuda_api(const std::vector<std::string>& candidates);

}  // namespace appliance
