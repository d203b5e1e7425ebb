// Runtime lifecycle and the caller-facing API. Its turns are in engine/turn.cc, plans in
// engine/plans.cc.
#include "engine/runtime.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "common/log.h"
#include "engine/star_negotiator.h"
#include "engine/tree_negotiator.h"
#include "transport/auth.h"
#include "transport/tcp/socket.h"

namespace appliance {

namespace {
constexpr uint32_t kDataFrameMax = 4u << 20;      // payload bytes of one DATA frame
constexpr uint32_t kControlFrameMax = 256u << 20;  // plans of very large models

std::unique_ptr<Negotiator> make_negotiator(const RuntimeConfig& cfg, NegotiationObserver* seen) {
  if (cfg.negotiation == "star") return std::make_unique<StarNegotiator>(cfg.negotiator(), seen);
  if (cfg.negotiation == "tree") return std::make_unique<TreeNegotiator>(cfg.negotiator(), seen);
  throw std::invalid_argument("negotiation must be tree or star, not '" + cfg.negotiation + "'");
}
}  // namespace

Runtime::Runtime(RuntimeConfig cfg) : cfg_(std::move(cfg)), timeline_(cfg_.rank), sched_(cfg_.schedule(), handles_) {
  if (cfg_.size < 1 || cfg_.rank < 0 || cfg_.rank >= cfg_.size)
    throw std::invalid_argument("rank " + std::to_string(cfg_.rank) + " is not within size " + std::to_string(cfg_.size));
  layout_.hosts.assign(cfg_.size, cfg_.host);
  negotiator_ = make_negotiator(cfg_, this);
  negotiator_->set_carry(carry());
  layout_.link_kinds.reset(new std::atomic<const char*>[cfg_.size]);
  for (int r = 0; r < cfg_.size; ++r) layout_.link_kinds[r].store("self");
  if (cfg_.size > 1) join();
  else control_ = std::make_unique<ControlPlane>(cfg_.rank, cfg_.size, cfg_.heartbeat_timeout_s, layout_.hosts);
  comm_ = std::make_unique<Comm>(cfg_.rank, cfg_.size, kDataFrameMax, [this](int peer) { return open_data(peer); });
  handles_.set_spin_us(cfg_.spin_us);
  // A caller blocked long enough to matter to the deadlock check wakes the engine, which looks.
  if (cfg_.size > 1 && cfg_.wait_report_s() > 0)
    handles_.watch_waits(static_cast<int64_t>(cfg_.wait_report_s() * 1e6), [this] { sched_.wake_always(); });
  // The Watch first: the registry's views of the job's Comm (hosts, process sets) copy it.
  comm_->set_watch(Watch{control_->epoll_fd(), [this] { read_control(true); }, [this] { return control_->arm(); }});
  backends_ = std::make_unique<BackendRegistry>(cfg_.backends(layout_.hosts), *comm_, store_.client.get(), &timeline_);
  if (cfg_.timeline_at_init()) try {
    timeline_.start(cfg_.timeline, cfg_.timeline_mark_cycles);
  } catch (const std::invalid_argument& e) {
    log_line(cfg_.rank, std::string("HOROVOD_TIMELINE: ") + e.what() + "; the job runs without a timeline");
  }
  sched_.start(this);
}

void Runtime::join() try {
  const MeshOptions mo = cfg_.mesh();
  if (cfg_.rank == 0) {
    // Listen on the address the launcher chose for the store, not on every interface.
    const std::string bind = server_bind_address(cfg_.store_host);
    try {
      store_.server = std::make_unique<TcpStoreServer>(bind, cfg_.store_port, mo.auth);
    } catch (const Error& e) {
      if (bind.empty()) throw;
      log_line(cfg_.rank, "cannot listen on " + bind + " (" + e.status().message + "); the store listens on all addresses");
      store_.server = std::make_unique<TcpStoreServer>("", cfg_.store_port, mo.auth);
    }
  }
  store_.client = std::make_unique<TcpStoreClient>(cfg_.store_host, cfg_.store_port, mo.auth, mo.timeout_ms);
  links_ = std::make_unique<Links>(*store_.client, mo);  // publish, and read every rank's address at once
  layout_.topo = links_->topology();
  for (int r = 0; r < cfg_.size; ++r) {
    layout_.hosts[r] = links_->peers()[r].host;
    layout_.link_kinds[r].store(links_->kind(r));
  }
  // The control links the negotiator talks over, opened now: those this rank connects
  // first (they cost no wait on anyone's caller), then those its peers connect.
  // (Control: the higher rank of a pair connects; links.h.)
  control_ = std::make_unique<ControlPlane>(cfg_.rank, cfg_.size, cfg_.heartbeat_timeout_s, layout_.hosts);
  std::vector<int> peers = negotiator_->control_peers();
  std::sort(peers.begin(), peers.end(), [this](int a, int b) { return (a < cfg_.rank) != (b < cfg_.rank) ? a < cfg_.rank : a < b; });
  const Deadline d = deadline_after_ms(mo.timeout_ms);
  for (int peer : peers)
    control_->add(peer, std::make_unique<Channel>(links_->open(peer, kControlChannel, d), kControlFrameMax));
  store_.client->release();  // joined: no socket to the store from here on (a later use connects again)
  if (cfg_.verbose && cfg_.rank == 0) {
    std::string line = "appliance: " + std::to_string(cfg_.size) + " ranks on " + std::to_string(layout_.topo.cross_size) + " host(s):";
    for (int r = 0; r < cfg_.size; ++r) line += " " + std::to_string(r) + "@" + layout_.hosts[r];
    line += "; data links of rank 0 (opened on first use):";
    for (int r = 1; r < cfg_.size; ++r) line += " " + std::to_string(r) + "=" + layout_.link_kinds[r].load();
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

Runtime::~Runtime() { shutdown(); }

std::unique_ptr<Channel> Runtime::open_data(int peer) {
  LinkPtr link = links_->open(peer, kDataChannel, deadline_after_ms(cfg_.start_timeout_ms()),
                              [this](int fd) { wait_for_link(fd); });
  layout_.link_kinds[peer].store(link->kind());
  return std::make_unique<Channel>(std::move(link), kDataFrameMax);
}

void Runtime::wait_for_link(int fd) {
  pollfd fds[2] = {{fd, POLLIN, 0}, {control_->epoll_fd(), POLLIN, 0}};
  const bool ready = control_->arm();
  if (!ready) ::poll(fds, 2, 50);
  read_control(true);  // an ABORT throws out of the wait; heartbeats go on
}

std::string Runtime::host_of(int rank) const {
  return rank >= 0 && rank < static_cast<int>(layout_.hosts.size()) ? layout_.hosts[rank] : std::string();
}

void Runtime::shutdown() {
  {
    std::lock_guard<std::mutex> g(callers_.mu);
    sched_.set_stopping();
  }
  sched_.join();
  timeline_.stop();  // after the loop: its last events are in
  std::lock_guard<std::mutex> g(store_.mu);
  if (store_.client) store_.requests = store_.client->requests();
  if (store_.server) store_.served = store_.server->served();
  store_.client.reset();
  store_.server.reset();  // a re-init (new generation) may bind the same port at once
  if (links_) links_->close();  // nobody connects to a rank that has left
  handles_.fail_all(Status{Code::kShutdown, cfg_.rank, cfg_.host, "the collective runtime was shut down on this rank"});
}

uint64_t Runtime::store_requests() const {
  std::lock_guard<std::mutex> g(store_.mu);
  return store_.client ? store_.client->requests() : store_.requests;
}

uint64_t Runtime::store_served() const {
  std::lock_guard<std::mutex> g(store_.mu);
  return store_.server ? store_.server->served() : store_.served;
}

uint32_t Runtime::new_group(int32_t process_set) {
  std::lock_guard<std::mutex> g(callers_.mu);
  return ++callers_.groups[process_set];
}

int Runtime::enqueue(Request req, TensorDesc in, TensorDesc out, std::function<void(const OpPtr&)> on_done) {
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
    std::lock_guard<std::mutex> g(callers_.mu);
    auto it = callers_.known_sets.find(s.process_set);
    if (it == callers_.known_sets.end()) bad("process set " + std::to_string(s.process_set) + " is not registered on this rank");
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
    std::lock_guard<std::mutex> g(callers_.mu);
    const uint64_t n = callers_.auto_names[s.process_set]++;
    req.name = (s.process_set ? "ps" + std::to_string(s.process_set) + "/" : std::string()) + op_kind_name(s.kind) +
               ".noname." + std::to_string(n);
  }
  const bool device = in.device >= 0 || out.device >= 0;
  auto op = std::make_shared<OpState>();
  op->req = std::move(req);
  op->in = std::move(in);
  op->out = std::move(out);
  op->on_done = std::move(on_done);
  if (s.kind == OpKind::kAllgather || s.kind == OpKind::kAlltoall || s.kind == OpKind::kReducescatter) op->pool = outputs_;
  size_t outstanding = 0;
  int h = handles_.add(op, &outstanding);
  {
    std::lock_guard<std::mutex> g(callers_.mu);
    if (!callers_.terminal.ok() || sched_.stopping()) {
      Status st = callers_.terminal.ok() ? Status{Code::kShutdown, cfg_.rank, cfg_.host, "the collective runtime is shutting down"} : callers_.terminal;
      handles_.complete(op, st);
      return h;
    }
    callers_.queue.push_back(op);
    sched_.post();
  }
  sched_.enqueued(outstanding, device);
  return h;
}

}  // namespace appliance
