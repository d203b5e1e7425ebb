// The CUDA runtime, loaded with dlopen(), and its checked calls (see cuda_api.h).
#include "backends/cuda/cuda_api.h"

#include <dlfcn.h>

#include "common/status.h"

namespace appliance {

void CudaApi::check(int rc, const char* what) const {
  if (rc == 0) return;
  const char* s = GetErrorString ? GetErrorString(rc) : nullptr;
  throw Error(Code::kInternal, std::string("CUDA ") + what + " failed: " + (s ? s : "error " + std::to_string(rc)));
}

std::string CudaApi::device_identity(int device) const {
  char bus[64] = {0};
  check(DeviceGetPCIBusId(bus, sizeof(bus) - 1, device), "cudaDeviceGetPCIBusId");
  return bus;
}

namespace {
template <typename F>
bool sym(void* lib, const char* name, F& out) {
  out = reinterpret_cast<F>(dlsym(lib, name));
  return out != nullptr;
}

// Fills api from lib; returns the first missing symbol, or "" when all are there.
std::string bind_all(void* lib, CudaApi& a) {
#define APPLIANCE_CUDA_SYM(field, name) \
  if (!sym(lib, name, a.field)) return name;
  APPLIANCE_CUDA_SYM(GetDeviceCount, "cudaGetDeviceCount")
  APPLIANCE_CUDA_SYM(GetDevice, "cudaGetDevice")
  APPLIANCE_CUDA_SYM(SetDevice, "cudaSetDevice")
  APPLIANCE_CUDA_SYM(DeviceGetPCIBusId, "cudaDeviceGetPCIBusId")
  APPLIANCE_CUDA_SYM(RuntimeGetVersion, "cudaRuntimeGetVersion")
  APPLIANCE_CUDA_SYM(EventCreateWithFlags, "cudaEventCreateWithFlags")
  APPLIANCE_CUDA_SYM(EventRecord, "cudaEventRecord")
  APPLIANCE_CUDA_SYM(EventQuery, "cudaEventQuery")
  APPLIANCE_CUDA_SYM(EventDestroy, "cudaEventDestroy")
  APPLIANCE_CUDA_SYM(StreamWaitEvent, "cudaStreamWaitEvent")
  APPLIANCE_CUDA_SYM(StreamSynchronize, "cudaStreamSynchronize")
  APPLIANCE_CUDA_SYM(MemcpyAsync, "cudaMemcpyAsync")
  APPLIANCE_CUDA_SYM(MemsetAsync, "cudaMemsetAsync")
  APPLIANCE_CUDA_SYM(Malloc, "cudaMalloc")
  APPLIANCE_CUDA_SYM(Free, "cudaFree")
  APPLIANCE_CUDA_SYM(MallocHost, "cudaMallocHost")
  APPLIANCE_CUDA_SYM(FreeHost, "cudaFreeHost")
  APPLIANCE_CUDA_SYM(GetErrorString, "cudaGetErrorString")
#undef APPLIANCE_CUDA_SYM
  return "";
}
}  // namespace

CudaApi load_cuda_api(const std::vector<std::string>& candidates) {
  CudaApi best;
  best.why = "no CUDA runtime library found (tried: " ;
  for (size_t i = 0; i < candidates.size(); ++i) best.why += (i ? ", " : "") + candidates[i];
  best.why += ")";
  for (const std::string& c : candidates) {
    // Never dlclose'd: CUDA libraries do not support being unloaded while in use.
    void* lib = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) continue;
    CudaApi a;
    a.library = c;
    std::string missing = bind_all(lib, a);
    if (!missing.empty()) {
      best = CudaApi{};
      best.library = c;
      best.why = c + " lacks " + missing + ": not a usable CUDA runtime";
      continue;
    }
    a.RuntimeGetVersion(&a.runtime_version);
    int n = 0;
    int rc = a.GetDeviceCount(&n);
    if (rc != 0 || n < 1) {
      best = a;
      best.why = "the CUDA runtime " + c + " sees no device" +
                 (rc ? std::string(" (") + a.GetErrorString(rc) + ")" : std::string());
      continue;
    }
    a.device_count = n;
    a.why.clear();
    return a;
  }
  return best;
}

}  // namespace appliance
