// The backends of a Runtime and which one runs a plan entry (see registry.h).
#include "backends/registry.h"

#include <fstream>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_api.h"
#include "backends/cuda/staging_backend.h"
#include "backends/nccl/nccl_api.h"
#include "backends/nccl/nccl_backend.h"
#include "common/log.h"
#include "common/status.h"

namespace appliance {

namespace {
std::string machine_id() {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(f, id);
  return id;
}
}  // namespace

BackendRegistry::BackendRegistry(BackendOptions o, Comm& comm, Store* store, ActivitySink* sink)
    : o_(std::move(o)), store_(store), sink_(sink), cuda_(std::make_unique<CudaApi>()),
      nccl_api_(std::make_unique<NcclApi>()) {
  // Hosts in order of first appearance; hierarchical collectives need H > 1 hosts of L > 1 ranks
  // each, host h holding ranks h*L .. h*L+L-1.
  HostLayout hosts;
  const int P = static_cast<int>(o_.hosts.size());
  int L = 0;
  while (L < P && o_.hosts[L] == o_.hosts[0]) ++L;
  bool regular = P > 0 && L > 1 && L < P && P % L == 0;
  for (int r = 0; regular && r < P; ++r)
    regular = o_.hosts[r] == o_.hosts[(r / L) * L] && (r % L != 0 || r == 0 || o_.hosts[r] != o_.hosts[r - 1]);
  for (int h = 0; regular && h < P / L; ++h)  // no host name twice
    for (int g = 0; g < h; ++g) regular = regular && o_.hosts[h * L] != o_.hosts[g * L];
  if (regular && comm.size() == P) {
    const int me = comm.rank(), host = me / L, l = me % L;
    std::vector<int> local, cross;
    for (int i = 0; i < L; ++i) local.push_back(host * L + i);
    for (int g = 0; g < P / L; ++g) cross.push_back(g * L + l);
    local_ = std::make_unique<Comm>(comm, local);
    cross_ = std::make_unique<Comm>(comm, cross);
    hosts = HostLayout{local_.get(), cross_.get(), host, L, P / L};
  }
  cpu_ = std::make_unique<CpuBackend>(comm, o_.collectives, hosts);
  cpu_->set_activity_sink(sink_);
}

BackendRegistry::~BackendRegistry() = default;

void BackendRegistry::add_set(int32_t id, Comm& comm) {
  SetBackends b;
  b.cpu = std::make_unique<CpuBackend>(comm, o_.collectives);
  b.cpu->set_activity_sink(sink_);
  sets_[id] = std::move(b);
}

void BackendRegistry::remove_set(int32_t id) { sets_.erase(id); }

void BackendRegistry::set_device_allocator(DeviceAllocator a) {
  std::lock_guard<std::mutex> g(cuda_mu_);
  alloc_ = std::move(a);
}

std::string BackendRegistry::cuda_path(std::string* why) const {
  std::lock_guard<std::mutex> g(cuda_mu_);
  if (!cuda_ready_) return "";
  if (why) *why = decision_.reason;
  return decision_.path == CudaPath::kNccl ? "nccl" : "staging";
}

Backend& BackendRegistry::for_entry(const PlanEntry& e, const std::vector<OpState*>& ops, int fallback_device) {
  const int32_t set = e.sigs.empty() ? 0 : e.sigs[0].process_set;
  if (set != 0) {
    // A process set runs on its Comm view: host memory directly, CUDA memory through host
    // staging (NCCL communicators exist for the global set only; making one is job-wide).
    auto it = sets_.find(set);
    APPLIANCE_ASSERT(it != sets_.end(), "a plan entry of process set " + std::to_string(set) + ", which has no backends here");
    SetBackends& sb = it->second;
    if (e.sigs[0].device < 0) return *sb.cpu;
    if (cuda_->library.empty()) load_cuda();  // not loaded yet (the global set's first CUDA entry loads it too)
    if (!sb.staging) {
      sb.staging = std::make_unique<StagingBackend>(*sb.cpu, *cuda_);
      sb.staging->set_activity_sink(sink_);
    }
    if (warned_.insert("process-set-staging").second)
      log_line(o_.rank, "warning: CUDA tensors of process sets other than the global one go through host memory");
    return *sb.staging;
  }
  if (e.sigs.empty() || e.sigs[0].device < 0) return *cpu_;
  if (!cuda_ready_) {
    int device = fallback_device;
    for (OpState* op : ops)
      if (op) {
        device = op->in.device;
        break;
      }
    setup_cuda(device < 0 ? 0 : device);
  }
  std::string why;
  if (select_cuda_backend(e, decision_.path, o_.size, &why) == CudaPath::kNccl) return *nccl_;
  if (why.empty()) why = decision_.reason;
  if (warned_.insert(why).second) log_line(o_.rank, "warning: CUDA tensors go through host memory: " + why);
  return *staging_;
}

void BackendRegistry::load_cuda() {
  *cuda_ = load_cuda_api(o_.cudart_candidates);
  if (!cuda_->usable())
    throw Error(Code::kInternal, "this rank has CUDA tensors but the collective core cannot use the CUDA runtime: " + cuda_->why,
                o_.rank, o_.host);
}

DeviceAllocator BackendRegistry::locked_allocator() {
  return [this](int dev, size_t bytes, uint64_t stream) {
    DeviceAllocator a;
    {
      std::lock_guard<std::mutex> g(cuda_mu_);
      a = alloc_;
    }
    if (!a) throw Error(Code::kInternal, "no device allocator: CUDA outputs need the framework adapter");
    return a(dev, bytes, stream);
  };
}

void BackendRegistry::setup_cuda(int device) {
  load_cuda();
  *nccl_api_ = load_nccl_api(o_.nccl_library, o_.nccl_candidates);
  DeviceReport mine;
  mine.host = o_.host;
  mine.machine = machine_id();
  mine.gpu = cuda_->device_identity(device);
  mine.nccl_version = nccl_api_->usable() ? nccl_api_->version : 0;
  mine.why = nccl_api_->why;
  std::vector<DeviceReport> all(o_.size);
  const int64_t timeout_ms = o_.exchange_timeout_ms;
  if (o_.size == 1) {
    all[0] = mine;
  } else {
    store_->set("cuda.report." + std::to_string(o_.rank), mine.encode());
    for (int r = 0; r < o_.size; ++r)
      all[r] = DeviceReport::decode(store_->get("cuda.report." + std::to_string(r), timeout_ms), "rank " + std::to_string(r));
  }
  CudaDecision d = decide_cuda_path(all);
  staging_ = std::make_unique<StagingBackend>(*cpu_, *cuda_);
  staging_->set_activity_sink(sink_);
  if (d.path == CudaPath::kNccl) {
    ncclUniqueId id{};
    if (o_.rank == 0) nccl_api_->check(nccl_api_->GetUniqueId(&id), "ncclGetUniqueId");
    if (o_.size > 1) {
      if (o_.rank == 0) store_->set("cuda.nccl_id", std::vector<uint8_t>(id.internal, id.internal + sizeof(id.internal)));
      std::vector<uint8_t> v = store_->get("cuda.nccl_id", timeout_ms);
      if (v.size() != sizeof(id.internal)) throw Error(Code::kProtocol, "NCCL unique id of the wrong size", 0, o_.hosts[0]);
      std::copy(v.begin(), v.end(), id.internal);
    }
    nccl_ = std::make_unique<NcclBackend>(*nccl_api_, *cuda_, o_.rank, o_.size, device, id, locked_allocator());
    if (o_.verbose && o_.rank == 0)
      log_line(o_.rank, "CUDA collectives through NCCL " + nccl_version_string(nccl_api_->version) + " (" + nccl_api_->library + ")");
  }
  std::lock_guard<std::mutex> g(cuda_mu_);
  decision_ = d;
  cuda_ready_ = true;
}

void BackendRegistry::stream_wait(const OpState& op, uint64_t stream) {
  cuda_->check(cuda_->StreamWaitEvent(reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(stream)), op.ready_event.get(), 0),
               "cudaStreamWaitEvent");
}

void BackendRegistry::abort() {
  if (nccl_) nccl_->abort();
}

}  // namespace appliance
