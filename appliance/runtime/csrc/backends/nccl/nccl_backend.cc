// NcclBackend: plan entries on CUDA tensors through one NCCL communicator, and the
// completion of each on its stream (see nccl_backend.h).
#include "backends/nccl/nccl_backend.h"

#include "backends/cuda/device_plan.h"
#include "common/status.h"

namespace appliance {

namespace {
cudaStream_t stream_of(const TensorDesc& d) { return reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(d.stream)); }

// NCCL's element type for a reduction (data movement uses bytes, see kNcclUint8).
int nccl_type(DataType t) {
  switch (t) {
    case DataType::kUInt8: return kNcclUint8;
    case DataType::kInt8: return kNcclInt8;
    case DataType::kInt32: return kNcclInt32;
    case DataType::kInt64: return kNcclInt64;
    case DataType::kFloat16: return kNcclFloat16;
    case DataType::kBFloat16: return kNcclBfloat16;
    case DataType::kFloat32: return kNcclFloat32;
    case DataType::kFloat64: return kNcclFloat64;
    default: break;
  }
  throw Error(Code::kInternal, std::string("NCCL has no reduction on ") + dtype_name(t) + " (device_plan should have staged it)");
}

class NcclCompletion final : public Completion {
 public:
  NcclCompletion(const NcclApi& nccl, const CudaApi& cuda, ncclComm_t comm, std::shared_ptr<void> ev)
      : nccl_(nccl), cuda_(cuda), comm_(comm), ev_(std::move(ev)) {}
  std::shared_ptr<void> ready_event() override { return ev_; }
  bool done() override {
    int async = kNcclSuccess;
    nccl_.CommGetAsyncError(comm_, &async);
    if (async != kNcclSuccess && async != kNcclInProgress) nccl_.check(async, "asynchronous operation");
    int rc = cuda_.EventQuery(ev_.get());
    if (rc == kCudaErrorNotReady) return false;
    cuda_.check(rc, "cudaEventQuery");
    return true;
  }

 private:
  const NcclApi& nccl_;
  const CudaApi& cuda_;
  ncclComm_t comm_;
  std::shared_ptr<void> ev_;  // destroyed when neither this nor an op holds it
};
}  // namespace

NcclBackend::NcclBackend(const NcclApi& nccl, const CudaApi& cuda, int rank, int size, int device,
                         const ncclUniqueId& id, DeviceAllocator alloc)
    : nccl_(nccl), cuda_(cuda), rank_(rank), size_(size), device_(device), alloc_(std::move(alloc)) {
  cuda_.check(cuda_.SetDevice(device_), "cudaSetDevice");
  nccl_.check(nccl_.CommInitRank(&comm_, size_, id, rank_), "ncclCommInitRank");
  cuda_.check(cuda_.EventCreateWithFlags(&fusion_free_, kCudaEventDisableTiming), "cudaEventCreate");
}

NcclBackend::~NcclBackend() {
  abort();  // local and bounded, unlike ncclCommDestroy, which may wait on peers
  if (fusion_free_) cuda_.EventDestroy(fusion_free_);
  if (fusion_) cuda_.Free(fusion_);
}

void NcclBackend::abort() {
  if (comm_) nccl_.CommAbort(comm_);
  comm_ = nullptr;
}

std::unique_ptr<Completion> NcclBackend::launch(const PlanEntry& e, const std::vector<OpState*>& ops) {
  if (!comm_) throw Error(Code::kAborted, "the NCCL communicator was aborted");
  cuda_.check(cuda_.SetDevice(device_), "cudaSetDevice");
  cudaStream_t st = nullptr;
  bool have = false;
  stream_ = nullptr;
  for (OpState* op : ops) {
    if (!op) continue;
    if (op->in.device != device_)
      throw Error(Code::kInvalid, "'" + op->req.name + "' is on cuda:" + std::to_string(op->in.device) +
                                      " but this rank's NCCL communicator is on cuda:" + std::to_string(device_) +
                                      ": use one GPU per rank (torch.cuda.set_device(hvd.local_rank()))");
    if (!have) st = stream_of(op->in), have = true;
  }
  stream_ = st;
  switch (e.kind) {
    case OpKind::kAllreduce: allreduce(e, ops, st); break;
    case OpKind::kAllgather: allgather(e, *ops.at(0), st); break;
    case OpKind::kBroadcast: broadcast(e, *ops.at(0), st); break;
    case OpKind::kAlltoall: alltoall(e, *ops.at(0), st); break;
    case OpKind::kReducescatter: reducescatter(e, *ops.at(0), st); break;
    default: APPLIANCE_ASSERT(false, std::string("NCCL backend asked to run ") + op_kind_name(e.kind));
  }
  cudaEvent_t raw = nullptr;
  cuda_.check(cuda_.EventCreateWithFlags(&raw, kCudaEventDisableTiming), "cudaEventCreate");
  const CudaApi* cuda = &cuda_;
  std::shared_ptr<void> ev(raw, [cuda](void* e) { cuda->EventDestroy(e); });
  cuda_.check(cuda_.EventRecord(raw, st), "cudaEventRecord");
  stream_ = st;
  return std::make_unique<NcclCompletion>(nccl_, cuda_, comm_, std::move(ev));
}

ncclRedOp_t NcclBackend::red_op(const Signature& s, bool* created) {
  *created = false;
  const double f = nccl_premul_factor(s, size_);
  switch (s.op) {
    case ReduceOp::kMin: return kNcclMin;
    case ReduceOp::kMax: return kNcclMax;
    case ReduceOp::kProduct: return kNcclProd;
    case ReduceOp::kAverage:
      if (f == 1.0) return kNcclSum;  // one rank, no scales: a copy
      if (s.prescale == 1.0 && s.postscale == 1.0) return kNcclAvg;
      break;
    default:
      if (f == 1.0) return kNcclSum;
  }
  // Sum-like with a factor: one pre-multiplied sum, the factor passed by value from the host.
  union {
    double d;
    float f;
    uint16_t h;
  } scalar{};
  switch (s.dtype) {
    case DataType::kFloat64: scalar.d = f; break;
    case DataType::kFloat32: scalar.f = static_cast<float>(f); break;
    case DataType::kFloat16: scalar.h = float_to_half_bits(static_cast<float>(f)); break;
    case DataType::kBFloat16: scalar.h = float_to_bf16_bits(static_cast<float>(f)); break;
    default: throw Error(Code::kInternal, "scaled NCCL reduction on an integer type (device_plan should have staged it)");
  }
  ncclRedOp_t op = 0;
  nccl_.check(nccl_.RedOpCreatePreMulSum(&op, &scalar, nccl_type(s.dtype), kNcclScalarHostImmediate, comm_),
              "ncclRedOpCreatePreMulSum");
  *created = true;
  return op;
}

uint8_t* NcclBackend::device_output(OpState& o, size_t bytes, std::vector<int64_t> shape) {
  if (!alloc_) throw Error(Code::kInternal, "no device allocator: CUDA outputs need the framework adapter");
  DeviceBlock b = alloc_(device_, bytes ? bytes : 1, static_cast<uint64_t>(reinterpret_cast<uintptr_t>(stream_)));
  o.device_output = b.owner;
  o.output_bytes = bytes;
  o.out_shape = std::move(shape);
  return reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(b.ptr));
}

uint8_t* NcclBackend::fusion_buffer(size_t bytes, cudaStream_t st) {
  // The previous batch may still be in flight on another stream: order after it.
  cuda_.check(cuda_.StreamWaitEvent(st, fusion_free_, 0), "cudaStreamWaitEvent");
  if (bytes > fusion_cap_) {
    if (fusion_) cuda_.check(cuda_.Free(fusion_), "cudaFree");  // synchronizes the device
    fusion_ = nullptr;
    size_t cap = fusion_cap_ ? fusion_cap_ : (1u << 20);
    while (cap < bytes) cap *= 2;
    cuda_.check(cuda_.Malloc(&fusion_, cap), "cudaMalloc (fusion buffer)");
    fusion_cap_ = cap;
  }
  return static_cast<uint8_t*>(fusion_);
}

void NcclBackend::allreduce(const PlanEntry& e, const std::vector<OpState*>& ops, cudaStream_t st) {
  const Signature& s = e.sigs[0];
  bool created = false;
  ncclRedOp_t op = red_op(s, &created);
  const int type = nccl_type(s.dtype);
  const size_t esize = dtype_size(s.dtype);
  if (e.names.size() == 1 && ops[0]) {
    OpState& o = *ops[0];
    nccl_.check(nccl_.AllReduce(o.in.data(), o.out.data(), static_cast<size_t>(s.numel()), type, op, comm_, st),
                "ncclAllReduce");
  } else {
    size_t total = 0;
    for (const Signature& x : e.sigs) total += x.nbytes();
    uint8_t* buf = fusion_buffer(total, st);
    size_t off = 0;
    for (size_t i = 0; i < e.names.size(); ++i) {
      const size_t n = e.sigs[i].nbytes();
      if (n && ops[i]) cuda_.check(cuda_.MemcpyAsync(buf + off, ops[i]->in.data(), n, kCudaMemcpyDefault, st), "cudaMemcpyAsync (fuse)");
      else if (n) cuda_.check(cuda_.MemsetAsync(buf + off, 0, n, st), "cudaMemsetAsync");
      off += n;
    }
    nccl_.check(nccl_.AllReduce(buf, buf, total / esize, type, op, comm_, st), "ncclAllReduce (fused)");
    off = 0;
    for (size_t i = 0; i < e.names.size(); ++i) {
      const size_t n = e.sigs[i].nbytes();
      if (n && ops[i]) cuda_.check(cuda_.MemcpyAsync(ops[i]->out.data(), buf + off, n, kCudaMemcpyDefault, st), "cudaMemcpyAsync (unfuse)");
      off += n;
    }
    cuda_.check(cuda_.EventRecord(fusion_free_, st), "cudaEventRecord");
  }
  if (created) nccl_.RedOpDestroy(op, comm_);
}

void NcclBackend::allgather(const PlanEntry& e, OpState& o, cudaStream_t st) {
  const Signature& s = e.sigs[0];
  const size_t row = static_cast<size_t>(s.row_elems()) * dtype_size(s.dtype);
  std::vector<size_t> bytes(size_), offs(size_);
  size_t total = 0;
  int64_t rows = 0;
  bool even = true;
  for (int r = 0; r < size_; ++r) {
    bytes[r] = static_cast<size_t>(e.sizes[r]) * row;
    offs[r] = total;
    total += bytes[r];
    rows += e.sizes[r];
    even = even && bytes[r] == bytes[0];
  }
  std::vector<int64_t> shape = o.in.shape;
  shape[0] = rows;
  uint8_t* out = device_output(o, total, shape);
  if (even) {
    nccl_.check(nccl_.AllGather(o.in.data(), out, bytes[0], kNcclUint8, comm_, st), "ncclAllGather");
    return;
  }
  nccl_.check(nccl_.GroupStart(), "ncclGroupStart");
  for (int r = 0; r < size_; ++r)
    if (bytes[r]) nccl_.check(nccl_.Broadcast(o.in.data(), out + offs[r], bytes[r], kNcclUint8, r, comm_, st), "ncclBroadcast");
  nccl_.check(nccl_.GroupEnd(), "ncclGroupEnd");
}

void NcclBackend::broadcast(const PlanEntry& e, OpState& o, cudaStream_t st) {
  const Signature& s = e.sigs[0];
  if (!s.nbytes()) return;
  nccl_.check(nccl_.Broadcast(o.in.data(), o.out.data(), s.nbytes(), kNcclUint8, s.root, comm_, st), "ncclBroadcast");
}

void NcclBackend::alltoall(const PlanEntry& e, OpState& o, cudaStream_t st) {
  AlltoallLayout l = alltoall_layout(e, o.in.shape, size_, rank_);
  o.recv_splits = std::move(l.recv_splits);
  uint8_t* out = device_output(o, l.recv_total, std::move(l.out_shape));
  const uint8_t* in = static_cast<const uint8_t*>(o.in.data());
  size_t soff = 0, roff = 0;
  nccl_.check(nccl_.GroupStart(), "ncclGroupStart");
  for (int p = 0; p < size_; ++p) {
    if (p == rank_ && l.recv[p])
      cuda_.check(cuda_.MemcpyAsync(out + roff, in + soff, l.recv[p], kCudaMemcpyDefault, st), "cudaMemcpyAsync");
    else if (p != rank_ && l.send[p])
      nccl_.check(nccl_.Send(in + soff, l.send[p], kNcclUint8, p, comm_, st), "ncclSend");
    if (p != rank_ && l.recv[p]) nccl_.check(nccl_.Recv(out + roff, l.recv[p], kNcclUint8, p, comm_, st), "ncclRecv");
    soff += l.send[p];
    roff += l.recv[p];
  }
  nccl_.check(nccl_.GroupEnd(), "ncclGroupEnd");
}

void NcclBackend::reducescatter(const PlanEntry& e, OpState& o, cudaStream_t st) {
  const Signature& s = e.sigs[0];
  const int64_t dim0 = s.shape.empty() ? 1 : s.shape[0];
  const size_t row = static_cast<size_t>(s.row_elems());
  std::vector<size_t> counts(size_), offs(size_);
  size_t off = 0;
  bool even = true;
  for (int r = 0; r < size_; ++r) {
    counts[r] = static_cast<size_t>(reducescatter_rows(dim0, size_, r)) * row;
    offs[r] = off;
    off += counts[r];
    even = even && counts[r] == counts[0];
  }
  std::vector<int64_t> shape = s.shape;
  if (!shape.empty()) shape[0] = reducescatter_rows(dim0, size_, rank_);
  const size_t esize = dtype_size(s.dtype);
  uint8_t* out = device_output(o, counts[rank_] * esize, shape);
  bool created = false;
  ncclRedOp_t op = red_op(s, &created);
  const int type = nccl_type(s.dtype);
  const uint8_t* in = static_cast<const uint8_t*>(o.in.data());
  if (even) {
    nccl_.check(nccl_.ReduceScatter(in, out, counts[0], type, op, comm_, st), "ncclReduceScatter");
  } else {
    nccl_.check(nccl_.GroupStart(), "ncclGroupStart");
    for (int r = 0; r < size_; ++r)
      if (counts[r]) nccl_.check(nccl_.Reduce(in + offs[r] * esize, out, counts[r], type, op, r, comm_, st), "ncclReduce");
    nccl_.check(nccl_.GroupEnd(), "ncclGroupEnd");
  }
  if (created) nccl_.RedOpDestroy(op, comm_);
}

}  // namespace appliance
