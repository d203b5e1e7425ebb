// Names, sizes and validity of dtypes, reduce ops and operation kinds (see types.h).
#include "common/types.h"

namespace appliance {

size_t dtype_size(DataType t) {
  switch (t) {
    case DataType::kUInt8:
    case DataType::kInt8:
    case DataType::kBool: return 1;
    case DataType::kInt16:
    case DataType::kFloat16:
    case DataType::kBFloat16: return 2;
    case DataType::kInt32:
    case DataType::kFloat32: return 4;
    case DataType::kInt64:
    case DataType::kFloat64: return 8;
  }
  return 0;
}

const char* dtype_name(DataType t) {
  switch (t) {
    case DataType::kUInt8: return "uint8";
    case DataType::kInt8: return "int8";
    case DataType::kInt16: return "int16";
    case DataType::kInt32: return "int32";
    case DataType::kInt64: return "int64";
    case DataType::kFloat16: return "float16";
    case DataType::kBFloat16: return "bfloat16";
    case DataType::kFloat32: return "float32";
    case DataType::kFloat64: return "float64";
    case DataType::kBool: return "bool";
  }
  return "unknown";
}

bool dtype_valid(uint8_t raw) { return raw < kNumDataTypes; }

bool dtype_is_integer(DataType t) {
  switch (t) {
    case DataType::kFloat16:
    case DataType::kBFloat16:
    case DataType::kFloat32:
    case DataType::kFloat64: return false;
    default: return true;
  }
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kAverage: return "Average";
    case ReduceOp::kSum: return "Sum";
    case ReduceOp::kAdasum: return "Adasum";
    case ReduceOp::kMin: return "Min";
    case ReduceOp::kMax: return "Max";
    case ReduceOp::kProduct: return "Product";
  }
  return "unknown";
}

bool reduce_op_valid(uint8_t raw) { return raw <= static_cast<uint8_t>(ReduceOp::kProduct); }

const char* op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::kAllreduce: return "allreduce";
    case OpKind::kAllgather: return "allgather";
    case OpKind::kBroadcast: return "broadcast";
    case OpKind::kAlltoall: return "alltoall";
    case OpKind::kReducescatter: return "reducescatter";
    case OpKind::kBarrier: return "barrier";
    case OpKind::kJoin: return "join";
  }
  return "unknown";
}

bool op_kind_valid(uint8_t raw) { return raw <= static_cast<uint8_t>(OpKind::kJoin); }

}  // namespace appliance
