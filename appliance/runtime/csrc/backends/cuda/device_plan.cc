// NCCL or host staging, per job and per entry; DeviceReport's bytes; the scalars NCCL is
// handed (see device_plan.h).
#include "backends/cuda/device_plan.h"

#include <cstring>
#include <map>

#include "backends/nccl/nccl_api.h"
#include "common/status.h"
#include "wire/codec.h"

namespace appliance {

std::vector<uint8_t> DeviceReport::encode() const {
  Writer w;
  w.str(host);
  w.str(machine);
  w.str(gpu);
  w.i32(nccl_version);
  w.str(why);
  return w.buffer();
}

DeviceReport DeviceReport::decode(const std::vector<uint8_t>& bytes, const std::string& from) {
  Reader r(bytes.data(), bytes.size(), "device report of " + from);
  DeviceReport d;
  d.host = r.str();
  d.machine = r.str();
  d.gpu = r.str();
  d.nccl_version = r.i32();
  d.why = r.str();
  return d;
}

namespace {
std::string who(const std::vector<DeviceReport>& ranks, int r) {
  return std::to_string(r) + " (" + ranks[r].host + ")";
}
}  // namespace

CudaDecision decide_cuda_path(const std::vector<DeviceReport>& ranks) {
  CudaDecision d;
  for (size_t r = 0; r < ranks.size(); ++r)
    if (ranks[r].nccl_version <= 0) {
      d.reason = "rank " + who(ranks, static_cast<int>(r)) + " cannot use NCCL: " + ranks[r].why;
      return d;
    }
  for (size_t r = 1; r < ranks.size(); ++r)
    if (nccl_version_major_minor(ranks[r].nccl_version) != nccl_version_major_minor(ranks[0].nccl_version)) {
      d.reason = "NCCL versions differ: rank " + who(ranks, 0) + " has " + nccl_version_string(ranks[0].nccl_version) +
                 ", rank " + who(ranks, static_cast<int>(r)) + " has " + nccl_version_string(ranks[r].nccl_version);
      return d;
    }
  std::map<std::pair<std::string, std::string>, std::vector<int>> by_gpu;
  for (size_t r = 0; r < ranks.size(); ++r) by_gpu[{ranks[r].machine, ranks[r].gpu}].push_back(static_cast<int>(r));
  for (auto& kv : by_gpu) {
    if (kv.second.size() < 2) continue;
    std::string list;
    for (size_t i = 0; i < kv.second.size(); ++i)
      list += (i ? (i + 1 == kv.second.size() ? " and " : ", ") : "") + std::to_string(kv.second[i]);
    d.reason = "ranks " + list + " share one GPU (" + kv.first.second + " on host " + ranks[kv.second[0]].host +
               "), which NCCL refuses; pin one GPU per rank with torch.cuda.set_device(hvd.local_rank())";
    return d;
  }
  d.path = CudaPath::kNccl;
  return d;
}

CudaPath select_cuda_backend(const PlanEntry& e, CudaPath path, int size, std::string* why) {
  if (path == CudaPath::kStaging) return CudaPath::kStaging;
  if (e.kind != OpKind::kAllreduce && e.kind != OpKind::kReducescatter) return CudaPath::kNccl;
  const Signature& s = e.sigs[0];
  auto staged = [&](const std::string& reason) {
    if (why) *why = reason;
    return CudaPath::kStaging;
  };
  if (s.op == ReduceOp::kAdasum) return staged("NCCL has no Adasum; it runs on the host (collectives/adasum.cc)");
  if (s.dtype == DataType::kInt16 || s.dtype == DataType::kBool)
    return staged(std::string("NCCL has no ") + dtype_name(s.dtype) + " reductions");
  const bool scaled = s.prescale != 1.0 || s.postscale != 1.0;
  const bool sum_like = s.op == ReduceOp::kSum || s.op == ReduceOp::kAverage;
  if (scaled && !sum_like)
    return staged(std::string("scale factors with op ") + reduce_op_name(s.op) + " are applied on the host");
  if (dtype_is_integer(s.dtype) && (scaled || s.op == ReduceOp::kAverage))
    return staged(std::string("integer ") + (scaled ? "scale factors" : "Average") + " on " + dtype_name(s.dtype) +
                  " truncates on the host, as on the CPU path");
  if (size == 1 && sum_like && nccl_premul_factor(s, size) != 1.0)
    return staged("a scaled sum on one rank is scaled on the host (NCCL 2.28's one-rank PreMulSum misses the last element)");
  return CudaPath::kNccl;
}

double nccl_premul_factor(const Signature& s, int size) {
  double f = s.prescale * s.postscale;
  if (s.op == ReduceOp::kAverage) f /= size;
  return f;
}

uint16_t float_to_half_bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  const uint32_t sign = (b >> 16) & 0x8000u;
  const int32_t exp = static_cast<int32_t>((b >> 23) & 0xff) - 127 + 15;
  uint32_t mant = b & 0x7fffffu;
  if (((b >> 23) & 0xff) == 0xff) return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0));  // inf/nan
  if (exp >= 31) return static_cast<uint16_t>(sign | 0x7c00u);                                         // overflow
  if (exp <= 0) {                                                                                     // subnormal
    if (exp < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    const int shift = 14 - exp;
    uint32_t h = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  uint32_t h = (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) ++h;  // may carry into the exponent: still right
  return static_cast<uint16_t>(sign | h);
}

uint16_t float_to_bf16_bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  if ((b & 0x7f800000u) == 0x7f800000u && (b & 0x7fffffu)) return static_cast<uint16_t>((b >> 16) | 0x40);  // nan
  b += 0x7fffu + ((b >> 16) & 1);
  return static_cast<uint16_t>(b >> 16);
}

}  // namespace appliance
