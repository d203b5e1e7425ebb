// The door's work on a given Runtime (capi/door.h): what both bindings call.
#include "capi/door.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace appliance {
namespace door {

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

int32_t submit(Runtime& rt, Request* qs, TensorDesc* ins, TensorDesc* outs, int32_t n, bool group, int* handles,
               std::string* err, const std::function<Completion(int32_t)>& on_done) {
  int32_t i = 0;
  try {
    if (group && n > 0) {
      const uint32_t id = rt.new_group(qs[0].sig.process_set);
      for (int32_t k = 0; k < n; ++k) {
        qs[k].sig.group_id = id;
        qs[k].sig.group_size = static_cast<uint32_t>(n);
      }
    }
    for (; i < n; ++i) {
      if (on_done) {
        rt.enqueue(std::move(qs[i]), std::move(ins[i]), std::move(outs[i]), on_done(i));
      } else {
        handles[i] = rt.enqueue(std::move(qs[i]), std::move(ins[i]), std::move(outs[i]));
      }
    }
  } catch (const std::exception& e) {
    *err = e.what();
  }
  return i;
}

int32_t wait(Runtime& rt, const int* handles, int32_t n, int64_t stream, OpPtr* ops, char* finished,
             std::string* refused) {
  int32_t first_bad = n;
  const int64_t t0 = steady_us();
  int64_t now = t0;  // the latest reading, handed from one wait to the next
  int64_t planned = 0;
  for (int32_t i = 0; i < n; ++i) {
    finished[i] = 1;
    try {
      bool fin = true;
      ops[i] = stream < 0 ? rt.wait(handles[i], &now) : rt.wait_on_stream(handles[i], static_cast<uint64_t>(stream), &fin);
      finished[i] = fin ? 1 : 0;
      planned = std::max(planned, ops[i]->planned_us);
      if (fin && !ops[i]->status.ok() && first_bad == n) first_bad = i;
    } catch (const std::exception& e) {
      if (first_bad == n) {
        first_bad = i;
        *refused = e.what();
      }
    }
  }
  rt.note_wait(t0, stream < 0 && now ? now : steady_us(), planned);
  return first_bad;
}

void status(const OpState& op, std::string* message, appliance_core_status* st) {
  const Status& s = op.status;
  if (message->empty() && !s.ok()) *message = s.to_string();
  st->ok = s.ok() ? 1 : 0;
  st->code = static_cast<int32_t>(s.code);
  st->origin_rank = s.origin_rank;
  st->code_name = code_name(s.code);
  st->origin_host = s.host.c_str();
  st->message = message->c_str();
}

void output(const OpState& op, appliance_core_output* out) {
  *out = appliance_core_output{};
  if (!op.done.load() || !op.status.ok()) return;
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

}  // namespace door
}  // namespace appliance
