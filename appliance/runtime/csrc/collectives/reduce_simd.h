// CPU-specific kernels for 16-bit floats (reduce_x86.cc), used by reduce.cc's reduce_into and
// scale before its portable loops: each call handles a prefix of the buffer (a multiple of
// the vector width) and returns how many elements it did; the portable loop does the rest.
// 0 means "not here": another dtype or op, a CPU without AVX2+F16C, or tests asking for the
// portable path (use_portable_kernels) so both paths are checked against the same references.
#pragma once

#include <cstddef>

#include "common/types.h"

namespace appliance {
namespace simd {

bool kernels_available();          // this CPU runs them (x86-64 with AVX2 and F16C)
void use_portable_kernels(bool on);  // tests: force the portable loops (process-wide)

size_t reduce16(void* dst, const void* src, size_t count, DataType dt, ReduceOp op);
size_t scale16(void* buf, size_t count, DataType dt, float factor);

}  // namespace simd
}  // namespace appliance
