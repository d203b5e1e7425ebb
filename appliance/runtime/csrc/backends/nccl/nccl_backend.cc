// NCCL backend: loaded lazily with dlopen so one build runs everywhere. This first slice only
// probes whether libnccl and the CUDA runtime can be loaded; CUDA tensors are refused at
// enqueue until the backend executes plans (see engine/runtime.cc).
#include <dlfcn.h>

#include <mutex>

namespace appliance {

bool nccl_available() {
  static std::once_flag once;
  static bool ok = false;
  std::call_once(once, [] {
    void* cudart = dlopen("libcudart.so", RTLD_NOW | RTLD_LOCAL);
    if (!cudart) cudart = dlopen("libcudart.so.12", RTLD_NOW | RTLD_LOCAL);
    void* nccl = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    ok = cudart && nccl;
    if (nccl) dlclose(nccl);
    if (cudart) dlclose(cudart);
  });
  return ok;
}

}  // namespace appliance
