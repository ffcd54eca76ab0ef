// Fused Adam/AdamW: every SIMD path x grad dtype x output dtype x state dtype vs the reference.
//
// Tolerances (fast path vs reference, same inputs, one step):
//   scalar path: identical values (same operations in the same order, no FMA).
//   SIMD paths (FMA): m, v within 8*2^-24 of the sum of the magnitudes of their terms; p within
//     8*2^-24*|p| plus step_size times the propagated m/v error over denom.
//   bf16 m/v: within the fp32 bound above plus 1 bf16 ulp (identical for scalar); bf16/fp16
//     param_out: within 1 ulp of the reference's (identical for scalar), and exactly the RNE
//     conversion of the path's own fp32 p.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <tuple>

#include "optim/adam.h"
#include "optim/adam_reference.h"
#include "optim_test_util.h"
#include "tests/util/status_test_util.h"

namespace zoe::optim::test {
namespace {

struct Case {
  size_t n;
  size_t offset;
  int64_t step;
  bool adamw;
};

struct Data {
  Buf p, g, m, v, out;
};

Data make_data(size_t n, size_t off, DType gd, DType sd, int out, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> up(-1.0f, 1.0f), uv(0.0f, 1e-4f);
  std::normal_distribution<float> ng(0.0f, 1.0f), nm(0.0f, 1e-2f);
  Data d{Buf(DType::kF32, n, off), Buf(gd, n, off), Buf(sd, n, off), Buf(sd, n, off),
         Buf(out == 1 ? DType::kF16 : DType::kBF16, n, off)};
  for (size_t i = 0; i < n; ++i) {
    d.p.set(i, up(rng));
    d.g.set(i, ng(rng) * 10.0f);  // a loss-scaled gradient (scale 1/1024 below)
    d.m.set(i, nm(rng));
    d.v.set(i, uv(rng));
  }
  return d;
}

AdamArgs args_for(Data& d, DType gd, DType sd, int out, const Case& c, bool sr) {
  AdamArgs a;
  a.buf.n = d.p.size();
  a.buf.param = d.p.f32();
  a.buf.grad = d.g.data();
  a.buf.grad_dtype = gd;
  a.buf.exp_avg = d.m.data();
  a.buf.exp_avg_sq = d.v.data();
  a.buf.state_dtype = sd;
  a.buf.param_out = out ? d.out.data() : nullptr;
  a.buf.param_out_dtype = out == 1 ? DType::kF16 : DType::kBF16;
  a.params.lr = 1e-3f;
  a.params.beta1 = 0.9f;
  a.params.beta2 = 0.999f;
  a.params.eps = 1e-8f;
  a.params.weight_decay = 0.01f;
  a.params.adamw = c.adamw;
  a.params.stochastic_rounding = sr;
  a.params.sr_seed = 1234;
  a.step.step = c.step;
  a.step.grad_scale = 1.0f / 1024.0f;
  return a;
}

using Combo = std::tuple<int, DType, int, int>;  // path, grad dtype, out (0/1/2), state (0/2/3)

class AdamPaths : public ::testing::TestWithParam<Combo> {};

TEST_P(AdamPaths, MatchesReference) {
  auto [pi, gd, out, st] = GetParam();
  const Path& path = all_paths()[pi];
  std::string why = path_unavailable(path);
  if (!why.empty()) GTEST_SKIP() << why;
  const DType sd = st == 0 ? DType::kF32 : DType::kBF16;
  const bool sr = st == 3;
  const bool exact = path.level == SimdLevel::kScalar;
  const Case cases[] = {{0, 0, 1, true},        {1, 1, 1000000, false}, {15, 0, 1, true},
                        {17, 1, 1000000, true}, {33000, 1, 1, true},    {33000, 0, 1000000, false}};
  uint32_t seed = 1;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << path.name << " n=" << c.n << " offset=" << c.offset
                                      << " step=" << c.step << (c.adamw ? " adamw" : " adam-l2"));
    Data fast = make_data(c.n, c.offset, gd, sd, out, seed);
    Data ref = make_data(c.n, c.offset, gd, sd, out, seed);
    Data before = make_data(c.n, c.offset, gd, sd, out, seed);
    ++seed;
    AdamArgs af = args_for(fast, gd, sd, out, c, sr);
    AdamArgs ar = args_for(ref, gd, sd, out, c, sr);
    // Aligned cases write param_out with streaming stores, misaligned ones cannot.
    ASSERT_OK(adam_step(af, exec_for(path, nullptr, c.offset == 0)));
    ASSERT_OK(ref::adam_step(ar));
    auto k = make_adam_constants(ar.params, ar.step).value();

    const double e = 8.0 * 0x1p-24;
    auto gl = [&](size_t i) {
      return std::fabs(double(before.g.get(i)) * k.grad_scale) + double(k.l2) * std::fabs(before.p.get(i));
    };
    auto bound_m = [&](size_t i) {
      return exact ? 0.0 : e * (k.beta1 * std::fabs(before.m.get(i)) + k.one_minus_beta1 * gl(i));
    };
    auto bound_v = [&](size_t i) {
      return exact ? 0.0 : e * (k.beta2 * std::fabs(before.v.get(i)) + k.one_minus_beta2 * gl(i) * gl(i));
    };
    auto bound_p = [&](size_t i) {
      if (exact) return 0.0;
      double denom = std::sqrt(double(ref.v.get(i))) * k.inv_sqrt_bc2 + k.eps;
      return e * std::fabs(before.p.get(i)) +
             k.step_size * (bound_m(i) / denom +
                            std::fabs(ref.m.get(i)) * (e + bound_v(i) / (ref.v.get(i) + 1e-30)) / denom);
    };
    EXPECT_TRUE(near_f32("param", fast.p.f32(), ref.p.f32(), c.n, bound_p));
    if (sd == DType::kF32) {
      EXPECT_TRUE(near_f32("exp_avg", fast.m.f32(), ref.m.f32(), c.n, bound_m));
      EXPECT_TRUE(near_f32("exp_avg_sq", fast.v.f32(), ref.v.f32(), c.n, bound_v));
    } else {
      if (exact) {
        EXPECT_TRUE(near_half("exp_avg", fast.m.u16(), ref.m.u16(), c.n, sd, 0));
        EXPECT_TRUE(near_half("exp_avg_sq", fast.v.u16(), ref.v.u16(), c.n, sd, 0));
      } else {
        // 1 bf16 ulp, or the fp32 bound plus one bf16 ulp where m cancels to a tiny value.
        std::vector<float> fm(c.n), rm(c.n), fv(c.n), rv(c.n);
        for (size_t i = 0; i < c.n; ++i)
          fm[i] = fast.m.get(i), rm[i] = ref.m.get(i), fv[i] = fast.v.get(i), rv[i] = ref.v.get(i);
        auto bf16_bound = [&](const std::vector<float>& a, const std::vector<float>& b, auto fp32_bound) {
          return [&, fp32_bound](size_t i) {
            return fp32_bound(i) + std::ldexp(std::max(std::fabs(a[i]), std::fabs(b[i])), -7);
          };
        };
        EXPECT_TRUE(near_f32("exp_avg (bf16)", fm.data(), rm.data(), c.n, bf16_bound(fm, rm, bound_m)));
        EXPECT_TRUE(near_f32("exp_avg_sq (bf16)", fv.data(), rv.data(), c.n, bf16_bound(fv, rv, bound_v)));
      }
    }
    if (out) {
      DType od = out == 1 ? DType::kF16 : DType::kBF16;
      EXPECT_TRUE(near_half("param_out", fast.out.u16(), ref.out.u16(), c.n, od, exact ? 0 : 1));
      std::vector<uint16_t> own(c.n);
      for (size_t i = 0; i < c.n; ++i)
        own[i] = od == DType::kF16 ? f32_to_f16(fast.p.f32()[i]) : f32_to_bf16(fast.p.f32()[i]);
      EXPECT_TRUE(near_half("param_out vs own p", fast.out.u16(), own.data(), c.n, od, 0));
    }
  }
}

std::string combo_name(const ::testing::TestParamInfo<Combo>& info) {
  auto [pi, gd, out, st] = info.param;
  static const char* outs[] = {"none", "fp16", "bf16"};
  static const char* states[] = {"fp32", "", "bf16", "bf16sr"};
  return std::string(all_paths()[pi].name) + "_g" + dtype_name(gd) + "_out" + outs[out] + "_m" + states[st];
}

INSTANTIATE_TEST_SUITE_P(All, AdamPaths,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3),
                                            ::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                                            ::testing::Values(0, 1, 2), ::testing::Values(0, 2, 3)),
                         combo_name);

// Large size, a pool of 2 threads, param_out written with streaming stores across chunks.
TEST(Adam, LargeAllPathsTwoThreads) {
  auto pool = CpuPool::create({2, -1, CpuPool::Backend::kAuto}).value();
  const size_t n = 1000003;
  for (const Path& path : all_paths()) {
    if (!path_unavailable(path).empty()) continue;
    SCOPED_TRACE(path.name);
    Case c{n, 0, 1, true};
    Data fast = make_data(n, 0, DType::kBF16, DType::kF32, 2, 7);  // aligned: streaming stores
    Data ref = make_data(n, 0, DType::kBF16, DType::kF32, 2, 7);
    AdamArgs af = args_for(fast, DType::kBF16, DType::kF32, 2, c, false);
    AdamArgs ar = args_for(ref, DType::kBF16, DType::kF32, 2, c, false);
    ASSERT_OK(adam_step(af, exec_for(path, pool.get(), true)));
    ASSERT_OK(ref::adam_step(ar));
    EXPECT_TRUE(near_f32("param", fast.p.f32(), ref.p.f32(), n,
                         [&](size_t i) { return 1e-6 * std::fabs(ref.p.f32()[i]) + 1e-9; }));
    EXPECT_TRUE(near_half("param_out", fast.out.u16(), ref.out.u16(), n, DType::kBF16, 1));
  }
}

// The same bits whatever the thread count and backend.
TEST(Adam, DeterministicAcrossThreads) {
  const size_t n = 1000003;
  std::vector<std::unique_ptr<CpuPool>> pools;
  pools.push_back(nullptr);
  for (auto be : {CpuPool::Backend::kAuto, CpuPool::Backend::kStdThread}) {
    for (int t : {1, 2, 3}) pools.push_back(CpuPool::create({t, -1, be}).value());
  }
  Case c{n, 0, 10, true};
  std::vector<Data> results;
  for (auto& pool : pools) {
    Data d = make_data(n, 0, DType::kF32, DType::kBF16, 2, 11);
    AdamArgs a = args_for(d, DType::kF32, DType::kBF16, 2, c, true);
    ASSERT_OK(adam_step(a, Exec{pool.get(), std::nullopt, true, std::nullopt}));
    results.push_back(std::move(d));
  }
  for (size_t i = 1; i < results.size(); ++i) {
    EXPECT_TRUE(results[i].p.same_bytes(results[0].p)) << "pool " << i;
    EXPECT_TRUE(results[i].m.same_bytes(results[0].m)) << "pool " << i;
    EXPECT_TRUE(results[i].v.same_bytes(results[0].v)) << "pool " << i;
    EXPECT_TRUE(results[i].out.same_bytes(results[0].out)) << "pool " << i;
  }
}

// The reference itself against textbook Adam/AdamW in double precision over several steps.
TEST(AdamReference, MatchesDoublePrecisionTextbook) {
  for (bool adamw : {true, false}) {
    const size_t n = 257;
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> p(n), g(n), m(n, 0.0f), v(n, 0.0f);
    for (auto& x : p) x = nd(rng);
    std::vector<double> pd(p.begin(), p.end()), md(n, 0.0), vd(n, 0.0);
    AdamParams hp;
    hp.lr = 1e-2f;
    hp.weight_decay = 0.1f;
    hp.adamw = adamw;
    for (int t = 1; t <= 20; ++t) {
      for (auto& x : g) x = nd(rng);
      AdamArgs a;
      a.buf = {n, p.data(), g.data(), DType::kF32, m.data(), v.data(), DType::kF32, nullptr, DType::kBF16};
      a.params = hp;
      a.step = {t, 0.5f};
      ASSERT_OK(ref::adam_step(a));
      const double b1 = hp.beta1, b2 = hp.beta2, lr = hp.lr, wd = hp.weight_decay;
      for (size_t i = 0; i < n; ++i) {
        double gi = 0.5 * g[i];
        if (!adamw)
          gi += wd * pd[i];
        else
          pd[i] *= 1.0 - lr * wd;
        md[i] = b1 * md[i] + (1 - b1) * gi;
        vd[i] = b2 * vd[i] + (1 - b2) * gi * gi;
        double mh = md[i] / (1 - std::pow(b1, t)), vh = vd[i] / (1 - std::pow(b2, t));
        pd[i] -= lr * mh / (std::sqrt(vh) + hp.eps);
      }
    }
    for (size_t i = 0; i < n; ++i) {
      ASSERT_NEAR(p[i], pd[i], 1e-5 * (1 + std::fabs(pd[i]))) << "adamw=" << adamw << " index " << i;
    }
  }
}

// First step from zero moments moves every parameter by lr * sign(g) (|m_hat| / sqrt(v_hat) = 1);
// at step 10^6 the bias corrections are exactly 1.
TEST(Adam, BiasCorrectionSteps1And1e6) {
  AdamParams hp;
  auto c1 = make_adam_constants(hp, {1, 1.0f}).value();
  EXPECT_FLOAT_EQ(c1.step_size, hp.lr / (1.0f - hp.beta1));
  EXPECT_FLOAT_EQ(c1.inv_sqrt_bc2, static_cast<float>(1.0 / std::sqrt(1.0 - 0.999f)));
  auto c6 = make_adam_constants(hp, {1000000, 1.0f}).value();
  EXPECT_EQ(c6.step_size, hp.lr);
  EXPECT_EQ(c6.inv_sqrt_bc2, 1.0f);
  for (const Path& path : all_paths()) {
    if (!path_unavailable(path).empty()) continue;
    const size_t n = 100;
    std::vector<float> p(n, 1.0f), g(n), m(n, 0.0f), v(n, 0.0f);
    for (size_t i = 0; i < n; ++i) g[i] = (i % 2 ? -1.0f : 1.0f) * (0.01f + float(i));
    AdamArgs a;
    a.buf = {n, p.data(), g.data(), DType::kF32, m.data(), v.data(), DType::kF32, nullptr, DType::kBF16};
    a.params = hp;
    a.step = {1, 1.0f};
    ASSERT_OK(adam_step(a, exec_for(path)));
    for (size_t i = 0; i < n; ++i) {
      ASSERT_NEAR(p[i], 1.0f - hp.lr * (i % 2 ? -1.0f : 1.0f), 1e-6) << path.name << " index " << i;
    }
  }
}

TEST(Adam, RejectsBadArguments) {
  float p = 0, g = 0, m = 0, v = 0;
  AdamArgs a;
  a.buf = {1, &p, &g, DType::kF32, &m, &v, DType::kF32, nullptr, DType::kBF16};
  a.step.step = 0;
  EXPECT_EQ(adam_step(a).code(), StatusCode::kInvalidArgument);
  a.step.step = 1;
  a.params.beta2 = 1.0f;
  EXPECT_EQ(adam_step(a).code(), StatusCode::kInvalidArgument);
  a.params.beta2 = 0.999f;
  a.buf.state_dtype = DType::kF16;
  EXPECT_EQ(adam_step(a).code(), StatusCode::kInvalidArgument);
  a.buf.state_dtype = DType::kF32;
  a.buf.grad = nullptr;
  EXPECT_EQ(adam_step(a).code(), StatusCode::kInvalidArgument);
  a.buf.grad = &g;
  a.step.grad_scale = INFINITY;
  EXPECT_EQ(adam_step(a).code(), StatusCode::kInvalidArgument);
  a.step.grad_scale = 1.0f;
  EXPECT_OK(adam_step(a));
}

// inf/NaN gradients: the norm reports the overflow and the full step leaves every buffer alone.
TEST(Adam, OverflowSkipsStep) {
  for (const Path& path : all_paths()) {
    if (!path_unavailable(path).empty()) continue;
    for (DType gd : {DType::kF32, DType::kF16, DType::kBF16}) {
      for (float bad : {INFINITY, -INFINITY, NAN}) {
        SCOPED_TRACE(::testing::Message() << path.name << " " << dtype_name(gd) << " " << bad);
        const size_t n = 40000;
        Data d = make_data(n, 1, gd, DType::kF32, 2, 5);
        Data before = make_data(n, 1, gd, DType::kF32, 2, 5);
        d.g.set(n - 3, bad);
        AdamGroup group;
        group.step = 41;
        AdamBuffers b{n,          d.p.f32(),   d.g.data(),   gd,          d.m.data(),
                      d.v.data(), DType::kF32, d.out.data(), DType::kBF16};
        auto r = adam_full_step(group, b, 1024.0f, 1.0f, exec_for(path));
        ASSERT_OK(r);
        EXPECT_TRUE(r->skipped);
        EXPECT_TRUE(r->scale.overflow);
        EXPECT_EQ(group.step, 41);
        EXPECT_TRUE(d.p.same_bytes(before.p));
        EXPECT_TRUE(d.m.same_bytes(before.m));
        EXPECT_TRUE(d.v.same_bytes(before.v));
        EXPECT_TRUE(d.out.same_bytes(before.out));
      }
    }
  }
}

// A finite full step: unscale + clip folded into the Adam pass equals scaling the grads first.
TEST(Adam, FullStepFoldsUnscaleAndClip) {
  const size_t n = 5000;
  Data fused = make_data(n, 0, DType::kF32, DType::kF32, 0, 9);
  Data sep = make_data(n, 0, DType::kF32, DType::kF32, 0, 9);
  AdamGroup group;
  group.step = 4;
  AdamBuffers b{n,           fused.p.f32(), fused.g.data(), DType::kF32, fused.m.data(), fused.v.data(),
                DType::kF32, nullptr,       DType::kBF16};
  auto r = adam_full_step(group, b, 1024.0f, 0.5f, Exec{nullptr, SimdLevel::kScalar, false, std::nullopt});
  ASSERT_OK(r);
  ASSERT_FALSE(r->skipped);
  EXPECT_EQ(group.step, 5);
  double norm = std::sqrt(ref::grad_norm_sq(sep.g.data(), DType::kF32, n).sum_sq) / 1024.0;
  EXPECT_NEAR(r->scale.grad_norm, norm, 1e-9 * norm);
  ASSERT_GT(norm, 0.5);  // clipping is active
  EXPECT_NEAR(r->scale.clip_coef, 0.5 / (norm + 1e-6), 1e-6);
  AdamArgs a;
  a.buf = {n,           sep.p.f32(), sep.g.data(), DType::kF32, sep.m.data(), sep.v.data(),
           DType::kF32, nullptr,     DType::kBF16};
  a.step = {5, r->scale.grad_scale};
  ASSERT_OK(ref::adam_step(a));
  EXPECT_TRUE(fused.p.same_bytes(sep.p));
  EXPECT_TRUE(fused.m.same_bytes(sep.m));
}

}  // namespace
}  // namespace zoe::optim::test
