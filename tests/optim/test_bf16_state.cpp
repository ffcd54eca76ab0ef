// The accuracy cost of keeping Adam's m and v in bf16, measured on a noisy quadratic.
//
// Three runs from the same start, same hyperparameters and same gradient noise: fp32 m/v (the
// baseline), bf16 m/v rounded to nearest even, bf16 m/v rounded stochastically. The test prints
// the final loss of each and the RMS distance of their parameters from the fp32 run, relative
// to how far the fp32 run moved; it fails only on gross regressions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>

#include "optim/adam.h"
#include "optim_test_util.h"
#include "tests/util/status_test_util.h"

namespace zoe::optim::test {
namespace {

struct TrainRun {
  std::vector<float> p;
  double loss = 0;
};

TrainRun train(int state, int steps, size_t n, float noise_sigma) {
  // loss = 0.5 * sum h_i (p_i - t_i)^2, h spread over 4 decades; gradient noise sigma*h.
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> h(n), t(n), p(n), g(n);
  for (size_t i = 0; i < n; ++i) {
    h[i] = std::pow(10.0f, -2.0f + 4.0f * float(i) / float(n));
    t[i] = u(rng);
    p[i] = 0.0f;
  }
  Buf m(state ? DType::kBF16 : DType::kF32, n), v(state ? DType::kBF16 : DType::kF32, n);
  for (size_t i = 0; i < n; ++i) m.set(i, 0.0f), v.set(i, 0.0f);
  std::mt19937 noise(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  AdamArgs a;
  a.buf = {
      n,       p.data(),    g.data(), DType::kF32, m.data(), v.data(), state ? DType::kBF16 : DType::kF32,
      nullptr, DType::kBF16};
  a.params.lr = 1e-3f;
  a.params.stochastic_rounding = state == 2;
  for (int s = 1; s <= steps; ++s) {
    for (size_t i = 0; i < n; ++i) g[i] = h[i] * (p[i] - t[i]) + noise_sigma * h[i] * nd(noise);
    a.step = {s, 1.0f};
    EXPECT_OK(adam_step(a));
  }
  TrainRun r{p, 0.0};
  for (size_t i = 0; i < n; ++i) r.loss += 0.5 * h[i] * (double(p[i]) - t[i]) * (double(p[i]) - t[i]);
  return r;
}

TEST(Bf16State, AccuracyCost) {
  const size_t n = 2048;
  const int steps = 3000;
  double start_loss = 0;
  {
    std::mt19937 rng(42);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (size_t i = 0; i < n; ++i) {
      float h = std::pow(10.0f, -2.0f + 4.0f * float(i) / float(n));
      float t = u(rng);
      start_loss += 0.5 * h * double(t) * t;
    }
  }
  printf("bf16 m/v accuracy (%zu params, %d AdamW steps, lr 1e-3, quadratic with curvatures 1e-2..1e2):\n", n,
         steps);
  for (float sigma : {0.0f, 0.1f}) {
    TrainRun f32 = train(0, steps, n, sigma), rne = train(1, steps, n, sigma), sr = train(2, steps, n, sigma);
    auto rel_dist = [&](const TrainRun& r) {
      double d = 0, moved = 0;
      for (size_t i = 0; i < n; ++i) {
        d += (double(r.p[i]) - f32.p[i]) * (double(r.p[i]) - f32.p[i]);
        moved += double(f32.p[i]) * f32.p[i];
      }
      return std::sqrt(d / moved);
    };
    printf(
        "  gradient noise %.1f*h: loss start %.5g, fp32 m/v %.5g, bf16 RNE %.5g (%+.1f%%), bf16 stochastic "
        "%.5g (%+.1f%%)\n",
        sigma, start_loss, f32.loss, rne.loss, 100 * (rne.loss / f32.loss - 1), sr.loss,
        100 * (sr.loss / f32.loss - 1));
    printf(
        "    params' RMS distance from the fp32-m/v run, relative to their RMS: RNE %.3g, stochastic %.3g\n",
        rel_dist(rne), rel_dist(sr));
    std::string tag = sigma > 0 ? "_noisy" : "_clean";
    RecordProperty("loss_fp32" + tag, std::to_string(f32.loss));
    RecordProperty("loss_bf16_rne" + tag, std::to_string(rne.loss));
    RecordProperty("loss_bf16_sr" + tag, std::to_string(sr.loss));
    EXPECT_LT(f32.loss, 0.5 * start_loss);
    EXPECT_LT(rne.loss, 0.5 * start_loss);
    EXPECT_LT(sr.loss, 0.5 * start_loss);
    EXPECT_LT(rel_dist(sr), 0.2);
    EXPECT_LT(rel_dist(rne), 0.2);
  }
}

}  // namespace
}  // namespace zoe::optim::test
