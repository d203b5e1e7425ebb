// The C door (capi/appliance_core.h): each function of the table is the door's work
// (capi/door.h) on the process's Runtime. Exceptions never cross it: a refused submit returns its
// message in err.
#include "capi/capi.h"

#include "capi/door.h"

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

int32_t c_submit(const appliance_core_request* reqs, int32_t n, appliance_core_done done, void* user,
                 appliance_core_op** ops, char* err, size_t err_len) {
  std::string why;
  int32_t enqueued = 0;
  try {
    std::shared_ptr<Runtime> rt = process_runtime();
    if (!rt) throw std::invalid_argument("the collective runtime has not been initialized; call hvd.init() first");
    if (n <= 0) return 0;
    if (!done && !ops) throw std::invalid_argument("submit without a callback needs ops[] for wait()");
    std::vector<Request> qs(static_cast<size_t>(n));
    std::vector<TensorDesc> ins(static_cast<size_t>(n)), outs(static_cast<size_t>(n));
    for (int32_t k = 0; k < n; ++k) door::describe(reqs[k], &qs[k], &ins[k], &outs[k]);  // every member read first
    if (done) {
      enqueued = door::submit(*rt, qs.data(), ins.data(), outs.data(), n, n > 1, nullptr, &why, [done, user](int32_t i) {
        return door::Completion([done, user, i](const OpPtr& op) {
          auto* h = new appliance_core_op;
          h->op = op;
          appliance_core_status st;
          door::status(*op, &h->message, &st);
          done(user, i, h, &st);
        });
      });
    } else {
      std::vector<int> handles(static_cast<size_t>(n));
      enqueued = door::submit(*rt, qs.data(), ins.data(), outs.data(), n, n > 1, handles.data(), &why);
      for (int32_t i = 0; i < enqueued; ++i) {
        ops[i] = new appliance_core_op;
        ops[i]->rt = rt;
        ops[i]->handle = handles[i];
      }
    }
  } catch (const std::exception& e) {
    why = e.what();
  }
  if (enqueued < n) copy_err(why, err, err_len);
  return enqueued;
}

// Waits (once) for a wait-based operation; an unknown handle completes it as refused.
void settle(appliance_core_op* h) {
  if (h->op) return;
  std::string refused;
  char finished = 1;
  door::wait(*h->rt, &h->handle, 1, -1, &h->op, &finished, &refused);
  if (!h->op) {
    h->op = std::make_shared<OpState>();
    h->op->status = Status{Code::kInvalid, -1, "", refused};
    h->op->done.store(true);
  }
}

int32_t c_poll(appliance_core_op* h) {
  if (h->op) return h->op->done.load() ? 1 : 0;
  try {
    return door::poll(*h->rt, h->handle) ? 1 : 0;
  } catch (const std::exception&) {
    return 1;  // forgotten: done
  }
}

void c_wait(appliance_core_op* h, appliance_core_status* st) {
  settle(h);
  door::status(*h->op, &h->message, st);
}

void c_output(appliance_core_op* h, appliance_core_output* out) {
  if (!h->op) {
    *out = appliance_core_output{};
    return;
  }
  door::output(*h->op, out);
}

void c_release(appliance_core_op* h) {
  if (!h) return;
  if (!h->op && h->rt) settle(h);  // never waited for: its handle is freed once done
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
