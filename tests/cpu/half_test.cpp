// The host fp16/bf16 conversions (src/common/half.h) that store every test input and every fp16/bf16 CPU output:
// checked against the compiler's _Float16 (IEEE binary16, round to nearest even) and against bf16 worked by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include "common/half.h"

namespace {

using flashlite::bf16_to_float;
using flashlite::float_to_bf16;
using flashlite::float_to_fp16;
using flashlite::fp16_to_float;

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t bits_of(_Float16 h) {
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}

#if defined(__FLT16_MAX__)
TEST(Half, Fp16ToFloatIsExactForEveryPattern) {
  for (uint32_t u = 0; u < 65536; ++u) {
    _Float16 h;
    const uint16_t b = uint16_t(u);
    std::memcpy(&h, &b, 2);
    const float want = float(h), got = fp16_to_float(b);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << u;
    } else {
      ASSERT_EQ(bits_of(got), bits_of(want)) << std::hex << u;
      ASSERT_EQ(float_to_fp16(got), b) << std::hex << u;  // round trip
    }
  }
}

TEST(Half, FloatToFp16RoundsLikeTheCompiler) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> any;
  int checked = 0;
  const auto check = [&](float f) {
    const uint16_t want = bits_of(_Float16(f)), got = float_to_fp16(f);
    if (std::isnan(f)) {
      ASSERT_EQ(got & 0x7c00u, 0x7c00u);
      ASSERT_NE(got & 0x3ffu, 0u);
    } else {
      ASSERT_EQ(got, want) << f << " bits " << std::hex << bits_of(f);
    }
    ++checked;
  };
  // Random floats across every exponent fp16 can reach (and beyond), plus exact ties around every fp16 value.
  for (int i = 0; i < 200000; ++i) {
    const uint32_t u = any(rng);
    const uint32_t exp = 100 + (u >> 8) % 50;  // 2^-27 .. 2^22: zero, subnormals, normals, overflow
    check(float_of((u & 0x807fffffu) | (exp << 23)));
  }
  for (uint32_t b = 0; b < 0x7c00; ++b) {
    const float lo = fp16_to_float(uint16_t(b)), hi = fp16_to_float(uint16_t(b + 1));
    check(lo + (hi - lo) / 2);
    check(-(lo + (hi - lo) / 2));
  }
  for (float f : {0.f, -0.f, 65504.f, 65519.f, 65520.f, 1e30f, std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::denorm_min(), 5.9604645e-8f, 2.9802322e-8f, 2.9802326e-8f,
                  std::numeric_limits<float>::quiet_NaN()}) {
    check(f);
    check(-f);
  }
  EXPECT_GT(checked, 200000);
}
#endif

TEST(Half, Bf16RoundsToNearestEven) {
  // bf16 keeps 8 significant bits: 1 + 2^-7 is representable, 1 + 2^-8 is a tie between 1 and 1 + 2^-7.
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);                                // tie -> even (down)
  EXPECT_EQ(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);                            // tie -> even (up)
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3f81);        // above the tie
  EXPECT_EQ(float_to_bf16(-2.5f), 0xc020);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(float_to_bf16(float_of(0x7f7f7fffu)), 0x7f7f);  // just below the tie with infinity
  EXPECT_EQ(float_to_bf16(float_of(0x7f7f8000u)), 0x7f80);  // the tie rounds to even: infinity
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  // Every bf16 value converts exactly and back.
  for (uint32_t u = 0; u < 65536; ++u) {
    const float f = bf16_to_float(uint16_t(u));
    ASSERT_EQ(bits_of(f), u << 16);
    if (!std::isnan(f)) {
      ASSERT_EQ(float_to_bf16(f), u);
    }
  }
}

}  // namespace
