// Element-wise reduction and scaling kernels (see reduce.h).
//
// Every kernel is a plain loop over __restrict pointers with the operation inlined, so GCC
// -O3 vectorizes the float32/float64/integer paths (and, being branch-free, the 16-bit float
// paths too). On x86-64 with AVX2+F16C the 16-bit floats go through reduce_x86.cc's kernels
// first (same results, bit for bit; the portable loops take the tail). Semantics worth knowing:
//  * integers wrap on overflow (computed in unsigned arithmetic, no undefined behaviour);
//  * float Min/Max propagate NaN from either side (like torch.minimum/np.minimum);
//  * float16/bfloat16 are widened to float32, combined, and rounded back to nearest-even;
//  * bool: Sum/Max = logical or, Min/Product = logical and; results are 0 or 1;
//  * scale: float32/16-bit floats multiply by (float)factor, float64 by factor, integers
//    multiply in double and truncate toward zero (values beyond int64 saturate; then the
//    result wraps to the element width), bool stays true only for a non-zero factor.
// Failure modes: Error(kInvalid) for Average/Adasum (the caller applies Average as a scale).
#include "collectives/reduce.h"

#include <cstring>
#include <string>
#include <type_traits>

#include "collectives/reduce_simd.h"
#include "common/status.h"

namespace appliance {

namespace {

inline float bits_f(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t f_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// ---- 16-bit float conversions (branch-free so loops over them vectorize) ----------------

// c ? a : b through masks: every arm is computed anyway, and GCC keeps the loop straight-line
// (a ternary over float arithmetic becomes a branch, because the FP ops might trap).
inline uint32_t select(bool c, uint32_t a, uint32_t b) {
  uint32_t m = 0u - static_cast<uint32_t>(c);
  return (a & m) | (b & ~m);
}

inline float h2f(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t em = h & 0x7fffu;
  // normal halves: re-bias the exponent (15 -> 127) and widen the mantissa (10 -> 23 bits)
  uint32_t normal = (em << 13) + (112u << 23);
  // subnormal halves (exponent field 0): em * 2^-24 is exact and a normal float
  uint32_t sub = f_bits(static_cast<float>(static_cast<int32_t>(em)) * 0x1p-24f);
  // infinities and NaNs keep their payload
  uint32_t special = (em << 13) | 0x7f800000u;
  uint32_t mag = select(em >= 0x7c00u, special, select(em < 0x0400u, sub, normal));
  return bits_f(mag | sign);
}

inline uint16_t f2h(float f) {
  uint32_t u = f_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  // NaN: quiet it, keep the top payload bits
  uint32_t nan = 0x7e00u | ((a >> 13) & 0x3ffu);
  // normal result: drop 13 mantissa bits rounding to nearest even; a carry out of the
  // mantissa bumps the exponent, which is exactly right
  uint32_t normal = ((a - (112u << 23)) + 0xfffu + ((a >> 13) & 1u)) >> 13;
  // subnormal result: let the FPU round |f| + 0.5 at a ulp of 2^-24, then read the integer
  uint32_t sub = f_bits(bits_f(a) + 0.5f) - f_bits(0.5f);
  // 0x477ff000 = 65520, the midpoint between the largest half (65504) and 2^16: ties go to
  // the even neighbour, infinity
  uint32_t mag =
      select(a > 0x7f800000u, nan, select(a >= 0x477ff000u, 0x7c00u, select(a >= 0x38800000u, normal, sub)));
  return static_cast<uint16_t>(mag | sign);
}

inline float b2f(uint16_t b) { return bits_f(static_cast<uint32_t>(b) << 16); }

inline uint16_t f2b(float f) {
  uint32_t u = f_bits(f);
  uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  uint32_t nan = (u >> 16) | 0x0040u;
  return static_cast<uint16_t>(select((u & 0x7fffffffu) > 0x7f800000u, nan, rounded));
}

// ---- element operations -----------------------------------------------------------------

// Integer arithmetic in an unsigned type at least as wide as int, so overflow wraps.
template <typename T>
using Wide = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;

struct OpSum {
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
      return a + b;
    } else {
      return static_cast<T>(static_cast<Wide<T>>(a) + static_cast<Wide<T>>(b));
    }
  }
};
struct OpProduct {
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
      return a * b;
    } else {
      return static_cast<T>(static_cast<Wide<T>>(a) * static_cast<Wide<T>>(b));
    }
  }
};
struct OpMin {
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
      return (b < a || b != b) ? b : a;  // NaN in either operand wins
    } else {
      return b < a ? b : a;
    }
  }
};
struct OpMax {
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
      return (b > a || b != b) ? b : a;
    } else {
      return b > a ? b : a;
    }
  }
};

template <typename Op, typename T>
void reduce_loop(T* __restrict d, const T* __restrict s, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = Op::apply(d[i], s[i]);
}

struct Half {
  static float widen(uint16_t v) { return h2f(v); }
  static uint16_t narrow(float f) { return f2h(f); }
};
struct BFloat {
  static float widen(uint16_t v) { return b2f(v); }
  static uint16_t narrow(float f) { return f2b(f); }
};

template <typename Op, typename Cvt>
void reduce_loop16(uint16_t* __restrict d, const uint16_t* __restrict s, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = Cvt::narrow(Op::apply(Cvt::widen(d[i]), Cvt::widen(s[i])));
}

void bool_or(uint8_t* __restrict d, const uint8_t* __restrict s, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = static_cast<uint8_t>((d[i] | s[i]) != 0);
}
void bool_and(uint8_t* __restrict d, const uint8_t* __restrict s, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = static_cast<uint8_t>((d[i] != 0) & (s[i] != 0));
}

template <typename Op>
void reduce_typed(void* dst, const void* src, size_t n, DataType dt) {
  switch (dt) {
    case DataType::kUInt8: return reduce_loop<Op>(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), n);
    case DataType::kInt8: return reduce_loop<Op>(static_cast<int8_t*>(dst), static_cast<const int8_t*>(src), n);
    case DataType::kInt16: return reduce_loop<Op>(static_cast<int16_t*>(dst), static_cast<const int16_t*>(src), n);
    case DataType::kInt32: return reduce_loop<Op>(static_cast<int32_t*>(dst), static_cast<const int32_t*>(src), n);
    case DataType::kInt64: return reduce_loop<Op>(static_cast<int64_t*>(dst), static_cast<const int64_t*>(src), n);
    case DataType::kFloat32: return reduce_loop<Op>(static_cast<float*>(dst), static_cast<const float*>(src), n);
    case DataType::kFloat64: return reduce_loop<Op>(static_cast<double*>(dst), static_cast<const double*>(src), n);
    case DataType::kFloat16:
      return reduce_loop16<Op, Half>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), n);
    case DataType::kBFloat16:
      return reduce_loop16<Op, BFloat>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), n);
    case DataType::kBool: {
      auto* d = static_cast<uint8_t*>(dst);
      auto* s = static_cast<const uint8_t*>(src);
      if (std::is_same_v<Op, OpSum> || std::is_same_v<Op, OpMax>) return bool_or(d, s, n);
      return bool_and(d, s, n);
    }
  }
  throw Error(Code::kInvalid, "reduce: unknown dtype " + std::to_string(static_cast<int>(dt)));
}

// ---- scaling ----------------------------------------------------------------------------

template <typename T>
void scale_float(T* __restrict p, size_t n, T f) {
  for (size_t i = 0; i < n; ++i) p[i] = p[i] * f;
}

template <typename Cvt>
void scale16(uint16_t* __restrict p, size_t n, float f) {
  for (size_t i = 0; i < n; ++i) p[i] = Cvt::narrow(Cvt::widen(p[i]) * f);
}

template <typename T>
void scale_int(T* __restrict p, size_t n, double f) {
  for (size_t i = 0; i < n; ++i) {
    double v = static_cast<double>(p[i]) * f;
    v = v < -9.2e18 ? -9.2e18 : (v > 9.2e18 ? 9.2e18 : v);  // keep the conversion defined
    if (v != v) v = 0;
    int64_t t = static_cast<int64_t>(v);  // truncates toward zero
    p[i] = static_cast<T>(static_cast<std::make_unsigned_t<T>>(static_cast<uint64_t>(t)));
  }
}

}  // namespace

float half_to_float(uint16_t h) { return h2f(h); }
uint16_t float_to_half(float f) { return f2h(f); }
float bfloat16_to_float(uint16_t b) { return b2f(b); }
uint16_t float_to_bfloat16(float f) { return f2b(f); }

void reduce_into(void* dst, const void* src, size_t count, DataType dt, ReduceOp op) {
  if (count == 0) return;
  if (dt == DataType::kFloat16 || dt == DataType::kBFloat16) {  // vector kernels first, where the CPU has them
    const size_t done = simd::reduce16(dst, src, count, dt, op);
    dst = static_cast<uint16_t*>(dst) + done;
    src = static_cast<const uint16_t*>(src) + done;
    count -= done;
    if (count == 0) return;
  }
  switch (op) {
    case ReduceOp::kSum: return reduce_typed<OpSum>(dst, src, count, dt);
    case ReduceOp::kMin: return reduce_typed<OpMin>(dst, src, count, dt);
    case ReduceOp::kMax: return reduce_typed<OpMax>(dst, src, count, dt);
    case ReduceOp::kProduct: return reduce_typed<OpProduct>(dst, src, count, dt);
    case ReduceOp::kAverage:
    case ReduceOp::kAdasum: break;
  }
  throw Error(Code::kInvalid, std::string("reduce: op ") + reduce_op_name(op) +
                                  " is not an element-wise reduction (Average = Sum then scale; Adasum unsupported)");
}

void scale(void* buf, size_t count, DataType dt, double factor) {
  if (factor == 1.0 || count == 0) return;
  if (dt == DataType::kFloat16 || dt == DataType::kBFloat16) {
    const size_t done = simd::scale16(buf, count, dt, static_cast<float>(factor));
    buf = static_cast<uint16_t*>(buf) + done;
    count -= done;
    if (count == 0) return;
  }
  switch (dt) {
    case DataType::kFloat32: return scale_float(static_cast<float*>(buf), count, static_cast<float>(factor));
    case DataType::kFloat64: return scale_float(static_cast<double*>(buf), count, factor);
    case DataType::kFloat16: return scale16<Half>(static_cast<uint16_t*>(buf), count, static_cast<float>(factor));
    case DataType::kBFloat16: return scale16<BFloat>(static_cast<uint16_t*>(buf), count, static_cast<float>(factor));
    case DataType::kUInt8: return scale_int(static_cast<uint8_t*>(buf), count, factor);
    case DataType::kInt8: return scale_int(static_cast<int8_t*>(buf), count, factor);
    case DataType::kInt16: return scale_int(static_cast<int16_t*>(buf), count, factor);
    case DataType::kInt32: return scale_int(static_cast<int32_t*>(buf), count, factor);
    case DataType::kInt64: return scale_int(static_cast<int64_t*>(buf), count, factor);
    case DataType::kBool: {
      if (factor != 0) return;  // non-zero stays non-zero; normalise nothing
      std::memset(buf, 0, count);
      return;
    }
  }
  throw Error(Code::kInvalid, "scale: unknown dtype " + std::to_string(static_cast<int>(dt)));
}

}  // namespace appliance
