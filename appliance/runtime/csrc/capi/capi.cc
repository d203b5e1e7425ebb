// The C door (capi/appliance_core.h): each function of the table over the process's Runtime.
// Exceptions never cross it: a refused submit returns its message in err.
#include "capi/capi.h"

#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace appliance {

static_assert(APPLIANCE_FLOAT32 == static_cast<int>(DataType::kFloat32) && APPLIANCE_BOOL == static_cast<int>(DataType::kBool) &&
                  APPLIANCE_BFLOAT16 == static_cast<int>(DataType::kBFloat16) && kNumDataTypes == 10,
              "appliance_core.h's dtype codes are the core's");
static_assert(APPLIANCE_PRODUCT == static_cast<int>(ReduceOp::kProduct) && APPLIANCE_ADASUM == static_cast<int>(ReduceOp::kAdasum),
              "appliance_core.h's reduce ops are the core's");
static_assert(APPLIANCE_JOIN == static_cast<int>(OpKind::kJoin) && APPLIANCE_REDUCESCATTER == static_cast<int>(OpKind::kReducescatter),
              "appliance_core.h's kinds are the core's");
static_assert(APPLIANCE_STALLED == static_cast<int>(Code::kStalled) && APPLIANCE_SHUTDOWN == static_cast<int>(Code::kShutdown),
              "appliance_core.h's status codes are the core's");

}  // namespace appliance

// The opaque operation: what the door's caller holds until release().
struct appliance_core_op {
  std::shared_ptr<appliance::Runtime> rt;  // wait-based: the runtime its handle belongs to
  int handle = 0;
  appliance::OpPtr op;   // set once done (callback) or by wait()
  std::string message;   // the status's text, kept for the caller
};

namespace appliance {
namespace {

std::mutex g_mu;
std::shared_ptr<Runtime> g_runtime;

void copy_err(const std::string& what, char* err, size_t len) {
  if (!err || !len) return;
  const size_t n = std::min(what.size(), len - 1);
  std::memcpy(err, what.data(), n);
  err[n] = '\0';
}

void fill_status(appliance_core_op* h, appliance_core_status* st) {
  const Status& s = h->op->status;
  if (h->message.empty() && !s.ok()) h->message = s.to_string();
  st->ok = s.ok() ? 1 : 0;
  st->code = static_cast<int32_t>(s.code);
  st->origin_rank = s.origin_rank;
  st->code_name = code_name(s.code);
  st->origin_host = s.host.c_str();
  st->message = h->message.c_str();
}

int32_t c_topology(appliance_core_topology* out) {
  std::shared_ptr<Runtime> rt = process_runtime();
  if (!rt) return 0;
  const Topology& t = rt->topology();
  *out = appliance_core_topology{rt->rank(), rt->size(), t.local_rank, t.local_size, t.cross_rank, t.cross_size};
  return 1;
}

int32_t c_process_set(int32_t id, int32_t* size, int32_t* rank) {
  std::shared_ptr<Runtime> rt = process_runtime();
  std::vector<int> members;
  if (!rt || !rt->process_set_members(id, &members)) return -1;
  if (size) *size = static_cast<int32_t>(members.size());
  int32_t mine = -1;
  for (size_t i = 0; i < members.size(); ++i)
    if (members[i] == rt->rank()) mine = static_cast<int32_t>(i);
  if (rank) *rank = mine;
  return mine >= 0 ? 1 : 0;
}

void describe(const appliance_core_request& r, Request* q, TensorDesc* in, TensorDesc* out) {
  if (r.kind < 0 || !op_kind_valid(static_cast<uint8_t>(r.kind))) throw std::invalid_argument("unknown operation kind " + std::to_string(r.kind));
  if (r.reduce_op < 0 || !reduce_op_valid(static_cast<uint8_t>(r.reduce_op))) throw std::invalid_argument("unknown reduce op " + std::to_string(r.reduce_op));
  if (r.dtype < 0 || !dtype_valid(static_cast<uint8_t>(r.dtype))) throw std::invalid_argument("unknown dtype code " + std::to_string(r.dtype));
  if (r.ndim < 0 || (r.ndim > 0 && !r.shape)) throw std::invalid_argument("bad shape (ndim " + std::to_string(r.ndim) + ")");
  const OpKind kind = static_cast<OpKind>(r.kind);
  const bool core_output = kind == OpKind::kAllgather || kind == OpKind::kAlltoall || kind == OpKind::kReducescatter;
  if (core_output && r.device >= 0) throw std::invalid_argument(std::string(op_kind_name(kind)) + " through the C door takes host memory only");
  q->sig.kind = kind;
  q->sig.op = static_cast<ReduceOp>(r.reduce_op);
  q->sig.prescale = r.prescale == 0 ? 1.0 : r.prescale;
  q->sig.postscale = r.postscale == 0 ? 1.0 : r.postscale;
  q->sig.root = r.root;
  q->sig.process_set = r.process_set;
  if (r.name) q->name = r.name;
  if (r.nsplits > 0) q->splits.assign(r.splits, r.splits + r.nsplits);
  in->ptr = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(r.data));
  in->dtype = static_cast<DataType>(r.dtype);
  in->shape.assign(r.shape, r.shape + r.ndim);
  in->device = r.device;
  in->stream = r.stream;
  *out = *in;
  out->ptr = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(r.out));
}

int32_t c_submit(const appliance_core_request* reqs, int32_t n, appliance_core_done done, void* user,
                 appliance_core_op** ops, char* err, size_t err_len) {
  int32_t i = 0;
  try {
    std::shared_ptr<Runtime> rt = process_runtime();
    if (!rt) throw std::invalid_argument("the collective runtime has not been initialized; call hvd.init() first");
    if (n <= 0) return 0;
    if (!done && !ops) throw std::invalid_argument("submit without a callback needs ops[] for wait()");
    std::vector<Request> qs(static_cast<size_t>(n));
    std::vector<TensorDesc> ins(static_cast<size_t>(n)), outs(static_cast<size_t>(n));
    for (int32_t k = 0; k < n; ++k) describe(reqs[k], &qs[k], &ins[k], &outs[k]);  // every member read first
    if (n > 1) {
      const uint32_t group = rt->new_group(qs[0].sig.process_set);
      for (Request& q : qs) {
        q.sig.group_id = group;
        q.sig.group_size = static_cast<uint32_t>(n);
      }
    }
    for (; i < n; ++i) {
      if (done) {
        rt->enqueue(std::move(qs[i]), std::move(ins[i]), std::move(outs[i]), [done, user, i](const OpPtr& op) {
          auto* h = new appliance_core_op;
          h->op = op;
          appliance_core_status st;
          fill_status(h, &st);
          done(user, i, h, &st);
        });
      } else {
        auto* h = new appliance_core_op;
        h->rt = rt;
        try {
          h->handle = rt->enqueue(std::move(qs[i]), std::move(ins[i]), std::move(outs[i]));
        } catch (...) {
          delete h;
          throw;
        }
        ops[i] = h;
      }
    }
  } catch (const std::exception& e) {
    copy_err(e.what(), err, err_len);
  }
  return i;
}

int32_t c_poll(appliance_core_op* h) {
  if (h->op) return h->op->done.load() ? 1 : 0;
  try {
    return h->rt->poll(h->handle) ? 1 : 0;
  } catch (const std::exception&) {
    return 1;  // forgotten: done
  }
}

void c_wait(appliance_core_op* h, appliance_core_status* st) {
  if (!h->op) {
    int64_t now = 0;
    h->op = h->rt->wait(h->handle, &now);
  }
  fill_status(h, st);
}

void c_output(appliance_core_op* h, appliance_core_output* out) {
  *out = appliance_core_output{};
  if (!h->op || !h->op->done.load() || !h->op->status.ok()) return;
  const OpState& op = *h->op;
  out->value = op.value;
  if (op.output) {
    out->data = op.output->data();
    out->bytes = op.output_bytes;
    out->ndim = static_cast<int32_t>(op.out_shape.size());
    out->shape = op.out_shape.data();
  }
  if (op.req.sig.kind == OpKind::kAlltoall) {
    out->nsplits = static_cast<int32_t>(op.recv_splits.size());
    out->splits = op.recv_splits.data();
  }
}

void c_release(appliance_core_op* h) {
  if (!h) return;
  if (!h->op && h->rt) {  // never waited for: its handle is freed once done
    try {
      int64_t now = 0;
      h->op = h->rt->wait(h->handle, &now);
    } catch (const std::exception&) {
    }
  }
  delete h;
}

const appliance_core_api kApi = {
    APPLIANCE_CORE_ABI_VERSION, sizeof(appliance_core_api), c_topology, c_process_set, c_submit, c_poll, c_wait,
    c_output, c_release,
};

}  // namespace

const appliance_core_api* core_api() { return &kApi; }

std::shared_ptr<Runtime> set_process_runtime(std::shared_ptr<Runtime> rt) {
  std::lock_guard<std::mutex> g(g_mu);
  std::swap(g_runtime, rt);
  return rt;
}

std::shared_ptr<Runtime> process_runtime() {
  std::lock_guard<std::mutex> g(g_mu);
  return g_runtime;
}

}  // namespace appliance
