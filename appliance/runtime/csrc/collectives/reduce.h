// Element-wise kernels: reduce one buffer into another, and scale a buffer.
// float16 and bfloat16 are computed in float32 and rounded back (round to nearest even).
// Integer scaling multiplies in double and truncates toward zero, as Horovod does, which is
// how an integer Average truncates. bool: Sum/Max = or, Min/Product = and.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/types.h"

namespace appliance {

// dst[i] = op(dst[i], src[i]) for i < count. op is Sum, Min, Max or Product.
void reduce_into(void* dst, const void* src, size_t count, DataType dt, ReduceOp op);

// buf[i] = buf[i] * factor. A factor of exactly 1.0 is a no-op.
void scale(void* buf, size_t count, DataType dt, double factor);

// How a host reduction applies `op` over `size` ranks: the op reduce_into runs (Average: Sum),
// then the factor scale() applies to the result (the postscale; for Average divided by size).
inline ReduceOp reduction_op(ReduceOp op) { return op == ReduceOp::kAverage ? ReduceOp::kSum : op; }
inline double final_scale(ReduceOp op, double postscale, int size) {
  return op == ReduceOp::kAverage ? postscale / size : postscale;
}

// Conversions used by the kernels and tests.
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
float bfloat16_to_float(uint16_t b);
uint16_t float_to_bfloat16(float f);

}  // namespace appliance
