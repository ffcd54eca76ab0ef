// LossScaler: the dynamic scale stays a normal positive fp32 number, which the update needs.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "zero/loss_scaler.h"

namespace zoe::zero {
namespace {

bool normal_fp32(double scale) {
  const float f = static_cast<float>(scale);
  return std::isnormal(f) && f > 0;
}

TEST(LossScaler, GrowthStopsAtTheLargestFp32PowerOfTwo) {
  LossScaler::Options o;
  o.initial_scale_power = 120;
  o.window = 1;
  LossScaler s(o);
  for (int i = 0; i < 2000; ++i) {
    s.update(false);
    ASSERT_TRUE(normal_fp32(s.scale())) << "after " << i + 1 << " steps without overflow: " << s.scale();
  }
  EXPECT_EQ(s.scale(), LossScaler::kMaxScale);
  // An overflow still halves it.
  o.hysteresis = 1;
  LossScaler t(o);
  for (int i = 0; i < 100; ++i) t.update(false);
  t.update(true);
  EXPECT_EQ(t.scale(), LossScaler::kMaxScale / 2);
}

TEST(LossScaler, ShrinkStopsAtTheSmallestScaleTheConfigAccepts) {
  LossScaler::Options o;
  o.initial_scale_power = 0;
  o.hysteresis = 1;
  o.min_scale = static_cast<double>(std::numeric_limits<float>::min());
  LossScaler s(o);
  for (int i = 0; i < 2000; ++i) {
    s.update(true);
    ASSERT_TRUE(normal_fp32(s.scale())) << "after " << i + 1 << " overflows: " << s.scale();
  }
  EXPECT_EQ(s.scale(), o.min_scale);
}

TEST(LossScaler, Fp32RangeOfALoadedScale) {
  EXPECT_TRUE(LossScaler::fits_fp32(65536.0));
  EXPECT_TRUE(LossScaler::fits_fp32(static_cast<double>(std::numeric_limits<float>::min())));
  EXPECT_FALSE(LossScaler::fits_fp32(1e-300));  // 0 in fp32: the update's scale check would abort
  EXPECT_FALSE(LossScaler::fits_fp32(1e-40));   // denormal in fp32
  EXPECT_FALSE(LossScaler::fits_fp32(1e300));   // infinite in fp32
  EXPECT_FALSE(LossScaler::fits_fp32(0.0));
  EXPECT_FALSE(LossScaler::fits_fp32(std::nan("")));
}

}  // namespace
}  // namespace zoe::zero
