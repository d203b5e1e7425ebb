// Which backend runs a plan entry, and the CUDA side of a Runtime: the job-wide choice
// between NCCL and host staging (made once, at the job's first CUDA entry, from every rank's
// DeviceReport exchanged through the authenticated store), the NCCL communicator (its unique
// id travels the same way), and the polling of launched device work.
#include <fstream>

#include "common/log.h"
#include "engine/runtime.h"

namespace appliance {

namespace {
std::string machine_id() {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(f, id);
  return id;
}
}  // namespace

void Runtime::set_device_allocator(DeviceAllocator a) {
  std::lock_guard<std::mutex> g(cuda_mu_);
  alloc_ = std::move(a);
}

std::string Runtime::cuda_path(std::string* why) const {
  std::lock_guard<std::mutex> g(cuda_mu_);
  if (!cuda_ready_) return "";
  if (why) *why = cuda_decision_.reason;
  return cuda_decision_.path == CudaPath::kNccl ? "nccl" : "staging";
}

Backend& Runtime::backend_for(const PlanEntry& e, const std::vector<OpState*>& ops) {
  const int32_t set = e.sigs.empty() ? 0 : e.sigs[0].process_set;
  if (set != 0) {
    // A process set runs on its Comm view: host memory directly, CUDA memory through host
    // staging (NCCL communicators exist for the global set only; making one is job-wide).
    SetComm& sc = *set_comm(set);
    if (e.sigs[0].device < 0) return *sc.cpu;
    if (cuda_.library.empty()) {  // not loaded yet (the global set's first CUDA entry loads it too)
      cuda_ = load_cuda_api(cfg_.cudart_candidates);
      if (!cuda_.usable())
        throw Error(Code::kInternal, "this rank has CUDA tensors but the collective core cannot use the CUDA runtime: " + cuda_.why,
                    cfg_.rank, cfg_.host);
    }
    if (!sc.staging) {
      sc.staging = std::make_unique<StagingBackend>(*sc.cpu, cuda_);
      sc.staging->set_activity_sink(&timeline_);
    }
    if (warned_.insert("process-set-staging").second)
      log_line(cfg_.rank, "warning: CUDA tensors of process sets other than the global one go through host memory");
    return *sc.staging;
  }
  if (e.sigs.empty() || e.sigs[0].device < 0) return *cpu_;
  if (!cuda_ready_) {
    int device = join_device_.load();
    for (OpState* op : ops)
      if (op) {
        device = op->in.device;
        break;
      }
    setup_cuda(device < 0 ? 0 : device);
  }
  std::string why;
  if (select_cuda_backend(e, cuda_decision_.path, cfg_.size, &why) == CudaPath::kNccl) return *nccl_;
  if (why.empty()) why = cuda_decision_.reason;
  if (warned_.insert(why).second)
    log_line(cfg_.rank, "warning: CUDA tensors go through host memory: " + why);
  return *staging_;
}

void Runtime::setup_cuda(int device) {
  cuda_ = load_cuda_api(cfg_.cudart_candidates);
  if (!cuda_.usable())
    throw Error(Code::kInternal, "this rank has CUDA tensors but the collective core cannot use the CUDA runtime: " + cuda_.why,
                cfg_.rank, cfg_.host);
  nccl_api_ = load_nccl_api(cfg_.nccl_library, cfg_.nccl_candidates);
  DeviceReport mine;
  mine.host = cfg_.host;
  mine.machine = machine_id();
  mine.gpu = cuda_.device_identity(device);
  mine.nccl_version = nccl_api_.usable() ? nccl_api_.version : 0;
  mine.why = nccl_api_.why;
  std::vector<DeviceReport> all(cfg_.size);
  const int64_t timeout_ms = static_cast<int64_t>(cfg_.start_timeout_s * 1000);
  if (cfg_.size == 1) {
    all[0] = mine;
  } else {
    store_->set("cuda.report." + std::to_string(cfg_.rank), mine.encode());
    for (int r = 0; r < cfg_.size; ++r)
      all[r] = DeviceReport::decode(store_->get("cuda.report." + std::to_string(r), timeout_ms), "rank " + std::to_string(r));
  }
  CudaDecision d = decide_cuda_path(all);
  staging_ = std::make_unique<StagingBackend>(*cpu_, cuda_);
  staging_->set_activity_sink(&timeline_);
  if (d.path == CudaPath::kNccl) {
    ncclUniqueId id{};
    if (cfg_.rank == 0) nccl_api_.check(nccl_api_.GetUniqueId(&id), "ncclGetUniqueId");
    if (cfg_.size > 1) {
      if (cfg_.rank == 0) store_->set("cuda.nccl_id", std::vector<uint8_t>(id.internal, id.internal + sizeof(id.internal)));
      std::vector<uint8_t> v = store_->get("cuda.nccl_id", timeout_ms);
      if (v.size() != sizeof(id.internal)) throw Error(Code::kProtocol, "NCCL unique id of the wrong size", 0, host_of(0));
      std::copy(v.begin(), v.end(), id.internal);
    }
    auto locked = [this](int dev, size_t bytes, uint64_t stream) {
      DeviceAllocator a;
      {
        std::lock_guard<std::mutex> g(cuda_mu_);
        a = alloc_;
      }
      if (!a) throw Error(Code::kInternal, "no device allocator: CUDA outputs need the framework adapter");
      return a(dev, bytes, stream);
    };
    nccl_ = std::make_unique<NcclBackend>(nccl_api_, cuda_, cfg_.rank, cfg_.size, device, id, locked);
    if (cfg_.verbose && cfg_.rank == 0)
      log_line(cfg_.rank, "CUDA collectives through NCCL " + nccl_version_string(nccl_api_.version) + " (" + nccl_api_.library + ")");
  }
  std::lock_guard<std::mutex> g(cuda_mu_);
  cuda_decision_ = d;
  cuda_ready_ = true;
}

void Runtime::stream_wait(const OpState& op, uint64_t stream) {
  cuda_.check(cuda_.StreamWaitEvent(reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(stream)), op.ready_event.get(), 0),
              "cudaStreamWaitEvent");
}

void Runtime::poll_running() {
  while (!running_.empty()) {
    Running& r = running_.front();
    if (!r.pending->done()) return;  // in plan order: later entries wait for earlier ones
    for (auto& op : r.ops)
      if (op) {
        if (timeline_.on()) timeline_.done(op->req.name, op->req.sig);
        handles_.complete(op, Status::Ok());
      }
    running_.pop_front();
  }
}

void Runtime::abort_backends() {
  if (nccl_) nccl_->abort();
}

}  // namespace appliance
