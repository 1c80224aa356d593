// Element types and the 16-bit float conversions every layer relies on.
//
// bf16 and f16 are storage types: arithmetic happens in fp32 after widening.
// The narrowing conversions round to nearest, ties to even, and keep NaN a
// NaN (a plain truncation would turn some NaN payloads into infinities), so
// results match what PyTorch and the hardware produce bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace brisk::core {

enum class DType : uint8_t { f32, bf16, f16, i32, i64, u16, i8, u8 };
inline constexpr int kNumDTypes = 8;

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::bf16: case DType::f16: case DType::u16: return 2;
    case DType::i8: case DType::u8: return 1;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u16: return "u16";
    case DType::i8: return "i8";
    case DType::u8: return "u8";
  }
  return "?";
}

constexpr bool dtype_is_float(DType t) {
  return t == DType::f32 || t == DType::bf16 || t == DType::f16;
}

// Parses "f32", "bf16", ...; throws brisk::core::Error naming the bad value.
DType dtype_from_name(std::string_view name);

inline uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float f32_from_bits(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

// ---- bf16: the top 16 bits of an fp32 --------------------------------------
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return uint16_t(u >> 16);
}
inline float bf16_to_f32(uint16_t h) { return f32_from_bits(uint32_t(h) << 16); }

// ---- f16: IEEE binary16 -----------------------------------------------------
uint16_t f32_to_f16(float f);
float f16_to_f32(uint16_t h);

struct bf16 {
  uint16_t bits = 0;
  bf16() = default;
  explicit bf16(float f) : bits(f32_to_bf16(f)) {}
  explicit operator float() const { return bf16_to_f32(bits); }
};
struct f16 {
  uint16_t bits = 0;
  f16() = default;
  explicit f16(float f) : bits(f32_to_f16(f)) {}
  explicit operator float() const { return f16_to_f32(bits); }
};

// Reads element i of a buffer of any dtype as a double / writes one back.
// Slow and general: meant for reference kernels, tests and tools.
double load_as_double(const void* data, DType t, size_t i);
void store_from_double(void* data, DType t, size_t i, double v);

}  // namespace brisk::core
