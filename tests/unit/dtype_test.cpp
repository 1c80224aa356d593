// 16-bit float conversions: exhaustive round trips, rounding to nearest even,
// NaN and infinity handling.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "brisk/core/dtype.h"
#include "brisk/core/error.h"

using namespace brisk::core;

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::f32), 4u);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::i64), 8u);
  EXPECT_EQ(dtype_size(DType::i8), 1u);
  for (int i = 0; i < kNumDTypes; ++i) EXPECT_EQ(dtype_from_name(dtype_name(DType(i))), DType(i));
  EXPECT_THROW(dtype_from_name("float33"), ConfigError);
}

TEST(DType, F16RoundTripsEveryFiniteValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_f32(uint16_t(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f)))) << h;
      continue;
    }
    EXPECT_EQ(f32_to_f16(f), uint16_t(h)) << "h=" << h << " f=" << f;
  }
}

TEST(DType, F16RoundsToNearestEven) {
  // 1 + 2^-11 lies halfway between 1 and the next f16 (1 + 2^-10): ties go to even (1).
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), f32_to_f16(1.0f));
  // 1 + 3*2^-11 is halfway between 1+2^-10 (odd) and 1+2^-9 (even): goes up.
  EXPECT_EQ(f16_to_f32(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11))), 1.0f + std::ldexp(1.0f, -9));
  EXPECT_EQ(f16_to_f32(f32_to_f16(65504.f)), 65504.f);
  EXPECT_TRUE(std::isinf(f16_to_f32(f32_to_f16(65520.f))));
  EXPECT_EQ(f16_to_f32(f32_to_f16(std::ldexp(1.0f, -24))), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(f16_to_f32(f32_to_f16(std::ldexp(1.0f, -26))), 0.0f);
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(DType, BF16RoundTripsAndRounds) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = bf16_to_f32(uint16_t(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(f))));
      continue;
    }
    EXPECT_EQ(f32_to_bf16(f), uint16_t(h));
  }
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);  // tie -> even
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8))), 1.0f + std::ldexp(1.0f, -6));
  // A NaN whose payload sits only in the low bits must not become infinity.
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(f32_from_bits(0x7f800001u)))));
  EXPECT_TRUE(std::isinf(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::infinity()))));
}

TEST(DType, LoadStoreAnyType) {
  alignas(8) unsigned char buf[64];
  for (int i = 0; i < kNumDTypes; ++i) {
    store_from_double(buf, DType(i), 3, 42.0);
    EXPECT_EQ(load_as_double(buf, DType(i), 3), 42.0) << dtype_name(DType(i));
  }
  store_from_double(buf, DType::i32, 0, -2.7);
  EXPECT_EQ(load_as_double(buf, DType::i32, 0), -2.0);  // truncates toward zero
}
