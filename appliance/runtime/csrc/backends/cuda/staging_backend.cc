// StagingBackend: CUDA tensors through host copies and the CPU backend (see
// staging_backend.h).
#include "backends/cuda/staging_backend.h"

#include <cstring>

#include "collectives/reduce.h"

namespace appliance {

namespace {
cudaStream_t stream_of(const TensorDesc& d) { return reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(d.stream)); }
uint64_t addr(const void* p) { return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p)); }

// On the device a 16-bit tensor is scaled by a factor of its own type (NCCL's scalar, Horovod's
// CUDA kernels); the host scales in float32. Rounding the factors first gives the device's results.
double as_device_factor(double f, DataType dt) {
  if (dt == DataType::kFloat16) return half_to_float(float_to_half(static_cast<float>(f)));
  if (dt == DataType::kBFloat16) return bfloat16_to_float(float_to_bfloat16(static_cast<float>(f)));
  return f;
}
}  // namespace

std::unique_ptr<Completion> StagingBackend::launch(const PlanEntry& e, const std::vector<OpState*>& ops) {
  // Host shadows of this rank's operations; the CPU backend runs on them.
  std::vector<std::unique_ptr<OpState>> shadows(ops.size());
  std::vector<std::vector<uint8_t>> host_in(ops.size()), host_out(ops.size());
  std::vector<OpState*> raw(ops.size(), nullptr);
  note(e, "MEMCPY_IN_HOST_BUFFER");
  for (size_t i = 0; i < ops.size(); ++i) {
    OpState* op = ops[i];
    if (!op) continue;
    auto sh = std::make_unique<OpState>();
    sh->req = op->req;
    sh->in = op->in;
    sh->out = op->out;
    const size_t bytes = op->req.sig.nbytes();
    cudaStream_t st = stream_of(op->in);
    if (op->in.device >= 0) cuda_.check(cuda_.SetDevice(op->in.device), "cudaSetDevice");
    host_in[i].resize(bytes ? bytes : 1);
    if (bytes && op->in.ptr) {
      cuda_.check(cuda_.MemcpyAsync(host_in[i].data(), op->in.data(), bytes, kCudaMemcpyDefault, st), "cudaMemcpyAsync (to host)");
      cuda_.check(cuda_.StreamSynchronize(st), "cudaStreamSynchronize");
    }
    sh->in.ptr = addr(host_in[i].data());
    sh->in.device = -1;
    if (op->out.ptr) {
      host_out[i].resize(bytes ? bytes : 1);
      sh->out.ptr = op->out.ptr == op->in.ptr ? sh->in.ptr : addr(host_out[i].data());
      sh->out.device = -1;
    }
    raw[i] = sh.get();
    shadows[i] = std::move(sh);
  }
  PlanEntry scaled = e;
  for (Signature& sig : scaled.sigs) {
    sig.prescale = as_device_factor(sig.prescale, sig.dtype);
    sig.postscale = as_device_factor(sig.postscale, sig.dtype);
  }
  cpu_.execute(scaled, raw);
  note(e, "MEMCPY_OUT_HOST_BUFFER");
  for (size_t i = 0; i < ops.size(); ++i) {
    OpState* op = ops[i];
    if (!op) continue;
    OpState& sh = *shadows[i];
    const size_t bytes = op->req.sig.nbytes();
    cudaStream_t st = stream_of(op->out.ptr ? op->out : op->in);
    if (op->out.ptr && bytes) {
      cuda_.check(cuda_.MemcpyAsync(op->out.data(), sh.out.data(), bytes, kCudaMemcpyDefault, st), "cudaMemcpyAsync (to device)");
      cuda_.check(cuda_.StreamSynchronize(st), "cudaStreamSynchronize");
    }
    op->output = std::move(sh.output);
    op->output_bytes = sh.output_bytes;
    op->out_shape = std::move(sh.out_shape);
    op->recv_splits = std::move(sh.recv_splits);
    op->value = sh.value;
  }
  return nullptr;
}

}  // namespace appliance
