// f16 conversions and the any-dtype element access used by reference kernels.
#include "brisk/core/dtype.h"

#include <cmath>
#include <string>

#include "brisk/core/error.h"

namespace brisk::core {

DType dtype_from_name(std::string_view name) {
  for (int i = 0; i < kNumDTypes; ++i)
    if (dtype_name(DType(i)) == name) return DType(i);
  throw ConfigError("unknown dtype '" + std::string(name) + "' (expected f32, bf16, f16, i32, i64, u16, i8 or u8)");
}

// Round to nearest even, subnormals, overflow to infinity, NaN kept: the
// float-arithmetic formulation (as in the FP16 library) lets the FPU round.
uint16_t f32_to_f16(float f) {
  const float scale_to_inf = 0x1.0p+112f, scale_to_zero = 0x1.0p-110f;
  float base = (std::fabs(f) * scale_to_inf) * scale_to_zero;
  const uint32_t w = f32_bits(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xff000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = f32_from_bits((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = f32_bits(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007c00u;
  const uint32_t mantissa_bits = bits & 0x00000fffu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  return uint16_t((sign >> 16) | (shl1_w > 0xff000000u ? 0x7e00u : nonsign));
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return f32_from_bits(sign);
    const float v = std::ldexp(float(mant), -24);  // subnormal
    return sign ? -v : v;
  }
  if (exp == 31) return f32_from_bits(sign | 0x7f800000u | (mant << 13));
  return f32_from_bits(sign | ((exp + 112) << 23) | (mant << 13));
}

double load_as_double(const void* data, DType t, size_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(data)[i];
    case DType::bf16: return bf16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case DType::f16: return f16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case DType::i32: return static_cast<const int32_t*>(data)[i];
    case DType::i64: return double(static_cast<const int64_t*>(data)[i]);
    case DType::u16: return static_cast<const uint16_t*>(data)[i];
    case DType::i8: return static_cast<const int8_t*>(data)[i];
    case DType::u8: return static_cast<const uint8_t*>(data)[i];
  }
  return 0.0;
}

// Integer stores truncate toward zero like a C cast (values are assumed in range).
void store_from_double(void* data, DType t, size_t i, double v) {
  switch (t) {
    case DType::f32: static_cast<float*>(data)[i] = float(v); break;
    case DType::bf16: static_cast<uint16_t*>(data)[i] = f32_to_bf16(float(v)); break;
    case DType::f16: static_cast<uint16_t*>(data)[i] = f32_to_f16(float(v)); break;
    case DType::i32: static_cast<int32_t*>(data)[i] = int32_t(v); break;
    case DType::i64: static_cast<int64_t*>(data)[i] = int64_t(v); break;
    case DType::u16: static_cast<uint16_t*>(data)[i] = uint16_t(v); break;
    case DType::i8: static_cast<int8_t*>(data)[i] = int8_t(v); break;
    case DType::u8: static_cast<uint8_t*>(data)[i] = uint8_t(v); break;
  }
}

}  // namespace brisk::core
