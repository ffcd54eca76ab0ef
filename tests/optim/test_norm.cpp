// Gradient norms, the fused convert+norm pass and the scale pass on every SIMD path vs the reference.
//
// Tolerances: sums of squares within 1e-12 relative (double accumulation, different order);
// conversions bit-identical to core/dtype.h's RNE, except that the AVX512-BF16 instruction
// flushes fp32 subnormal inputs to a signed zero (checked explicitly below).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "optim/adam.h"
#include "optim/adam_reference.h"
#include "optim_test_util.h"
#include "tests/util/status_test_util.h"

namespace zoe::optim::test {
namespace {

using Combo = std::tuple<int, DType>;
class NormPaths : public ::testing::TestWithParam<Combo> {};

Buf random_buf(DType d, size_t n, size_t off, uint32_t seed) {
  Buf b(d, n, off);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (size_t i = 0; i < n; ++i) b.set(i, nd(rng));
  return b;
}

TEST_P(NormPaths, MatchesReference) {
  auto [pi, d] = GetParam();
  const Path& path = all_paths()[pi];
  if (auto why = path_unavailable(path); !why.empty()) GTEST_SKIP() << why;
  for (size_t n : {size_t(0), size_t(1), size_t(15), size_t(17), size_t(40001), size_t(1000003)}) {
    for (size_t off : {0, 1}) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << " offset=" << off);
      Buf g = random_buf(d, n, off, uint32_t(n + off));
      auto r = grad_norm_sq(g.data(), d, n, exec_for(path));
      ASSERT_OK(r);
      NormResult want = ref::grad_norm_sq(g.data(), d, n);
      EXPECT_TRUE(r->finite);
      EXPECT_NEAR(r->sum_sq, want.sum_sq, 1e-12 * want.sum_sq);
      for (int bad : {0, 1, 2}) {  // inf, -inf, NaN at a position inside a tail or a chunk
        if (n == 0) break;
        Buf gb = random_buf(d, n, off, 3);
        gb.set(n / 2, bad == 0 ? INFINITY : bad == 1 ? -INFINITY : NAN);
        auto rb = grad_norm_sq(gb.data(), d, n, exec_for(path));
        ASSERT_OK(rb);
        EXPECT_FALSE(rb->finite) << "bad=" << bad;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, NormPaths,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3),
                                            ::testing::Values(DType::kF32, DType::kF16, DType::kBF16)),
                         [](const ::testing::TestParamInfo<Combo>& i) {
                           return std::string(all_paths()[std::get<0>(i.param)].name) + "_" +
                                  dtype_name(std::get<1>(i.param));
                         });

// Inputs that exercise rounding: random values over many binades, specials, fp16 edges and
// fp32 subnormals.
std::vector<float> conversion_inputs(size_t n) {
  std::vector<float> x(n);
  std::mt19937 rng(17);
  std::uniform_int_distribution<uint32_t> bits;
  const float specials[] = {0.0f,           -0.0f,          INFINITY,           -INFINITY, NAN,
                            -NAN,           65504.0f,       65519.0f,           65520.0f,  -65520.0f,
                            1e-8f,          5.96e-8f,       2.98e-8f,           6.1e-5f,   3.4e38f,
                            1.0f + 0x1p-8f, 1.0f + 0x1p-9f, 1.0f + 3 * 0x1p-9f, 1e-39f,    -1e-40f};
  for (size_t i = 0; i < n; ++i) {
    if (i < sizeof(specials) / sizeof(float)) {
      x[i] = specials[i];
    } else {
      uint32_t u = bits(rng);
      // Exponents around fp16's range most of the time.
      if (i % 4) u = (u & 0x807fffffu) | ((100u + (u >> 23) % 50u) << 23);
      x[i] = f32_from_bits(u);
    }
  }
  return x;
}

bool is_f32_subnormal(float x) { return x != 0.0f && std::fabs(x) < 0x1p-126f; }

using ConvCombo = std::tuple<int, DType, DType>;
class ConvertPaths : public ::testing::TestWithParam<ConvCombo> {};

TEST_P(ConvertPaths, MatchesReference) {
  auto [pi, sd, dd] = GetParam();
  const Path& path = all_paths()[pi];
  if (auto why = path_unavailable(path); !why.empty()) GTEST_SKIP() << why;
  for (size_t n : {size_t(1), size_t(15), size_t(17), size_t(50001)}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    std::vector<float> xs = conversion_inputs(n);
    Buf src(sd, n, 1), got(dd, n, 1), want(dd, n, 0);
    for (size_t i = 0; i < n; ++i) src.set(i, xs[i]);
    auto r = convert_with_norm(src.data(), sd, got.data(), dd, n, true, exec_for(path));
    ASSERT_OK(r);
    NormResult wr = ref::convert_with_norm(src.data(), sd, want.data(), dd, n);
    EXPECT_EQ(r->finite, wr.finite);
    if (wr.finite) {
      EXPECT_NEAR(r->sum_sq, wr.sum_sq, 1e-12 * wr.sum_sq);
    }
    size_t first = n, bad = 0;
    for (size_t i = 0; i < n; ++i) {
      float a = got.get(i), b = want.get(i);
      bool same = dd == DType::kF32 ? (f32_bits(a) == f32_bits(b) || (std::isnan(a) && std::isnan(b)))
                                    : half_ulp_distance(got.u16()[i], want.u16()[i], dd) == 0;
      // vcvtneps2bf16 treats fp32 subnormal inputs as zero.
      if (!same && path.hw_bf16 && dd == DType::kBF16 && is_f32_subnormal(src.get(i))) {
        same = (got.u16()[i] & 0x7fff) == 0 && (got.u16()[i] >> 15) == (f32_bits(src.get(i)) >> 31);
      }
      if (!same && first == n) first = i;
      bad += !same;
    }
    EXPECT_EQ(bad, 0u) << "first bad index " << first << ": src " << (first < n ? src.get(first) : 0.0f)
                       << " got " << (first < n ? got.get(first) : 0.0f) << " want "
                       << (first < n ? want.get(first) : 0.0f);
    auto r2 = convert_with_norm(src.data(), sd, got.data(), dd, n, false, exec_for(path));
    ASSERT_OK(r2);
    EXPECT_EQ(r2->sum_sq, 0.0);
  }
}

INSTANTIATE_TEST_SUITE_P(All, ConvertPaths,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3),
                                            ::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                                            ::testing::Values(DType::kF32, DType::kF16, DType::kBF16)),
                         [](const ::testing::TestParamInfo<ConvCombo>& i) {
                           return std::string(all_paths()[std::get<0>(i.param)].name) + "_" +
                                  dtype_name(std::get<1>(i.param)) + "_to_" +
                                  dtype_name(std::get<2>(i.param));
                         });

TEST(Norm, DeterministicAcrossThreads) {
  const size_t n = 1000003;
  Buf g = random_buf(DType::kF32, n, 0, 1);
  Buf dst(DType::kBF16, n);
  auto serial = grad_norm_sq(g.data(), DType::kF32, n).value();
  auto serial_c = convert_with_norm(g.data(), DType::kF32, dst.data(), DType::kBF16, n).value();
  for (auto be : {CpuPool::Backend::kAuto, CpuPool::Backend::kStdThread}) {
    for (int t : {1, 2, 3}) {
      auto pool = CpuPool::create({t, -1, be}).value();
      Exec e{pool.get(), std::nullopt, true, std::nullopt};
      EXPECT_EQ(grad_norm_sq(g.data(), DType::kF32, n, e).value().sum_sq, serial.sum_sq) << t;
      EXPECT_EQ(convert_with_norm(g.data(), DType::kF32, dst.data(), DType::kBF16, n, true, e).value().sum_sq,
                serial_c.sum_sq)
          << t;
    }
  }
}

// accumulate_with_norm: acc = (first ? 0 : acc) + float(src) exactly as a plain loop does, the
// per-chunk sums of squares of the new acc, and the same bits when done in chunk-aligned pieces.
TEST(Norm, AccumulateWithNorm) {
  for (const Path& path : all_paths()) {
    if (!path_unavailable(path).empty()) continue;
    for (DType d : {DType::kF32, DType::kF16, DType::kBF16}) {
      for (size_t n : {size_t(0), size_t(1), size_t(17), 3 * kChunkElems + 5}) {
        SCOPED_TRACE(::testing::Message() << path.name << " " << dtype_name(d) << " n=" << n);
        Buf g1 = random_buf(d, n, 1, 7), g2 = random_buf(d, n, 0, 8);
        std::vector<float> acc(n + 1, 123.0f), want(n);
        std::vector<double> parts(norm_chunks(n) + 1, -1.0);
        ASSERT_OK(accumulate_with_norm(acc.data(), g1.data(), d, n, true, parts.data(), exec_for(path)));
        ASSERT_OK(accumulate_with_norm(acc.data(), g2.data(), d, n, false, parts.data(), exec_for(path)));
        for (size_t i = 0; i < n; ++i) {
          want[i] = g1.get(i) + g2.get(i);
          ASSERT_EQ(acc[i], want[i]) << "first bad index " << i;
        }
        EXPECT_EQ(acc[n], 123.0f) << "wrote past the end";
        for (size_t c = 0; c < norm_chunks(n); ++c) {
          double w = 0;
          for (size_t i = c * kChunkElems; i < std::min(n, (c + 1) * kChunkElems); ++i)
            w += double(want[i]) * want[i];
          EXPECT_NEAR(parts[c], w, 1e-12 * w) << "chunk " << c;
        }
        EXPECT_EQ(parts[norm_chunks(n)], -1.0) << "wrote a partial past the end";
        // In two pieces split at a chunk boundary: the same accumulator and partials, bit for bit.
        if (n > 2 * kChunkElems) {
          std::vector<float> acc2(n);
          std::vector<double> parts2(norm_chunks(n));
          const size_t cut = 2 * kChunkElems, es = dtype_size(d);
          for (bool first : {true, false}) {
            const Buf& g = first ? g1 : g2;
            ASSERT_OK(
                accumulate_with_norm(acc2.data(), g.data(), d, cut, first, parts2.data(), exec_for(path)));
            ASSERT_OK(accumulate_with_norm(acc2.data() + cut, static_cast<const char*>(g.data()) + cut * es,
                                           d, n - cut, first, parts2.data() + cut / kChunkElems,
                                           exec_for(path)));
          }
          EXPECT_EQ(0, memcmp(acc2.data(), acc.data(), n * 4));
          for (size_t c = 0; c < parts2.size(); ++c) EXPECT_EQ(parts2[c], parts[c]) << "chunk " << c;
        }
      }
    }
  }
  // Overflow shows as a non-finite partial; bad arguments are errors.
  Buf g = random_buf(DType::kBF16, 100, 0, 9);
  g.set(50, INFINITY);
  std::vector<float> acc(100, 0.0f);
  double part = 0;
  ASSERT_OK(accumulate_with_norm(acc.data(), g.data(), DType::kBF16, 100, false, &part));
  EXPECT_FALSE(std::isfinite(part));
  EXPECT_FALSE(accumulate_with_norm(nullptr, g.data(), DType::kBF16, 100, false, &part).is_ok());
  EXPECT_FALSE(accumulate_with_norm(acc.data(), acc.data(), DType::kF32, 100, false, &part).is_ok());
}

TEST(Norm, ScaleInPlace) {
  for (const Path& path : all_paths()) {
    if (!path_unavailable(path).empty()) continue;
    for (DType d : {DType::kF32, DType::kF16, DType::kBF16}) {
      const size_t n = 20001;
      Buf a = random_buf(d, n, 1, 2), b = random_buf(d, n, 1, 2);
      ASSERT_OK(scale_in_place(a.data(), d, n, 0.125f, exec_for(path)));
      for (size_t i = 0; i < n; ++i) b.set(i, b.get(i) * 0.125f);
      EXPECT_TRUE(a.same_bytes(b)) << path.name << " " << dtype_name(d);
    }
  }
}

TEST(Norm, StepScale) {
  auto s = compute_step_scale({400.0, true}, 4.0f, 1.0f);  // norm 20 / 4 = 5 > 1
  EXPECT_FALSE(s.overflow);
  EXPECT_DOUBLE_EQ(s.grad_norm, 5.0);
  EXPECT_NEAR(s.clip_coef, 1.0 / (5.0 + 1e-6), 1e-7);
  EXPECT_NEAR(s.grad_scale, s.clip_coef / 4.0f, 1e-9);
  auto u = compute_step_scale({0.25, true}, 2.0f, 1.0f);
  EXPECT_EQ(u.clip_coef, 1.0f);
  EXPECT_EQ(u.grad_scale, 0.5f);
  EXPECT_TRUE(compute_step_scale({INFINITY, false}, 2.0f, 1.0f).overflow);
  EXPECT_TRUE(compute_step_scale({NAN, true}, 2.0f, 0.0f).overflow);
}

}  // namespace
}  // namespace zoe::optim::test
