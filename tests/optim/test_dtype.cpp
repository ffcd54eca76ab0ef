// core/dtype.h conversions: RNE, specials and subnormals, checked against F16C hardware and
// against the exact nearest value computed in double.
#include <gtest/gtest.h>
#include <immintrin.h>

#include <cmath>
#include <random>

#include "core/cpu.h"
#include "core/dtype.h"

namespace zoe {
namespace {

__attribute__((target("f16c"))) uint16_t hw_f32_to_f16(float x) {
  return static_cast<uint16_t>(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
__attribute__((target("f16c"))) float hw_f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }

bool same_or_both_nan(float a, float b) {
  return f32_bits(a) == f32_bits(b) || (std::isnan(a) && std::isnan(b));
}

TEST(DType, F16ToF32AllValuesMatchF16C) {
  if (!cpu_features().f16c) GTEST_SKIP() << "CPU lacks F16C";
  for (uint32_t h = 0; h < 65536; ++h) {
    ASSERT_TRUE(same_or_both_nan(f16_to_f32(uint16_t(h)), hw_f16_to_f32(uint16_t(h))))
        << "h=0x" << std::hex << h;
  }
}

TEST(DType, F32ToF16MatchesF16C) {
  if (!cpu_features().f16c) GTEST_SKIP() << "CPU lacks F16C";
  // Every 251st float (17 M values over all exponents), then every tie between fp16 neighbours.
  for (uint64_t u = 0; u <= 0xffffffffull; u += 251) {
    float x = f32_from_bits(uint32_t(u));
    uint16_t a = f32_to_f16(x), b = hw_f32_to_f16(x);
    if (std::isnan(x)) {
      ASSERT_TRUE((a & 0x7c00) == 0x7c00 && (a & 0x3ff)) << std::hex << u;
      ASSERT_EQ(a, b) << "NaN payload, bits 0x" << std::hex << u;
    } else {
      ASSERT_EQ(a, b) << "bits 0x" << std::hex << u;
    }
  }
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    for (float sign : {1.0f, -1.0f}) {
      float mid = sign * float((double(f16_to_f32(uint16_t(h))) + double(f16_to_f32(uint16_t(h + 1)))) / 2);
      ASSERT_EQ(f32_to_f16(mid), hw_f32_to_f16(mid)) << "tie above h=0x" << std::hex << h;
    }
  }
}

TEST(DType, BF16IsNearestEven) {
  std::mt19937 rng(1);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 2000000; ++i) {
    float x = f32_from_bits(bits(rng));
    uint16_t h = f32_to_bf16(x);
    if (std::isnan(x)) {
      ASSERT_TRUE(std::isnan(bf16_to_f32(h)));
      ASSERT_EQ(h >> 15, f32_bits(x) >> 31);
      continue;
    }
    // The two bf16 candidates around x are the truncation and the next one up in magnitude.
    uint16_t lo = uint16_t(f32_bits(x) >> 16), hi = uint16_t(lo + 1);
    double dl = std::fabs(double(x) - bf16_to_f32(lo));
    double dh = std::isinf(bf16_to_f32(hi)) ? std::ldexp(1.0, 128) - std::fabs(double(x))
                                            : std::fabs(double(x) - bf16_to_f32(hi));
    uint16_t want = dl < dh ? lo : dh < dl ? hi : ((lo & 1) ? hi : lo);
    ASSERT_EQ(h, want) << "x bits 0x" << std::hex << f32_bits(x);
  }
  EXPECT_EQ(f32_to_bf16(INFINITY), 0x7f80);
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_bf16(3.4028235e38f), 0x7f80);              // max float rounds up to inf
  EXPECT_EQ(f32_to_bf16(f32_from_bits(0x7f800001)), 0x7fc0);  // signalling NaN comes back quiet
  EXPECT_EQ(f32_to_bf16(1e-40f), 0x0001);                     // subnormals round like normals in software
}

TEST(DType, BF16StochasticIsUnbiased) {
  float x = 1.0f + 0x1p-9f;  // exactly between 1 and the next bf16 (1 + 2^-7) at 1/4
  std::mt19937 rng(2);
  int up = 0, trials = 100000;
  for (int i = 0; i < trials; ++i) up += f32_to_bf16_stochastic(x, uint16_t(rng())) != 0x3f80;
  EXPECT_NEAR(double(up) / trials, 0.25, 0.01);
  EXPECT_EQ(f32_to_bf16_stochastic(2.0f, 0xffff), 0x4000);  // exact values never move
}

TEST(DType, UlpDistance) {
  EXPECT_EQ(half_ulp_distance(0x3f80, 0x3f81, DType::kBF16), 1u);
  EXPECT_EQ(half_ulp_distance(0x0000, 0x8000, DType::kBF16), 0u);
  EXPECT_EQ(half_ulp_distance(0x0001, 0x8001, DType::kF16), 2u);
  EXPECT_EQ(half_ulp_distance(0x7e00, 0x7e01, DType::kF16), 0u);  // both NaN
  EXPECT_EQ(half_ulp_distance(0x7e00, 0x3c00, DType::kF16), UINT32_MAX);
}

}  // namespace
}  // namespace zoe
