// NCCL, loaded with dlopen(), its version and its checked calls (see nccl_api.h).
#include "backends/nccl/nccl_api.h"

#include <dlfcn.h>

#include "common/status.h"

namespace appliance {

void NcclApi::check(int rc, const char* what) const {
  if (rc == kNcclSuccess) return;
  const char* s = GetErrorString ? GetErrorString(rc) : nullptr;
  throw Error(Code::kInternal, std::string("NCCL ") + what + " failed: " + (s ? s : "error " + std::to_string(rc)));
}

std::string nccl_version_string(int code) {
  int major, minor, patch;
  if (code >= 20900) {
    major = code / 10000, minor = code / 100 % 100, patch = code % 100;
  } else {
    major = code / 1000, minor = code / 100 % 10, patch = code % 100;
  }
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

int nccl_version_major_minor(int code) { return code >= 20900 ? code / 100 : (code / 1000) * 100 + code / 100 % 10; }

namespace {
template <typename F>
bool sym(void* lib, const char* name, F& out) {
  out = reinterpret_cast<F>(dlsym(lib, name));
  return out != nullptr;
}

std::string bind_all(void* lib, NcclApi& a) {
#define APPLIANCE_NCCL_SYM(field, name) \
  if (!sym(lib, name, a.field)) return name;
  APPLIANCE_NCCL_SYM(GetUniqueId, "ncclGetUniqueId")
  APPLIANCE_NCCL_SYM(CommInitRank, "ncclCommInitRank")
  APPLIANCE_NCCL_SYM(CommDestroy, "ncclCommDestroy")
  APPLIANCE_NCCL_SYM(CommAbort, "ncclCommAbort")
  APPLIANCE_NCCL_SYM(CommGetAsyncError, "ncclCommGetAsyncError")
  APPLIANCE_NCCL_SYM(AllReduce, "ncclAllReduce")
  APPLIANCE_NCCL_SYM(Broadcast, "ncclBroadcast")
  APPLIANCE_NCCL_SYM(Reduce, "ncclReduce")
  APPLIANCE_NCCL_SYM(AllGather, "ncclAllGather")
  APPLIANCE_NCCL_SYM(ReduceScatter, "ncclReduceScatter")
  APPLIANCE_NCCL_SYM(Send, "ncclSend")
  APPLIANCE_NCCL_SYM(Recv, "ncclRecv")
  APPLIANCE_NCCL_SYM(GroupStart, "ncclGroupStart")
  APPLIANCE_NCCL_SYM(GroupEnd, "ncclGroupEnd")
  APPLIANCE_NCCL_SYM(RedOpCreatePreMulSum, "ncclRedOpCreatePreMulSum")
  APPLIANCE_NCCL_SYM(RedOpDestroy, "ncclRedOpDestroy")
  APPLIANCE_NCCL_SYM(GetErrorString, "ncclGetErrorString")
#undef APPLIANCE_NCCL_SYM
  return "";
}

NcclApi try_one(const std::string& c, bool* loaded) {
  NcclApi a;
  // Never dlclose'd: NCCL keeps threads and CUDA state alive while communicators exist.
  void* lib = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
  *loaded = lib != nullptr;
  if (!lib) {
    const char* err = dlerror();
    a.why = "cannot load " + c + (err ? std::string(": ") + err : std::string());
    return a;
  }
  a.library = c;
  if (!sym(lib, "ncclGetVersion", a.GetVersion)) {
    a.why = c + " has no ncclGetVersion: not an NCCL library";
    return a;
  }
  if (a.GetVersion(&a.version) != kNcclSuccess || a.version <= 0) {
    a.why = c + ": ncclGetVersion failed";
    a.version = 0;
    return a;
  }
  if (a.version < kMinNcclVersion) {
    a.why = "NCCL " + nccl_version_string(a.version) + " (" + c + ") is older than " +
            nccl_version_string(kMinNcclVersion) + ", the oldest this runtime uses";
    return a;
  }
  std::string missing = bind_all(lib, a);
  if (!missing.empty()) a.why = "NCCL " + nccl_version_string(a.version) + " (" + c + ") lacks " + missing;
  return a;
}
}  // namespace

NcclApi load_nccl_api(const std::string& explicit_path, const std::vector<std::string>& candidates) {
  bool loaded = false;
  if (!explicit_path.empty()) {
    NcclApi a = try_one(explicit_path, &loaded);
    if (!a.usable()) a.why = "APPLIANCE_NCCL_LIBRARY=" + explicit_path + ": " + a.why;
    return a;
  }
  std::string tried;
  for (const std::string& c : candidates) {
    NcclApi a = try_one(c, &loaded);
    if (loaded) return a;
    tried += (tried.empty() ? "" : ", ") + c;
  }
  NcclApi none;
  none.why = "no NCCL library found (tried: " + tried + ")";
  return none;
}

}  // namespace appliance
