// Signatures and requests: equality, sizes, their bytes, and the text of a cross-rank
// mismatch (see request.h).
#include "coordinator/request.h"

#include <sstream>

namespace appliance {

bool Signature::operator==(const Signature& o) const {
  return kind == o.kind && dtype == o.dtype && shape == o.shape && op == o.op && prescale == o.prescale &&
         postscale == o.postscale && root == o.root && (device < 0) == (o.device < 0) &&
         group_id == o.group_id && group_size == o.group_size && process_set == o.process_set;
}

int64_t Signature::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t Signature::row_elems() const {
  int64_t n = 1;
  for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}

bool Signature::cacheable() const {
  // A group's id is new at every call (Runtime::new_group), so its members would never hit.
  return process_set == 0 && group_size <= 1 &&
         (kind == OpKind::kAllreduce || kind == OpKind::kBroadcast || kind == OpKind::kReducescatter);
}

void Signature::encode(Writer& w) const {
  w.u8(static_cast<uint8_t>(kind));
  w.u8(static_cast<uint8_t>(dtype));
  w.i64s(shape);
  w.u8(static_cast<uint8_t>(op));
  w.f64(prescale);
  w.f64(postscale);
  w.i32(root);
  w.i32(device);
  w.u32(group_id);
  w.u32(group_size);
  w.i32(process_set);
}

Signature Signature::decode(Reader& r) {
  Signature s;
  uint8_t k = r.u8();
  if (!op_kind_valid(k)) r.fail("unknown operation kind " + std::to_string(k));
  s.kind = static_cast<OpKind>(k);
  uint8_t d = r.u8();
  if (!dtype_valid(d)) r.fail("unknown dtype " + std::to_string(d));
  s.dtype = static_cast<DataType>(d);
  s.shape = r.i64s(64);
  for (int64_t x : s.shape)
    if (x < 0) r.fail("negative dimension " + std::to_string(x));
  uint8_t op = r.u8();
  if (!reduce_op_valid(op)) r.fail("unknown reduce op " + std::to_string(op));
  s.op = static_cast<ReduceOp>(op);
  s.prescale = r.f64();
  s.postscale = r.f64();
  s.root = r.i32();
  s.device = r.i32();
  s.group_id = r.u32();
  s.group_size = r.u32();
  s.process_set = r.i32();
  if (s.process_set < 0) r.fail("negative process set id " + std::to_string(s.process_set));
  return s;
}

void Request::encode(Writer& w) const {
  w.str(name);
  sig.encode(w);
  w.i64s(splits);
}

Request Request::decode(Reader& r) {
  Request q;
  q.name = r.str(1 << 16);
  q.sig = Signature::decode(r);
  q.splits = r.i64s(1 << 20);
  return q;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

namespace {
std::string tail(const std::vector<int64_t>& s) {
  return s.empty() ? "[]" : shape_str(std::vector<int64_t>(s.begin() + 1, s.end()));
}
}  // namespace

std::string describe_mismatch(const std::string& name, int ra, const Request& a, int rb, const Request& b) {
  const Signature &x = a.sig, &y = b.sig;
  std::ostringstream os;
  auto head = [&](const char* what) -> std::ostringstream& {
    os << op_kind_name(x.kind) << " '" << name << "': " << what << " differs: rank " << ra << " has ";
    return os;
  };
  if (x.kind != y.kind) {
    os << "tensor '" << name << "': operation differs: rank " << ra << " submitted " << op_kind_name(x.kind)
       << ", rank " << rb << " submitted " << op_kind_name(y.kind);
  } else if (x.dtype != y.dtype) {
    head("dtype") << dtype_name(x.dtype) << ", rank " << rb << " has " << dtype_name(y.dtype);
  } else if ((x.device < 0) != (y.device < 0)) {
    head("device") << (x.device < 0 ? "cpu" : "cuda") << ", rank " << rb << " has " << (y.device < 0 ? "cpu" : "cuda");
  } else if (x.process_set != y.process_set) {
    head("process set") << x.process_set << ", rank " << rb << " has " << y.process_set;
  } else if (x.group_id != y.group_id || x.group_size != y.group_size) {
    head("group") << x.group_id << "/" << x.group_size << ", rank " << rb << " has " << y.group_id << "/" << y.group_size;
  } else if (x.kind == OpKind::kAllgather || x.kind == OpKind::kAlltoall) {
    if (x.shape.size() != y.shape.size() || x.shape.empty() || tail(x.shape) != tail(y.shape))
      head("shape beyond the first dimension") << shape_str(x.shape) << ", rank " << rb << " has " << shape_str(y.shape);
  } else if (x.kind != OpKind::kBarrier && x.kind != OpKind::kJoin && x.shape != y.shape) {
    head("shape") << shape_str(x.shape) << ", rank " << rb << " has " << shape_str(y.shape);
  } else if ((x.kind == OpKind::kAllreduce || x.kind == OpKind::kReducescatter) && x.op != y.op) {
    head("reduce op") << reduce_op_name(x.op) << ", rank " << rb << " has " << reduce_op_name(y.op);
  } else if ((x.kind == OpKind::kAllreduce || x.kind == OpKind::kReducescatter) &&
             (x.prescale != y.prescale || x.postscale != y.postscale)) {
    head("scale factors (prescale, postscale)") << "(" << x.prescale << ", " << x.postscale << "), rank " << rb
                                                << " has (" << y.prescale << ", " << y.postscale << ")";
  } else if (x.kind == OpKind::kBroadcast && x.root != y.root) {
    head("root rank") << x.root << ", rank " << rb << " has " << y.root;
  }
  return os.str();
}

}  // namespace appliance
