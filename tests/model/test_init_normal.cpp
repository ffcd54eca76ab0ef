// The initial values' normal kernel (core/init_normal.h): every SIMD path this CPU runs gives the
// scalar path's values bit for bit (many elements, odd and even starts and ends, blocks' edges,
// far indices, extreme keys), and the values are N(0, 1) (moments, tails, the pair's two sides).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/init_normal.h"
#include "model/gpt.h"
#include "zoe/random.h"

namespace zoe::model {
namespace {

struct Level {
  const char* name;
  SimdLevel level;
  initk::NormalFn fn;
};

// The built paths this CPU can run, beside the scalar reference.
std::vector<Level> runnable_levels() {
  std::vector<Level> out;
  const SimdLevel cpu = detected_simd_level();
  if (cpu >= SimdLevel::kAvx2 && initk::normal_avx2())
    out.push_back({"avx2", SimdLevel::kAvx2, initk::normal_avx2()});
  if (cpu >= SimdLevel::kAvx512 && initk::normal_avx512())
    out.push_back({"avx512", SimdLevel::kAvx512, initk::normal_avx512()});
  return out;
}

std::vector<float> fill(initk::NormalFn fn, uint64_t key, uint64_t first, size_t n, float sd = 1.0f) {
  std::vector<float> v(n + 2, 7.0f);
  fn(key, first, n, sd, v.data() + 1);
  EXPECT_EQ(v[0], 7.0f) << "wrote before the range";
  EXPECT_EQ(v[n + 1], 7.0f) << "wrote past the range";
  return std::vector<float>(v.begin() + 1, v.end() - 1);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  return a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(InitNormal, EveryPathEqualsTheScalarBitForBit) {
  const auto levels = runnable_levels();
  if (levels.empty()) GTEST_SKIP() << "this CPU runs the scalar path only";
  const uint64_t keys[] = {0, 1, 0x9E3779B97F4A7C15ull, ~uint64_t{0}, 0x123456789ABCDEFull};
  struct Range {
    uint64_t first;
    size_t n;
  };
  const Range ranges[] = {{0, 0},
                          {0, 1},
                          {1, 1},
                          {0, 2},
                          {1, 2},
                          {3, 5},
                          {0, 511},
                          {1, 512},
                          {511, 3},
                          {255, 1027},
                          {0, 1u << 20},
                          {12345, 99999},
                          {(uint64_t{1} << 40) + 1, 4097},
                          {~uint64_t{0} - 5000, 5000}};
  for (const Level& lv : levels) {
    for (uint64_t key : keys) {
      for (const Range& r : ranges) {
        const auto ref = fill(initk::normal_scalar(), key, r.first, r.n, 0.02f);
        EXPECT_TRUE(same_bits(fill(lv.fn, key, r.first, r.n, 0.02f), ref))
            << lv.name << " key " << key << " elements [" << r.first << ", +" << r.n << ")";
      }
    }
    // normal_for picks that path for its level.
    EXPECT_EQ(initk::normal_for(lv.level), lv.fn) << lv.name;
  }
  EXPECT_EQ(initk::normal_for(SimdLevel::kScalar), initk::normal_scalar());
}

TEST(InitNormal, AShardIsTheSliceOfTheWhole) {
  const auto whole = fill(initk::normal_scalar(), 42, 0, 3000);
  for (uint64_t first : {uint64_t{0}, uint64_t{1}, uint64_t{511}, uint64_t{1000}}) {
    const auto part = fill(initk::normal_for(detected_simd_level()), 42, first, 1001);
    EXPECT_TRUE(same_bits(part, std::vector<float>(whole.begin() + first, whole.begin() + first + 1001)))
        << "first " << first;
  }
}

TEST(InitNormal, StandardNormal) {
  const size_t n = size_t{1} << 22;
  const auto v = fill(initk::normal_for(detected_simd_level()), 9, 0, n);
  double s[2] = {0, 0}, s2[2] = {0, 0}, s4 = 0, cross = 0, tail2 = 0, tail3 = 0, top = 0;
  for (size_t i = 0; i < n; ++i) {
    const double x = v[i];
    ASSERT_TRUE(std::isfinite(x)) << i;
    s[i & 1] += x, s2[i & 1] += x * x, s4 += x * x * x * x;
    if (i & 1) cross += x * v[i - 1];
    tail2 += std::fabs(x) > 2.0, tail3 += std::fabs(x) > 3.0;
    top = std::fmax(top, std::fabs(x));
  }
  const double half = n / 2.0;
  for (int side = 0; side < 2; ++side) {  // the cosine and the sine sides on their own
    EXPECT_NEAR(s[side] / half, 0.0, 0.003) << "side " << side;
    EXPECT_NEAR(std::sqrt(s2[side] / half), 1.0, 0.003) << "side " << side;
  }
  EXPECT_NEAR(cross / half, 0.0, 0.005);                // the two sides of a pair are uncorrelated
  EXPECT_NEAR(s4 / n, 3.0, 0.03);                       // kurtosis of a normal
  EXPECT_NEAR(tail2 / n, 0.0455003, 0.0006);            // P(|z| > 2)
  EXPECT_NEAR(tail3 / n, 0.0026998, 0.00015);           // P(|z| > 3)
  EXPECT_LE(top, std::sqrt(-2.0 * std::log(0x1p-24)));  // the radius's bound with 24 bits
}

TEST(InitNormal, GptWeightsAreNormalWithTheirStd) {
  GptConfig c{.vocab = 4096, .seq = 64, .d_model = 512, .heads = 4, .layers = 2};
  std::vector<float> w(size_t{4096} * 512);
  gpt_init(c, 3, 0, 0, w.data(), w.size());  // wte: N(0, 0.02)
  double s = 0, s2 = 0;
  for (float x : w) s += x, s2 += static_cast<double>(x) * x;
  const double mean = s / w.size();
  EXPECT_NEAR(mean, 0.0, 1e-4);
  EXPECT_NEAR(std::sqrt(s2 / w.size() - mean * mean), 0.02, 1e-4);
  // A residual projection: 0.02 / sqrt(2 * layers).
  std::vector<float> p(size_t{512} * 512);
  gpt_init(c, 3, 1, kProjW, p.data(), p.size());
  s2 = 0;
  for (float x : p) s2 += static_cast<double>(x) * x;
  EXPECT_NEAR(std::sqrt(s2 / p.size()), 0.02 / 2.0, 1e-4);
}

// zoe/random.h: the normal fill is the scalar kernel's values (scaled, shifted) at every element,
// across the threads' chunk boundaries; each fill is a function of (seed, index) only, so a
// prefix of a long fill is the short fill.
TEST(RandomFill, NormalIsTheKernelsStreamAcrossChunks) {
  const size_t n = (size_t{1} << 21) + 77;  // three chunks, the last one partial
  std::vector<float> out(n);
  zoe::fill_normal(out.data(), n, 0.5f, 0.02f, 42);
  const auto ref = fill(initk::normal_scalar(), 42, 0, n, 0.02f);
  size_t wrong = 0;
  for (size_t i = 0; i < n; ++i) wrong += out[i] != ref[i] + 0.5f;
  EXPECT_EQ(wrong, 0u);
  std::vector<float> shorter(1000);
  zoe::fill_normal(shorter.data(), shorter.size(), 0.5f, 0.02f, 42);
  EXPECT_TRUE(same_bits(shorter, std::vector<float>(out.begin(), out.begin() + 1000)));
  std::vector<float> other(1000);
  zoe::fill_normal(other.data(), other.size(), 0.5f, 0.02f, 43);
  EXPECT_FALSE(same_bits(shorter, other)) << "another seed, another stream";
  zoe::fill_normal(nullptr, 0, 0.0f, 1.0f, 1);  // nothing to do
}

TEST(RandomFill, UniformStaysInItsRangeWithItsMoments) {
  const size_t n = (size_t{1} << 22) + 5;
  std::vector<float> out(n);
  const float lo = -0.125f, hi = 0.375f;
  zoe::fill_uniform(out.data(), n, lo, hi, 7);
  double s = 0, s2 = 0;
  float mn = hi, mx = lo;
  for (float x : out) {
    s += x, s2 += static_cast<double>(x) * x;
    mn = std::min(mn, x), mx = std::max(mx, x);
  }
  EXPECT_GE(mn, lo);
  EXPECT_LT(mx, hi);
  const double mean = s / n, var = s2 / n - mean * mean;
  EXPECT_NEAR(mean, 0.125, 5e-4);
  EXPECT_NEAR(var, 0.25 / 12.0, 5e-5);  // (hi - lo)^2 / 12
  std::vector<float> again(n);
  zoe::fill_uniform(again.data(), n, lo, hi, 7);
  EXPECT_TRUE(same_bits(out, again));
  zoe::fill_uniform(again.data(), 1000, lo, hi, 8);
  EXPECT_FALSE(same_bits(std::vector<float>(out.begin(), out.begin() + 1000),
                         std::vector<float>(again.begin(), again.begin() + 1000)));
  // A range of one value, and one a product would round up to its end, stay inside.
  std::vector<float> one(4096);
  zoe::fill_uniform(one.data(), one.size(), 2.0f, 2.0f, 1);
  for (float x : one) ASSERT_EQ(x, 2.0f);
  zoe::fill_uniform(one.data(), one.size(), 1.0f, 1.0f + 0x1p-22f, 1);
  for (float x : one) ASSERT_TRUE(x >= 1.0f && x < 1.0f + 0x1p-22f) << x;
}

}  // namespace
}  // namespace zoe::model
