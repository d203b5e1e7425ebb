// The device decisions (backends/cuda/device_plan.h): NCCL or host staging for the whole job
// from every rank's DeviceReport, then per entry; and the scalars NCCL is handed.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "backends/cuda/device_plan.h"

namespace appliance {
namespace {

DeviceReport report(const std::string& host, const std::string& machine, const std::string& gpu, int nccl,
                    const std::string& why = "") {
  DeviceReport d;
  d.host = host;
  d.machine = machine;
  d.gpu = gpu;
  d.nccl_version = nccl;
  d.why = why;
  return DeviceReport::decode(d.encode(), "test");  // through the bytes ranks exchange
}

PlanEntry entry(OpKind kind, DataType dt, ReduceOp op, double prescale = 1.0, double postscale = 1.0) {
  PlanEntry e;
  e.kind = kind;
  Signature s;
  s.kind = kind;
  s.dtype = dt;
  s.op = op;
  s.prescale = prescale;
  s.postscale = postscale;
  s.device = 0;
  e.sigs.push_back(s);
  e.names.push_back("t");
  return e;
}

CudaPath select(const PlanEntry& e, int size = 2, std::string* why = nullptr) {
  return select_cuda_backend(e, CudaPath::kNccl, size, why);
}

TEST(DecideCudaPath, takes_nccl_when_every_rank_has_the_same_major_minor_on_its_own_gpu) {
  CudaDecision d = decide_cuda_path({report("a", "m1", "gpu0", 22907), report("a", "m1", "gpu1", 22905),
                                     report("b", "m2", "gpu0", 22907)});
  EXPECT_EQ(d.path, CudaPath::kNccl);
  EXPECT_EQ(d.reason, "");
}

TEST(DecideCudaPath, one_rank_without_nccl_moves_the_job_to_staging_naming_it) {
  CudaDecision d = decide_cuda_path({report("a", "m1", "g0", 22907), report("b", "m2", "g0", 0, "libnccl.so.2 not found")});
  EXPECT_EQ(d.path, CudaPath::kStaging);
  EXPECT_EQ(d.reason, "rank 1 (b) cannot use NCCL: libnccl.so.2 not found");
}

TEST(DecideCudaPath, differing_nccl_versions_move_the_job_to_staging) {
  CudaDecision d = decide_cuda_path({report("a", "m1", "g0", 22907), report("b", "m2", "g0", 22805)});
  EXPECT_EQ(d.path, CudaPath::kStaging);
  EXPECT_NE(d.reason.find("NCCL versions differ"), std::string::npos) << d.reason;
}

TEST(DecideCudaPath, two_ranks_on_one_gpu_move_the_job_to_staging) {
  CudaDecision d = decide_cuda_path({report("a", "m1", "g0", 22907), report("a", "m1", "g0", 22907)});
  EXPECT_EQ(d.path, CudaPath::kStaging);
  EXPECT_NE(d.reason.find("ranks 0 and 1 share one GPU (g0 on host a)"), std::string::npos) << d.reason;
}

TEST(DeviceReport, a_truncated_report_is_a_protocol_error) {
  std::vector<uint8_t> b = report("a", "m", "g", 1).encode();
  b.resize(b.size() - 1);
  try {
    DeviceReport::decode(b, "rank 3");
    ADD_FAILURE() << "decoded a truncated report";
  } catch (const Error& e) {
    EXPECT_EQ(e.status().code, Code::kProtocol);
    EXPECT_NE(std::string(e.what()).find("device report of rank 3"), std::string::npos) << e.what();
  }
}

TEST(SelectCudaBackend, nccl_runs_plain_reductions_and_every_other_kind) {
  EXPECT_EQ(select(entry(OpKind::kAllreduce, DataType::kFloat32, ReduceOp::kSum)), CudaPath::kNccl);
  EXPECT_EQ(select(entry(OpKind::kAllreduce, DataType::kFloat16, ReduceOp::kAverage, 2.0, 0.5)), CudaPath::kNccl);
  EXPECT_EQ(select(entry(OpKind::kAllgather, DataType::kBool, ReduceOp::kSum)), CudaPath::kNccl);
  EXPECT_EQ(select(entry(OpKind::kBroadcast, DataType::kInt16, ReduceOp::kSum)), CudaPath::kNccl);
}

TEST(SelectCudaBackend, what_nccl_lacks_goes_through_host_staging_with_its_reason) {
  struct Case {
    PlanEntry e;
    int size;
    const char* reason_part;
  } cases[] = {
      {entry(OpKind::kAllreduce, DataType::kFloat32, ReduceOp::kAdasum), 2, "no Adasum"},
      {entry(OpKind::kAllreduce, DataType::kInt16, ReduceOp::kSum), 2, "no int16 reductions"},
      {entry(OpKind::kReducescatter, DataType::kBool, ReduceOp::kMax), 2, "no bool reductions"},
      {entry(OpKind::kAllreduce, DataType::kFloat32, ReduceOp::kMax, 2.0), 2, "scale factors with op Max"},
      {entry(OpKind::kAllreduce, DataType::kInt32, ReduceOp::kAverage), 2, "integer Average"},
      {entry(OpKind::kAllreduce, DataType::kInt32, ReduceOp::kSum, 1.0, 3.0), 2, "integer scale factors"},
      {entry(OpKind::kAllreduce, DataType::kFloat32, ReduceOp::kSum, 0.5), 1, "one rank"},
  };
  for (const Case& c : cases) {
    std::string why;
    EXPECT_EQ(select(c.e, c.size, &why), CudaPath::kStaging) << c.reason_part;
    EXPECT_NE(why.find(c.reason_part), std::string::npos) << why;
  }
  EXPECT_EQ(select_cuda_backend(entry(OpKind::kAllreduce, DataType::kFloat32, ReduceOp::kSum), CudaPath::kStaging, 2, nullptr),
            CudaPath::kStaging);  // a job on staging stays there
}

TEST(NcclPremulFactor, folds_prescale_postscale_and_average_into_one_factor) {
  Signature s;
  s.op = ReduceOp::kAverage;
  s.prescale = 2.0;
  s.postscale = 0.5;
  EXPECT_DOUBLE_EQ(nccl_premul_factor(s, 4), 0.25);
  s.op = ReduceOp::kSum;
  EXPECT_DOUBLE_EQ(nccl_premul_factor(s, 4), 1.0);
}

TEST(HalfBits, round_to_nearest_even_with_overflow_to_infinity_and_subnormals) {
  EXPECT_EQ(float_to_half_bits(1.0f), 0x3c00);
  EXPECT_EQ(float_to_half_bits(-2.0f), 0xc000);
  EXPECT_EQ(float_to_half_bits(0.1f), 0x2e66);
  EXPECT_EQ(float_to_half_bits(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_half_bits(65520.0f), 0x7c00);
  EXPECT_EQ(float_to_half_bits(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(float_to_half_bits(std::ldexp(1.0f, -25)), 0x0000);        // a tie: to even (zero)
  EXPECT_EQ(float_to_half_bits(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(float_to_half_bits(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(float_to_half_bits(std::numeric_limits<float>::quiet_NaN()) & 0x7e00, 0x7e00);
}

TEST(Bf16Bits, round_to_nearest_even_and_keep_nan_a_nan) {
  EXPECT_EQ(float_to_bf16_bits(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16_bits(1.0f + std::ldexp(1.0f, -8)), 0x3f80);      // tie: down to even
  EXPECT_EQ(float_to_bf16_bits(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);  // tie: up to even
  EXPECT_EQ(float_to_bf16_bits(-2.0f), 0xc000);
  const uint16_t nan = float_to_bf16_bits(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7f80, 0x7f80);
  EXPECT_NE(nan & 0x7f, 0);
}

}  // namespace
}  // namespace appliance
