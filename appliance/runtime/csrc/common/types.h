// Element types, reduction ops and collective kinds shared by every layer of the core.
// The numeric values are part of the Python binding and of the wire format: append only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace appliance {

enum class DataType : uint8_t {
  kUInt8 = 0,
  kInt8 = 1,
  kInt16 = 2,
  kInt32 = 3,
  kInt64 = 4,
  kFloat16 = 5,
  kBFloat16 = 6,
  kFloat32 = 7,
  kFloat64 = 8,
  kBool = 9,
};
constexpr int kNumDataTypes = 10;

size_t dtype_size(DataType t);
const char* dtype_name(DataType t);
bool dtype_valid(uint8_t raw);
bool dtype_is_integer(DataType t);  // true for the integer types and bool

// Values follow Horovod's (hvd.Average == 0, hvd.Sum == 1, ...). Adasum: allreduce of floats only.
enum class ReduceOp : uint8_t {
  kAverage = 0,
  kSum = 1,
  kAdasum = 2,
  kMin = 3,
  kMax = 4,
  kProduct = 5,
};
const char* reduce_op_name(ReduceOp op);
bool reduce_op_valid(uint8_t raw);

enum class OpKind : uint8_t {
  kAllreduce = 0,
  kAllgather = 1,
  kBroadcast = 2,
  kAlltoall = 3,
  kReducescatter = 4,
  kBarrier = 5,
  kJoin = 6,
};
const char* op_kind_name(OpKind k);
bool op_kind_valid(uint8_t raw);

}  // namespace appliance
