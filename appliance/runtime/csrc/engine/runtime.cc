// Runtime lifecycle and the caller-facing API. The background loop is in engine/loop.cc.
#include "engine/runtime.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "common/log.h"
#include "transport/tcp/socket.h"

namespace appliance {

namespace {
constexpr uint32_t kDataFrameMax = 4u << 20;      // payload bytes of one DATA frame
constexpr uint32_t kControlFrameMax = 256u << 20;  // plans of very large models
}  // namespace

Runtime::Runtime(RuntimeConfig cfg) : cfg_(std::move(cfg)), timeline_(cfg_.rank), cache_(cfg_.cache_capacity) {
  if (cfg_.size < 1 || cfg_.rank < 0 || cfg_.rank >= cfg_.size)
    throw std::invalid_argument("rank " + std::to_string(cfg_.rank) + " is not within size " + std::to_string(cfg_.size));
  hosts_.assign(cfg_.size, cfg_.host);
  std::vector<std::unique_ptr<Channel>> data(cfg_.size);
  ctrl_.resize(cfg_.size);
  if (cfg_.size > 1) try {
    const int64_t timeout_ms = static_cast<int64_t>(cfg_.start_timeout_s * 1000);
    AuthParams auth{cfg_.secret, cfg_.job_id, cfg_.rank};
    if (cfg_.rank == 0) {
      // Listen on the address the launcher chose for the store, not on every interface.
      const std::string bind = server_bind_address(cfg_.store_host);
      try {
        store_server_ = std::make_unique<TcpStoreServer>(bind, cfg_.store_port, auth);
      } catch (const Error& e) {
        if (bind.empty()) throw;
        log_line(cfg_.rank, "cannot listen on " + bind + " (" + e.status().message + "); the store listens on all addresses");
        store_server_ = std::make_unique<TcpStoreServer>("", cfg_.store_port, auth);
      }
    }
    store_ = std::make_unique<TcpStoreClient>(cfg_.store_host, cfg_.store_port, auth, timeout_ms);
    MeshOptions mo;
    mo.rank = cfg_.rank;
    mo.size = cfg_.size;
    mo.host = cfg_.host;
    mo.bind_addr = cfg_.data_addr;
    mo.store_host = cfg_.store_host;
    mo.allow_shm = cfg_.shm;
    mo.timeout_ms = timeout_ms;
    mo.peer_timeout_ms = static_cast<int>(cfg_.heartbeat_timeout_s * 1000);
    mo.auth = auth;
    Mesh mesh = build_mesh(*store_, mo);
    topo_ = mesh.topo;
    for (int r = 0; r < cfg_.size; ++r) hosts_[r] = mesh.peers[r].host;
    links_.assign(cfg_.size, "self");
    for (int r = 0; r < cfg_.size; ++r)
      if (mesh.data[r]) {
        links_[r] = mesh.data[r]->kind();
        data[r] = std::make_unique<Channel>(std::move(mesh.data[r]), kDataFrameMax);
      }
    auto now = Clock::now();
    for (int r = 0; r < static_cast<int>(mesh.control.size()); ++r) {
      if (!mesh.control[r]) continue;
      int peer = mesh.control[r]->peer();
      ctrl_[peer].ch = std::make_unique<Channel>(std::move(mesh.control[r]), kControlFrameMax);
      ctrl_[peer].last_recv = ctrl_[peer].last_send = now;
    }
    for (int r = 0; r < cfg_.size; ++r)
      if (ctrl_[r].ch) ctrl_ranks_.push_back(r);
    if (cfg_.verbose && cfg_.rank == 0) {
      std::string line = "appliance: " + std::to_string(cfg_.size) + " ranks on " + std::to_string(topo_.cross_size) + " host(s):";
      for (int r = 0; r < cfg_.size; ++r) line += " " + std::to_string(r) + "@" + mesh.peers[r].host;
      line += "; data links of rank 0:";
      for (int r = 1; r < cfg_.size; ++r) line += " " + std::to_string(r) + "=" + links_[r];
      log_line(cfg_.rank, line);
    }
  } catch (const Error& e) {
    // Could not join: the report names the rank that never came; a lost store (the only
    // connection without a rank) means rank 0, which hosts it, is gone.
    Status s = e.status();
    if (s.origin_rank < 0 && s.code == Code::kPeerLost && cfg_.rank != 0) s.origin_rank = 0;
    record_fault(s);
    throw;
  }
  comm_ = std::make_unique<Comm>(cfg_.rank, cfg_.size, std::move(data), kDataFrameMax);
  copts_.chunk_bytes = std::max<size_t>(1, cfg_.chunk_bytes);
  handles_.set_spin_us(cfg_.spin_us);
  BackendOptions bo;
  bo.rank = cfg_.rank;
  bo.size = cfg_.size;
  bo.host = cfg_.host;
  bo.hosts = hosts_;
  bo.exchange_timeout_ms = static_cast<int64_t>(cfg_.start_timeout_s * 1000);
  bo.collectives = copts_;
  bo.verbose = cfg_.verbose;
  bo.nccl_library = cfg_.nccl_library;
  bo.nccl_candidates = cfg_.nccl_candidates;
  bo.cudart_candidates = cfg_.cudart_candidates;
  backends_ = std::make_unique<BackendRegistry>(std::move(bo), *comm_, store_.get(), &timeline_);
  if (cfg_.rank == 0) {
    CoordinatorOptions co;
    co.size = cfg_.size;
    co.fusion_threshold = cfg_.fusion_threshold;
    co.cycle_time_ms = cfg_.cycle_time_ms;
    co.stall_check_s = cfg_.effective_stall_check_s();
    co.stall_shutdown_s = cfg_.stall_shutdown_s;
    coord_ = std::make_unique<Coordinator>(co);
  }
  if (cfg_.heartbeat_timeout_s > 0)
    hb_interval_ms_ = std::max<int64_t>(50, std::min<int64_t>(1000, static_cast<int64_t>(cfg_.heartbeat_timeout_s * 250)));
  next_stall_check_ = Clock::now() + std::chrono::seconds(1);

  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (wake_fd_ < 0 || epoll_fd_ < 0) throw Error(Code::kInternal, "cannot create eventfd/epoll");
  for (int r = 0; r < cfg_.size; ++r) {
    if (!ctrl_[r].ch) continue;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u32 = static_cast<uint32_t>(r);
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, ctrl_[r].ch->link().wait_handle(), &ev);
  }
  comm_->set_watch(Watch{epoll_fd_, [this] { read_control(true); }, [this] { return arm_control(); }});
  if (cfg_.timeline_at_init()) try {
    timeline_.start(cfg_.timeline, cfg_.timeline_mark_cycles);
  } catch (const std::invalid_argument& e) {
    log_line(cfg_.rank, std::string("HOROVOD_TIMELINE: ") + e.what() + "; the job runs without a timeline");
  }
  thread_ = std::thread([this] { loop(); });
}

Runtime::~Runtime() {
  shutdown();
  if (wake_fd_ >= 0) close(wake_fd_);
  if (epoll_fd_ >= 0) close(epoll_fd_);
}

std::string Runtime::host_of(int rank) const {
  return rank >= 0 && rank < static_cast<int>(hosts_.size()) ? hosts_[rank] : std::string();
}

void Runtime::shutdown() {
  {
    std::lock_guard<std::mutex> g(qmu_);
    stopping_ = true;
    ++posted_;
  }
  uint64_t one = 1;
  if (wake_fd_ >= 0) (void)!write(wake_fd_, &one, sizeof(one));
  {
    std::lock_guard<std::mutex> g(park_mu_);  // park() checks stopping_ under it: no lost wake-up
  }
  park_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  timeline_.stop();  // after the loop: its last events are in
  store_.reset();
  store_server_.reset();  // a re-init (new generation) may bind the same port at once
  handles_.fail_all(Status{Code::kShutdown, cfg_.rank, cfg_.host, "the collective runtime was shut down on this rank"});
}

uint32_t Runtime::new_group(int32_t process_set) {
  std::lock_guard<std::mutex> g(qmu_);
  return ++groups_[process_set];
}

int Runtime::enqueue(Request req, TensorDesc in, TensorDesc out) {
  Signature& s = req.sig;
  auto bad = [&](const std::string& why) {
    throw std::invalid_argument(std::string(op_kind_name(s.kind)) + (req.name.empty() ? "" : " '" + req.name + "'") + ": " + why);
  };
  if (s.kind == OpKind::kJoin) {
    req.name = "__join__";
    s.process_set = 0;  // join is job-wide
  }
  // No name: "<kind>.noname.<n>", n counting per process set, given once the op is accepted.
  const bool auto_name = req.name.empty();
  s.shape = in.shape;
  s.dtype = in.dtype;
  if (s.op == ReduceOp::kAdasum && s.kind == OpKind::kReducescatter) bad("Adasum is an allreduce only");
  if (s.op == ReduceOp::kAdasum && s.kind == OpKind::kAllreduce && dtype_is_integer(s.dtype))
    bad(std::string("Adasum needs floating point tensors, not ") + dtype_name(s.dtype));
  s.device = in.device;
  if (s.kind == OpKind::kJoin && s.device >= 0) join_device_ = s.device;
  for (int64_t d : s.shape)
    if (d < 0) bad("negative dimension in shape " + shape_str(s.shape));
  const bool needs_rows = s.kind == OpKind::kAllgather || s.kind == OpKind::kAlltoall || s.kind == OpKind::kReducescatter;
  if (needs_rows && s.shape.empty()) bad("needs a tensor with at least one dimension");
  if (s.numel() > 0 && s.kind != OpKind::kBarrier && s.kind != OpKind::kJoin && in.ptr == 0) bad("null data pointer");
  if ((s.kind == OpKind::kAllreduce || s.kind == OpKind::kBroadcast) && s.numel() > 0 && out.ptr == 0) bad("null output pointer");
  int P = cfg_.size;
  if (s.process_set != 0) {
    std::lock_guard<std::mutex> g(qmu_);
    auto it = known_sets_.find(s.process_set);
    if (it == known_sets_.end()) bad("process set " + std::to_string(s.process_set) + " is not registered on this rank");
    const std::vector<int>& m = it->second;
    if (!std::binary_search(m.begin(), m.end(), cfg_.rank))
      bad("rank " + std::to_string(cfg_.rank) + " is not in process set " + std::to_string(s.process_set) + " " + shape_str(std::vector<int64_t>(m.begin(), m.end())));
    P = static_cast<int>(m.size());
    if (!auto_name) req.name = "ps" + std::to_string(s.process_set) + "/" + req.name;  // names are per set
  }
  if (s.kind == OpKind::kBroadcast && (s.root < 0 || s.root >= P))
    bad("root rank " + std::to_string(s.root) + " is not within size " + std::to_string(P));
  if (s.kind == OpKind::kAlltoall) {
    if (req.splits.empty()) {
      if (s.shape[0] % P != 0)
        bad("cannot split " + std::to_string(s.shape[0]) + " rows evenly over " + std::to_string(P) + " ranks; pass splits");
    } else {
      if (static_cast<int>(req.splits.size()) != P)
        bad("splits has " + std::to_string(req.splits.size()) + " entries, expected one per rank (" + std::to_string(P) + ")");
      int64_t sum = 0;
      for (int64_t x : req.splits) {
        if (x < 0) bad("negative split " + std::to_string(x));
        sum += x;
      }
      if (sum != s.shape[0]) bad("splits sum to " + std::to_string(sum) + " but the first dimension is " + std::to_string(s.shape[0]));
    }
  } else {
    req.splits.clear();
  }
  if (s.kind != OpKind::kAllreduce && s.kind != OpKind::kReducescatter) {
    s.op = ReduceOp::kSum;
    s.prescale = s.postscale = 1.0;
  }
  if (s.kind != OpKind::kBroadcast) s.root = 0;
  if (s.kind == OpKind::kBarrier || s.kind == OpKind::kJoin) {
    s.shape.clear();
    s.device = -1;  // no data: runs on the host
  }

  if (auto_name) {
    std::lock_guard<std::mutex> g(qmu_);
    const uint64_t n = auto_names_[s.process_set]++;
    req.name = (s.process_set ? "ps" + std::to_string(s.process_set) + "/" : std::string()) + op_kind_name(s.kind) +
               ".noname." + std::to_string(n);
  }
  if (in.device >= 0 || out.device >= 0) device_ops_.store(true);  // callers stop driving (drive.cc)
  auto op = std::make_shared<OpState>();
  op->req = std::move(req);
  op->in = std::move(in);
  op->out = std::move(out);
  if (s.kind == OpKind::kAllgather || s.kind == OpKind::kAlltoall || s.kind == OpKind::kReducescatter) op->pool = outputs_;
  size_t outstanding = 0;
  int h = handles_.add(op, &outstanding);
  {
    std::lock_guard<std::mutex> g(qmu_);
    if (!terminal_.ok() || stopping_) {
      Status st = terminal_.ok() ? Status{Code::kShutdown, cfg_.rank, cfg_.host, "the collective runtime is shutting down"} : terminal_;
      handles_.complete(op, st);
      return h;
    }
    queue_.push_back(op);
    ++posted_;
  }
  const int64_t now_us = steady_us();
  // A burst: issued soon after the previous one without waiting for it (a synchronous loop
  // waits for each op, so its ops never count, however fast it goes).
  burst_.store(outstanding > 0 && now_us - last_enqueue_us_.exchange(now_us) < kBurstGapUs);
  if (sleeping_.exchange(false)) {
    uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
  }
  return h;
}

}  // namespace appliance
